"""FP8 dense GEMM on a GPU: gemmlab.gemm_fp8 against torch._scaled_mm (cuBLASLt) and gemmlab's own bf16, verified
first, timed interleaved, in eager and in CUDA-graph replay: ``gemmlab bench fp8 --suite dense``'s rows
(``gemmlab.bench.fp8``, the one implementation), at the shapes below, written where benchmarks/results readers look.

Per shape one interleaved run of every candidate (``gemmlab.bench.fp8.dense_row``), baseline torch._scaled_mm with
per-tensor scales: scaled_mm, fp8_tensor (gemm_fp8 per tensor), fp8_block (A 1x128, B 128x128) and bf16
(gemmlab.gemm on the dequantized operands, only at 8192^3), each output checked against
the float64 reference of its own operands under ``gemmlab.ref.gemm_fp8_bound`` (bf16: ``gemmlab.ref.gemm_check``).
TFLOPS = 2*M*N*K / t. Ratios are speeds, the median over rounds of the denominator's time / the numerator's (> 1:
the numerator is faster), with their 95% intervals: fp8_tensor / scaled_mm, fp8_block / fp8_tensor and
fp8_tensor / bf16 (issue 25 names the targets). Shapes: ``gemmlab.bench.fp8.DENSE_SHAPES``.
Writes <out>/<gpu>-fp8-dense.json (GPU, clocks, versions, git SHA: GEMMLAB_GIT_SHA where the checkout is not a git
one) and prints the table last (--quick: two shapes).

    PYTHONPATH=src python -m benchmarks fp8-dense [--quick] [--rounds 10] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from gemmlab.bench import fp8, fp8_view
from gemmlab.bench.fp8_view import short
from gemmlab.device import gpu_slug
from gemmlab.instruments import timing

SHAPES = fp8.DENSE_SHAPES
QUICK = fp8.DENSE_QUICK
BF16_AT = ("square-8192",)
MODES = ("eager", "graph")


def run_shape(name, shape, args):
    row = fp8.dense_row(name, shape, MODES, with_bf16=name in BF16_AT, rounds=args.rounds)
    print(_line(row), flush=True)
    return row


def _line(row):
    cells = [f"{row['shape']:<18}"]
    for mode in MODES:
        t, r, ok = row[f"{mode}_tflops"], row[f"{mode}_ratios"], row[f"{mode}_checks"]
        tf = {c: f"{v:.1f}" for c, v in t.items()}
        cells.append(
            f"{mode}: TFLOPS mm {tf.get('scaled_mm', '-')} t {tf.get('fp8_tensor', '-')} "
            f"b {tf.get('fp8_block', '-')}"
            + (f" bf16 {tf['bf16']}" if "bf16" in tf else "")
            + f" | t/mm {short(r['fp8_tensor/scaled_mm'])} b/t {short(r['fp8_block/fp8_tensor'])}"
            + (f" t/bf16 {short(r['fp8_tensor/bf16'])}" if r["fp8_tensor/bf16"] else "")
            + ("" if all(ok.values()) else f" CHECK FAILED {[c for c, v in ok.items() if not v]}")
        )
    return "  ".join(cells)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    problem = fp8_view.script_problem("fp8_dense", args.rounds, torch.cuda.is_available())
    if problem:
        print(problem, file=sys.stderr)
        return 2
    env = timing.env_info()
    rows = [run_shape(name, shape, args) for name, shape in SHAPES.items() if not args.quick or name in QUICK]
    path = fp8_view.write_script_json(
        args.out,
        gpu_slug(torch.cuda.get_device_name()),
        "dense",
        args.quick,
        {"env": env, "args": vars(args), "method": __doc__.split("\n\n")[1], "rows": rows},
    )
    print(f"wrote {path}")
    print("\nshape               mode   fp8_tensor/scaled_mm  fp8_block/fp8_tensor  fp8_tensor/bf16  checks")
    for row in rows:
        for mode in MODES:
            r = row[f"{mode}_ratios"]
            print(
                f"{row['shape']:<19} {mode:<6} {short(r['fp8_tensor/scaled_mm']):>20}  "
                f"{short(r['fp8_block/fp8_tensor']):>20}  {short(r['fp8_tensor/bf16']):>15}  "
                f"{'ok' if all(row[f'{mode}_checks'].values()) else 'FAILED'}"
            )
    medians = [row[f"{m}_ratios"]["fp8_tensor/scaled_mm"] for row in rows for m in MODES]
    medians = [x for x in medians if x is not None]
    if medians:
        print(f"median fp8_tensor/scaled_mm over shapes and modes: {statistics.median(medians):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
