"""Repeated grades: the no-false-failure check (the shipped kernels and cuBLAS graded N times each, none may FAIL)
and the self-grade (cuBLAS against itself: 1.00 within +-3%, or inconclusive). One row per grade: verdict, ratio
and its 95% interval, rounds (of them on full-mantissa inputs), calls a batch, the protocol's cost as a share of a
baseline call, the wake-up per side, the SM clock per side, the honest-arithmetic counts, the first failure.

    python -m benchmarks grade-repeat --cases competition --runs 20 \\
        --kernel gemmlab --kernel builtin:cublas [--budget 120] [--out DIR]
    python -m benchmarks grade-repeat --cases competition --kernel builtin:cublas=10 --quick-correctness \\
        --time-limit-s 480 --out DIR        # issue 29: the self-grade, within +-3% in 10 of 10 (one device call)

``gemmlab`` is gemmlab's own kernel; ``builtin:NAME`` kernels are graded with --allow-vendor (they are the vendor);
``KERNEL=RUNS`` grades that one RUNS times (else --runs), the kernels interleaved. ``--quick-correctness`` keeps the
first listed correctness case only (the timed shape is still verified before it is timed, by the exact-shape check):
the timing protocol is what is repeated. No grade starts after ``--time-limit-s``.
Writes DIR/grade-repeat-<cases>-<first seed>.json after every grade (the environment: GPU, clocks, versions, git
SHA; one row and every report, less the correctness trials, per grade); prints the table and, per kernel, how many
grades PASSed, how many of the ratios lie within +-3% of 1 (the self-grade) and whether every verdict was the same.
A competition grade takes about a minute on an H200 (--budget caps its timed rounds)."""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from gemmlab.grade import grade, load_any
from gemmlab.instruments.timing import env_info

SELF_BAND = 0.03  # cuBLAS graded against itself: a ratio within 1 +- this (issue 29)


def row(kernel: str, i: int, r: dict, seconds: float) -> dict:
    p = r.get("performance") or {}
    h = p.get("honest") or {}
    over = (p["protocol_overhead_ms"] / p["baseline_ms"]) if p.get("baseline_ms") else None
    rc = (p.get("rounding") or {}).get("candidate") or {}
    return {
        "kernel": kernel,
        "run": i,
        "verdict": r["verdict"],
        "ratio": p.get("ratio"),
        "ci95": h.get("ci95"),
        "half_width": h.get("half_width"),
        "rounds": p.get("rounds"),
        "full_rounds": p.get("rounds_full_mantissa"),
        "calls": p.get("calls_per_batch"),
        "overhead_share": over,
        "wake_ms": p.get("wake_ms_by_side"),
        "mhz": {k: v.get("sm_clock_mhz_mean") for k, v in (p.get("clocks_by_side") or {}).items()},
        "not_rounded": rc.get("not_rounded"),
        "judged": rc.get("judged"),
        "value": (p.get("value_dependence") or {}).get("ci98"),
        "failure": (r["failures"][0] if r["failures"] else None),
        "inconclusive": r.get("inconclusive"),
        "seconds": seconds,
    }


def kernel_runs(specs: list[str], runs: int) -> list[tuple[str, int]]:
    """``KERNEL`` or ``KERNEL=RUNS`` (a file kernel's ``FILE.py:FN`` holds no "="), each with its number of grades."""
    out = []
    for spec in specs:
        name, eq, n = spec.rpartition("=") if "=" in spec else (spec, "", "")
        if eq and not (n.isdigit() and int(n) > 0):
            raise ValueError(f"--kernel {spec!r}: RUNS must be a positive integer")
        out.append((name, int(n) if eq else runs))
    return out


def quick_cases(cases: str, out_dir: Path) -> str:
    """A copy of the case file with its first listed correctness case only, written beside the results."""
    d = json.loads(Path(load_any(cases).path).read_text())
    d["correctness"] = d["correctness"][:1]
    d["about"] = f"{d.get('about', '')} (grade-repeat --quick-correctness: the first listed case only)".strip()
    path = out_dir / f"cases-{Path(cases).stem}-quick.json"
    path.write_text(json.dumps(d, indent=1))
    return str(path)


def summary(kernel: str, mine: list[dict]) -> str:
    """PASS/INCONCLUSIVE/FAIL counts, the PASSes' ratios, the share within +-SELF_BAND, and the verdicts' agreement."""
    if not mine:
        return f"{kernel}: no grade ran"
    ratios = [x["ratio"] for x in mine if x["verdict"] == "PASS"]
    within = sum(x["verdict"] == "PASS" and abs(x["ratio"] - 1) <= SELF_BAND for x in mine)
    verdicts = {x["verdict"] for x in mine}
    return (
        f"{kernel}: {sum(x['verdict'] == 'PASS' for x in mine)} PASS, "
        f"{sum(x['verdict'] == 'INCONCLUSIVE' for x in mine)} INCONCLUSIVE, "
        f"{sum(x['verdict'] == 'FAIL' for x in mine)} FAIL of {len(mine)}; ratio of the PASSes "
        + (f"{min(ratios):.3f}..{max(ratios):.3f} (median {statistics.median(ratios):.3f})" if ratios else "-")
        + f"; PASS within 1+-{SELF_BAND:.0%}: {within} of {len(mine)}; "
        + ("the same verdict in every grade" if len(verdicts) == 1 else f"verdicts differ: {sorted(verdicts)}")
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="competition")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0, help="seed of the first run (split a long check in parts)")
    ap.add_argument(
        "--kernel",
        action="append",
        default=None,
        help="gemmlab, builtin:cublas, FILE.py:FN, each optionally =RUNS (repeat the option)",
    )
    ap.add_argument("--budget", type=float, default=None, help="seconds of timed rounds per grade")
    ap.add_argument("--quick-correctness", action="store_true", help="the first listed correctness case only")
    ap.add_argument("--time-limit-s", type=float, default=None, help="no grade starts after this many seconds")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    try:
        kernels = kernel_runs(args.kernel or ["gemmlab", "builtin:cublas"], args.runs)
        if args.runs < 1 or (args.time_limit_s is not None and not args.time_limit_s > 0):
            raise ValueError(f"--runs {args.runs} and --time-limit-s {args.time_limit_s}: positive numbers")
    except ValueError as e:
        print(f"grade-repeat: {e}", file=sys.stderr)
        return 2
    rows, reports, skipped, start = [], [], [], time.time()
    out = Path(args.out) / f"grade-repeat-{Path(args.cases).stem}-{args.first_seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cases = quick_cases(args.cases, out.parent) if args.quick_correctness else args.cases
    head = {
        "env": env_info(),
        "cases": args.cases,
        "cases_file": cases,
        "quick_correctness": args.quick_correctness,
        "budget_s": args.budget,
        "time_limit_s": args.time_limit_s,
        "kernels": dict(kernels),
    }
    for i in range(args.first_seed, args.first_seed + max(n for _, n in kernels)):
        for k, n in kernels:  # interleaved, so a drifting machine hits every kernel alike
            if i >= args.first_seed + n:
                continue
            if args.time_limit_s is not None and time.time() - start > args.time_limit_s:
                skipped.append({"kernel": k, "run": i})
                continue
            t0 = time.time()
            r = grade(
                cases,
                kernel=None if k == "gemmlab" else k,
                allow_vendor=k.startswith("builtin:"),
                seed=i,
                budget_s=args.budget,
                progress=lambda m, k=k, i=i, t0=t0: print(
                    f"  [{k} {i} +{time.time() - t0:5.1f}s] {m}", file=sys.stderr, flush=True
                ),
            )
            rows.append(row(k, i, r, time.time() - t0))
            reports.append({key: v for key, v in r.items() if key != "correctness"})
            print(
                f"{k} run {i}: {r['verdict']} ratio {rows[-1]['ratio']} ci {rows[-1]['ci95']} "
                f"({rows[-1]['seconds']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            out.write_text(
                json.dumps({**head, "rows": rows, "not_run": skipped, "reports": reports}, indent=1, default=str)
            )  # after each grade
    out.write_text(json.dumps({**head, "rows": rows, "not_run": skipped, "reports": reports}, indent=1, default=str))
    print(f"wrote {out}" + (f"; {len(skipped)} grades not started (--time-limit-s)" if skipped else ""))
    print(
        f"{'kernel':16} {'run':>3} {'verdict':12} {'ratio':>6} {'95% CI':>16} {'+-':>5} {'rounds':>7} {'calls':>5} "
        f"{'ovh%':>5} {'MHz c/b':>11} {'notCR%':>6}  why"
    )
    for x in rows:
        ci = f"[{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}]" if x["ci95"] else "-"
        mhz = "/".join(f"{v:.0f}" if v else "-" for v in (x["mhz"].get("candidate"), x["mhz"].get("baseline")))
        why = (x["failure"] or {}).get("reason") or x["inconclusive"] or ""
        print(
            f"{x['kernel'][:16]:16} {x['run']:3d} {x['verdict']:12} {x['ratio'] or 0:6.3f} {ci:>16} "
            f"{100 * (x['half_width'] or 0):5.1f} {x['rounds'] or 0:4d}/{x['full_rounds'] or 0:<2d} "
            f"{x['calls'] or 0:5d} "
            f"{100 * (x['overhead_share'] or 0):5.1f} {mhz:>11} "
            f"{100 * (x['not_rounded'] or 0) / max(x['judged'] or 1, 1):6.3f}  {why[:70]}"
        )
    for k, _ in kernels:
        print(summary(k, [x for x in rows if x["kernel"] == k]))
    return 1 if any(x["verdict"] == "FAIL" for x in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
