"""Stable bench (the competition's stable_bench): the same measurement in N separate processes.

Each process starts cold, compiles its kernels fresh (its own empty Triton cache), verifies, warms up and
times the backends interleaved (``bench.gemm.bench_shape``) while NVML samples the clock, and prints one
JSON line. The parent reports the distribution across processes (median, min, max, cv of the per-process
medians and ratios) and flags clock oscillation within a process or clock drift between processes: a
number that only one process produced is not a result.

    stable_bench((M, N, K), dtype, backends, processes=5) -> {"env", "args", "processes": [...], "summary"}
    python -m gemmlab.bench.stable --child '{"shape": [M, N, K], ...}'     (one process; used by the parent)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence

import torch

from gemmlab import output
from gemmlab.instruments import stats, timing
from gemmlab.instruments.compare import outcome
from gemmlab.output import Table, long_row, num
from gemmlab.problems import Shape

UNSTABLE_CV = 0.03  # per-process medians varying more than this are flagged


def _child(args: dict) -> dict:
    from gemmlab.bench.gemm import bench_shape

    m, n, k = args["shape"]
    r = bench_shape(
        m,
        n,
        k,
        getattr(torch, args["dtype"]),
        args["backends"],
        rounds=args["rounds"],
        reps=args["reps"],
        warmup_s=args["warmup_s"],
        graph=args["graph"],
        seed=args["seed"],
    )
    out = {"clocks": r.get("clocks", {}), "candidates": {}}
    for name, c in r["candidates"].items():
        ok, why = outcome(c)
        out["candidates"][name] = {
            "ok": ok,
            "error": why,
            "median_ms": c.get("median_ms"),
            "tflops": c.get("tflops"),
            "ratio": (c.get("vs_baseline") or {}).get("ratio"),
            "clocks": c.get("clocks", {}),
        }
    return out


def run_process(args: dict, timeout: float = 600.0) -> dict:
    """One fresh process with an empty Triton cache; returns its JSON line or the reason it failed."""
    with tempfile.TemporaryDirectory(prefix="gemmlab-stable-") as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        try:
            p = subprocess.run(
                [sys.executable, "-m", "gemmlab.bench.stable", "--child", json.dumps(args)],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return {"failed": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"failed": f"exit {p.returncode}: {(p.stderr or p.stdout)[-800:]}"}
    return json.loads(lines[-1])


def summarize_processes(procs: list[dict], backends: Sequence[str]) -> dict:
    """Distribution across processes per backend, and the clock flags."""
    good = [p for p in procs if "failed" not in p]
    out: dict = {"processes_ok": len(good), "processes_failed": len(procs) - len(good), "backends": {}, "flags": []}
    for name in dict.fromkeys([*backends, "cublas"]):
        meds = [
            p["candidates"][name]["median_ms"]
            for p in good
            if p["candidates"].get(name, {}).get("median_ms") is not None
        ]
        ratios = [
            p["candidates"][name]["ratio"] for p in good if p["candidates"].get(name, {}).get("ratio") is not None
        ]
        wrong = sum(1 for p in good if not p["candidates"].get(name, {}).get("ok"))
        entry: dict = {"wrong_in": wrong}
        if meds:
            entry["median_ms"] = stats.summarize(meds)
            if entry["median_ms"]["cv"] > UNSTABLE_CV:
                out["flags"].append(
                    f"{name}: per-process medians vary by cv {entry['median_ms']['cv']:.1%} "
                    f"({min(meds):.4f}-{max(meds):.4f} ms)"
                )
        if ratios:
            entry["ratio"] = {key.removesuffix("_ms"): v for key, v in stats.summarize(ratios).items()}
            ci = stats.median_interval(ratios)  # None with fewer than 6 processes: no 95% interval
            entry["ratio"].update(ci95=list(ci) if ci else None)
        if wrong:
            out["flags"].append(f"{name}: wrong output in {wrong} process(es)")
        out["backends"][name] = entry
    clk = [p["clocks"] for p in good if "sm_clock_mhz_mean" in p.get("clocks", {})]
    if clk:
        out["flags"] += stats.clock_flags(
            [c["sm_clock_mhz_mean"] for c in clk],
            [c["sm_clock_mhz_min"] for c in clk],
            [c["sm_clock_mhz_max"] for c in clk],
        )
        out["sm_clock_mhz"] = {
            "mean_per_process": [c["sm_clock_mhz_mean"] for c in clk],
            "min": min(c["sm_clock_mhz_min"] for c in clk),
            "max": max(c["sm_clock_mhz_max"] for c in clk),
        }
    else:
        out["sm_clock_mhz"] = None
        out["flags"].append("no clock data (no NVML or no GPU): clock oscillation cannot be checked")
    if out["processes_failed"]:
        out["flags"].append(f"{out['processes_failed']} process(es) failed")
    return out


def stable_bench(
    shape: Shape,
    dtype: torch.dtype = torch.float16,
    backends: Sequence[str] = ("gemmlab",),
    *,
    processes: int = 5,
    rounds: int = 6,
    reps: int = 5,
    warmup_s: float = 1.0,
    graph: bool = False,
    seed: int = 0,
    timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The measurement of ``bench.gemm.bench_shape`` in ``processes`` fresh processes, one after another."""
    if processes < 2:
        raise ValueError("a stable bench needs at least 2 processes")
    args = {
        "shape": list(shape),
        "dtype": str(dtype).removeprefix("torch."),
        "backends": list(backends),
        "rounds": rounds,
        "reps": reps,
        "warmup_s": warmup_s,
        "graph": graph,
        "seed": seed,
    }
    procs = []
    for i in range(processes):
        if progress:
            progress(f"process {i + 1}/{processes}")
        procs.append(run_process(args, timeout))
    return {
        "kind": "stable-bench",
        "env": timing.env_info(),
        "args": dict(args, processes=processes),
        "processes": procs,
        "summary": summarize_processes(procs, backends),
    }


def _ratio(entry: dict) -> dict | None:
    """The ratio summary (older reports named its keys median_ms, min_ms, ...)."""
    r = entry.get("ratio")
    return None if not r else {k.removesuffix("_ms"): v for k, v in r.items()}


def tables(res: dict) -> list[Table]:
    """One row per backend: the median of the process medians, their range and cv, the ratio to cuBLAS."""
    s, args = res["summary"], res["args"]
    t = Table(
        f"stable bench {'x'.join(map(str, args['shape']))} {args['dtype']}: {s['processes_ok']} processes "
        f"({s['processes_failed']} failed)",
        (
            "backend",
            "median ms (of process medians)",
            "min-max ms",
            "cv",
            "ratio vs cuBLAS",
            "ratio min-max",
            "wrong in",
        ),
    )
    for name, e in s["backends"].items():
        tm, r = e.get("median_ms"), _ratio(e)
        t.rows.append(
            [
                name,
                num(tm and tm["median_ms"], ".4f"),
                "-" if not tm else f"{tm['min_ms']:.4f}-{tm['max_ms']:.4f}",
                num(tm and tm["cv"], ".2%"),
                num(r and r["median"], ".3f"),
                "-" if not r else f"{r['min']:.3f}-{r['max']:.3f}",
                str(e["wrong_in"]),
            ]
        )
    clk = s.get("sm_clock_mhz")
    if clk:
        t.notes.append(
            "mean SM clock per process: "
            + ", ".join(f"{c:.0f}" for c in clk["mean_per_process"])
            + f" MHz (range {clk['min']:.0f}-{clk['max']:.0f})"
        )
    t.notes += [f"[yellow]warning: {f}" for f in s["flags"]]
    return [t]


def long_rows(res: dict) -> list[dict]:
    """Per backend: the process medians' median (p20, p80 across processes) and the ratio to cuBLAS."""
    shape, out = "x".join(map(str, res["args"]["shape"])), []
    for name, e in res["summary"]["backends"].items():
        tm, r = e.get("median_ms"), _ratio(e)
        if tm:
            out.append(
                long_row(
                    "gemm",
                    name,
                    "time",
                    "ms",
                    "shape",
                    shape,
                    tm["median_ms"],
                    tm.get("p20_ms"),
                    tm.get("p80_ms"),
                    mode="processes",
                    cv=tm["cv"],
                    wrong_in=e["wrong_in"],
                )
            )
        if r:
            out.append(
                long_row(
                    "gemm",
                    name,
                    "ratio_vs_cublas",
                    "x",
                    "shape",
                    shape,
                    r["median"],
                    r.get("p20"),
                    r.get("p80"),
                    mode="processes",
                    ci95=r.get("ci95"),
                )
            )
    return out


def write(res: dict, out_dir, stem: str = "stable-bench") -> list:
    return output.write(res, out_dir, stem, tables(res), long_rows(res))


def _main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] != "--child":
        sys.exit("usage: python -m gemmlab.bench.stable --child JSON")
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    print(json.dumps(_child(json.loads(sys.argv[2])), default=str))


if __name__ == "__main__":
    _main()
