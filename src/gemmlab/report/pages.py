"""The tables of the results pages, one function per kind of table, each reading committed result files.

    TABLES[name](load, spec) -> Section(table, envs, clocks)

``load(path)`` reads one result file (JSON, relative to the results tree); ``spec`` is the table's entry in
``index.json``'s "pages" (the files it reads and its options). A table reads the files' own fields, never a
suite's code, so a page changes only when the data does. Ratios are baseline time / gemmlab time (> 1: gemmlab
faster), the median of per-round ratios of an interleaved run, with its bootstrap 95% interval where kept.

The tables live beside this registry, by suite: ``tables_gemm`` (dense GEMM suites), ``tables_moe`` (MoE and model
suites), ``tables_lab`` (probe, tune, grade, grade-gap, host-cost) and ``tables_fp8`` (fp8-variants, fp8-decode);
``section`` holds ``Section`` and the cells.
"""

from __future__ import annotations

from collections.abc import Callable

from gemmlab.report.section import Section
from gemmlab.report.tables_fp8 import fp8_decode, fp8_variants
from gemmlab.report.tables_gemm import (
    BROAD_KEYS,
    CAP,
    PAR,
    broad,
    broad_ratios,
    broad_summary,
    clock_order,
    distribution,
    gemm_suite,
    seed_table,
    stable,
)
from gemmlab.report.tables_lab import device_profile, grade, grade_gap, host_cost, tune
from gemmlab.report.tables_moe import model_bench, moe_bench, moe_liger, whole_model

__all__ = [
    "BROAD_KEYS",
    "CAP",
    "PAR",
    "TABLES",
    "Section",
    "broad",
    "broad_ratios",
    "broad_summary",
    "clock_order",
    "device_profile",
    "fp8_decode",
    "fp8_variants",
    "distribution",
    "gemm_suite",
    "grade",
    "grade_gap",
    "host_cost",
    "model_bench",
    "moe_bench",
    "moe_liger",
    "seed_table",
    "stable",
    "tune",
    "whole_model",
]


TABLES: dict[str, Callable[..., Section]] = {
    "gemm-suite": gemm_suite,
    "broad": broad,
    "broad-summary": broad_summary,
    "clock-order": clock_order,
    "stable": stable,
    "seed-table": seed_table,
    "moe-bench": moe_bench,
    "moe-liger": moe_liger,
    "model-bench": model_bench,
    "whole-model": whole_model,
    "device-profile": device_profile,
    "tune": tune,
    "grade": grade,
    "grade-gap": grade_gap,
    "host-cost": host_cost,
    "fp8-variants": fp8_variants,
    "fp8-decode": fp8_decode,
}
