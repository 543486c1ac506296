"""The FP8 ops as ``torch.library`` custom ops, with fake (meta) implementations for ``torch.compile``; no autograd.

    gemmlab::gemm_fp8(a (M, K), b (K, N), a_scale, b_scale, out_dtype=bfloat16) -> (M, N)
    gemmlab::gemm_fp8_out(a, b, a_scale, b_scale, out!)                          out= variant, out's dtype
    gemmlab::quantize_fp8(x, granularity="tensor", block=[1, 128]) -> (q e4m3, scale fp32)
    gemmlab::grouped_gemm_fp8(x (S, K), w (E, N, K), offsets, x_scale?, w_scale, out_dtype, validate) -> (S, N)
    gemmlab::grouped_gemm_fp8_out(x, w, offsets, x_scale?, w_scale, out!, validate)      out= variant, out's dtype
    gemmlab::moe_forward_fp8(x (T, H), w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, validate) -> (T, H)

Registered on ``import gemmlab`` (torch and the checks only; each op's body imports its launcher on first call, as
``ops.gemm.custom`` does). Each op checks its arguments in the real implementation and, on metadata, in the fake one.
"""

import torch
from torch import Tensor

from gemmlab.ops.dispatch import negative_kernel
from gemmlab.ops.fp8.checks import FP8, check_gemm_fp8_args, check_quantize_args, quantize_scale_shape
from gemmlab.ops.fp8.moe_checks import check_grouped_fp8_args, check_moe_fp8_args


def _launch_gemm_fp8(a, b, a_scale, b_scale, out_dtype, out):
    from gemmlab.ops.fp8.launch import launch_gemm_fp8  # (the first call loads the kernel)

    return launch_gemm_fp8(a, b, a_scale, b_scale, out_dtype, out)


@torch.library.custom_op("gemmlab::gemm_fp8", mutates_args=())
def gemm_fp8(a: Tensor, b: Tensor, a_scale: Tensor, b_scale: Tensor, out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    return _launch_gemm_fp8(a, b, a_scale, b_scale, out_dtype, None)


@gemm_fp8.register_fake
def _(a, b, a_scale, b_scale, out_dtype=torch.bfloat16):
    check_gemm_fp8_args(a, b, a_scale, b_scale, out_dtype)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


@torch.library.custom_op("gemmlab::gemm_fp8_out", mutates_args=("out",))
def gemm_fp8_out(a: Tensor, b: Tensor, a_scale: Tensor, b_scale: Tensor, out: Tensor) -> None:
    _launch_gemm_fp8(a, b, a_scale, b_scale, out.dtype, out)


@gemm_fp8_out.register_fake
def _(a, b, a_scale, b_scale, out):
    check_gemm_fp8_args(a, b, a_scale, b_scale, out.dtype, out)


negative_kernel("gemm_fp8_out", 4)


@torch.library.custom_op(
    "gemmlab::quantize_fp8",
    mutates_args=(),
    schema='(Tensor x, str granularity="tensor", int[2] block=[1, 128]) -> (Tensor, Tensor)',
)
def quantize_fp8(x: Tensor, granularity: str = "tensor", block: tuple[int, int] = (1, 128)) -> tuple[Tensor, Tensor]:
    from gemmlab.ops.fp8.quantize import launch_quantize_fp8

    return launch_quantize_fp8(x, granularity, block)


@quantize_fp8.register_fake
def _(x, granularity="tensor", block=(1, 128)):
    blk = check_quantize_args(x, granularity, block)
    scale = x.new_empty(quantize_scale_shape(tuple(x.shape), granularity, blk), dtype=torch.float32)
    return x.new_empty(x.shape, dtype=FP8), scale


@torch.library.custom_op("gemmlab::grouped_gemm_fp8", mutates_args=())
def grouped_gemm_fp8(
    x: Tensor,
    w: Tensor,
    offsets: Tensor,
    x_scale: Tensor | None,
    w_scale: Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    validate: bool = True,
) -> Tensor:
    from gemmlab.ops.fp8.moe_launch import launch_grouped_gemm_fp8

    return launch_grouped_gemm_fp8(x, w, offsets, x_scale, w_scale, out_dtype, validate)


@grouped_gemm_fp8.register_fake
def _(x, w, offsets, x_scale, w_scale, out_dtype=torch.bfloat16, validate=True):
    s, _, _, n = check_grouped_fp8_args(x, w, offsets, x_scale, w_scale, out_dtype)
    return x.new_empty((s, n), dtype=out_dtype)


@torch.library.custom_op("gemmlab::grouped_gemm_fp8_out", mutates_args=("out",))
def grouped_gemm_fp8_out(
    x: Tensor, w: Tensor, offsets: Tensor, x_scale: Tensor | None, w_scale: Tensor, out: Tensor, validate: bool = True
) -> None:
    from gemmlab.ops.fp8.moe_launch import launch_grouped_gemm_fp8

    launch_grouped_gemm_fp8(x, w, offsets, x_scale, w_scale, out.dtype, validate, out)


@grouped_gemm_fp8_out.register_fake
def _(x, w, offsets, x_scale, w_scale, out, validate=True):
    check_grouped_fp8_args(x, w, offsets, x_scale, w_scale, out.dtype, out)


negative_kernel("grouped_gemm_fp8_out", 5)


@torch.library.custom_op("gemmlab::moe_forward_fp8", mutates_args=())
def moe_forward_fp8(
    x: Tensor,
    w1: Tensor,
    w1_scale: Tensor,
    w2: Tensor,
    w2_scale: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    validate: bool = True,
) -> Tensor:
    from gemmlab.ops.fp8.moe_launch import launch_moe_forward_fp8

    return launch_moe_forward_fp8(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, validate)


@moe_forward_fp8.register_fake
def _(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, validate=True):
    check_moe_fp8_args(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids)
    return torch.empty_like(x, memory_format=torch.contiguous_format)
