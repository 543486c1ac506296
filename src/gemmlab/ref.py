"""References, baselines and tolerances shared by tests, the grader and the benchmarks.

References are slow, obvious and exact-ish (float64 / float32 loops); ``moe_composite`` is the MoE baseline
the benchmarks, the tuner and the grader time gemmlab against (torch ops on ``torch._grouped_mm``).

The one public reference module; its parts live beside it, by op: ``ref_gemm`` (the dense GEMM), ``ref_moe``
(grouped GEMM and MoE, the composite baseline) and ``ref_fp8`` (FP8 GEMM and FP8 experts). Import from here."""

from __future__ import annotations

from gemmlab.ref_fp8 import (
    FP8_MMA_CHUNK,
    FP8_MMA_UNIT,
    FP8_MMA_WINDOW,
    FP8_SCALE_BLOCK,
    dequantize_fp8,
    fp8_mma_gamma,
    gemm_fp8_bound,
    gemm_fp8_check,
    gemm_fp8_ref,
    grouped_gemm_fp8_check,
    moe_fp8_check,
    moe_fp8_ref,
)
from gemmlab.ref_gemm import (
    gemm_check,
    gemm_ref,
    gemm_tolerance,
    mantissa_bits,
)
from gemmlab.ref_moe import (
    grouped_gemm_check,
    grouped_gemm_ref,
    moe_check,
    moe_composite,
    moe_grad_check,
    moe_layer_ref,
    moe_oai_ref,
    moe_ref,
    moe_same_dtype,
    swiglu_oai,
)

__all__ = [
    "gemm_ref",
    "mantissa_bits",
    "gemm_tolerance",
    "gemm_check",
    "FP8_SCALE_BLOCK",
    "FP8_MMA_CHUNK",
    "FP8_MMA_WINDOW",
    "FP8_MMA_UNIT",
    "fp8_mma_gamma",
    "dequantize_fp8",
    "gemm_fp8_ref",
    "gemm_fp8_bound",
    "gemm_fp8_check",
    "grouped_gemm_ref",
    "grouped_gemm_check",
    "moe_ref",
    "moe_same_dtype",
    "moe_layer_ref",
    "moe_composite",
    "moe_check",
    "moe_grad_check",
    "moe_oai_ref",
    "swiglu_oai",
    "grouped_gemm_fp8_check",
    "moe_fp8_ref",
    "moe_fp8_check",
]
