"""Nsight Compute's counters as ``gemmlab profile`` reads them: which metrics (``METRICS``, the warp-stall
reasons), their units, and how a report's raw CSV becomes per-launch summaries and a call's total.

    parse_raw_csv(text)          ``ncu --import R --csv --page raw``: one dict per launch
    launch_summary(launch)       one launch's values in the shown units, its stalls and top stalls
    total(launches)              a call of several launches: sums, duration-weighted means, maxima
    requested(available)         the counter names to ask for, and the metrics this ncu lacks
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One line of the summary: ``ncu`` names the counter as ncu spells it (``alt``: its name in other ncu
    versions, read where ``ncu`` is missing), ``unit`` the unit shown (values are converted from the unit ncu
    reports), ``combine`` how launches of one call add up: "sum", "mean" (weighted by duration) or "max"."""

    key: str
    label: str
    ncu: str
    unit: str
    combine: str
    alt: str = ""

    def names(self) -> tuple[str, ...]:
        return (self.ncu, self.alt) if self.alt else (self.ncu,)


# What decides a GEMM's speed on sm_90. "pipe_tensor" cycles count HMMA and wgmma (GMMA) together; wgmma
# alone shows as its instruction issue rate (there is no gmma-only cycles counter on sm_90). Names checked
# against published sm_90 metric lists (ncu 2025.x); a name this ncu lacks is listed, not guessed.
METRICS: tuple[Metric, ...] = (
    Metric("duration", "duration", "gpu__time_duration.sum", "us", "sum"),
    Metric("sm_clock", "SM clock", "sm__cycles_elapsed.avg.per_second", "MHz", "mean"),
    Metric(
        "tensor_pipe",
        "tensor pipe busy (elapsed)",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "%",
        "mean",
    ),
    Metric(
        "tensor_pipe_active",
        "tensor pipe busy (SM active)",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        "%",
        "mean",
    ),
    Metric(
        "gmma_inst",
        "wgmma issue (SM active)",
        "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
        "%",
        "mean",
    ),
    Metric("sm_throughput", "SM throughput", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "mean"),
    Metric(
        "memory_throughput",
        "memory throughput",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "%",
        "mean",
    ),
    Metric(
        "dram_throughput",
        "DRAM throughput",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "%",
        "mean",
        alt="gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    Metric("dram_read", "DRAM read", "dram__bytes_read.sum", "MB", "sum"),
    Metric("dram_write", "DRAM write", "dram__bytes_write.sum", "MB", "sum"),
    Metric("l2_throughput", "L2 throughput", "lts__throughput.avg.pct_of_peak_sustained_elapsed", "%", "mean"),
    Metric("l2_hit", "L2 hit rate", "lts__t_sector_hit_rate.pct", "%", "mean"),
    Metric("occupancy", "achieved occupancy", "sm__warps_active.avg.pct_of_peak_sustained_active", "%", "mean"),
    Metric("issue_active", "issue slots busy", "smsp__issue_active.avg.pct_of_peak_sustained_active", "%", "mean"),
    Metric(
        "smem_conflicts_ld",
        "shared-mem bank conflicts (ld)",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "count",
        "sum",
    ),
    Metric(
        "smem_conflicts_st",
        "shared-mem bank conflicts (st)",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
        "count",
        "sum",
    ),
    Metric("registers", "registers / thread", "launch__registers_per_thread", "count", "max"),
    Metric("smem_per_block", "shared memory / block (dynamic)", "launch__shared_mem_per_block_dynamic", "KB", "max"),
    Metric("waves", "waves / SM", "launch__waves_per_multiprocessor", "waves", "max"),
)
# Warp-stall reasons (the WarpStateStats section's): cycles per issued instruction a warp spends stalled
# for each reason. "selected" is issuing itself, not a stall: kept, never ranked as a top stall.
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
STALL_REASONS = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "gmma",
    "imc_miss",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
)
TOP_STALLS = 5
# ncu's units -> the shown unit: factor to multiply by. A unit not listed here is an error, not a guess.
UNITS = {
    "us": {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6},
    "MHz": {
        "cycle/second": 1e-6,
        "hz": 1e-6,
        "cycle/usecond": 1.0,
        "cycle/nsecond": 1e3,
        "khz": 1e-3,
        "mhz": 1.0,
        "ghz": 1e3,
    },
    "MB": {"byte": 1e-6, "kbyte": 1e-3, "mbyte": 1.0, "gbyte": 1e3, "tbyte": 1e6},
    "KB": {"byte": 1e-3, "kbyte": 1.0, "mbyte": 1e3, "byte/block": 1e-3, "kbyte/block": 1.0, "mbyte/block": 1e3},
    "%": {"%": 1.0, "": 1.0},
}


def number(text: str) -> float | None:
    """An ncu CSV value: "1,234.5" -> 1234.5 (thousands separators); "n/a", "" -> None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_raw_csv(text: str) -> list[dict]:
    """``ncu --import R --csv --page raw``: one dict per launch, in launch order: {"id", "kernel", "grid",
    "block", "metrics": {name: (value or None, unit)}}. Lines that are not CSV rows (==PROF== ...) are
    skipped; raises ValueError without a header row."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        first = text.strip().splitlines()[:1]
        raise ValueError(f'ncu CSV: no header row ("ID", ...); output began {first[0][:120] if first else ""!r}')
    header = rows[start]
    body = rows[start + 1 :]
    units = body.pop(0) if body and body[0] and body[0][0] == "" else [""] * len(header)
    col = {name: i for i, name in enumerate(header)}
    out = []
    for r in body:
        if len(r) != len(header):
            continue
        metrics = {name: (number(r[i]), units[i] if i < len(units) else "") for name, i in col.items() if "__" in name}
        out.append(
            {
                "id": int(number(r[col["ID"]]) or 0),
                "kernel": r[col.get("Kernel Name", 0)],
                "grid": r[col["Grid Size"]] if "Grid Size" in col else None,
                "block": r[col["Block Size"]] if "Block Size" in col else None,
                "metrics": metrics,
            }
        )
    return out


def convert(value: float | None, unit: str, to: str) -> float | None:
    """``value`` in ncu's ``unit`` as ``to`` ("us", "MHz", "MB", "%"; anything else: unchanged)."""
    if value is None or to not in UNITS:
        return value
    factors = UNITS[to]
    if unit.lower() not in factors:
        raise ValueError(f"ncu unit {unit!r} for a value shown in {to}: expected one of {sorted(factors)}")
    return value * factors[unit.lower()]


def metric_names(query_output: str) -> set[str]:
    """The metric names in ``ncu --query-metrics`` output (table or CSV; full names such as
    ``sm__throughput.avg.pct_of_peak_sustained_elapsed`` in mode "all", base names in mode "base"), with
    the base name (``unit__name``) of each full one."""
    names = set()
    for line in query_output.splitlines():
        first = line.strip().split(",")[0].split()[:1]
        name = first[0].strip('"') if first else ""
        if re.fullmatch(r"[a-z0-9]+__[\w.]+", name):
            names.update((name, name.split(".")[0]))
    return names


def requested(available: set[str] | None) -> tuple[list[str], list[str]]:
    """(metrics to ask ncu for, metrics this ncu lacks). ``available`` None: ask for all. Launch statistics
    (``launch__*``) are not hardware counters and are never in the query's list."""
    wanted = [name for m in METRICS for name in m.names()] + [STALL_METRIC.format(r) for r in STALL_REASONS]
    if not available:
        return wanted, []
    keep = [w for w in wanted if w.startswith("launch__") or w in available or w.split(".")[0] in available]
    known = set(keep) | {m.ncu for m in METRICS if m.alt in keep}  # a metric found under its other name
    return keep, [w for w in wanted if w not in known and w not in {m.alt for m in METRICS if m.ncu in keep}]


# ------------------------------------------------------------------------------------------- summarising


def launch_summary(launch: dict) -> dict:
    """One launch: its kernel, grid, block, the METRICS values (None where missing) and its stall reasons."""
    values, problems = {}, []
    for m in METRICS:
        value, unit = next(
            (launch["metrics"][x] for x in m.names() if launch["metrics"].get(x, (None,))[0] is not None), (None, "")
        )
        try:
            values[m.key] = convert(value, unit, m.unit)
        except ValueError as e:
            values[m.key] = None
            problems.append(f"{m.ncu}: {e}")
    stalls = {
        r: launch["metrics"][STALL_METRIC.format(r)][0]
        for r in STALL_REASONS
        if launch["metrics"].get(STALL_METRIC.format(r), (None,))[0] is not None
    }
    return {
        "kernel": launch["kernel"],
        "grid": launch["grid"],
        "block": launch["block"],
        "values": values,
        "stalls": stalls,
        "problems": problems,
    }


def _combine(parts: list[tuple[float | None, float]], how: str) -> float | None:
    """Launch values (value, duration weight) of one call added up as ``how`` says."""
    known = [(v, w) for v, w in parts if v is not None]
    if not known:
        return None
    if how == "sum":
        return sum(v for v, _ in known)
    if how == "max":
        return max(v for v, _ in known)
    total = sum(w for _, w in known)
    return sum(v * w for v, w in known) / total if total > 0 else sum(v for v, _ in known) / len(known)


def total(launches: list[dict]) -> dict:
    """The call as a whole: METRICS combined over its launches, stall reasons weighted by duration, the
    top stall reasons (largest first, "selected" left out)."""
    weights = [s["values"].get("duration") or 0.0 for s in launches]
    values = {
        m.key: _combine([(s["values"].get(m.key), w) for s, w in zip(launches, weights, strict=True)], m.combine)
        for m in METRICS
    }
    reasons = sorted({r for s in launches for r in s["stalls"]}, key=STALL_REASONS.index)
    stalls = {
        r: _combine([(s["stalls"].get(r), w) for s, w in zip(launches, weights, strict=True)], "mean") for r in reasons
    }
    top = sorted(((r, v) for r, v in stalls.items() if r != "selected" and v), key=lambda rv: -rv[1])
    return {"launches": len(launches), "values": values, "stalls": stalls, "top_stalls": top[:TOP_STALLS]}
