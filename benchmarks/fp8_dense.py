"""FP8 dense GEMM on a GPU: gemmlab.gemm_fp8 against torch._scaled_mm (cuBLASLt) and gemmlab's own bf16, verified
first, timed interleaved, in eager and in CUDA-graph replay.

Per shape one interleaved run of every candidate (``instruments.compare.compare_many``: verified on the timed call,
L2 flushed, CUDA events, rounds alternating the order, checked again after timing), baseline torch._scaled_mm with
per-tensor scales:
    scaled_mm        torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=bf16), per-tensor scales, b K-major
    fp8_tensor       gemmlab.gemm_fp8, per-tensor scales (the same operands)
    fp8_block        gemmlab.gemm_fp8, block scales: A 1x128, B 128x128 (the same data quantized that way)
    bf16             gemmlab.gemm on the dequantized operands in bf16 (only at 8192^3: the issue's 1.6x target)
Each output is checked against the float64 reference of its own operands under ``gemmlab.ref.gemm_fp8_bound``
(bf16: ``gemmlab.ref.gemm_check``). TFLOPS = 2*M*N*K / t. Ratios are speeds, the median over rounds of the
denominator's time / the numerator's (> 1: the numerator is faster): fp8_tensor / scaled_mm (issue target >= 1.00),
fp8_block / fp8_tensor (>= 0.9), fp8_tensor / bf16 (>= 1.6 at 8192^3). Shapes: 4096^3, 8192^3,
8192x8192x16384, and DeepSeek-V3's nn.Linear shapes at 4096 tokens (attention q_a, q_b, o; dense MLP gate/up, down).
Writes <out>/<gpu>-fp8-dense.json (GPU, clocks, versions, git SHA: GEMMLAB_GIT_SHA where the checkout is not a git
one) and prints the table last. About 4 minutes on an H200 (--quick: two shapes).

    PYTHONPATH=src python -m benchmarks fp8-dense [--quick] [--rounds 10] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import gemmlab
from gemmlab.device import gpu_slug
from gemmlab.instruments import stats, timing
from gemmlab.instruments.compare import compare_many
from gemmlab.ref import gemm_check, gemm_fp8_bound, gemm_fp8_ref

SHAPES = {  # name: (M, N, K)
    "square-4096": (4096, 4096, 4096),
    "square-8192": (8192, 8192, 8192),
    "8192x8192x16384": (8192, 8192, 16384),
    "dsv3-q_a": (4096, 1536, 7168),
    "dsv3-q_b": (4096, 24576, 1536),
    "dsv3-o": (4096, 7168, 16384),
    "dsv3-mlp-gate/up": (4096, 18432, 7168),
    "dsv3-mlp-down": (4096, 7168, 18432),
}
QUICK = ("square-8192", "dsv3-o")
BF16_AT = ("square-8192",)


def _fp8_checker(qa, qb, sa, sb):
    """A check of outputs of (qa * sa) @ (qb * sb): the float64 reference and bound computed once."""
    ref = gemm_fp8_ref(qa, qb, sa, sb)
    bound = gemm_fp8_bound(qa, qb, sa, sb, torch.bfloat16, ref)

    def check(out):
        err = (out.double() - ref).abs()
        finite = bool(torch.isfinite(out).all())
        worst = (err / bound).max().item() if finite else float("inf")
        return {"ok": finite and worst <= 1.0, "worst": worst}

    return check


def _candidates(m, n, k, with_bf16):
    """The candidates' calls and one check routing each output to its own operands' reference."""
    g = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k)
    x = torch.randn(m, k, generator=g, device="cuda")
    w = torch.randn(n, k, generator=g, device="cuda")  # nn.Linear weight (N, K)
    qa, sa = gemmlab.quantize_fp8(x, "tensor")
    qw, sw = gemmlab.quantize_fp8(w, "tensor")
    qb = qw.t()  # (K, N) K-major: what torch._scaled_mm needs for b
    qa_blk, sa_blk = gemmlab.quantize_fp8(x, "block", (1, 128))
    qw_blk, sw_blk = gemmlab.quantize_fp8(w, "block", (128, 128))
    qb_blk, sb_blk = qw_blk.t(), sw_blk.t()
    del x, w
    out_t = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    out_b = torch.empty_like(out_t)
    checks = {out_b.data_ptr(): _fp8_checker(qa_blk, qb_blk, sa_blk, sb_blk)}
    tensor_check = _fp8_checker(qa, qb, sa, sw)
    fns = {
        "scaled_mm": lambda: torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sw, out_dtype=torch.bfloat16),
        "fp8_tensor": lambda: gemmlab.gemm_fp8(qa, qb, sa, sw, out=out_t),
        "fp8_block": lambda: gemmlab.gemm_fp8(qa_blk, qb_blk, sa_blk, sb_blk, out=out_b),
    }
    if with_bf16:
        a16 = (qa.float() * sa).to(torch.bfloat16)
        b16 = (qb.float() * sw).to(torch.bfloat16)
        out16 = torch.empty_like(out_t)
        checks[out16.data_ptr()] = lambda out: gemm_check(out, a16, b16)
        fns["bf16"] = lambda: gemmlab.gemm(a16, b16, out=out16)

    def check(out):
        return checks.get(out.data_ptr(), tensor_check)(out)

    return fns, check


def _speed(res, cand, base):
    """How much faster ``cand`` ran than ``base`` (base time / cand time, the median of per-round ratios)."""
    c = res["candidates"]
    if not res.get("timed") or "per_round_ms" not in c.get(cand, {}) or "per_round_ms" not in c.get(base, {}):
        return None
    return stats.ratio_summary(c[cand]["per_round_ms"], c[base]["per_round_ms"])["ratio"]


def run_shape(name, shape, args):
    m, n, k = shape
    fns, check = _candidates(m, n, k, name in BF16_AT)
    row = {"shape": name, "m": m, "n": n, "k": k}
    for graph in (False, True):
        res = compare_many(fns, "scaled_mm", check=check, flops=2.0 * m * n * k, dtype="float8_e4m3fn",
                           rounds=args.rounds, reps=5, warmup_s=0.3, graph=graph)
        mode = "graph" if graph else "eager"
        row[mode] = res
        row[f"{mode}_tflops"] = {c: round(v["tflops"], 1) for c, v in res["candidates"].items() if "tflops" in v}
        row[f"{mode}_ratios"] = {"fp8_tensor/scaled_mm": _speed(res, "fp8_tensor", "scaled_mm"),
                                 "fp8_block/fp8_tensor": _speed(res, "fp8_block", "fp8_tensor"),
                                 "fp8_tensor/bf16": _speed(res, "fp8_tensor", "bf16")}
        row[f"{mode}_checks"] = {c: v["check"].get("ok") and v.get("check_after", True)
                                 for c, v in res["candidates"].items()}
    print(_line(row), flush=True)
    return row


def _fmt(x):
    return "-" if x is None else f"{x:.2f}"


def _line(row):
    cells = [f"{row['shape']:<18}"]
    for mode in ("eager", "graph"):
        t, r, ok = row[f"{mode}_tflops"], row[f"{mode}_ratios"], row[f"{mode}_checks"]
        cells.append(f"{mode}: TFLOPS mm {t.get('scaled_mm', '-')} t {t.get('fp8_tensor', '-')} "
                     f"b {t.get('fp8_block', '-')}" + (f" bf16 {t['bf16']}" if "bf16" in t else "")
                     + f" | t/mm {_fmt(r['fp8_tensor/scaled_mm'])} b/t {_fmt(r['fp8_block/fp8_tensor'])}"
                     + (f" t/bf16 {_fmt(r['fp8_tensor/bf16'])}" if r["fp8_tensor/bf16"] else "")
                     + ("" if all(ok.values()) else f" CHECK FAILED {[c for c, v in ok.items() if not v]}"))
    return "  ".join(cells)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_dense: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.rounds < 6:
        print("fp8_dense: --rounds must be at least 6 (the ratio's 95% interval)", file=sys.stderr)
        return 2
    env = timing.env_info()
    rows = [run_shape(name, shape, args) for name, shape in SHAPES.items() if not args.quick or name in QUICK]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{gpu_slug(torch.cuda.get_device_name())}-fp8-dense{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps({"env": env, "args": vars(args), "method": __doc__.split("\n\n")[1], "rows": rows},
                               indent=1, default=str))
    print(f"wrote {path}")
    print("\nshape               mode   fp8_tensor/scaled_mm  fp8_block/fp8_tensor  fp8_tensor/bf16  checks")
    for row in rows:
        for mode in ("eager", "graph"):
            r = row[f"{mode}_ratios"]
            print(f"{row['shape']:<19} {mode:<6} {_fmt(r['fp8_tensor/scaled_mm']):>20}  "
                  f"{_fmt(r['fp8_block/fp8_tensor']):>20}  {_fmt(r['fp8_tensor/bf16']):>15}  "
                  f"{'ok' if all(row[f'{mode}_checks'].values()) else 'FAILED'}")
    medians = [row[f"{m}_ratios"]["fp8_tensor/scaled_mm"] for row in rows for m in ("eager", "graph")]
    medians = [x for x in medians if x is not None]
    if medians:
        print(f"median fp8_tensor/scaled_mm over shapes and modes: {statistics.median(medians):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
