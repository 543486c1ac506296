"""Issue 23's dense sweep on a GPU (``gemmlab.tune.dense``: the grid, the candidates, what each row holds): every
candidate path and config at every grid point, verified, then timed interleaved against cuBLAS and gemmlab's
choice; the rows ``benchmarks/dense_rules.py`` turns into the GPU's dispatch rules.

    python -m benchmarks sweep-dense [--grid full|quick|cpu|dense-suite] [--out DIR] [--workers 12] [--rounds 5]
        [--reps 3] [--warmup-s 0.05] [--budget-s 230] [--check-only | --compile-only]

Compilation first, in parallel: every (point, candidate) is planned on "meta" operands, one of each distinct kernel
kept (``tune.dense.compile_jobs``), and ``--workers`` child processes run their share of those once (no checks, no
timing), so Triton's on-disk cache holds the kernels before the timed process needs them (it compiles whatever a
child missed); ``--compile-only`` stops there (``--grid dense-suite --compile-only``: the kernels ``bench gemm
--suite dense`` will launch, compiled in parallel before it). ``--budget-s``: no grid point starts after that many
seconds, compiling included (the rest are listed). ``--check-only``: plan and verify, no timing (also under the
CPU interpreter).

Writes under --out: ``sweep-dense.jsonl`` (one row per point and candidate, with the env: GPU, clocks, versions,
git SHA from GEMMLAB_GIT_SHA), ``sweep-dense-compile.jsonl`` (the children's seconds and errors). Prints one line
per point, then a short table. Runtime on an H200 (full grid, 12 workers): about 3-4 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from gemmlab.device import target_for
from gemmlab.instruments.timing import env_info
from gemmlab.tune.dense import GRIDS, compile_job, compile_jobs, grid, sweep_point


def compile_all(args) -> tuple[int, float]:
    """Run the compile children, each on every ``workers``-th of the distinct kernels; (kernels, seconds)."""
    t0 = time.perf_counter()
    jobs = compile_jobs(grid(args.grid), target_for(torch.device("cuda")))
    jobs_file = Path(args.compile_log).with_suffix(".jobs.json")
    jobs_file.write_text(json.dumps(jobs))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [
        sys.executable,
        __file__,
        "--grid",
        args.grid,
        "--workers",
        str(args.workers),
        "--compile-log",
        args.compile_log,
        "--jobs",
        str(jobs_file),
    ]
    procs = [subprocess.Popen([*cmd, "--worker", str(i)], env=env) for i in range(args.workers)]
    for proc in procs:
        proc.wait()
    jobs_file.unlink()
    return len(jobs), time.perf_counter() - t0


def compile_share(args) -> None:
    points = grid(args.grid)
    with open(args.compile_log, "a") as log:
        for i, name in json.loads(Path(args.jobs).read_text())[args.worker :: args.workers]:
            log.write(json.dumps(compile_job(points[i], name)) + "\n")
            log.flush()


def table(rows: list[dict]) -> None:
    print(f"\n{'point':32s} {'variant':38s} {'path':14s} {'ms':>8s} {'vs cuBLAS':>9s}  vs gemmlab")
    for r in rows:
        if r["variant"] == "cublas":
            continue
        if "error" in r or not (r.get("check") or {}).get("ok"):
            print(f"{r['spec']:32s} {r['variant'][:38]:38s} {(r.get('error') or 'WRONG ' + str(r.get('check')))[:70]}")
            continue
        ms = f"{r['median_ms']:.4f}" if "median_ms" in r else "ok"
        vs = f"{r['vs_cublas']['ratio']:.3f}" if r.get("vs_cublas") else "-"
        vg = r.get("vs_gemmlab")
        ci = (vg or {}).get("ci95")
        vg_s = (f"{vg['ratio']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else " (no interval)")) if vg else ""
        print(f"{r['spec']:32s} {r['variant'][:38]:38s} {r['path']:14s} {ms:>8s} {vs:>9s}  {vg_s}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", choices=GRIDS, default="full")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--workers", type=int, default=12, help="compile children (0: compile in the timed process)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=0.05)
    ap.add_argument("--budget-s", type=float, default=230.0, help="start no grid point after this many seconds")
    ap.add_argument("--check-only", action="store_true", help="plan and verify every candidate, no timing")
    ap.add_argument(
        "--compile-only",
        action="store_true",
        help="compile the grid's kernels in the children, then "
        "stop (--grid dense-suite: before bench gemm --suite dense)",
    )
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compile-log", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--jobs", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    args.compile_log = args.compile_log or str(out_dir / "sweep-dense-compile.jsonl")
    if args.worker is not None:
        compile_share(args)
        return
    t_start = time.perf_counter()
    if args.workers and torch.cuda.is_available() and not args.check_only:
        Path(args.compile_log).unlink(missing_ok=True)
        kernels, secs = compile_all(args)
        print(f"compiled {kernels} kernels in {secs:.0f} s ({args.workers} children)", flush=True)
    if args.compile_only:
        return
    env = env_info()
    out = out_dir / "sweep-dense.jsonl"
    out.unlink(missing_ok=True)
    rows, not_run = [], []
    for point in grid(args.grid):
        if time.perf_counter() - t_start > args.budget_s:
            not_run.append(point.spec)
            continue
        t0 = time.perf_counter()
        mine = sweep_point(
            point, env, rounds=args.rounds, reps=args.reps, warmup_s=args.warmup_s, check_only=args.check_only
        )
        print(f"{point.spec}: {len(mine)} rows in {time.perf_counter() - t0:.1f} s", flush=True)
        with out.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in mine))
        rows += mine
    table(rows)
    bad = [
        r
        for r in rows
        if r["variant"] != "cublas" and ((r.get("check") and not r["check"]["ok"]) or r.get("check_after") is False)
    ]
    print(
        f"\n{len(rows)} rows -> {out} in {time.perf_counter() - t_start:.0f} s; {len(bad)} wrong"
        + (": " + ", ".join(f"{r['spec']} {r['variant']}" for r in bad) if bad else "")
        + (f"; not run (budget): {', '.join(not_run)}" if not_run else "")
    )
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
