"""Known-bad FP8 GEMMs in the fp8 signature FN(a, b, a_scale, b_scale, c, M, N, K): a (M, K) and b (N, K) e4m3,
scales () or (M, 1) and (1, N) fp32, c (M, N) written in place (``gemmlab.sandbox.candidate``). Each breaks one
rule of the fp8 grader (tests/grade/test_fp8_grade.py); ``dequantized_fp32`` is their honest twin (no vendor GEMM:
a float32 matmul on the CPU is torch's BLAS, so it runs with --allow-vendor)."""

import time
import traceback

import torch

PERF_M = 24  # the performance case's M in tests/cases/fp8-small.json


def _timed() -> bool:
    """Whether this call is one of a timed batch (the worker's timing loop, ``time_calls``, is on the stack)."""
    return any(f.f_code.co_name == "time_calls" for f, _ in traceback.walk_stack(None))


def _exact32(a, b, a_scale, b_scale):
    """(A a_scale) @ (B b_scale) from the e4m3 values as given, fp32 throughout: (M, N) float32."""
    return (a.float() * a_scale) @ (b.float() * b_scale.t()).t()


def dequantized_fp32(a, b, a_scale, b_scale, c, M, N, K):
    c.copy_(_exact32(a, b, a_scale, b_scale))


def ignores_scales(a, b, a_scale, b_scale, c, M, N, K):
    """The e4m3 codes multiplied as if every scale were 1."""
    c.copy_(a.float() @ b.float().t())


def bf16_arithmetic(a, b, a_scale, b_scale, c, M, N, K):
    """Dequantized and rounded to bf16, then multiplied in bf16 with bf16 partial sums (one per 16 of K)."""
    x, w = (a.float() * a_scale).bfloat16(), (b.float() * b_scale.t()).bfloat16()
    acc = torch.zeros((M, N), dtype=torch.bfloat16, device=c.device)
    for k in range(0, K, 16):
        acc = acc + (x[:, k : k + 16] @ w[:, k : k + 16].t())
    c.copy_(acc)


def rounds_toward_zero(a, b, a_scale, b_scale, c, M, N, K):
    """The exact fp32 product, rounded toward zero into C (within one ulp everywhere: the max-error bound passes)."""
    exact = _exact32(a, b, a_scale, b_scale)
    r = exact.to(c.dtype)
    bits = r.view(torch.int16)
    c.copy_(torch.where(r.float().abs() > exact.abs(), (bits - 1).view(c.dtype), r))


def rounds_toward_zero_when_timed(a, b, a_scale, b_scale, c, M, N, K):
    """Honest through every check of the timed size (its exact-shape trials), toward zero while timed."""
    if M == PERF_M and _timed():
        return rounds_toward_zero(a, b, a_scale, b_scale, c, M, N, K)
    return dequantized_fp32(a, b, a_scale, b_scale, c, M, N, K)


def slow_on_full_mantissa(a, b, a_scale, b_scale, c, M, N, K):
    """Honest arithmetic always, but a fast path only for quantized inputs: on e4m3 values with every mantissa bit
    set (the full-mantissa kind) each call takes 200 ms longer (tens of times a tiny call, past a busy CPU's noise)."""
    if bool(((a.view(torch.uint8) & 0x7) == 0x7).all()):
        time.sleep(0.2)
    dequantized_fp32(a, b, a_scale, b_scale, c, M, N, K)


def wrong_only_at_perf_size(a, b, a_scale, b_scale, c, M, N, K):
    """Right on every listed case, wrong at the timed size (the competition story)."""
    import gemmlab

    gemmlab.gemm_fp8(a, b.t(), a_scale, b_scale, out_dtype=c.dtype, out=c)
    if M == PERF_M:
        c.mul_(1.25)


def writes_part_of_c(a, b, a_scale, b_scale, c, M, N, K):
    """Only the first half of C's rows (rounded up): the rest keeps the grader's NaN poison."""
    c[: (M + 1) // 2].copy_(
        _exact32(a[: (M + 1) // 2], b, a_scale if a_scale.dim() == 0 else a_scale[: (M + 1) // 2], b_scale)
    )


# ------------------------------------------------------------------------------- FP8 experts (moe_fp8 signature)
# FN(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out): x (T, H) bf16, w1 (E, 2I, H) and w2 (E, H, I)
# e4m3 with 128x128 block scales, out (T, H) written in place (tests/grade/test_fp8_moe_grade.py).


def _dequantized(q, scale):
    """(E, N, K) e4m3 times its (E, Nb, Kb) block scales, in bf16 (elementwise torch ops only: no vendor GEMM)."""
    s = scale.repeat_interleave(128, 1).repeat_interleave(128, 2)[:, : q.shape[1], : q.shape[2]]
    return (q.float() * s).to(torch.bfloat16)


def bf16_on_dequantized_weights(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """The contract's violation: gemmlab's bf16 layer on the dequantized weights, activations never quantized."""
    import gemmlab

    out.copy_(gemmlab.moe_forward(x, _dequantized(w1, w1_scale), _dequantized(w2, w2_scale), topk_weights, topk_ids))


def ignores_topk_weights(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """Sums the experts' outputs without the top-k weights."""
    import gemmlab

    packed = gemmlab.PackedMoEFP8(w1, w1_scale, w2, w2_scale)
    out.copy_(gemmlab.moe_forward(x, packed, None, torch.ones_like(topk_weights), topk_ids))


def writes_part_of_out(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """The right layer, but only the first half of each row of out (rounded up): the rest keeps the NaN poison."""
    import gemmlab

    y = gemmlab.moe_forward(x, gemmlab.PackedMoEFP8(w1, w1_scale, w2, w2_scale), None, topk_weights, topk_ids)
    half = (out.shape[1] + 1) // 2
    out[:, :half].copy_(y[:, :half])
