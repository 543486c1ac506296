"""Small experts and small T (issue 15): ``moe_forward``'s configs against candidates, Liger and the HBM roofline.

    PYTHONPATH=src python3 benchmarks/sweep_moe_small.py [--cases NAME ...] [--modes eager graph]
        [--liger pinned|autotune|off] [--rounds 5] [--reps 3] [--out benchmarks/results/nvidia-h200-moe-small.jsonl]

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows.
Cases: Qwen3-30B-A3B (E 128, k 8, H 2048, I 768) and OLMoE-1B-7B (E 64, k 8, H 2048, I 1024), bf16, T in
{1, 16, 64, 256, 1024, 4096} uniform, plus Zipf T = 128 (the problem of ``gemmlab bench moe``).
Candidates per case (``moe_forward(..., configs=(gate_up, down))``, which pins both launches; the down
launch takes the gate/up BLOCK_M): "current" (what ``moe_config`` picks now: tiles sized from the host's bound
on the largest group, min(T, S)), "mean" (the rule before it: 16-row tiles whenever groups average <= 16
rows), and the pairs of ``FAMILIES`` whose T range holds the case (stages trimmed as ``moe_config`` trims
them, for ``programs_per_sm`` programs per SM). Liger-Kernel's ``LigerFusedMoEFunction`` when importable:
"pinned" sets LIGER_FUSED_MOE_AUTOTUNE=0 (one config per kernel: the runtime budget), "autotune" lets it tune
(Triton's autotuner; slow: minutes). Liger reads its tile count on the host (one .item()), so it has no CUDA
graph: in graph mode it is left out and ratio_vs_liger is None.
Every candidate is checked against the float32 reference (``ref.moe_check``) before timing and after;
timing is ``instruments.compare.compare_many``: interleaved rounds, L2 flushed, median of rounds x reps.
Printed per case and mode: median ms, TFLOPS (2*S*H*2I + 2*S*I*H over the median), x_bound = time /
(bytes of the experts hit / HBM copy bandwidth), where bytes = experts hit * 3*H*I * 2 (bf16 weights read
once) and the bandwidth is ``probe.hbm_copy_gbps`` measured once at start (read + write bytes of a 1 GiB
device copy), vs_liger (Liger's time / ours, > 1: gemmlab faster; eager only) and vs_current.
JSONL to --out: one "env" line, then one line per (case, mode, candidate) with the exact configs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from gemmlab.bench import moe as bm
from gemmlab.device import target_for
from gemmlab.instruments.compare import compare_many
from gemmlab.instruments.stats import ratio_summary
from gemmlab.instruments.timing import env_info
from gemmlab.ops.moe import MoEConfig, moe_config, moe_forward
from gemmlab.ops.moe_config import fit_stages
from gemmlab.problems import MOE_MODELS, MoEModel
from gemmlab.ref import moe_check, moe_ref
from sweep_moe_configs import C as C1  # benchmarks/ is sys.path[0] when run as a script
from sweep_moe_configs import name_of

MODELS = {"qwen3-30b-a3b": MOE_MODELS["qwen3-30b-a3b"],
          "olmoe-1b-7b": MOE_MODELS.get("olmoe-1b-7b", MoEModel(hidden=2048, intermediate=1024, experts=64, top_k=8))}
CASES = {f"{m}:{t}:{r}": (m, t, r) for m in MODELS for t, r in
         [(1, "uniform"), (16, "uniform"), (64, "uniform"), (128, "zipf"), (256, "uniform"), (1024, "uniform"),
          (4096, "uniform")]}


def C(bm_: int, bn: int, bk: int, w: int, s: int, p: int = 1) -> MoEConfig:
    return replace(C1(bm_, bn, bk, w, s), programs_per_sm=p)


# (T range, [(gate_up, down), ...]): the candidate space, as data. Why each: the report of issue 15's helper
# "moesmall" (the grid is num_sms persistent programs, one resident per SM; at T <= 16 the gate/up has only
# E_hit * I / BLOCK_N work items, e.g. 8 * 768 / 128 = 48 for Qwen3 at T = 1, so most SMs stream nothing).
FAMILIES: list[tuple[tuple[int, int], list[tuple[MoEConfig, MoEConfig]]]] = [
    ((1, 64), [  # BLOCK_M 16 (mma.sync): every group fits one tile at T <= 16
        (C(16, 64, 128, 4, 3, p=2), C(16, 128, 128, 4, 3, p=2)),
        (C(16, 32, 64, 4, 5, p=4), C(16, 64, 64, 4, 5, p=4)),
        (C(16, 16, 128, 2, 4, p=4), C(16, 64, 64, 4, 5, p=4)),  # T = 1: >= 384 gate/up items of 16 columns
    ]),
    ((1, 1024), [  # BLOCK_M 64 (HGMMA; Liger's BLOCK_M): one tile per expert while groups hold <= 64 rows
        (C(64, 64, 64, 4, 4), C(64, 64, 64, 4, 4)),  # Liger's tile shape, one program per SM ...
        (C(64, 64, 64, 4, 4, p=2), C(64, 64, 64, 4, 4, p=2)),  # ... and two (separates the shape from the count)
        (C(64, 128, 32, 8, 4, p=2), C(64, 128, 64, 4, 4, p=2)),
        (C(64, 32, 64, 4, 3, p=4), C(64, 64, 64, 4, 3, p=4)),  # narrow N: more programs streaming at small T
        (C(64, 64, 64, 4, 2, p=8), C(64, 128, 64, 4, 2, p=8)),  # ~a program per work item (Liger's grid):
    ]),  # more than fit at once; the rest wait for a slot
    ((1024, 1 << 30), [  # BLOCK_M 128 (the large-expert tiles) with more programs per SM
        (C(128, 64, 64, 8, 3, p=2), C(128, 128, 64, 8, 3, p=2)),
        (C(128, 128, 64, 8, 4), C(128, 128, 64, 8, 4)),  # down at BLOCK_N 128: twice the programs along H
    ]),
]
OVERSUBSCRIBED = 8  # programs_per_sm from which a pair is not meant to fit in shared memory all at once


def fitted(pair: tuple[MoEConfig, MoEConfig]) -> tuple[MoEConfig, MoEConfig]:
    """The pair as a launch uses it: stages trimmed as ``moe_config`` trims them; down takes gate/up's BLOCK_M."""
    g, d = pair
    return fit_stages(g, 1, 2), fit_stages(replace(d, block_m=g.block_m), 2, 2)


def label(pair: tuple[MoEConfig, MoEConfig]) -> str:
    return " + ".join(name_of(c) + (f" p{c.programs_per_sm}" if c.programs_per_sm > 1 else "") for c in pair)


def candidates(model: MoEModel, t: int, target) -> dict[str, tuple[MoEConfig, MoEConfig]]:
    s, e, h, i = t * model.top_k, model.experts, model.hidden, model.intermediate
    cur = fitted((moe_config(target, s, e, 1, 2, dtype=torch.bfloat16, n=i, k=h, max_group=t),
                  moe_config(target, s, e, 2, 2, dtype=torch.bfloat16, n=h, k=i, max_group=t)))
    out = {"current": cur}
    if -(-s // max(1, min(e, s))) <= 16:  # the mean rule: 16-row tiles (configs/nvidia-h200.json before issue 15)
        out["mean"] = fitted((C(16, 128, 64, 4, 4), C(16, 128, 64, 4, 4)))
    for (lo, hi), pairs in FAMILIES:
        if lo <= t <= hi:
            for p in pairs:
                f = fitted(p)
                if f not in out.values():
                    out[label(f)] = f
    return out


def liger_fn(mode: str):
    """LigerFusedMoEFunction.apply(x, w1 (E, 2I, H), w2 (E, H, I), topk_ids (T, k) int32, topk_weights (T, k)),
    or None (not importable / off). The env var must be set before liger_kernel is imported."""
    if mode == "off":
        return None, "off"
    os.environ["LIGER_FUSED_MOE_AUTOTUNE"] = "0" if mode == "pinned" else "1"
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
    except Exception as e:  # not installed, or it does not import here
        return None, f"not importable ({type(e).__name__}: {str(e)[:120]})"
    import liger_kernel

    return LigerFusedMoEFunction.apply, f"liger-kernel {getattr(liger_kernel, '__version__', '?')} ({mode})"


def run_case(name: str, args, bw_gbps: float, liger, target) -> list[dict]:
    model_name, t, routing = CASES[name]
    model = MODELS[model_name]
    p = bm.problem(model, t, routing, torch.bfloat16, seed=t)
    x, w1, w2, wts, ids = p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
    s, h, i, e = t * model.top_k, model.hidden, model.intermediate, model.experts
    ref = moe_ref(x, w1, w2, wts, ids)
    counts = torch.bincount(ids.reshape(-1).long(), minlength=e)
    hit = int((counts > 0).sum())
    hit_bytes = hit * 3 * h * i * w1.element_size()
    bound_ms = hit_bytes / (bw_gbps * 1e9) * 1e3
    flops = 2.0 * s * h * 2 * i + 2.0 * s * i * h
    cands = candidates(model, t, target)

    def check(out):
        c = moe_check(out, x, w1, w2, wts, ids, ref)
        return {key: c[key] for key in ("ok", "max_abs_err", "allowed")}

    ids32 = ids.to(torch.int32)

    def lig():
        with torch.no_grad():
            return liger(x, w1, w2, ids32, wts)

    rows = []
    for mode in args.modes:
        fns = {n: (lambda c=c: moe_forward(x, w1, w2, wts, ids, validate=False, configs=c)) for n, c in cands.items()}
        fns["default call"] = lambda: moe_forward(x, w1, w2, wts, ids, validate=False)  # the user's path
        use_liger = liger is not None and mode == "eager"
        if use_liger:
            fns["liger"] = lig
        res = compare_many(fns, "current", check=check, flops=flops, dtype="bfloat16", rounds=args.rounds,
                           reps=args.reps, warmup_s=args.warmup, graph=mode == "graph")
        c_all = res["candidates"]
        cur_ms = c_all["current"].get("median_ms")
        lig = c_all.get("liger", {})
        lig_ms = lig.get("median_ms")
        for n, c in c_all.items():
            ms = c.get("median_ms")
            vs = ratio_summary(c["per_round_ms"], lig["per_round_ms"]) if ms and lig_ms and n != "liger" else {}
            vs_cur = (ratio_summary(c["per_round_ms"], c_all["current"]["per_round_ms"])
                      if ms and cur_ms and n != "current" else {})  # interleaved: the ledger's paired interval
            rows.append({
                "case": name, "model": model_name, "tokens": t, "routing": routing, "mode": mode, "candidate": n,
                "configs": [asdict(k) for k in cands[n]] if n in cands else None,  # None: default call, liger
                "ok": bool(c["check"].get("ok")) and c.get("check_after", True) is True,
                "check": c["check"], "median_ms": ms, "p20_ms": c.get("p20_ms"), "p80_ms": c.get("p80_ms"),
                "tflops": c.get("tflops"), "experts_hit": hit, "max_rows_per_expert": int(counts.max()),
                "hit_bytes": hit_bytes, "hbm_copy_gbps": bw_gbps, "bound_ms": bound_ms,
                "x_bound": ms / bound_ms if ms else None,
                "ratio_vs_liger": vs.get("ratio"), "ratio_vs_liger_ci95": vs.get("ci95"),
                "ratio_vs_current": cur_ms / ms if ms and cur_ms else None,
                "ratio_vs_current_ci95": vs_cur.get("ci95"), "vs_current_per_round": vs_cur.get("per_round"),
                "sm_clock_mhz": (c.get("clocks") or {}).get("sm_clock_mhz_mean")})
    return rows


def _f(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def print_case(rows: list[dict], seconds: float) -> None:
    r0 = rows[0]
    print(f"\n{r0['case']}  S={r0['tokens'] * MODELS[r0['model']].top_k}  experts hit {r0['experts_hit']}  "
          f"max rows/expert {r0['max_rows_per_expert']}  bound {r0['bound_ms']:.4f} ms "
          f"({r0['hit_bytes'] / 1e9:.3f} GB at {r0['hbm_copy_gbps']:.0f} GB/s)  [{seconds:.0f} s]", flush=True)
    print(f"  {'mode':5s} {'candidate':74s} {'ms':>8s} {'TFLOPS':>7s} {'x_bound':>7s} {'vs_liger':>8s} "
          f"{'vs_cur':>6s}")
    for r in sorted(rows, key=lambda r: (r["mode"], r["median_ms"] or 1e9)):
        state = "" if r["ok"] else f"  WRONG/NOT TIMED: {r['check']}"
        print(f"  {r['mode']:5s} {r['candidate'][:74]:74s} {_f(r['median_ms'], '8.4f')} {_f(r['tflops'], '7.1f')} "
              f"{_f(r['x_bound'], '7.2f')} {_f(r['ratio_vs_liger'], '8.3f')} {_f(r['ratio_vs_current'], '6.3f')}"
              f"{state}", flush=True)


def print_summary(rows: list[dict]) -> None:
    """Per case and mode: the current config against the fastest verified gemmlab candidate."""
    print(f"\n{'case':26s} {'mode':5s} {'current ms':>10s} {'x_bound':>7s} {'vs_liger':>8s}   best candidate "
          f"{'ms':>8s} {'x_bound':>7s} {'vs_liger':>8s} {'vs_cur':>6s}")
    for key in dict.fromkeys((r["case"], r["mode"]) for r in rows):
        mine = [r for r in rows if (r["case"], r["mode"]) == key and r["candidate"] != "liger" and r["ok"]
                and r["median_ms"]]
        cur = next((r for r in mine if r["candidate"] == "current"), None)
        if not mine or cur is None:
            print(f"{key[0]:26s} {key[1]:5s} no verified timing")
            continue
        best = min(mine, key=lambda r: r["median_ms"])
        print(f"{key[0]:26s} {key[1]:5s} {cur['median_ms']:10.4f} {_f(cur['x_bound'], '7.2f')} "
              f"{_f(cur['ratio_vs_liger'], '8.3f')}   {best['candidate'][:60]}\n{'':26s} {'':5s} {'':10s} {'':7s} "
              f"{'':8s}   {'':14s} {best['median_ms']:8.4f} {_f(best['x_bound'], '7.2f')} "
              f"{_f(best['ratio_vs_liger'], '8.3f')} {_f(best['ratio_vs_current'], '6.3f')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=list(CASES), help=f"of {', '.join(CASES)}")
    ap.add_argument("--modes", nargs="*", default=["eager", "graph"], choices=["eager", "graph"])
    ap.add_argument("--liger", default="pinned", choices=["pinned", "autotune", "off"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=0.2, help="seconds of warm-up per case and mode")
    ap.add_argument("--budget", type=float, default=170.0,
                    help="seconds: cases not started by then are skipped (and listed)")
    ap.add_argument("--out", default="benchmarks/results/nvidia-h200-moe-small.jsonl")
    args = ap.parse_args()
    bad = [c for c in args.cases if c not in CASES]
    if bad or not torch.cuda.is_available():
        print(f"sweep_moe_small: {'unknown cases ' + ', '.join(bad) if bad else 'needs a CUDA GPU'}", file=sys.stderr)
        raise SystemExit(2)
    from gemmlab.bench.probe import hbm_copy_gbps

    t_start = time.time()
    liger, liger_note = liger_fn(args.liger)
    bw = hbm_copy_gbps()
    print(f"HBM copy {bw['gbps']:.0f} GB/s (read + write of a {bw['bytes_per_copy'] >> 20} MiB copy); "
          f"Liger: {liger_note}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    target = target_for(torch.device("cuda"))
    every = []
    with out.open("w") as f:
        f.write(json.dumps({"env": env_info(), "hbm_copy": bw, "liger": liger_note, "args": vars(args)},
                           default=str) + "\n")
        for n_done, name in enumerate(args.cases):
            if time.time() - t_start > args.budget:
                print(f"\nbudget of {args.budget:.0f} s spent: skipped {', '.join(args.cases[n_done:])}", flush=True)
                break
            t0 = time.time()
            rows = run_case(name, args, bw["gbps"], liger, target)
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")
            f.flush()
            print_case(rows, time.time() - t0)
            every += rows
            torch.cuda.empty_cache()
    print_summary(every)
    print(f"\nwrote {out} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
