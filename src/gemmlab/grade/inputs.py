"""Grader inputs and tolerances: seeded, never zero, in the case's layout.

Distributions (drawn by ``problems.matrix``, the one input generator, from the grader's own seeds):
    competition  (r % 100 - 50) / 100 from a seeded integer RNG: uniform on {-0.50, -0.49, ..., 0.49}
    uniform      U[-1, 1)
    normal       N(0, 1)

Tolerance on max |C - C_ref|:
    competition  base * sqrt(K / ref_k), C_ref = the float32-accumulated product (no TF32), kept in float32.
                 This is the competition's contract and is never loosened. C_ref is not rounded to the output
                 dtype: a correct kernel's float32 sum differs from the reference's in the last bits (another
                 summation order), and where the two straddle a rounding boundary the rounded outputs differ by
                 one output ulp, 0.0625 for |C| in [64, 128) in fp16, above the bound 0.0566 at K = 16384. The
                 competition inputs reach |C| >= 64 in a few elements of an 8192x8192 output, so with every timed
                 call verified a correct kernel would fail. Against the float32 sum a correct kernel is off by
                 at most half an ulp plus its summation error.
    otherwise    2 * max |C_torch - C_ref| + one ulp of max |C_ref| in the output dtype, with C_ref the
                 float64 product and C_torch what torch.mm makes in the same dtype (fp32 reductions): a
                 candidate may be twice as far off as the vendor library, plus one rounding step.
Both kinds also keep C_torch (``vendor``): the yardstick of the honest-arithmetic rule (``grade/rounding.py``).

Timed calls draw from the case's distribution, and a secret share of them from ``FULL_MANTISSA`` (every
mantissa bit random), so that a timed call cannot be told from a check by its inputs.
"""

from __future__ import annotations

import math

import torch

from gemmlab.grade.rounding import vendor_product
from gemmlab.problems import generator, matrix
from gemmlab.ref import gemm_ref, mantissa_bits

SECOND_DISTRIBUTION = {"competition": "uniform", "uniform": "normal", "normal": "uniform"}
FULL_MANTISSA = SECOND_DISTRIBUTION  # the other kind of timed input: full-mantissa where the case's is not


def operands(m: int, n: int, k: int, dist: str, seed: int, dtype: torch.dtype, device: str, layout: str):
    """Logical A (M, K) and B (K, N), stored in ``layout`` (colmajor: strides (1, rows)), each from a
    generator of its own seeded from ``seed`` (2 seed + 1 for A, 2 seed + 2 for B)."""
    col = layout == "colmajor"
    a = matrix(m, k, dist, generator(2 * seed + 1, device), dtype, colmajor=col)
    b = matrix(k, n, dist, generator(2 * seed + 2, device), dtype, colmajor=col)
    return a, b


TF32_EXACT = (torch.float16, torch.bfloat16)  # dtypes whose every value TF32 holds exactly


def reference(a: torch.Tensor, b: torch.Tensor, dist: str, dtype: torch.dtype, base: float, ref_k: int) -> dict:
    """What a correct C is compared with, the bound on max |C - C_ref|, and the vendor's C (same dtype)."""
    k = a.shape[1]
    vendor = vendor_product(a, b)
    if dist == "competition":  # the competition's FP32 reference: products exact, sums in fp32
        prev = torch.backends.cuda.matmul.allow_tf32
        # every fp16 and bf16 value is a TF32 value (10 mantissa bits or fewer, within TF32's 8-bit exponent), so
        # TF32 tensor cores multiply these exactly and sum in fp32, as FP32 cores would, at several times the rate
        torch.backends.cuda.matmul.allow_tf32 = a.dtype in TF32_EXACT and b.dtype in TF32_EXACT
        try:
            c_ref = a.float() @ b.float()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        return {"c_ref": c_ref, "tol": base * math.sqrt(k / ref_k), "rule": f"{base}*sqrt(K/{ref_k})", "vendor": vendor}
    c64 = gemm_ref(a, b)
    torch_err = (vendor.double() - c64).abs().max().item() if c64.numel() else 0.0
    ulp = 2.0 ** (
        math.floor(math.log2(max(c64.abs().max().item() if c64.numel() else 0.0, 1e-30))) - mantissa_bits(dtype)
    )
    return {"c_ref": c64, "tol": 2 * torch_err + ulp, "rule": "2*err(torch.mm)+1ulp", "vendor": vendor}
