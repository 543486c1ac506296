"""The FP8 results tables: the dense kernel's variants and the small-M decode path, each against cuBLASLt.

    fp8_variants(load, spec) -> Section   ``python -m benchmarks fp8-variants`` (graph replay): per shape and scale
                                          mode, each variant's TFLOPS and speed against cuBLASLt, registers, spills,
                                          worst error over the bound; the variants that were not timed, and why
    fp8_decode(load, spec)   -> Section   ``python -m benchmarks fp8-decode``: per M, shape and scale mode, each
                                          candidate's µs in graph replay, speed against cuBLASLt (95% interval) in
                                          graph replay and eager, and the fraction of the copy bandwidth it reached

Ratios are cuBLASLt time / candidate time (> 1: the candidate is faster), the median of per-round ratios of an
interleaved run; "-" where cuBLASLt has no such call (block scales at M = 1 in this torch).
"""

from __future__ import annotations

from gemmlab.output import Table, num
from gemmlab.report.section import Section, ci_text, mhz_of


def _ratio(v) -> float | None:
    return v.get("ratio") if isinstance(v, dict) else v


def fp8_variants(load, spec) -> Section:
    r = load(spec["file"])
    t = Table(
        spec.get("title", "FP8 kernel variants against cuBLASLt (graph replay)"),
        ("shape", "scales", "kernel", "TFLOPS", "vs cuBLASLt", "registers", "spills", "worst / bound"),
    )
    clocks = []
    for row in r["rows"]:
        shape = f"{row['shape']} ({row['m']}x{row['n']}x{row['k']})"
        kernels = row.get("kernels", {})
        by_speed = sorted(row.get("tflops", {}), key=lambda c: -(row["tflops"][c] or 0))
        for c in by_speed:
            k = kernels.get(c, {})
            t.rows.append(
                [
                    shape,
                    row["mode"],
                    c,
                    num(row["tflops"][c], ".1f"),
                    num(_ratio(row.get("vs_baseline", {}).get(c)), ".3f"),
                    num(k.get("n_regs"), "d"),
                    num(k.get("n_spills"), "d"),
                    num((row.get("checks", {}).get(c) or {}).get("worst"), ".3f"),
                ]
            )
        for c, why in row.get("unavailable", {}).items():
            t.rows.append([shape, row["mode"], c, "-", "-", "-", "-", f"not timed: {why}"])
        clocks.append(mhz_of(row.get("compare") or {}))
    return Section(t, [r["env"]], clocks)


def fp8_decode(load, spec) -> Section:
    r = load(spec["file"])
    t = Table(
        spec.get("title", "FP8 small M against cuBLASLt"),
        ("M", "shape", "scales", "candidate", "graph µs", "graph vs cuBLASLt", "95% CI", "eager vs cuBLASLt", "HBM"),
    )
    clocks = []
    for row in r["rows"]:
        graph, eager = row.get("graph") or {}, row.get("eager") or {}
        for c, us in graph.get("us", {}).items():
            if c == "cublas_fast":
                continue
            g = graph.get("vs_cublas", {}).get(c)
            t.rows.append(
                [
                    str(row["m"]),
                    f"{row['shape']}",
                    row["mode"],
                    c,
                    num(us, ".1f"),
                    "1 (baseline)" if c == "cublas" else num(_ratio(g), ".3f"),
                    "-" if c == "cublas" else ci_text(g if isinstance(g, dict) else None),
                    "1 (baseline)" if c == "cublas" else num(_ratio(eager.get("vs_cublas", {}).get(c)), ".3f"),
                    num(graph.get("hbm_fraction", {}).get(c), ".2f"),
                ]
            )
        clocks.append(mhz_of(graph))
    return Section(t, [r["env"]], clocks)
