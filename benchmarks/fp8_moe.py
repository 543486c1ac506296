"""FP8 experts on a GPU: gemmlab.moe_forward on a PackedMoEFP8 against gemmlab's own bf16 moe_forward on the same
(dequantized) weights, verified first, timed interleaved, in eager and in CUDA-graph replay.

Per token count one interleaved run of both candidates (``instruments.compare.compare_many``: verified on the timed
call, L2 flushed, CUDA events, rounds alternating the order, checked again after timing), baseline bf16:
    bf16   gemmlab.moe_forward(x, pack_moe_weights(w1, w2), None, weights, ids), w1/w2 the FP8 weights dequantized
    fp8    gemmlab.moe_forward(x, pack_moe_fp8(...), None, weights, ids): e4m3 weights with 128x128 block scales,
           activations quantized per 1x128 block on the fly
at DeepSeek-V3's routed experts (H 7168, I 2048, E 256, top_k 8, sigmoid routing of random logits), T 4096 and 128.
Checks: fp8 against ``gemmlab.ref.moe_fp8_ref`` under its bound (``moe_fp8_check``), bf16 by ``gemmlab.ref.moe_check``.
TFLOPS = 2 * T * k * 3 * H * I / t (the three expert matmuls of each routed row). The ratio is a speed, the median
over rounds of bf16's time / fp8's (> 1: FP8 is faster; the issue's target is >= 1.5 at T 4096).
Writes <out>/<gpu>-fp8-moe.json (GPU, clocks, versions, git SHA: GEMMLAB_GIT_SHA where the checkout is not a git
one) and prints the table last. Sized to finish within 6 minutes on an H200 (not yet run there; --quick: T 4096
only).

    PYTHONPATH=src python -m benchmarks fp8-moe [--quick] [--rounds 10] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import gemmlab
from gemmlab.device import gpu_slug
from gemmlab.instruments import stats, timing
from gemmlab.instruments.compare import compare_many
from gemmlab.ref import dequantize_fp8, moe_check, moe_fp8_ref, moe_ref

H, INTER, E, TOP_K = 7168, 2048, 256, 8  # DeepSeek-V3's routed experts
TOKENS = (4096, 128)
QUICK = (4096,)


def _weights():
    """(PackedMoEFP8, PackedMoE of the same weights dequantized to bf16)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = torch.randn(E, 2 * INTER, H, generator=g, device="cuda", dtype=torch.bfloat16) / H**0.5
    w2 = torch.randn(E, H, INTER, generator=g, device="cuda", dtype=torch.bfloat16) / INTER**0.5
    fp8 = gemmlab.pack_moe_fp8(w1, w2)
    for w, q, s in ((w1, fp8.w1, fp8.w1_scale), (w2, fp8.w2, fp8.w2_scale)):
        for e in range(E):  # the bf16 candidate multiplies the same values: FP8's, dequantized
            w[e].copy_(dequantize_fp8(q[e], s[e], (128, 128)).to(torch.bfloat16))
    bf16 = gemmlab.pack_moe_weights(w1, w2)
    del w1, w2
    torch.cuda.empty_cache()
    return fp8, bf16


def _checker(x, weights, ids, fp8, w1, w2):
    """One check routing each candidate's output to its own reference (each computed once)."""
    ref8, bound8 = moe_fp8_ref(x, fp8, weights, ids, bound=True)
    ref16 = moe_ref(x, w1, w2, weights, ids)
    owner: dict[int, str] = {}  # output address -> the candidate that wrote it last

    def check_fp8(y):
        finite = bool(torch.isfinite(y).all())
        worst = ((y.double() - ref8).abs() / bound8).max().item() if finite else float("inf")
        return {"ok": finite and worst <= 1.0, "worst": worst}

    def check(y):
        if owner.get(y.data_ptr()) == "fp8":
            return check_fp8(y)
        return moe_check(y, x, w1, w2, weights, ids, ref=ref16)

    def tagged(name, fn):
        def call():
            y = fn()
            owner[y.data_ptr()] = name
            return y
        return call

    return check, tagged


def _speed(res, cand, base):
    c = res["candidates"]
    if not res.get("timed") or "per_round_ms" not in c.get(cand, {}) or "per_round_ms" not in c.get(base, {}):
        return None
    return stats.ratio_summary(c[cand]["per_round_ms"], c[base]["per_round_ms"])["ratio"]


def run_tokens(t, packs, args):
    fp8, bf16 = packs
    g = torch.Generator(device="cuda").manual_seed(t)
    x = torch.randn(t, H, generator=g, device="cuda", dtype=torch.bfloat16)
    weights, ids = gemmlab.route(torch.randn(t, E, generator=g, device="cuda"), TOP_K, scoring="sigmoid")
    check, tagged = _checker(x, weights, ids, fp8, bf16.w1, bf16.w2)
    fns = {"bf16": tagged("bf16", lambda: gemmlab.moe_forward(x, bf16, None, weights, ids)),
           "fp8": tagged("fp8", lambda: gemmlab.moe_forward(x, fp8, None, weights, ids))}
    flops = 2.0 * t * TOP_K * 3 * H * INTER
    row = {"tokens": t, "h": H, "i": INTER, "e": E, "top_k": TOP_K}
    for graph in (False, True):
        res = compare_many(fns, "bf16", check=check, flops=flops, dtype="float8_e4m3fn", rounds=args.rounds,
                           reps=5, warmup_s=0.3, graph=graph)
        mode = "graph" if graph else "eager"
        row[mode] = res
        row[f"{mode}_tflops"] = {c: round(v["tflops"], 1) for c, v in res["candidates"].items() if "tflops" in v}
        row[f"{mode}_fp8/bf16"] = _speed(res, "fp8", "bf16")
        row[f"{mode}_checks"] = {c: bool(v["check"].get("ok") and v.get("check_after", True))
                                 for c, v in res["candidates"].items()}
        print(f"T={t:<5} {mode:<5} TFLOPS {row[f'{mode}_tflops']}  fp8/bf16 {_fmt(row[f'{mode}_fp8/bf16'])}  "
              f"checks {row[f'{mode}_checks']}", flush=True)
    return row


def _fmt(x):
    return "-" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only T {', '.join(map(str, QUICK))}")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_moe: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.rounds < 6:
        print("fp8_moe: --rounds must be at least 6 (the ratio's 95% interval)", file=sys.stderr)
        return 2
    env = timing.env_info()
    packs = _weights()
    rows = [run_tokens(t, packs, args) for t in TOKENS if not args.quick or t in QUICK]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{gpu_slug(torch.cuda.get_device_name())}-fp8-moe{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps({"env": env, "args": vars(args), "method": __doc__.split("\n\n")[1], "rows": rows},
                               indent=1, default=str))
    print(f"wrote {path}")
    print("\ntokens  mode   TFLOPS bf16  TFLOPS fp8  fp8/bf16  checks")
    for row in rows:
        for mode in ("eager", "graph"):
            tf = row[f"{mode}_tflops"]
            print(f"{row['tokens']:<7} {mode:<6} {tf.get('bf16', '-'):>11}  {tf.get('fp8', '-'):>10}  "
                  f"{_fmt(row[f'{mode}_fp8/bf16']):>8}  {'ok' if all(row[f'{mode}_checks'].values()) else 'FAILED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
