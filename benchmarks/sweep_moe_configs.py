"""Sweep MoEConfigs of the grouped kernel against torch._grouped_mm, interleaved, each verified first.

    PYTHONPATH=src python3 benchmarks/sweep_moe_configs.py [--cases NAME ...] [--out DIR]

For every case (model, T, routing, part): the problem of ``gemmlab bench moe`` (bf16, random x and
weights, top-k routing of random logits); part "grouped" times ``grouped_gemm`` (the first GEMM, gate+up
N = 2I, rows already sorted by expert) per candidate config against ``torch._grouped_mm``; part "forward"
times ``moe_forward`` per (first, second) config pair against the composite of torch ops. Every candidate
is run once and checked against the float32 reference before it is timed (a wrong one is recorded, never
timed); all are timed as CUDA-graph replays, interleaved, L2 flushed. Writes ``<out>/<gpu>-moe-sweep.json``
and prints the best config per case. This is how ``moe_config``'s choices were made.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from gemmlab.bench import moe as bm
from gemmlab.device import gpu_slug, target_for
from gemmlab.instruments.compare import compare_many
from gemmlab.instruments.timing import env_info
from gemmlab.ops.moe import MoEConfig, grouped_gemm, moe_config, moe_forward, sort_routes
from gemmlab.problems import MOE_MODELS
from gemmlab.ref import grouped_gemm_ref, moe_check, moe_ref


def C(bm_, bn, bk, w, s, g=8, clip=False, ot=True) -> MoEConfig:
    return MoEConfig(block_m=bm_, block_n=bn, block_k=bk, num_warps=w, num_stages=s, group_m=g, clip=clip,
                     out_tma=ot)


# Candidate spaces, as data. "grouped": one config; "forward": (first GEMM, second GEMM) pairs.
GROUPED = [C(128, 256, 64, 8, 3), C(128, 256, 64, 8, 3, ot=False), C(128, 256, 64, 8, 4),
           C(128, 256, 64, 8, 4, ot=False), C(128, 256, 64, 8, 3, g=16), C(128, 256, 64, 8, 3, clip=True),
           C(64, 128, 128, 4, 3), C(64, 128, 128, 4, 3, ot=False)]
FORWARD = [(C(128, 128, 64, 8, 3), C(128, 256, 64, 8, 3)),
           (C(128, 128, 64, 8, 3, ot=False), C(128, 256, 64, 8, 3, ot=False)),
           (C(128, 128, 64, 8, 4), C(128, 256, 64, 8, 3)), (C(128, 128, 64, 8, 4), C(128, 256, 64, 8, 4)),
           (C(128, 128, 64, 8, 3, clip=True), C(128, 256, 64, 8, 3, clip=True))]
CASES = {f"{m}:{t}:{part}{':zipf' if r == 'zipf' else ''}": (m, t, r, part)
         for m in ("deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b") for t in (16, 128, 1024, 4096, 16384)
         for part in ("grouped", "forward") for r in ("uniform", "zipf")}


def name_of(cfg) -> str:
    if isinstance(cfg, tuple):
        return " + ".join(name_of(c) for c in cfg)
    return (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} g{cfg.group_m}"
            f"{' clip' if cfg.clip else ''}{' tma-store' if cfg.out_tma and not cfg.clip else ''}")


def sweep_case(model_name: str, tokens: int, routing: str, part: str, rounds: int, reps: int) -> dict:
    model = MOE_MODELS[model_name]
    p = bm.problem(model, tokens, routing, torch.bfloat16, seed=tokens)
    x, w1, w2, wts, ids = p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
    s, i = tokens * model.top_k, model.intermediate
    target = target_for(x.device)
    if part == "grouped":
        r = sort_routes(ids, model.experts, 16)
        xs, offs = x[r.token.long()].contiguous(), r.offsets
        ref = grouped_gemm_ref(xs, w1, offs)
        tol = 2.0 * 2.0**-7 * ref.abs().max().item() + 1e-3
        default = moe_config(target, s, model.experts, 0)
        space = [default] + [c for c in GROUPED if c != default]
        outs = {name_of(c): torch.empty((s, 2 * i), dtype=x.dtype, device=x.device) for c in space}
        fns = {f"gemmlab {name_of(c)}": (lambda c=c: grouped_gemm(xs, w1, offs, out=outs[name_of(c)],
                                                                  validate=False, config=c)) for c in space}
        w1t = w1.transpose(1, 2)
        fns["torch._grouped_mm"] = lambda: torch._grouped_mm(xs, w1t, offs=offs)
        baseline = "torch._grouped_mm"

        def check(out):
            err = (out.float() - ref).abs().max().item()
            return {"ok": err <= tol, "max_abs_err": err}

        flops = 2.0 * s * model.hidden * 2 * i
    else:
        ref = moe_ref(x, w1, w2, wts, ids)
        d1, d2 = moe_config(target, s, model.experts, 1), moe_config(target, s, model.experts, 2)
        default = (d1, replace(d2, block_m=d1.block_m))
        space = [default] + [c for c in FORWARD if c != default]
        fns = {f"gemmlab {name_of(c)}": (lambda c=c: moe_forward(x, w1, w2, wts, ids, validate=False, configs=c))
               for c in space}
        fns["torch composite"] = lambda: bm.composite_forward(x, w1, w2, wts, ids)
        baseline = "torch composite"

        def check(out):
            c = moe_check(out, x, w1, w2, wts, ids, ref)
            return {key: c[key] for key in ("ok", "max_abs_err", "allowed")}

        flops = 2.0 * s * model.hidden * 2 * i + 2.0 * s * i * model.hidden
    res = compare_many(fns, baseline, check=check, flops=flops, dtype="bfloat16", rounds=rounds, reps=reps,
                       warmup_s=0.3, graph=True)
    counts = torch.bincount(ids.reshape(-1).long(), minlength=model.experts)
    return {"model": model_name, "tokens": tokens, "routing": routing, "part": part, "S": s,
            "max_rows_per_expert": int(counts.max()), "default": name_of(default), **res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=list(CASES), help=f"of {', '.join(CASES)}")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    report = {"env": env_info(), "cases": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{gpu_slug(torch.cuda.get_device_name())}-moe-sweep.json"
    for name in args.cases:
        t0 = time.time()
        case = sweep_case(*CASES[name], rounds=args.rounds, reps=args.reps)
        report["cases"].append(case)
        path.write_text(json.dumps(report, indent=1, default=str))
        base = case["candidates"][case["baseline"]]
        print(f"\n{name}  (S={case['S']}, max rows/expert {case['max_rows_per_expert']}, {time.time() - t0:.0f} s) "
              f"baseline {case['baseline']} {base.get('median_ms', float('nan')):.3f} ms "
              f"{base.get('tflops', 0):.0f} TFLOPS", flush=True)
        ranked = sorted(((c.get("vs_baseline") or {}).get("ratio") or 0.0, n, c)
                        for n, c in case["candidates"].items() if n != case["baseline"])
        for ratio, n, c in ranked[::-1]:
            mark = "*" if n == f"gemmlab {case['default']}" else " "
            state = f"{c['median_ms']:.3f} ms {c['tflops']:.0f} TF x{ratio:.3f}" if c.get("median_ms") else \
                f"NOT TIMED: {c['check']}"
            print(f"  {mark} {n:45s} {state}", flush=True)
        torch.cuda.empty_cache()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
