"""MoE forward + backward on a GPU: gemmlab's fused backward (recomputing gate/up, the default; and the option
that keeps them from the forward, ``moe_forward_saving``) against torch's composite on ``torch._grouped_mm``
through autograd and (``--baseline liger``, when installed) Liger-Kernel's ``LigerFusedMoEFunction``. Every
candidate's four gradients (dx, dw1, dw2, d topk_weights) are checked first by ``gemmlab.ref.moe_grad_check``
(torch.autograd of the float32 loop, one expert at a time; the rule of ``bench moe --baseline liger``), then the
candidates are timed interleaved (L2 flushed, median of rounds x reps), then each one's peak memory is measured
alone (bytes allocated above what was live before the call, the returned gradients included).

    PYTHONPATH=src python -m benchmarks moe-backward                     # Qwen3-30B-A3B, Mixtral; T 1024, 4096
    PYTHONPATH=src python -m benchmarks moe-backward --baseline liger --out benchmarks/results/moe_backward.json
    PYTHONPATH=src python -m benchmarks moe-backward --sweep        # the backward alone under a few configs

TFLOPS = 18*S*H*I / t: the forward's 6*S*H*I (gate/up 4, down 2) and the backward's 12*S*H*I (dX and dW1 4
each, d(act) and dW2 2 each); work a candidate recomputes (gemmlab redoes the gate/up GEMM, 4*S*H*I) is not
counted. S = T*k routed rows. Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from dataclasses import replace

import torch

import gemmlab
from gemmlab.bench.moe import composite_forward, problem
from gemmlab.instruments import timing
from gemmlab.instruments.compare import compare_many
from gemmlab.ops import moe as moe_ops
from gemmlab.ops.moe import MoEBackwardConfig
from gemmlab.problems import MOE_MODELS
from gemmlab.ref import moe_grad_check


def _liger():
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
    except ImportError as e:
        return None, f"liger-kernel is not installed ({e}): skipped"
    return LigerFusedMoEFunction.apply, None


def candidates(p: dict, dy: torch.Tensor, liger: bool) -> tuple[dict, list[str]]:
    """{name: fn() -> (dx, dw1, dw2, d topk_weights)} on leaves made from problem ``p``, and notes."""
    leaves = [p[n].detach().clone().requires_grad_(True) for n in ("x", "w1", "w2", "weights")]
    ids = p["ids"]
    x, w1, w2, tw = leaves

    def grads(forward):
        return lambda: torch.autograd.grad(forward(), leaves, dy)

    fns = {"gemmlab": grads(lambda: gemmlab.moe_forward(x, w1, w2, tw, ids, validate=False)),
           "gemmlab saving gate/up": grads(lambda: moe_ops.moe_forward_saving(x, w1, w2, tw, ids, validate=False)),
           "torch composite (_grouped_mm)": grads(lambda: composite_forward(x, w1, w2, tw, ids))}
    notes = []
    if liger:
        apply, why = _liger()
        if apply is None:
            notes.append(why)
        else:
            fns["liger"] = grads(lambda: apply(x, w1, w2, ids, tw))
    return fns, notes


def checker(p: dict, dy: torch.Tensor):
    """The gradient check of one problem: ``moe_grad_check`` against the float32 loop's autograd."""
    return lambda out: moe_grad_check(tuple(out), dy, p["x"], p["w1"], p["w2"], p["weights"], p["ids"])


def peak_bytes(fn) -> int:
    """Bytes allocated at the peak of one call above what was live before it (its returned grads included)."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def run_case(model: str, tokens: int, routing: str, dtype: torch.dtype, liger: bool, rounds: int, reps: int,
             graph: bool) -> dict:
    m = MOE_MODELS[model]
    p = problem(m, tokens, routing, dtype, seed=tokens)
    dy = torch.randn((tokens, m.hidden), device="cuda", dtype=torch.float32).mul_(0.5).to(dtype)
    fns, notes = candidates(p, dy, liger)
    if graph:  # Liger's routing reads a count on the host
        if fns.pop("liger", None) is not None:
            notes.append("liger: its routing reads a count on the host (.item()), so it is not captured")
    try:
        fns["torch composite (_grouped_mm)"]()
    except Exception as e:  # no autograd for torch._grouped_mm in this torch
        notes.append(f"torch composite has no backward here ({type(e).__name__}: {str(e)[:120]}): dropped")
        fns.pop("torch composite (_grouped_mm)")
    # the peer if there is one, else torch, else gemmlab alone
    baseline = next(n for n in ("liger", "torch composite (_grouped_mm)", "gemmlab") if n in fns)
    s = tokens * m.top_k
    flops = 18.0 * s * m.hidden * m.intermediate
    res = compare_many(fns, baseline, check=checker(p, dy), flops=flops,
                       dtype=str(dtype).removeprefix("torch."), rounds=rounds, reps=reps, graph=graph)
    for name, fn in fns.items():
        if res["candidates"][name].get("check", {}).get("ok"):
            res["candidates"][name]["peak_bytes"] = peak_bytes(fn)
    return {"model": model, "tokens": tokens, "routing": routing, "dtype": str(dtype).removeprefix("torch."),
            "mode": "graph" if graph else "eager", "S": s, "notes": notes, **res}


def sweep_variants() -> dict[str, MoEBackwardConfig]:
    """One factor at a time from the default config (per case, ``backward_config``'s choice): the tile rows,
    the dh kernel's tile, the dX kernel's tile, the weight-gradient tile."""
    d = MoEBackwardConfig()
    out = {"default": None}
    for bm, warps in ((64, 4), (128, 8)):
        out[f"block_m={bm}"] = replace(d, block_m=bm, dh_warps=warps, dx_warps=warps)
    for bn, bk, warps, stages in ((128, 64, 8, 3), (64, 32, 4, 4), (64, 64, 4, 3), (32, 64, 4, 4)):
        out[f"dh {bn}x{bk} w{warps} s{stages}"] = replace(d, dh_block_n=bn, dh_block_k=bk, dh_warps=warps,
                                                          dh_stages=stages)
    for bn, bk, stages in ((256, 64, 3), (128, 32, 4), (64, 64, 4)):
        out[f"dx {bn}x{bk} s{stages}"] = replace(d, dx_block_n=bn, dx_block_k=bk, dx_stages=stages)
    for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 256, 32, 8, 3),
                                      (128, 64, 64, 4, 4)):
        out[f"wg {bm}x{bn}x{bk} w{warps} s{stages}"] = replace(d, wg_block_m=bm, wg_block_n=bn, wg_block_k=bk,
                                                               wg_warps=warps, wg_stages=stages)
    return out


def run_sweep(model: str, tokens: int, routing: str, dtype: torch.dtype, reps: int) -> list[dict]:
    """The backward alone (``ops.moe_backward.moe_backward``) under each ``sweep_variants`` config: median ms
    of ``reps`` L2-flushed calls after a check of its gradients (a variant that fails or cannot compile is
    reported as such)."""
    m = MOE_MODELS[model]
    p = problem(m, tokens, routing, dtype, seed=tokens)
    dy = torch.randn((tokens, m.hidden), device="cuda", dtype=torch.float32).mul_(0.5).to(dtype)
    check = checker(p, dy)
    args = (dy, p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    rows = []
    for name, cfg in sweep_variants().items():
        row = {"model": model, "tokens": tokens, "routing": routing, "variant": name}
        try:
            ok = check(moe_ops.moe_backward(*args, config=cfg))
            row["ok"] = ok["ok"]
            if ok["ok"]:
                timing.warmup({"v": lambda cfg=cfg: moe_ops.moe_backward(*args, config=cfg)}, 0.3)
                row["median_ms"] = statistics.median(
                    timing.time_calls(lambda cfg=cfg: moe_ops.moe_backward(*args, config=cfg), reps))
        except Exception as e:  # a config that does not compile (shared memory, registers) is a result too
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:160]}")
        rows.append(row)
        print(f"{model:<15} {tokens:>6} {name:<28} {'ok' if row['ok'] else 'FAIL':<4} "
              f"{row.get('median_ms', float('nan')):>8.3f} ms  {row.get('error', '')}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'model':<15} {'T':>6} {'routing':<8} {'candidate':<30} {'ok':<3} {'ms':>8} {'TFLOPS':>7} "
             f"{'speedup':>7} {'peak GiB':>9}"]
    for r in rows:
        for name, c in r["candidates"].items():
            ok = c.get("check", {}).get("ok")
            ms = c.get("median_ms")
            ratio = (c.get("vs_baseline") or {}).get("ratio")  # baseline time / this time: > 1 is faster
            lines.append(f"{r['model']:<15} {r['tokens']:>6} {r['routing']:<8} {name[:30]:<30} "
                         f"{'yes' if ok else 'NO':<3} {ms if ms is not None else float('nan'):>8.3f} "
                         f"{c.get('tflops', float('nan')):>7.1f} "
                         f"{ratio if ratio is not None else (1.0 if name == r['baseline'] else float('nan')):>7.2f} "
                         f"{c.get('peak_bytes', float('nan')) / 2**30:>9.3f}")
        for n in r["notes"]:
            lines.append(f"  note: {n}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3-30b-a3b,mixtral-8x7b")
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--routing", default="uniform", choices=("uniform", "zipf"))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--baseline", default="", choices=("", "liger"), help="liger: add Liger-Kernel (if installed)")
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (without Liger)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sweep", action="store_true", help="time the backward alone under a few configs instead")
    ap.add_argument("--out", default="", help="write the rows and provenance as JSON here")
    a = ap.parse_args(argv)
    models = a.models.split(",")
    unknown = [m for m in models if m not in MOE_MODELS]
    if unknown:
        print(f"moe_backward: unknown model(s) {unknown}; known: {sorted(MOE_MODELS)}", file=sys.stderr)
        return 2
    try:
        tokens = [int(t) for t in a.tokens.split(",")]
    except ValueError:
        print(f"moe_backward: --tokens must be integers, got {a.tokens!r}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("moe_backward: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    rows = []
    if a.sweep:
        for model in models:
            for t in tokens:
                rows += run_sweep(model, t, a.routing, dtype, max(a.reps, 10))
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"env": timing.env_info(), "sweep": rows}, f, indent=1, default=str)
        return 0
    for model in models:
        for t in tokens:
            rows.append(run_case(model, t, a.routing, dtype, a.baseline == "liger", a.rounds, a.reps, a.graph))
            print(table(rows[-1:]), flush=True)
    print()
    print(table(rows))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"env": timing.env_info(), "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
