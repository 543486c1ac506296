"""Where an eager ``moe_forward`` call spends its host time: cProfile over N calls per case, on the GPU.

    PYTHONPATH=src python3 benchmarks/moe_host_profile.py [--calls 200] [--out FILE.txt]

Per case (bf16, uniform routing, the problem of ``gemmlab bench moe``): host µs per call (wall clock of N
back-to-back calls without synchronizing, divided by N, after a synchronize at each end; when the GPU is the
bottleneck this is device time), then the same calls under cProfile, top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from gemmlab.bench.moe import problem
from gemmlab.ops.moe import moe_forward
from gemmlab.problems import MOE_MODELS

CASES = [("qwen3-30b-a3b", 16), ("qwen3-30b-a3b", 64), ("qwen3-30b-a3b", 1024), ("qwen3-30b-a3b", 4096)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    text = io.StringIO()
    for name, t in CASES:
        p = problem(MOE_MODELS[name], t, "uniform", torch.bfloat16, 0, torch.device("cuda"))
        call = (lambda p=p: moe_forward(p["x"], p["w1"], p["w2"], p["weights"], p["ids"]))
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            call()
        host = (time.perf_counter() - t0) / args.calls
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / args.calls
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            call()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        head = f"== {name} T={t}: host {host * 1e6:.1f} us/call (enqueue), wall {wall * 1e6:.1f} us/call"
        print(head, flush=True)
        text.write(head + "\n" + s.getvalue() + "\n")
        del p
    if args.out:
        with open(args.out, "w") as f:
            f.write(text.getvalue())
    else:
        print(text.getvalue())


if __name__ == "__main__":
    main()
