"""Ledger entries from the reports of ``grade``, ``bench gemm``, ``bench moe``, ``bench stable`` and
``table`` (``tune`` writes its own), and ``record``: what the CLI's ``--record "what changed"`` calls.
gemmlab's own kernels are inspected (SASS tensor-core count); a user kernel cannot be, so its entries stay
unverified and are never accepted.
"""

from __future__ import annotations

import functools
import sys

from gemmlab.instruments.compare import outcome
from gemmlab.ledger.store import Entry, Ledger


@functools.cache
def tensor_core_ops(m: int, n: int, k: int, dtype: str, packed: bool = False) -> int | None:
    """HGMMA + HMMA (+ QGMMA, IMMA) count of the kernel gemmlab launches at this shape (instruments.sass)."""
    import torch

    from gemmlab.instruments.sass import inspect_shape

    try:
        r = inspect_shape(m, n, k, getattr(torch, dtype), "NN", packed)
    except Exception:
        return None
    return r.get("tensor_core_ops")


def _shape(m: int, n: int, k: int) -> str:
    return f"{m}x{n}x{k}"


def _gemmlab_backend(name: str) -> bool:
    return name in ("gemmlab", "gemmlab-packed")


def from_bench(report: dict, note: str = "", command: str = "") -> list[Entry]:
    """One entry per shape and non-baseline backend of a ``bench gemm`` report."""
    out = []
    for r in report["results"]:
        m, n, k = r["shape"]
        for name, c in r["candidates"].items():
            if name == report["args"]["baseline"]:
                continue
            vs = c.get("vs_baseline") or {}
            correct, why = outcome(c)
            tc = tensor_core_ops(m, n, k, r["dtype"], name == "gemmlab-packed") if _gemmlab_backend(name) else None
            out.append(
                Entry(
                    kind="bench",
                    shape=_shape(m, n, k),
                    dtype=r["dtype"],
                    note=note,
                    command=command,
                    backend=name,
                    path=c.get("path"),
                    config=c.get("config"),
                    correct=correct,
                    error=why,
                    median_ms=c.get("median_ms"),
                    p20_ms=c.get("p20_ms"),
                    p80_ms=c.get("p80_ms"),
                    tflops=c.get("tflops"),
                    ratio=vs.get("ratio"),
                    ratio_ci=vs.get("ci95"),
                    per_round=vs.get("per_round"),
                    sm_clock_mhz=(c.get("clocks") or {}).get("sm_clock_mhz_mean"),
                    tensor_core_ops=tc,
                    report={
                        "env": report["env"],
                        "args": report["args"],
                        "result": {
                            "shape": r["shape"],
                            "case": r.get("case"),  # dtype, layout, padding (problems.Case)
                            "candidate": {key: v for key, v in c.items() if key != "per_round_ms"},
                        },
                    },
                )
            )
    return out


def from_stable(report: dict, note: str = "", command: str = "") -> list[Entry]:
    """One entry per non-cuBLAS backend of a ``bench stable`` report: each fresh process is one round (its
    median ratio to cuBLAS, interleaved in that process), so the interval spans compile-to-compile and
    process-to-process variation; correct only if no process saw a wrong output."""
    m, n, k = report["args"]["shape"]
    dtype = report["args"]["dtype"]
    good = [p for p in report["processes"] if "failed" not in p]
    out = []
    for name, s in report["summary"]["backends"].items():
        if name == "cublas":
            continue
        ratios = [p["candidates"][name]["ratio"] for p in good if p["candidates"].get(name, {}).get("ratio")]
        med, r = s.get("median_ms") or {}, s.get("ratio") or {}
        clocks = (report["summary"].get("sm_clock_mhz") or {}).get("mean_per_process") or []
        out.append(
            Entry(
                kind="bench",
                shape=_shape(m, n, k),
                dtype=dtype,
                note=note,
                command=command,
                backend=name,
                correct=bool(good) and s["wrong_in"] == 0 and len(good) == len(report["processes"]),
                error=("; ".join(report["summary"]["flags"]) or None) if s["wrong_in"] else None,
                median_ms=med.get("median_ms"),
                p20_ms=med.get("p20_ms"),
                p80_ms=med.get("p80_ms"),
                tflops=2.0 * m * n * k / (med["median_ms"] * 1e-3) / 1e12 if med.get("median_ms") else None,
                ratio=r.get("median"),
                ratio_ci=r.get("ci95"),
                per_round=ratios,
                sm_clock_mhz=sum(clocks) / len(clocks) if clocks else None,
                tensor_core_ops=tensor_core_ops(m, n, k, dtype, name == "gemmlab-packed")
                if _gemmlab_backend(name)
                else None,
                report={"env": report["env"], "args": report["args"], "summary": report["summary"]},
            )
        )
    return out


def from_table(table: dict, note: str = "", command: str = "") -> list[Entry]:
    """One entry per timed gemmlab row of a ``table`` report (the grouped MoE row under op "moe_grouped")."""
    shp = table["shape"]
    m, n, k = shp["M"], shp["N"], shp["K"]
    out = []
    for row in table["rows"]:
        if row.get("backend") not in ("gemmlab", "gemmlab-packed", "moe-grouped"):
            continue
        tc = row.get("tensor_core")
        ops = None if tc is None else (row.get("hgmma") or 0) + (row.get("hmma") or 0)
        if ops is None and row["backend"] != "moe-grouped":
            ops = tensor_core_ops(m, n, k, table["config"]["dtype"], row["backend"] == "gemmlab-packed")
        op = "moe_grouped" if row["backend"] == "moe-grouped" else "gemm"  # its own latency curve
        out.append(
            Entry(
                kind="table",
                op=op,
                shape=_shape(m, n, k),
                dtype=table["config"]["dtype"],
                note=note,
                command=command,
                backend=row["backend"],
                path=row.get("path"),
                config=row.get("config"),
                correct=bool(row.get("ok")),
                error=None if row.get("ok") else row.get("status"),
                median_ms=row.get("median_ms"),
                p20_ms=row.get("p20_ms"),
                p80_ms=row.get("p80_ms"),
                tflops=row.get("tflops"),
                ratio=row.get("ratio_vs_baseline"),
                ratio_ci=row.get("ci95"),
                per_round=row.get("per_round"),
                sm_clock_mhz=row.get("sm_clock_mhz"),
                tensor_core_ops=ops,
                report={"env": table["env"], "config": table["config"], "row": row},
            )
        )
    return out


def from_grade(report: dict, note: str = "", command: str = "") -> list[Entry]:
    """One entry for a grade: the performance shape, correct only if every rule passed (an INCONCLUSIVE grade
    passed them all; only its timing could not score)."""
    perf = report.get("performance") or {}
    shape = perf.get("shape") or report.get("performance_shape")
    if not shape:  # a case file without a performance shape: nothing timed, nothing to compare
        return []
    if report.get("mode") in ("moe", "moe_fp8"):
        return [_moe_grade_entry(report, perf, shape, note, command)]
    m, n, k = shape
    honest = perf.get("honest") or {}
    fp8 = report.get("mode") == "fp8"  # an op of its own; its SASS is not the fp16/bf16 GEMM's (not inspected)
    own = report["kernel"] == "gemmlab (default)" and not fp8
    failures = "; ".join(f"{f['name']}: {f['reason']}" for f in report.get("failures", []))
    return [
        Entry(
            kind="grade",
            op="gemm_fp8" if fp8 else "gemm",
            shape=_shape(m, n, k),
            dtype=report["dtype"],
            note=note,
            command=command,
            backend=report["kernel"],
            path=perf.get("timed_path"),
            correct=report["verdict"] in ("PASS", "INCONCLUSIVE"),
            error=failures or None,
            median_ms=perf.get("median_ms"),
            tflops=perf.get("tflops"),
            ratio=honest.get("ratio", perf.get("ratio")),
            ratio_ci=honest.get("ci95"),
            per_round=honest.get("per_round"),
            sm_clock_mhz=(perf.get("clocks") or {}).get("sm_clock_mhz_mean"),
            tensor_core_ops=tensor_core_ops(m, n, k, report["dtype"]) if own else None,
            report={key: v for key, v in report.items() if key != "correctness"},
        )
    ]


def _moe_grade_entry(report: dict, perf: dict, dims, note: str, command: str) -> Entry:
    """An MoE layer grade: its own op ("moe_forward", with FP8 experts "moe_forward_fp8") and shape key
    (T x H x I x E x k); gemmlab's own bf16/fp16 kernel is inspected through the first GEMM's sm_90 SASS
    (``instruments.sass.moe_report``; the FP8 experts' kernel is not)."""
    t, h, i, e, k = dims
    fp8 = report.get("mode") == "moe_fp8"
    own = report["kernel"] == "gemmlab (default)" and not fp8
    tc = moe_tensor_core_ops((1,), t * k, e, report["dtype"]) if own else None
    honest = perf.get("honest") or {}
    failures = "; ".join(f"{f['name']}: {f['reason']}" for f in report.get("failures", []))
    return Entry(
        kind="grade",
        op="moe_forward_fp8" if fp8 else "moe_forward",
        shape="x".join(map(str, dims)),
        dtype=report["dtype"],
        note=note,
        command=command,
        backend=report["kernel"],
        correct=report["verdict"] in ("PASS", "INCONCLUSIVE"),
        error=failures or None,
        median_ms=perf.get("median_ms"),
        tflops=perf.get("tflops"),
        ratio=honest.get("ratio", perf.get("ratio")),
        ratio_ci=honest.get("ci95"),
        per_round=honest.get("per_round"),
        sm_clock_mhz=(perf.get("clocks") or {}).get("sm_clock_mhz_mean"),
        tensor_core_ops=tc,
        report={key: v for key, v in report.items() if key != "correctness"},
    )


def moe_shape(t: int, h: int, i: int, e: int, k: int, routing: str = "uniform") -> str:
    """The MoE shape key "TxHxIxExk", with " zipf" for skewed routing (a different problem to time)."""
    return f"{t}x{h}x{i}x{e}x{k}" + ("" if routing == "uniform" else f" {routing}")


@functools.cache
def moe_tensor_core_ops(
    modes: tuple[int, ...], rows: int, experts: int, dtype: str, configs: tuple | None = None
) -> int | None:
    """The fewest tensor-core instructions (sm_90 SASS, ``instruments.sass.moe_report``) among the grouped
    kernels of ``modes`` (0 grouped, 1 gate/up, 2 down) for ``rows`` routed rows: each with the config
    ``moe_config`` picks, or ``configs[i]`` for ``modes[i]``. None under the interpreter or when a
    kernel does not compile."""
    import os

    import torch

    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    from gemmlab.instruments.sass import moe_report

    try:
        return min(
            moe_report(mode, rows, experts, getattr(torch, dtype), config=cfg)["tensor_core_ops"]
            for mode, cfg in zip(modes, configs or (None,) * len(modes), strict=True)
        )
    except Exception:
        return None


def from_moe_bench(report: dict, note: str = "", command: str = "") -> list[Entry]:
    """One entry per (model, T, routing, part) and non-baseline backend of a ``bench moe`` report; ops
    "moe_grouped" (first GEMM) and "moe_forward" (whole body), baselines torch._grouped_mm / the composite."""
    out = []
    for r in report["results"]:
        z = r["sizes"]
        shape = moe_shape(r["tokens"], z["H"], z["I"], z["E"], z["k"], r["routing"])
        op = "moe_grouped" if r["part"] == "grouped" else "moe_forward"
        for name, c in r["candidates"].items():
            if name == r["baseline"]:
                continue
            vs = c.get("vs_baseline") or {}
            modes = (0,) if r["part"] == "grouped" else (1, 2)
            tc = moe_tensor_core_ops(modes, z["S"], z["E"], r["dtype"]) if name == "gemmlab" else None
            correct, why = outcome(c)
            out.append(
                Entry(
                    kind="bench",
                    op=op,
                    shape=shape,
                    dtype=r["dtype"],
                    note=note,
                    command=command,
                    backend=name,
                    path="moe_grouped" if name == "gemmlab" else None,
                    correct=correct,
                    error=why,
                    median_ms=c.get("median_ms"),
                    p20_ms=c.get("p20_ms"),
                    p80_ms=c.get("p80_ms"),
                    tflops=c.get("tflops"),
                    ratio=vs.get("ratio"),
                    ratio_ci=vs.get("ci95"),
                    per_round=vs.get("per_round"),
                    sm_clock_mhz=(c.get("clocks") or {}).get("sm_clock_mhz_mean"),
                    tensor_core_ops=tc,
                    report={
                        "env": report["env"],
                        "args": report["args"],
                        "baseline": r["baseline"],
                        "case": {
                            key: r[key]
                            for key in (
                                "model",
                                "tokens",
                                "routing",
                                "part",
                                "sizes",
                                "experts_used",
                                "max_rows_per_expert",
                            )
                        },
                        "candidate": {key: v for key, v in c.items() if key != "per_round_ms"},
                    },
                )
            )
    return out


def record(entries: list[Entry], ledger: str | None = None, parent: int | None = None) -> list[Entry]:
    """Write entries (each decided against ``parent`` when its shape matches, else its default parent)."""
    db = Ledger.open(ledger)
    try:
        parent_shape = db.get(parent).shape if parent is not None and db.get(parent) else None
        if parent is not None and parent_shape is None:
            raise KeyError(f"--parent {parent}: no such ledger entry in {db.path}")
        for e in entries:
            e.command = e.command or " ".join(sys.argv)
            db.record(e, parent if e.shape == parent_shape else None)
    finally:
        db.close()
    return entries
