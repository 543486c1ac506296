"""Where an eager ``moe_forward`` call spends its host time, on the GPU.

    PYTHONPATH=src python3 benchmarks/moe_host_profile.py [--calls 200] [--out FILE.txt]
    PYTHONPATH=src python3 benchmarks/moe_host_profile.py --compare [--json FILE.json]

Default mode, per case (bf16, uniform routing, the problem of ``gemmlab bench moe``): host µs per call (wall clock
of N back-to-back calls without synchronizing, divided by N, after a synchronize at each end; when the GPU is the
bottleneck this is device time), then the same calls under cProfile, top functions by own time.

``--compare``: per case, first the checks (the first call, which plans and compiles, and later calls, which launch
the kept kernels, give bit-identical y; the custom op gives the same y; y against the float32 reference; at S above
``ALIGN_MAX_S`` the counting-sort routing equals the torch-ops routing), then the host cost of one call, measured so
the GPU never throttles it: bursts of ``--burst`` calls after a synchronize (fewer launches than the launch queue
holds), each call timed alone; median and p20/p80 over ``--rounds`` bursts. Three entry points: the eager public op
(``gemmlab.moe_forward``, no grad), the custom op (``torch.ops.gemmlab.moe_forward``, what torch.compile and nn.MoE
in training reach), and the eager op with x requiring grad (the custom op's autograd wrapper, forward only).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import time

import torch

from gemmlab.bench.moe import problem
from gemmlab.ops import moe as moe_ops
from gemmlab.ops import moe_plan, moe_routing
from gemmlab.ops.moe import moe_forward
from gemmlab.problems import MOE_MODELS, MoEModel
from gemmlab.ref import moe_check

CASES = [("qwen3-30b-a3b", 16), ("qwen3-30b-a3b", 64), ("qwen3-30b-a3b", 1024), ("qwen3-30b-a3b", 4096)]
OLMOE = MOE_MODELS.get("olmoe-1b-7b", MoEModel(hidden=2048, intermediate=1024, experts=64, top_k=8))
COMPARE_CASES = [*((MOE_MODELS[n], n, t) for n, t in CASES), (OLMOE, "olmoe-1b-7b", 1024)]


def profile(args) -> None:
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


def host_us(call, rounds: int, burst: int) -> tuple[float, float, float]:
    """Median, p20, p80 of one call's host time (µs), each call timed alone inside bursts after a synchronize."""
    for _ in range(3):
        call()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        for _ in range(burst):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    q = statistics.quantiles(times, n=10)
    return statistics.median(times) * 1e6, q[1] * 1e6, q[7] * 1e6


def check(p: dict, model: MoEModel) -> list[str]:
    """Failures (empty: all good) of the checks named in the module docstring."""
    x, w1, w2, tw, ids = p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
    bad = []
    moe_plan.clear_plans()
    first = moe_forward(x, w1, w2, tw, ids)  # plans, compiles (JIT)
    later = [moe_forward(x, w1, w2, tw, ids) for _ in range(2)]  # kept kernels, launched directly
    if not all(torch.equal(first, y) for y in later):
        bad.append("kept launches differ from the first call")
    if not next(iter(moe_plan.PLANS.values())).kept:
        bad.append("the plan kept no kernels (every call went through the JIT)")
    if not torch.equal(torch.ops.gemmlab.moe_forward(x, w1, w2, tw, ids, True, "auto"), first):
        bad.append("torch.ops.gemmlab.moe_forward differs from gemmlab.moe_forward")
    if x.shape[0] <= 1024 and not moe_check(first, x, w1, w2, tw, ids)["ok"]:
        bad.append("y against the float32 reference")
    s = ids.numel()
    if moe_ops.route_kind(s, model.experts) == "count":
        fast, slow = moe_ops.sort_routes(ids, model.experts, 16, tw), moe_routing.sort_routes_torch(ids, model.experts,
                                                                                                  16, tw)
        for name in ("order", "inv", "token", "offsets", "tile_offsets", "scale"):
            if not torch.equal(getattr(fast, name), getattr(slow, name)):
                bad.append(f"counting-sort routing: {name} differs from the torch path")
        if not bool(fast.ok[0]):
            bad.append("counting-sort routing: ok flag clear on valid ids")
    return bad


def entry_points(x, w1, w2, tw, ids, args) -> dict:
    """Host cost of the three entry points (module docstring) on these inputs."""
    xg = x.clone().requires_grad_(True)
    return {
        "eager": host_us(lambda: moe_forward(x, w1, w2, tw, ids), args.rounds, args.burst),
        "torch.ops": host_us(lambda: torch.ops.gemmlab.moe_forward(x, w1, w2, tw, ids, True, "auto"), args.rounds,
                             args.burst),
        "grad fwd": host_us(lambda: moe_forward(xg, w1, w2, tw, ids), args.rounds, args.burst),
    }


def compare(args) -> None:
    rows = []
    print(f"{'case':<24} {'checks':<7} {'eager us (p20-p80)':>22} {'torch.ops us':>22} {'grad fwd us':>22}",
          flush=True)
    for model, name, t in COMPARE_CASES:
        p = problem(model, t, "uniform", torch.bfloat16, 0, torch.device("cuda"))
        x, w1, w2, tw, ids = p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
        bad = check(p, model)
        entry = entry_points(x, w1, w2, tw, ids, args)
        cells = " ".join(f"{m:8.1f} ({lo:5.1f}-{hi:5.1f})" for m, lo, hi in entry.values())
        print(f"{name + ' T=' + str(t):<24} {'ok' if not bad else 'FAIL':<7} {cells}", flush=True)
        for b in bad:
            print("   FAIL:", b)
        rows.append({"model": name, "tokens": t, "route": moe_ops.route_kind(ids.numel(), model.experts),
                     "checks_failed": bad, **{k: {"median_us": v[0], "p20_us": v[1], "p80_us": v[2]}
                                              for k, v in entry.items()}})
        del p
    if args.json:
        try:
            sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            sha = ""
        import triton

        with open(args.json, "w") as f:
            json.dump({"what": "host us per eager moe_forward call (bf16, uniform routing)",
                       "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                       "git_sha": sha, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "rounds": args.rounds, "burst": args.burst, "results": rows}, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", action="store_true", help="checks, then host us per call of the three entry points")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--json", default=None, help="--compare: also write the rows (with provenance) here")
    args = ap.parse_args()
    compare(args) if args.compare else profile(args)


if __name__ == "__main__":
    main()
