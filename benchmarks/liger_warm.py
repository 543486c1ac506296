"""Compile Liger-Kernel's fused-MoE Triton kernels for the suite's models in parallel, then autotune them, all
outside any timing, so that ``gemmlab bench moe --baseline liger`` finds them compiled and tuned.

Liger's GEMM kernels take H and I as constexprs and autotune 32 configs (forward GEMMs, dX) or 16 (dW), its token
gather 40 (K a constexpr too): a few hundred compilations per model, one after another inside Triton's
autotuner. Here worker processes each run config j of every kernel (the kernel's list cut to that one config)
on a small problem with the model's H, I and k, so that every compilation lands in Triton's disk cache
(TRITON_CACHE_DIR, shared by all); then this process calls Liger once per model and part at T = --tune-tokens:
its autotuning finds every config compiled and, with TRITON_CACHE_AUTOTUNING=1, stores its choice on disk for
the bench's process (the bench's own tuning call then is a cache hit).

    TRITON_CACHE_DIR=$PWD/.triton-cache TRITON_CACHE_AUTOTUNING=1 PYTHONPATH=src:/tmp/site \\
        python -m benchmarks liger-warm --workers 16 --out DIR
Writes DIR/liger-warm.json: per model and part the compile and tuning seconds and the configs Liger chose.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import torch

from gemmlab.bench import moe_liger as ml
from gemmlab.bench import moe_peers
from gemmlab.instruments import timing
from gemmlab.problems import MOE_MODELS, MoEModel

_ORIGINAL: dict[str, list] = {}


def autotuners() -> dict:
    """Liger's autotuned fused-MoE kernels by name."""
    from liger_kernel.ops import fused_moe_kernels as k
    from triton.runtime.autotuner import Autotuner

    return {name: obj for name, obj in vars(k).items() if isinstance(obj, Autotuner)}


def compile_one(job: tuple[str, tuple[str, ...], int]) -> dict:
    """Worker: config j of every Liger kernel (the first where a kernel has fewer), run once per part."""
    name, parts, j = job
    for kname, tuner in autotuners().items():
        configs = _ORIGINAL.setdefault(kname, list(tuner.configs))
        tuner.configs = [configs[j] if j < len(configs) else configs[0]]
    m = MOE_MODELS[name]
    small = MoEModel(hidden=m.hidden, intermediate=m.intermediate, experts=max(m.top_k, 2), top_k=m.top_k)
    liger, info = moe_peers.load_liger()
    if liger is None:
        raise RuntimeError(info["reason"])
    t0, errors = time.perf_counter(), []
    for part in parts:
        try:  # a config too large for the device fails here; Liger's own autotuner skips it the same way
            moe_peers.tune_liger(liger, small, part, torch.bfloat16, 64)
        except Exception as e:
            errors.append(f"{part}: {type(e).__name__}: {str(e)[:200]}")
    torch.cuda.empty_cache()
    return {"model": name, "config": j, "seconds": time.perf_counter() - t0, "errors": errors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(ml.SUITE_MODELS))
    ap.add_argument("--parts", default="fwd,fwd+bwd")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--tune-tokens", type=int, default=4096)
    ap.add_argument("--time-limit-s", type=float, default=400.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    models, parts = args.models.split(","), tuple(args.parts.split(","))
    bad = [m for m in models if m not in MOE_MODELS] + [p for p in parts if p not in ml.PARTS]
    if bad or args.workers < 1:
        print(
            f"liger_warm: unknown model or part {bad} (models {list(MOE_MODELS)}, parts {ml.PARTS}) or --workers < 1",
            file=sys.stderr,
        )
        return 2
    liger, info = moe_peers.load_liger()
    if liger is None or not torch.cuda.is_available():
        print(f"liger_warm: nothing to do: {info.get('reason') or 'no CUDA device'}", file=sys.stderr)
        return 2

    def save() -> None:  # after every phase: a step killed by its time limit keeps what was done
        if args.out:
            path = Path(args.out) / "liger-warm.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1, default=str))

    t0 = time.monotonic()
    report = {
        "env": timing.env_info(),
        "liger": info,
        "args": vars(args),
        "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
        "autotuning_cache": os.environ.get("TRITON_CACHE_AUTOTUNING"),
        "compile": [],
        "tune": [],
    }
    most = max(len(t.configs) for t in autotuners().values())
    jobs = [(m, parts, j) for m in models for j in range(most)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(args.workers, len(jobs))) as pool:
        pending = pool.imap_unordered(compile_one, jobs)
        for _ in jobs:
            left = args.time_limit_s * 0.6 - (time.monotonic() - t0)  # the rest is for tuning
            try:
                report["compile"].append(pending.next(timeout=max(1.0, left)))
            except multiprocessing.TimeoutError:
                report["compile_stopped"] = f"time limit: {len(report['compile'])} of {len(jobs)} jobs done"
                pool.terminate()
                break
    report["compile_s"] = time.monotonic() - t0
    print(f"compiled {len(report['compile'])} of {len(jobs)} jobs in {report['compile_s']:.0f}s", flush=True)
    save()
    for m in models:
        for part in parts:
            if time.monotonic() - t0 > args.time_limit_s:
                report.setdefault("not_tuned", []).append(f"{m} {part}")
                continue
            r = moe_peers.tune_liger(liger, MOE_MODELS[m], part, torch.bfloat16, args.tune_tokens)
            report["tune"].append({"model": m, **r})
            print(f"tuned {m} {part} at T={args.tune_tokens}: {r['seconds']:.1f}s", flush=True)
            torch.cuda.empty_cache()
            report["chosen"] = {
                k: {str(key): str(cfg) for key, cfg in t.cache.items()} for k, t in autotuners().items()
            }
            save()
    report["elapsed_s"] = time.monotonic() - t0
    save()
    print(f"done in {report['elapsed_s']:.0f}s" + (f"; wrote {args.out}/liger-warm.json" if args.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
