"""FP8 experts on a GPU: gemmlab.moe_forward on a PackedMoEFP8 against gemmlab's own bf16 moe_forward on the same
(dequantized) weights, verified first, timed interleaved, in eager and in CUDA-graph replay: ``gemmlab bench fp8
--suite moe``'s rows (``gemmlab.bench.fp8``, the one implementation), written where benchmarks/results readers look.

Per token count one interleaved run of both candidates (``gemmlab.bench.fp8.moe_row``), baseline bf16:
    bf16   gemmlab.moe_forward(x, pack_moe_weights(w1, w2), None, weights, ids), w1/w2 the FP8 weights dequantized
    fp8    gemmlab.moe_forward(x, pack_moe_fp8(...), None, weights, ids): e4m3 weights with 128x128 block scales,
           activations quantized per 1x128 block on the fly
at DeepSeek-V3's routed experts (H 7168, I 2048, E 256, top_k 8, sigmoid routing of random logits), T 4096 and 128.
Checks: fp8 against ``gemmlab.ref.moe_fp8_ref`` under its bound (``moe_fp8_check``), bf16 by ``gemmlab.ref.moe_check``.
TFLOPS = 2 * T * k * 3 * H * I / t (the three expert matmuls of each routed row). The ratio is a speed, the median
over rounds of bf16's time / fp8's (> 1: FP8 is faster; issue 25 names the target), with its 95%
interval. Writes <out>/<gpu>-fp8-moe.json (GPU, clocks, versions, git SHA: GEMMLAB_GIT_SHA where the checkout is
not a git one) and prints the table last (--quick: T 4096 only).

    PYTHONPATH=src python -m benchmarks fp8-moe [--quick] [--rounds 10] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import sys

import torch

from gemmlab.bench import fp8, fp8_view
from gemmlab.bench.fp8_view import short
from gemmlab.device import gpu_slug
from gemmlab.instruments import timing

DIMS = fp8.DSV3_MOE
TOKENS, QUICK = fp8.MOE_TOKENS, fp8.MOE_QUICK
MODES = ("eager", "graph")


def run_tokens(t, packs, args):
    row = fp8.moe_row(t, packs, MODES, top_k=DIMS["top_k"], rounds=args.rounds)
    for mode in MODES:
        tf = {c: round(v, 1) for c, v in row[f"{mode}_tflops"].items()}
        print(
            f"T={t:<5} {mode:<5} TFLOPS {tf}  fp8/bf16 {short(row[f'{mode}_fp8/bf16'])}  "
            f"checks {row[f'{mode}_checks']}",
            flush=True,
        )
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only T {', '.join(map(str, QUICK))}")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    problem = fp8_view.script_problem("fp8_moe", args.rounds, torch.cuda.is_available())
    if problem:
        print(problem, file=sys.stderr)
        return 2
    env = timing.env_info()
    packs = fp8.moe_packs(DIMS["h"], DIMS["i"], DIMS["e"])
    rows = [run_tokens(t, packs, args) for t in TOKENS if not args.quick or t in QUICK]
    path = fp8_view.write_script_json(
        args.out,
        gpu_slug(torch.cuda.get_device_name()),
        "moe",
        args.quick,
        {"env": env, "args": vars(args), "method": __doc__.split("\n\n")[1], "rows": rows},
    )
    print(f"wrote {path}")
    print("\ntokens  mode   TFLOPS bf16  TFLOPS fp8  fp8/bf16  checks")
    for row in rows:
        for mode in MODES:
            tf = {c: round(v, 1) for c, v in row[f"{mode}_tflops"].items()}
            print(
                f"{row['tokens']:<7} {mode:<6} {tf.get('bf16', '-'):>11}  {tf.get('fp8', '-'):>10}  "
                f"{short(row[f'{mode}_fp8/bf16']):>8}  {'ok' if all(row[f'{mode}_checks'].values()) else 'FAILED'}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
