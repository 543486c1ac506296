"""FP8 (e4m3), the public module: ``gemm_fp8`` and ``quantize_fp8``.

    C (M, N) = (A * a_scale) @ (B * b_scale)     A (M, K), B (K, N) float8_e4m3fn; scales fp32; fp32 accumulation
    (q, scale) = quantize_fp8(x, granularity)    x ~= q * scale; per tensor, row, column or block

Each call checks its operands, then goes to the launchers (``ops.fp8.launch``: planner, config, kernel launch;
``ops.fp8.quantize``: the quantizer) directly when eager, or through the ``torch.ops.gemmlab`` custom ops
(``ops.fp8.custom``) when traced or under a dispatch mode. Scales, layouts and the alignment rule: the launch
module's docstring and docs/fp8.md.
"""

from __future__ import annotations

import torch

from gemmlab.ops import dispatch, launch
from gemmlab.ops.fp8 import custom as custom_fp8
from gemmlab.ops.fp8.checks import fp8_out_dtype
from gemmlab.ops.fp8.launch import launch_gemm_fp8
from gemmlab.ops.fp8.plan import Fp8Config, Fp8DecodeConfig, Fp8Plan, constexprs_fp8, execute_fp8, plan_fp8
from gemmlab.ops.fp8.quantize import launch_quantize_fp8

__all__ = [
    "Fp8Config",
    "Fp8DecodeConfig",
    "Fp8Plan",
    "constexprs_fp8",
    "execute_fp8",
    "gemm_fp8",
    "plan_fp8",
    "quantize_fp8",
]


def gemm_fp8(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """C (M, N) = (A * a_scale) @ (B * b_scale), fp32 accumulation, C in ``out_dtype`` (default: out's dtype if out
    is given, else bf16; a different out_dtype from out's is a ValueError): a (M, K) and b (K, N)
    float8_e4m3fn (b row-major or K-major, e.g. ``q.t()`` of a quantized nn.Linear weight); fp32 scales per tensor
    (), per row/column (M, 1) and (1, N), or block (M, cdiv(K, 128)) and (cdiv(K, 128), cdiv(N, 128)). ``out``
    (M, N) row-major in out_dtype, if given, is written and returned. No autograd. Alignment: K % 16 == 0 (and
    N % 16 == 0 for a row-major b), else ValueError (``ops.fp8.launch``). A ``torch.library`` custom op
    (``torch.ops.gemmlab.gemm_fp8``) under torch.compile; see ``gemmlab.ops.fp8.custom``."""
    out_dtype = fp8_out_dtype("gemm_fp8", out_dtype, out, torch.bfloat16)
    dispatch.refuse_neg_out("gemm_fp8", out)
    dispatch.refuse_neg_fp8("gemm_fp8", a=a, b=b)
    if launch.direct(a, b, a_scale, b_scale, out):
        return launch_gemm_fp8(a, b, a_scale, b_scale, out_dtype, out)
    dispatch.need_tensors("gemm_fp8", a=a, b=b, a_scale=a_scale, b_scale=b_scale)
    if out is None:
        return custom_fp8.gemm_fp8(a, b, a_scale, b_scale, out_dtype)
    dispatch.need_tensors("gemm_fp8", out=out)
    custom_fp8.gemm_fp8_out(a, b, a_scale, b_scale, out)
    return out


def quantize_fp8(
    x: torch.Tensor, granularity: str = "tensor", block: tuple[int, int] = (1, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with x ~= q * scale (scale broadcast over its group): q float8_e4m3fn like x, scale fp32 shaped by
    ``granularity`` ("tensor" (), "row" (M, 1), "col" (1, N), "block" over ``block`` = (rows, cols)); x bf16, fp16
    or fp32 (any shape for "tensor", else 2-D). No autograd. A ``torch.library`` custom op
    (``torch.ops.gemmlab.quantize_fp8``) under torch.compile."""
    if launch.direct(x):
        return launch_quantize_fp8(x, granularity, block)
    dispatch.need_tensors("quantize_fp8", x=x)
    return custom_fp8.quantize_fp8(x, granularity, list(block) if isinstance(block, tuple) else block)
