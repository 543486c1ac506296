"""Two runs of ``bench gemm`` on one suite (before and after a change of the dispatch table), case by case: each
run's ratio to cuBLAS was measured interleaved within that run; this only lines them up. CPU only.

    python -m benchmarks dense-ab BEFORE/gemm-bench.json AFTER/gemm-bench.json [--out FILE.json] [--cap 1.25]

Prints, per timing mode, the cases whose ratio moved by more than both runs' 95% intervals allow, then a summary
per run: cases, capped geomean (each ratio capped at --cap), median, worst, share at >= 0.98x and >= 0.95x.
--out writes the same as JSON, with both runs' env (GPU, clocks, versions, git SHA).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def ratios(report: dict) -> dict[tuple[str, str], dict]:
    """{(label, timing mode): gemmlab's vs_baseline (ratio, ci95) and path} of one gemm-bench.json."""
    out = {}
    for r in report["results"]:
        g = (r.get("candidates") or {}).get("gemmlab") or {}
        vs = g.get("vs_baseline")
        if vs and vs.get("ratio"):
            out[(r["label"], r.get("timing", "?"))] = {
                "ratio": vs["ratio"],
                "ci95": vs.get("ci95"),
                "path": g.get("path"),
                "config": g.get("config"),
            }
    return out


def summary(values: list[float], cap: float) -> dict:
    if not values:
        return {"cases": 0}
    s = sorted(values)
    return {
        "cases": len(s),
        "capped_geomean": math.exp(sum(math.log(min(v, cap)) for v in s) / len(s)),
        "median": s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2,
        "worst": s[0],
        "share_098": sum(v >= 0.98 for v in s) / len(s),
        "share_095": sum(v >= 0.95 for v in s) / len(s),
    }


def moved(b: dict, a: dict) -> bool:
    """The two intervals do not overlap (both runs' own 95% intervals; no interval: never counted as moved)."""
    if not b.get("ci95") or not a.get("ci95"):
        return False
    return a["ci95"][0] > b["ci95"][1] or a["ci95"][1] < b["ci95"][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--out", default=None)
    ap.add_argument("--cap", type=float, default=1.25)
    args = ap.parse_args()
    runs = {name: json.loads(Path(p).read_text()) for name, p in (("before", args.before), ("after", args.after))}
    rb, ra = ratios(runs["before"]), ratios(runs["after"])
    both = sorted(set(rb) & set(ra))
    rows = [{"case": k[0], "mode": k[1], "before": rb[k], "after": ra[k], "moved": moved(rb[k], ra[k])} for k in both]
    modes = sorted({k[1] for k in both})
    result = {
        "env": {n: r.get("env") for n, r in runs.items()},
        "cap": args.cap,
        "rows": rows,
        "only_before": sorted(f"{k[0]} ({k[1]})" for k in set(rb) - set(ra)),
        "only_after": sorted(f"{k[0]} ({k[1]})" for k in set(ra) - set(rb)),
        "summary": {
            m: {n: summary([r[n]["ratio"] for r in rows if r["mode"] == m], args.cap) for n in ("before", "after")}
            for m in modes
        },
    }
    for m in modes:
        print(f"\n{m}: cases whose ratio to cuBLAS moved beyond both intervals")
        for r in rows:
            if r["mode"] == m and r["moved"]:
                b, a = r["before"], r["after"]
                print(f"  {r['case']:36s} {b['ratio']:.3f} -> {a['ratio']:.3f}  {b['path']} -> {a['path']}")
    print(
        f"\n{'mode':6s} {'run':7s} {'cases':>5s} {'capped gm':>9s} {'median':>7s} {'worst':>6s} {'>=.98':>6s} "
        f"{'>=.95':>6s}"
    )
    for m in modes:
        for n in ("before", "after"):
            s = result["summary"][m][n]
            if s["cases"]:
                print(
                    f"{m:6s} {n:7s} {s['cases']:5d} {s['capped_geomean']:9.3f} {s['median']:7.3f} {s['worst']:6.3f} "
                    f"{s['share_098']:6.0%} {s['share_095']:6.0%}"
                )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
