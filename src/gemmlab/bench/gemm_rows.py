"""A ``bench gemm`` report flattened and summed up (``bench.gemm`` builds the report; ``bench.gemm_view`` prints
and writes it): ``rows(report)`` the long-format rows (``CSV_FIELDS``), ``summary(results)`` each backend's
geomean, worst case and the cases below ``FLOOR`` against cuBLAS, and the dense targets (``bench.targets``).
"""

from __future__ import annotations

import math
import statistics

from gemmlab.bench import targets
from gemmlab.instruments.compare import outcome

FLOOR = 0.97  # the issue-14 bar: no case below this ratio to cuBLAS


CSV_FIELDS = (
    "shape",
    "m",
    "n",
    "k",
    "dtype",
    "backend",
    "path",
    "ok",
    "max_abs_err",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "min_ms",
    "max_ms",
    "cv",
    "tflops",
    "ratio_vs_cublas",
    "ci95_lo",
    "ci95_hi",
    "verdict",
    "sm_clock_mhz",
    "power_w",
    "clock_event_reasons",
    "efficiency",
    "pack_ms",
    # cases (problems.Case) and timing modes
    "case",
    "layout",
    "pad",
    "offset",
    "aligned",
    "device_ms",
    "eager_ms",
    "ratio",
    "eager_ratio",
    "inductor_ratio",
    "compile_s",
    "note",
)


def _by_mode(r: dict) -> dict[str, dict]:
    """A result's candidates per timing mode (a report from before modes: its one mode)."""
    first = r.get("timing") or ("graph" if r.get("graph") else "eager")
    return {first: r.get("candidates", {}), **{m: v.get("candidates", {}) for m, v in r.get("other_modes", {}).items()}}


def rows(report: dict) -> list[dict]:
    """One flat row per (case, backend): the CSV and the printed table. ``ratio``/``device_ms`` come from
    the graph mode, ``eager_ratio``/``eager_ms`` from the wall mode, ``inductor_ratio`` from the graph mode
    (else the primary); ``ok`` only if the backend was right in every mode."""
    out = []
    for r in report["results"]:
        m, n, k = r["shape"]
        case = r.get("case") or {"dtype": r["dtype"], "layout": "row", "pad": 0, "offset": 0, "note": ""}
        modes = _by_mode(r)
        for name, c in r["candidates"].items():
            vs = c.get("vs_baseline") or {}
            clk = c.get("clocks") or {}
            graph = modes.get("graph", {}).get(name, {})
            wall = modes.get("wall", {}).get(name, {})
            vs_ind = (graph if "graph" in modes else c).get("vs_inductor") or {}
            out.append(
                {
                    "case": r.get("label") or f"{m}x{n}x{k}",
                    "shape": f"{m}x{n}x{k}",
                    "m": m,
                    "n": n,
                    "k": k,
                    "dtype": r["dtype"],
                    "layout": case["layout"],
                    "pad": case["pad"],
                    "offset": case["offset"],
                    "aligned": r.get("aligned", True),
                    "note": case.get("note", ""),
                    "backend": name,
                    "path": c.get("path"),
                    "ok": all(outcome(cands[name])[0] for cands in modes.values() if name in cands),
                    "max_abs_err": c["check"].get("max_abs_err"),
                    "median_ms": c.get("median_ms"),
                    "p20_ms": c.get("p20_ms"),
                    "p80_ms": c.get("p80_ms"),
                    "min_ms": c.get("min_ms"),
                    "max_ms": c.get("max_ms"),
                    "cv": c.get("cv"),
                    "tflops": c.get("tflops"),
                    "ratio_vs_cublas": vs.get("ratio"),
                    "ci95_lo": (vs.get("ci95") or [None])[0],
                    "ci95_hi": (vs.get("ci95") or [None, None])[1],
                    "verdict": vs.get("verdict"),
                    "device_ms": graph.get("median_ms"),
                    "eager_ms": wall.get("median_ms"),
                    "ratio": (graph.get("vs_baseline") or {}).get("ratio"),
                    "eager_ratio": (wall.get("vs_baseline") or {}).get("ratio"),
                    "inductor_ratio": vs_ind.get("ratio"),
                    "compile_s": c.get("compile_s"),
                    "sm_clock_mhz": clk.get("sm_clock_mhz_mean"),
                    "power_w": clk.get("power_w_mean"),
                    "clock_event_reasons": " ".join(clk.get("clock_event_reasons", [])) or None,
                    "efficiency": c.get("efficiency"),
                    "pack_ms": c.get("pack_ms"),
                    "error": next(
                        (
                            why
                            for cands in modes.values()
                            if name in cands
                            for ok, why in [outcome(cands[name])]
                            if not ok
                        ),
                        None,
                    ),
                }
            )
    return out


def _block(pairs: list[tuple[str, float]], floor: float) -> dict:
    """Geomean, minimum (and its case) and the cases below ``floor`` of (case, ratio) pairs."""
    if not pairs:
        return {"n": 0, "geomean": None, "min": None, "min_case": None, "floor": floor, "below": 0, "below_cases": []}
    low = min(pairs, key=lambda p: p[1])
    below = [c for c, v in pairs if v < floor]
    return {
        "n": len(pairs),
        "geomean": math.exp(statistics.fmean(math.log(v) for _, v in pairs)),
        "min": low[1],
        "min_case": low[0],
        "floor": floor,
        "below": len(below),
        "below_cases": below,
    }


def summary(report: dict) -> dict:
    """Per backend other than the baselines, over its verified cases: ``device`` (ratio to cuBLAS, graph
    replay), ``eager`` (wall clock), ``primary`` (the first mode's ratio), each as geomean, minimum and the
    count below 0.97 (``FLOOR``); ``vs_inductor`` with the losses (ratio < 1); the seeds' ratios; the wrong
    cases; ``targets``: issue 23's targets (``bench.targets``). ``inductor``: the same against cuBLAS. Cases not
    run for the budget are counted."""
    table = rows(report)
    out: dict = {"not_run": len(report.get("not_run", [])), "backends": {}}
    for name in dict.fromkeys(r["backend"] for r in table):
        if name == report["args"]["baseline"]:
            continue
        mine = [r for r in table if r["backend"] == name]
        good = [r for r in mine if r["ok"]]

        def pairs(key: str, rs=good) -> list[tuple[str, float]]:
            return [(r["case"], r[key]) for r in rs if r[key] is not None]

        out["backends"][name] = {
            "cases": len(mine),
            "wrong": [r["case"] for r in mine if not r["ok"]],
            "device": _block(pairs("ratio"), FLOOR),
            "eager": _block(pairs("eager_ratio"), FLOOR),
            "primary": _block(pairs("ratio_vs_cublas"), FLOOR),
            "vs_inductor": _block(pairs("inductor_ratio"), 1.0) if name != "inductor" else None,
            "seeds": {
                r["case"]: r["ratio"] if r["ratio"] is not None else r["ratio_vs_cublas"]
                for r in good
                if r["note"] == "seed"
            },
            "targets": targets.check(table, name, report["args"]["baseline"]),
        }
    return out
