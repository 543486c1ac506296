"""What ``bench moe --baseline liger``'s timed cases say (``bench.moe_liger`` times them; ``bench.moe_liger_view``
prints and writes them): each case's bars from its timed run (``case_bars``: gemmlab's share of the dense GEMM's
rate, each provider's time over the HBM bound for T <= ``HBM_MAX_TOKENS``), the flat rows (``rows``) and the
summary per part and mode (``summarize``: geomean and worst ratio against Liger, the dense fraction).
"""

from __future__ import annotations

import math

from gemmlab.bench.moe_bars import hbm_bound
from gemmlab.bench.moe_peers import COMPOSITE, GEMMLAB, LIGER, Provider
from gemmlab.instruments.compare import outcome
from gemmlab.problems import MoEModel

HBM_MAX_TOKENS = 64  # the HBM bar: forward cases with T <= this
DENSE = "dense torch.mm x2"
SHORT = {GEMMLAB: "gemmlab", LIGER: "liger", COMPOSITE: "composite", DENSE: "dense"}


def case_label(c: dict) -> str:
    return f"{c['model']} T={c['tokens']} {c['routing']} {c['mode']} {c['part']}"


def case_bars(
    res: dict, model: MoEModel, tokens: int, part: str, p: dict, providers: dict[str, Provider], hbm_gbps: float | None
) -> dict:
    """The case's bars from its timed run: gemmlab's share of the dense GEMM's rate, and each provider's time
    over the HBM bound (forward only, T <= HBM_MAX_TOKENS)."""
    bars = {}
    gl = res["candidates"].get(GEMMLAB, {})
    dn = res["candidates"].get(DENSE)
    if dn is not None and dn.get("tflops") and gl.get("tflops"):
        bars["dense"] = {
            "dense_ms": dn["median_ms"],
            "dense_tflops": dn["tflops"],
            "frac_of_dense": gl["tflops"] / dn["tflops"],
        }
    if part == "fwd" and tokens <= HBM_MAX_TOKENS and hbm_gbps:
        bars["hbm"] = hbm_bound(model, p["ids"], p["weights"], p["x"].element_size(), hbm_gbps)
        for name in providers:
            ms = res["candidates"].get(name, {}).get("median_ms")
            if ms:
                bars["hbm"][f"{SHORT.get(name, name)}_ratio_to_hbm_bound"] = ms / bars["hbm"]["hbm_bound_ms"]
    return bars


def rows(report: dict) -> list[dict]:
    """One flat row per case: each provider's median ms, TFLOPS, mode and peak memory (GiB), ratio_vs_liger
    (Liger time / gemmlab time per round, median; > 1: gemmlab faster), the bars, and ok (every provider
    checked before and after timing)."""
    out = []
    for r in report["results"]:
        row = {key: r.get(key) for key in ("model", "tokens", "routing", "mode", "part")}
        if "candidates" not in r:
            out.append({**row, "ok": False, "error": r.get("error")})
            continue
        cands, errors = r["candidates"], []
        for name, c in cands.items():
            s = SHORT.get(name, name)
            ok, why = outcome(c)
            if not ok:
                errors.append(f"{s}: {why}")
            mem = (r.get("memory") or {}).get(name) or {}
            if c["check"].get("strict") is False:
                worst = {n: round(g["worst"], 2) for n, g in c["check"]["grads"].items() if g["worst"] > 1}
                row[f"{s}_grads_outside_tolerance"] = worst  # timed (within GRAD_SLACK), not within 1x
            row.update(
                {
                    f"{s}_ms": c.get("median_ms"),
                    f"{s}_tflops": c.get("tflops"),
                    f"{s}_ok": ok,
                    f"{s}_mode": (r.get("provider_modes") or {}).get(name),
                    f"{s}_peak_gib": mem["peak_bytes"] / 2**30 if mem.get("peak_bytes") else None,
                }
            )
        vs = (cands.get(GEMMLAB, {}).get("vs_baseline") or {}) if r.get("baseline") == LIGER else {}
        hbm, dense = r["bars"].get("hbm") or {}, r["bars"].get("dense") or {}
        row.update(
            {
                "ok": not errors,
                "error": "; ".join(errors) or None,
                "ratio_vs_liger": vs.get("ratio"),
                "ratio_ci95": vs.get("ci95"),
                "dense_tflops": dense.get("dense_tflops"),
                "frac_of_dense": dense.get("frac_of_dense"),
                "hbm_bound_ms": hbm.get("hbm_bound_ms"),
                "ratio_to_hbm_bound": hbm.get("gemmlab_ratio_to_hbm_bound"),
                "liger_ratio_to_hbm_bound": hbm.get("liger_ratio_to_hbm_bound"),
            }
        )
        out.append(row)
    return out


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in xs) / len(xs)) if xs else None


def summarize(table: list[dict]) -> list[dict]:
    """Per (part, mode): cases, wrong ones, geomean / min of ratio_vs_liger and the cases below 1.0, the
    least frac_of_dense (T >= 4096) and the largest ratio_to_hbm_bound (T <= 64)."""
    out = []
    for key in dict.fromkeys((r["part"], r["mode"]) for r in table):
        group = [r for r in table if (r["part"], r["mode"]) == key]
        rated = [r for r in group if r.get("ok") and r.get("ratio_vs_liger")]
        dense = [r["frac_of_dense"] for r in group if r.get("ok") and r.get("frac_of_dense")]
        hbm = [r["ratio_to_hbm_bound"] for r in group if r.get("ok") and r.get("ratio_to_hbm_bound")]
        worst = min(rated, key=lambda r: r["ratio_vs_liger"], default=None)
        loose = [
            f"{case_label(r)}: {k.removesuffix('_grads_outside_tolerance')} {v}"
            for r in group
            for k, v in r.items()
            if k.endswith("_grads_outside_tolerance")
        ]
        out.append(
            {
                "part": key[0],
                "mode": key[1],
                "cases": len(group),
                "wrong": sum(not r.get("ok") for r in group),
                "grads_outside_tolerance": loose,
                "vs_liger_cases": len(rated),
                # graph mode: cases whose Liger could not be captured and ran eager (the ratio is against that)
                "liger_eager_in_graph": sum(
                    key[1] == "graph" and str(r.get("liger_mode")).startswith("eager") for r in group
                ),
                "geomean_ratio_vs_liger": _geomean([r["ratio_vs_liger"] for r in rated]),
                "min_ratio_vs_liger": worst["ratio_vs_liger"] if worst else None,
                "min_case": case_label(worst) if worst else None,
                "below_1": [f"{case_label(r)}: {r['ratio_vs_liger']:.3f}" for r in rated if r["ratio_vs_liger"] < 1.0],
                "min_frac_of_dense": min(dense, default=None),
                "geomean_frac_of_dense": _geomean(dense),
                "max_ratio_to_hbm_bound": max(hbm, default=None),
            }
        )
    return out
