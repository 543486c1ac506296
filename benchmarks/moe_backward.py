"""MoE forward + backward on a GPU: gemmlab's fused backward after the forward that keeps gate/up (the bundled
tables' choice under autograd, ``save_gate_up=True``) and after the one that has the backward recompute them
(``save_gate_up=False``), against torch's composite on ``torch._grouped_mm`` through autograd and
(``--baseline liger``, when installed) Liger-Kernel's ``LigerFusedMoEFunction``. Every candidate's four gradients
(dx, dw1, dw2, d topk_weights) are checked first by ``gemmlab.ref.moe_grad_check`` (torch.autograd of the float32
loop, one expert at a time; the rule of ``bench moe --baseline liger``), then the candidates are timed
interleaved (L2 flushed, median of rounds x reps), then each one's peak memory is measured alone (bytes allocated
above what was live before the call, the returned gradients included).

    PYTHONPATH=src python -m benchmarks moe-backward                     # Qwen3-30B-A3B, Mixtral; T 1024, 4096
    PYTHONPATH=src python -m benchmarks moe-backward --baseline liger --out benchmarks/results/moe_backward.json
    PYTHONPATH=src python -m benchmarks moe-backward --sweep        # the backward alone under a few configs
    PYTHONPATH=src python -m benchmarks moe-backward --profile --baseline liger   # device time per kernel

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
from dataclasses import asdict, replace

import torch

import gemmlab
from gemmlab.instruments import timing
from gemmlab.instruments.compare import compare_many
from gemmlab.ops import moe as moe_ops
from gemmlab.ops.moe import MoEBackwardConfig
from gemmlab.problems import MOE_MODELS, moe_inputs
from gemmlab.ref import moe_composite, moe_grad_check


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

    fns = {
        "gemmlab keeps gate/up": grads(
            lambda: gemmlab.moe_forward(x, w1, w2, tw, ids, validate=False, save_gate_up=True)
        ),
        "gemmlab recomputes gate/up": grads(
            lambda: gemmlab.moe_forward(x, w1, w2, tw, ids, validate=False, save_gate_up=False)
        ),
        "torch composite (_grouped_mm)": grads(lambda: moe_composite(x, w1, w2, tw, ids)),
    }
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


def run_case(
    model: str, tokens: int, routing: str, dtype: torch.dtype, liger: bool, rounds: int, reps: int, graph: bool
) -> dict:
    m = MOE_MODELS[model]
    p = moe_inputs(m, tokens, routing, dtype, seed=tokens)
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
    baseline = next(n for n in ("liger", "torch composite (_grouped_mm)", "gemmlab keeps gate/up") if n in fns)
    s = tokens * m.top_k
    flops = 18.0 * s * m.hidden * m.intermediate
    res = compare_many(
        fns,
        baseline,
        check=checker(p, dy),
        flops=flops,
        dtype=str(dtype).removeprefix("torch."),
        rounds=rounds,
        reps=reps,
        graph=graph,
    )
    for name, fn in fns.items():
        if res["candidates"][name].get("check", {}).get("ok"):
            res["candidates"][name]["peak_bytes"] = peak_bytes(fn)
    return {
        "model": model,
        "tokens": tokens,
        "routing": routing,
        "dtype": str(dtype).removeprefix("torch."),
        "mode": "graph" if graph else "eager",
        "S": s,
        "notes": notes,
        **res,
    }


def sweep_variants(d: MoEBackwardConfig) -> dict[str, tuple[str, MoEBackwardConfig]]:
    """One factor at a time from the case's config ``d`` (``backward_config``'s choice): {name: (factor, config)}
    for the tile rows, the dh kernel's tile, the dX kernel's tile, the weight-gradient tile."""
    out = {"default": ("", d)}
    for bm, warps in ((64, 4), (128, 8)):
        out[f"block_m={bm}"] = ("block_m", replace(d, block_m=bm, dh_warps=warps, dx_warps=warps))
    for bn, bk, warps, stages in ((128, 64, 8, 3), (64, 32, 4, 4), (64, 64, 4, 3), (32, 64, 4, 4), (128, 64, 8, 4)):
        out[f"dh {bn}x{bk} w{warps} s{stages}"] = (
            "dh",
            replace(d, dh_block_n=bn, dh_block_k=bk, dh_warps=warps, dh_stages=stages),
        )
    for bn, bk, stages in ((256, 64, 3), (256, 64, 4), (128, 32, 4), (64, 64, 4), (128, 64, 4)):
        out[f"dx {bn}x{bk} s{stages}"] = ("dx", replace(d, dx_block_n=bn, dx_block_k=bk, dx_stages=stages))
    for bm, bn, bk, warps, stages in (
        (128, 128, 64, 8, 3),
        (64, 128, 64, 4, 4),
        (128, 256, 32, 8, 3),
        (128, 64, 64, 4, 4),
        (128, 128, 32, 8, 4),
        (64, 128, 32, 4, 2),
    ):
        out[f"wg {bm}x{bn}x{bk} w{warps} s{stages}"] = (
            "wg",
            replace(d, wg_block_m=bm, wg_block_n=bn, wg_block_k=bk, wg_warps=warps, wg_stages=stages),
        )
    return out


def run_sweep(model: str, tokens: int, routing: str, dtype: torch.dtype, reps: int) -> list[dict]:
    """The backward alone (``ops.moe.backward.moe_backward``, on the gate/up the saving forward keeps; and once
    recomputing them) under each ``sweep_variants`` config: median ms of ``reps`` L2-flushed calls after a check
    of its gradients (a variant that fails or cannot compile is reported as such). Then, per factor, the fastest
    variant when it beats the default, and the config they make together (to try as a rule of the
    "moe_backward" tables; confirm with ``bench moe --baseline liger``)."""
    from gemmlab.device import target_for

    m = MOE_MODELS[model]
    p = moe_inputs(m, tokens, routing, dtype, seed=tokens)
    dy = torch.randn((tokens, m.hidden), device="cuda", dtype=torch.float32).mul_(0.5).to(dtype)
    check = checker(p, dy)
    args = (dy, p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    gate_up = torch.ops.gemmlab.moe_forward_saving(*args[1:], False)[1]  # what the saving forward keeps
    base = moe_ops.backward_config(
        target_for(dy.device), tokens * m.top_k, m.experts, dtype=dtype, n=m.intermediate, k=m.hidden
    )
    rows = []
    variants = [(name, f, cfg, gate_up) for name, (f, cfg) in sweep_variants(base).items()]
    for name, factor, cfg, gu in variants + [("recompute", "", base, None)]:
        row = {"model": model, "tokens": tokens, "routing": routing, "variant": name, "factor": factor}

        def call(cfg=cfg, gu=gu):
            return moe_ops.moe_backward(*args, config=cfg, gate_up=gu)

        try:
            ok = check(call())
            row["ok"] = ok["ok"]
            if ok["ok"]:
                timing.warmup({"v": call}, 0.3)
                row["median_ms"] = statistics.median(timing.time_calls(call, reps))
        except Exception as e:  # a config that does not compile (shared memory, registers) is a result too
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:160]}")
        rows.append(row)
        print(
            f"{model:<15} {tokens:>6} {name:<28} {'ok' if row['ok'] else 'FAIL':<4} "
            f"{row.get('median_ms', float('nan')):>8.3f} ms  {row.get('error', '')}",
            flush=True,
        )
    timed = {r["variant"]: r for r in rows if r.get("median_ms")}
    by_name = {name: cfg for name, _, cfg, _ in variants}
    best = dict(asdict(base))
    for factor in ("block_m", "dh", "dx", "wg"):
        cands = [r for r in timed.values() if r["factor"] == factor]
        win = min(cands, key=lambda r: r["median_ms"], default=None)
        if win and "default" in timed and win["median_ms"] < 0.98 * timed["default"]["median_ms"]:
            fields = ("block_m", "dh_warps", "dx_warps") if factor == "block_m" else None
            best.update(
                {
                    k: v
                    for k, v in asdict(by_name[win["variant"]]).items()
                    if (k in fields if fields else k.startswith(factor + "_"))
                }
            )
    changed = {k: v for k, v in best.items() if v != getattr(base, k)}
    print(f"{model:<15} {tokens:>6} suggested config (fields changed from {base}): {json.dumps(changed)}", flush=True)
    rows.append({"model": model, "tokens": tokens, "routing": routing, "variant": "suggested", "config": changed})
    return rows


def kernel_times(fn, reps: int = 3) -> list[tuple[str, float, int]]:
    """(kernel name, device us per call, launches per call) of ``fn``'s GPU work, by torch.profiler over ``reps``
    calls after one unprofiled call; largest first."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if us > 0:
            out.append((ev.key, us / reps, max(1, ev.count // reps)))
    return sorted(out, key=lambda r: -r[1])


def run_profile(model: str, tokens: int, routing: str, dtype: torch.dtype, liger: bool) -> dict:
    """Where each candidate's forward + backward spends device time, kernel by kernel (gradients checked first)."""
    m = MOE_MODELS[model]
    p = moe_inputs(m, tokens, routing, dtype, seed=tokens)
    dy = torch.randn((tokens, m.hidden), device="cuda", dtype=torch.float32).mul_(0.5).to(dtype)
    fns, notes = candidates(p, dy, liger)
    fns.pop("torch composite (_grouped_mm)")
    check = checker(p, dy)
    out = {"model": model, "tokens": tokens, "routing": routing, "notes": notes, "candidates": {}}
    for name, fn in fns.items():
        ok = check(fn())
        rows = kernel_times(fn)
        out["candidates"][name] = {
            "ok": ok["ok"],
            "total_us": sum(r[1] for r in rows),
            "kernels": [{"name": k, "us": us, "calls": n} for k, us, n in rows],
        }
    return out


def profile_table(r: dict) -> str:
    lines = [f"{r['model']} T={r['tokens']} {r['routing']}: device time per forward + backward, by kernel"]
    for name, c in r["candidates"].items():
        lines.append(f"  {name}: {c['total_us']:.0f} us{'' if c['ok'] else '  (GRADIENTS WRONG)'}")
        for k in c["kernels"][:12]:
            share = 100 * k["us"] / c["total_us"]
            lines.append(f"    {k['us']:>9.1f} us {share:>5.1f}%  x{k['calls']:<3} {k['name'][:90]}")
    lines += [f"  note: {n}" for n in r["notes"]]
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = [
        f"{'model':<15} {'T':>6} {'routing':<8} {'candidate':<30} {'ok':<3} {'ms':>8} {'TFLOPS':>7} "
        f"{'speedup':>7} {'peak GiB':>9}"
    ]
    for r in rows:
        for name, c in r["candidates"].items():
            ok = c.get("check", {}).get("ok")
            ms = c.get("median_ms")
            ratio = (c.get("vs_baseline") or {}).get("ratio")  # baseline time / this time: > 1 is faster
            lines.append(
                f"{r['model']:<15} {r['tokens']:>6} {r['routing']:<8} {name[:30]:<30} "
                f"{'yes' if ok else 'NO':<3} {ms if ms is not None else float('nan'):>8.3f} "
                f"{c.get('tflops', float('nan')):>7.1f} "
                f"{ratio if ratio is not None else (1.0 if name == r['baseline'] else float('nan')):>7.2f} "
                f"{c.get('peak_bytes', float('nan')) / 2**30:>9.3f}"
            )
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
    ap.add_argument("--profile", action="store_true", help="device time per kernel of each candidate instead")
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
    if a.profile:
        for model in models:
            for t in tokens:
                rows.append(run_profile(model, t, a.routing, dtype, a.baseline == "liger"))
                print(profile_table(rows[-1]), flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"env": timing.env_info(), "profile": rows}, f, indent=1, default=str)
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
