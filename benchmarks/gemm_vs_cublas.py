"""gemmlab.gemm against cuBLAS (torch.mm), fp16, interleaved in one run, every output verified first.

    PYTHONPATH=src python3 benchmarks/gemm_vs_cublas.py [--suite all] [--out benchmarks/results]

Per shape: A, B uniform in [-0.5, 0.5) (fresh seeds, never zeros); gemmlab's output (through ``gemm``,
the exact call that is timed) and cuBLAS's are checked against the float64 reference; then gemmlab,
gemmlab with a prepacked B (``pack_b``, packing outside the timed region) and cuBLAS run interleaved
(L2 flushed before every call, rounds alternating order) while NVML samples the SM clock; the last output
each candidate produced while being timed is checked again. TFLOPS = 2*M*N*K / median time.
Ratio = cuBLAS time / gemmlab time per round, median over rounds, bootstrap 95% interval.
Writes ``<out>/<gpu>-gemm.json`` and prints a table, with the bar of issue 2 (``problems.GEMM_BAR``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import gemmlab
from gemmlab.bench.timing import ClockSampler, env_info, interleave, ratio_summary, summarize
from gemmlab.ops.plan import gpu_slug
from gemmlab.problems import GEMM_BAR, parse_shape, suite
from gemmlab.ref import gemm_check, gemm_ref


def bar_for(shape) -> float | None:
    for shapes, bar in GEMM_BAR.values():
        if tuple(shape) in shapes:
            return bar
    return None


def host_overhead_us(fn, n: int = 200) -> float:
    """Host time per call when the GPU is not the bottleneck (median of n back-to-back calls)."""
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return sorted(ts)[n // 2] * 1e6


def bench_shape(m: int, n: int, k: int, rounds: int, reps: int, dtype: torch.dtype) -> dict:
    g = torch.Generator(device="cuda").manual_seed(1000003 * m + 1009 * n + k)
    a = torch.rand((m, k), device="cuda", dtype=dtype, generator=g) - 0.5
    b = torch.rand((k, n), device="cuda", dtype=dtype, generator=g) - 0.5
    packed = gemmlab.pack_b(b)
    ref = gemm_ref(a, b)
    outs = {name: torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
            for name in ("gemmlab", "gemmlab_packed", "cublas")}
    fns = {
        "gemmlab": lambda: gemmlab.gemm(a, b, out=outs["gemmlab"]),
        "gemmlab_packed": lambda: gemmlab.gemm(a, packed, out=outs["gemmlab_packed"]),
        "cublas": lambda: torch.mm(a, b, out=outs["cublas"]),
    }
    checks = {}
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        checks[name] = gemm_check(outs[name], a, b, ref)
        outs[name].fill_(float("nan"))  # what timing leaves behind must be its own work
    with ClockSampler() as clocks:
        # device time: CUDA-graph replays (no host launch cost), the kernels' own speed
        times = interleave(fns, rounds=rounds, reps=reps, warmup_s=1.0, graph=True)
        # eager: each call launched from Python as a user would, host overhead included where it shows
        eager = interleave(fns, rounds=max(4, rounds // 2), reps=reps, warmup_s=0.2)
    after = {name: gemm_check(outs[name], a, b, ref)["ok"] for name in fns}
    flops = 2.0 * m * n * k
    res = {"shape": [m, n, k], "dtype": str(dtype).removeprefix("torch."),
           "plan": {"raw_b": _plan_dict(gemmlab.plan(a, b)), "packed_b": _plan_dict(gemmlab.plan(a, packed))},
           "checks": {name: {kk: c[kk] for kk in ("ok", "max_abs_err", "worst")} for name, c in checks.items()},
           "checked_after_timing": after, "clocks": clocks.summary(), "bar": bar_for((m, n, k))}
    for name in fns:
        s = summarize([t for r in times[name] for t in r])
        e = summarize([t for r in eager[name] for t in r])
        res[name] = dict(s, tflops=flops / (s["median_ms"] * 1e-3) / 1e12, per_round_ms=times[name],
                         eager=dict(e, tflops=flops / (e["median_ms"] * 1e-3) / 1e12))
    for name in ("gemmlab", "gemmlab_packed"):
        res[f"{name}_vs_cublas"] = ratio_summary(times[name], times["cublas"])
        res[f"{name}_vs_cublas_eager"] = ratio_summary(eager[name], eager["cublas"])
    res["host_overhead_us"] = {name: host_overhead_us(fn) for name, fn in fns.items()}
    del ref
    torch.cuda.empty_cache()
    return res


def _plan_dict(p) -> dict:
    return {"path": p.path, "config": p.config.__dict__ if p.config else None, "reason": p.reason,
            "c_tma": p.c_tma, "a_kmajor": p.a_kmajor, "b_kmajor": p.b_kmajor}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="all")
    ap.add_argument("--shapes", nargs="*", default=None)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    shapes = [parse_shape(s) for s in args.shapes] if args.shapes else suite(args.suite)
    dtype = getattr(torch, args.dtype)
    info = env_info()
    results = [bench_shape(m, n, k, args.rounds, args.reps, dtype) for m, n, k in shapes]
    slug = gpu_slug(info.get("gpu", "cpu"))
    suffix = "" if args.dtype == "float16" else f"-{args.dtype}"
    path = Path(args.out) / f"{slug}-gemm{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env": info, "results": results}, indent=1))
    print(f"\n{info.get('gpu')} {args.dtype} torch {info['torch']} triton {info['triton']} {info['git_sha'][:12]}")
    print("device time (CUDA-graph replay); eager = launched from Python, host overhead included")
    print(f"{'shape':20s} {'path':15s} {'cuBLAS':>7s} {'gemmlab':>7s} {'ratio':>6s} {'95% CI':>13s} "
          f"{'packed':>6s} {'eager':>6s} {'MHz':>5s} {'bar':>5s} ok")
    for r in results:
        rv, rp, re_ = r["gemmlab_vs_cublas"], r["gemmlab_packed_vs_cublas"], r["gemmlab_vs_cublas_eager"]
        ok = all(c["ok"] for c in r["checks"].values()) and all(r["checked_after_timing"].values())
        bar = r["bar"]
        mark = "" if bar is None else ("PASS" if rv["ratio"] >= bar else "MISS")
        print(f"{'x'.join(map(str, r['shape'])):20s} {r['plan']['raw_b']['path']:15s} "
              f"{r['cublas']['tflops']:7.0f} {r['gemmlab']['tflops']:7.0f} {rv['ratio']:6.3f} "
              f"[{rv['ci95'][0]:.3f},{rv['ci95'][1]:.3f}] {rp['ratio']:6.3f} {re_['ratio']:6.3f} "
              f"{r['clocks'].get('sm_clock_mhz_mean', 0):5.0f} {bar if bar else '-':>5} "
              f"{'ok' if ok else 'WRONG'} {mark}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
