"""The dense targets over a ``bench gemm`` report's flat rows (``bench.gemm.rows``), per backend.

Over the verified cases, each of device time (CUDA-graph replay) and eager (wall clock, call to result), each
interleaved against cuBLAS (ratio = cuBLAS time / backend time, > 1: faster):

    none below FLOOR (0.95)
    at least NEAR_SHARE (90%) of the cases at NEAR (0.98) or more
    geomean at least GEOMEAN (1.02), each case's ratio capped at CAP (1.25) first, so that shapes where
    cuBLAS itself is pathological cannot carry it
and, for M >= EAGER_MIN_M (64), eager within 5% of graph replay: the eager ratio >= EAGER_VS_GRAPH (0.95)
times the device ratio, both capped at CAP (the host cost of an eager call must not undo what the kernel wins
on the device; a 3x win on the device that is 2.9x eager is no loss).

A case where cuBLAS failed its own check is not timed (``compare_many``): it is named, not counted.
"""

from __future__ import annotations

import math
import statistics

FLOOR = 0.95
NEAR, NEAR_SHARE = 0.98, 0.90
GEOMEAN, CAP = 1.02, 1.25
EAGER_VS_GRAPH, EAGER_MIN_M = 0.95, 64


def _mode(pairs: list[tuple[str, float]]) -> dict:
    """The three targets over (case, ratio) pairs of one timing mode."""
    if not pairs:
        return {"n": 0}
    low = min(pairs, key=lambda p: p[1])
    below = [c for c, v in pairs if v < FLOOR]
    near = sum(v >= NEAR for _, v in pairs) / len(pairs)
    capped = math.exp(statistics.fmean(math.log(min(v, CAP)) for _, v in pairs))
    return {
        "n": len(pairs),
        "min": low[1],
        "min_case": low[0],
        "below_floor": below,
        "near_share": near,
        "not_near": [c for c, v in pairs if v < NEAR],
        "capped_geomean": capped,
        "met": {"floor": not below, "near": near >= NEAR_SHARE, "geomean": capped >= GEOMEAN},
    }


def check(rows: list[dict], backend: str, baseline: str = "cublas") -> dict:
    """The dense targets for ``backend`` over ``rows`` (``bench.gemm.rows`` of a report timed in graph and wall
    modes). Returns {"device", "eager", "eager_vs_graph", "baseline_wrong", "wrong", "met"}; "met" needs both
    modes timed, every target of each met, and no wrong case."""
    mine = [r for r in rows if r["backend"] == backend]
    base_bad = {r["case"] for r in rows if r["backend"] == baseline and not r["ok"]}
    good = [r for r in mine if r["ok"] and r["case"] not in base_bad]
    device = _mode([(r["case"], r["ratio"]) for r in good if r["ratio"] is not None])
    eager = _mode([(r["case"], r["eager_ratio"]) for r in good if r["eager_ratio"] is not None])
    pairs = [
        (r["case"], min(r["eager_ratio"], CAP) / min(r["ratio"], CAP))
        for r in good
        if r["m"] >= EAGER_MIN_M and r["ratio"] and r["eager_ratio"] is not None
    ]
    apart = [c for c, v in pairs if v < EAGER_VS_GRAPH]
    evg = {
        "n": len(pairs),
        "apart": apart,
        "worst": min(pairs, key=lambda p: p[1]) if pairs else None,
        "met": not apart,
    }
    wrong = [r["case"] for r in mine if not r["ok"]]
    met = [device.get("met", {}), eager.get("met", {})]
    return {
        "device": device,
        "eager": eager,
        "eager_vs_graph": evg,
        "baseline_wrong": sorted(base_bad),
        "wrong": wrong,
        "met": bool(device["n"] and eager["n"]) and all(all(m.values()) for m in met) and evg["met"] and not wrong,
    }


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def lines(name: str, t: dict) -> list[str]:
    """The targets as printable lines."""
    out = []
    for mode, what in (("device", "device (graph)"), ("eager", "eager (wall clock)")):
        b = t[mode]
        if not b["n"]:
            continue
        m = b["met"]
        below = f": {', '.join(b['below_floor'])}" if b["below_floor"] else ""
        out.append(
            f"{name} targets, {what}, {b['n']} cases: none below {FLOOR} {_verdict(m['floor'])} "
            f"(min {b['min']:.3f} at {b['min_case']}; {len(b['below_floor'])} below{below}); "
            f"{b['near_share']:.0%} at >= {NEAR} {_verdict(m['near'])} (need {NEAR_SHARE:.0%}); "
            f"geomean capped at {CAP} {b['capped_geomean']:.3f} {_verdict(m['geomean'])} (need {GEOMEAN})"
        )
    e = t["eager_vs_graph"]
    if e["n"]:
        worst = f"; worst {e['worst'][1]:.3f} at {e['worst'][0]}" if e["worst"] else ""
        apart = f": {', '.join(e['apart'])}" if e["apart"] else ""
        out.append(
            f"{name} targets, eager ratio >= {EAGER_VS_GRAPH} x graph ratio at M >= {EAGER_MIN_M}: "
            f"{e['n'] - len(e['apart'])} of {e['n']} {_verdict(e['met'])}{worst}{apart}"
        )
    if t["baseline_wrong"]:
        out.append(
            f"{name} targets: not counted, cuBLAS failed its own check (not timed): {', '.join(t['baseline_wrong'])}"
        )
    if t["wrong"]:
        out.append(f"{name} targets: WRONG results: {', '.join(t['wrong'])}")
    missing = [what for mode, what in (("device", "graph"), ("eager", "wall")) if not t[mode]["n"]]
    if missing:
        out.append(
            f"{name} targets: not judged without {' and '.join(missing)} timing (bench gemm --modes graph,wall, "
            "on CUDA)"
        )
    out.append(
        f"{name} dense targets (none < {FLOOR}x cuBLAS, {NEAR_SHARE:.0%} >= {NEAR}x, capped geomean >= "
        f"{GEOMEAN}x): {'all met' if t['met'] else 'NOT all met'}"
    )
    return out
