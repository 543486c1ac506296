"""Repeated grades: the no-false-failure check (the shipped kernels and cuBLAS graded N times each, none may FAIL)
and the self-grade (cuBLAS against itself: 1.00 within +-3%, or inconclusive). One row per grade: verdict, ratio
and its 95% interval, rounds (of them on full-mantissa inputs), calls a batch, the protocol's cost as a share of a
baseline call, the wake-up per side, the SM clock per side, the honest-arithmetic counts, the first failure.

    python -m benchmarks grade-repeat --cases competition --runs 20 \\
        --kernel gemmlab --kernel builtin:cublas [--budget 120] [--out DIR]

``gemmlab`` is gemmlab's own kernel; ``builtin:NAME`` kernels are graded with --allow-vendor (they are the vendor).
Writes DIR/grade-repeat-<cases>-<first seed>.json after every grade (every report, less the correctness trials);
prints the table last. A competition grade takes about a minute on an H200 (--budget caps its timed rounds)."""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from gemmlab.grade import grade


def row(kernel: str, i: int, r: dict, seconds: float) -> dict:
    p = r.get("performance") or {}
    h = p.get("honest") or {}
    over = (p["protocol_overhead_ms"] / p["baseline_ms"]) if p.get("baseline_ms") else None
    rc = (p.get("rounding") or {}).get("candidate") or {}
    return {"kernel": kernel, "run": i, "verdict": r["verdict"], "ratio": p.get("ratio"), "ci95": h.get("ci95"),
            "half_width": h.get("half_width"), "rounds": p.get("rounds"), "full_rounds": p.get("rounds_full_mantissa"),
            "calls": p.get("calls_per_batch"), "overhead_share": over, "wake_ms": p.get("wake_ms_by_side"),
            "mhz": {k: v.get("sm_clock_mhz_mean") for k, v in (p.get("clocks_by_side") or {}).items()},
            "not_rounded": rc.get("not_rounded"), "judged": rc.get("judged"),
            "value": (p.get("value_dependence") or {}).get("ci98"),
            "failure": (r["failures"][0] if r["failures"] else None), "inconclusive": r.get("inconclusive"),
            "seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="competition")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0, help="seed of the first run (split a long check in parts)")
    ap.add_argument("--kernel", action="append", default=None, help="gemmlab, builtin:cublas, FILE.py:FN (repeat)")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timed rounds per grade")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    kernels = args.kernel or ["gemmlab", "builtin:cublas"]
    rows, reports = [], []
    out = Path(args.out) / f"grade-repeat-{Path(args.cases).stem}-{args.first_seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for i in range(args.first_seed, args.first_seed + args.runs):
        for k in kernels:  # interleaved, so a drifting machine hits every kernel alike
            t0 = time.time()
            r = grade(args.cases, kernel=None if k == "gemmlab" else k, allow_vendor=k.startswith("builtin:"),
                      seed=i, budget_s=args.budget,
                      progress=lambda m, k=k, i=i: print(f"  [{k} {i}] {m}", file=sys.stderr, flush=True))
            rows.append(row(k, i, r, time.time() - t0))
            reports.append({key: v for key, v in r.items() if key != "correctness"})
            print(f"{k} run {i}: {r['verdict']} ratio {rows[-1]['ratio']} ci {rows[-1]['ci95']} "
                  f"({rows[-1]['seconds']:.0f} s)", file=sys.stderr, flush=True)
            out.write_text(json.dumps({"rows": rows, "reports": reports}, indent=1, default=str))  # each grade
    print(f"wrote {out}")
    print(f"{'kernel':16} {'run':>3} {'verdict':12} {'ratio':>6} {'95% CI':>16} {'+-':>5} {'rounds':>7} {'calls':>5} "
          f"{'ovh%':>5} {'MHz c/b':>11} {'notCR%':>6}  why")
    for x in rows:
        ci = f"[{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}]" if x["ci95"] else "-"
        mhz = "/".join(f"{v:.0f}" if v else "-" for v in (x["mhz"].get("candidate"), x["mhz"].get("baseline")))
        why = (x["failure"] or {}).get("reason") or x["inconclusive"] or ""
        print(f"{x['kernel'][:16]:16} {x['run']:3d} {x['verdict']:12} {x['ratio'] or 0:6.3f} {ci:>16} "
              f"{100 * (x['half_width'] or 0):5.1f} {x['rounds'] or 0:4d}/{x['full_rounds'] or 0:<2d} "
              f"{x['calls'] or 0:5d} "
              f"{100 * (x['overhead_share'] or 0):5.1f} {mhz:>11} "
              f"{100 * (x['not_rounded'] or 0) / max(x['judged'] or 1, 1):6.3f}  {why[:70]}")
    failed = 0
    for k in kernels:
        mine = [x for x in rows if x["kernel"] == k]
        ratios = [x["ratio"] for x in mine if x["verdict"] == "PASS"]
        n_fail = sum(x["verdict"] == "FAIL" for x in mine)
        failed += n_fail
        print(f"{k}: {sum(x['verdict'] == 'PASS' for x in mine)} PASS, "
              f"{sum(x['verdict'] == 'INCONCLUSIVE' for x in mine)} INCONCLUSIVE, {n_fail} FAIL; ratio of the PASSes "
              + (f"{min(ratios):.3f}..{max(ratios):.3f} (median {statistics.median(ratios):.3f})" if ratios else "-"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
