"""The dense GEMM's reference and tolerance (``gemmlab.ref`` re-exports them: import them from there).
Legend: C (M, N) = A (M, K) @ B (K, N)."""

from __future__ import annotations

import math

import torch

from gemmlab.ops.gemm import PackedB


def gemm_ref(a: torch.Tensor, b: torch.Tensor | PackedB) -> torch.Tensor:
    """C = A @ B computed in float64 on the operands' device (a PackedB is accepted for b).
    a (M, K), b (K, N) -> (M, N) float64."""
    if isinstance(b, PackedB):
        b = b.view()
    return a.to(torch.float64) @ b.to(torch.float64)


def mantissa_bits(dtype: torch.dtype) -> int:
    return {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[dtype]


def gemm_tolerance(a: torch.Tensor, b: torch.Tensor | PackedB, dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for |C - ref| <= atol + rtol * |ref|, derived rather than guessed:

    - rtol = 2^-p, one ulp of the output dtype (p mantissa bits): a correct kernel rounds its fp32 sum
      once (half an ulp); the other half is slack for the fp32 error near a rounding boundary.
    - atol covers fp32 accumulation where |ref| is small: K roundings of partial sums of size about
      sqrt(K) * max|a| * max|b| random-walk to sqrt(K) * 2^-24 * that; we allow 32 times it. A missed or
      repeated K block changes an element by about sqrt(BLOCK_K) * E|a b|, orders of magnitude more.
      Plus one step of the output dtype's subnormals (fp16: 2^-24): below its smallest normal the rounding
      is absolute, half that step, which no relative term covers (a tiny B makes such outputs common).
    """
    k = a.shape[1]
    if k == 0 or a.numel() == 0 or b.numel() == 0:
        return 0.0, 0.0
    if isinstance(b, PackedB):
        b = b.view()
    amax = a.abs().max().item() * b.abs().max().item()
    subnormal_step = torch.finfo(dtype).smallest_normal * 2.0 ** -mantissa_bits(dtype)
    atol = 32 * 2.0**-24 * k * amax + subnormal_step
    return atol, 2.0 ** -mantissa_bits(dtype)


def gemm_check(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor | None = None) -> dict:
    """Compare a GEMM result with the float64 reference. Returns max_abs_err, the worst ratio of error
    to allowed error (<= 1 passes; NaN or Inf anywhere fails), and ok."""
    ref = gemm_ref(a, b) if ref is None else ref
    atol, rtol = gemm_tolerance(a, b, c.dtype)
    if c.numel() == 0:
        return {"max_abs_err": 0.0, "worst": 0.0, "atol": atol, "rtol": rtol, "ok": True}
    err = (c.to(torch.float64) - ref).abs()
    allowed = atol + rtol * ref.abs()
    finite = bool(torch.isfinite(c).all())
    worst = (err / allowed.clamp_min(1e-300)).max().item() if finite else math.inf
    max_err = err.max().item() if finite else math.inf
    return {"max_abs_err": max_err, "worst": worst, "atol": atol, "rtol": rtol, "ok": finite and worst <= 1.0}
