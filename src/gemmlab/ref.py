"""References and tolerances shared by tests, the grader and the benchmarks: slow, obvious, exact-ish."""

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
    """
    k = a.shape[1]
    if k == 0 or a.numel() == 0 or b.numel() == 0:
        return 0.0, 0.0
    if isinstance(b, PackedB):
        b = b.view()
    amax = a.abs().max().item() * b.abs().max().item()
    atol = 32 * 2.0**-24 * k * amax
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
    return {"max_abs_err": max_err, "worst": worst, "atol": atol, "rtol": rtol,
            "ok": finite and worst <= 1.0}


# ------------------------------------------------------------------------------------------------ MoE
# Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k.


def grouped_gemm_ref(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """float32 loop over groups: rows offsets[e-1]:offsets[e] of x (S, K) times w[e]^T (w (E, N, K)).
    Rows past offsets[-1] are zero."""
    out = torch.zeros((x.shape[0], w.shape[1]), dtype=torch.float32, device=x.device)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        out[start:end] = x[start:end].float() @ w[e].float().t()
        start = end
    return out


def moe_ref(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor) -> torch.Tensor:
    """float32 loop over experts: y (T, H) = sum_j topk_weights[t, j] * (silu(x_t gate_e^T) * (x_t up_e^T))
    w2_e^T with e = topk_ids[t, j]; w1 (E, 2I, H) holds gate rows [0, I) then up rows [I, 2I); w2 (E, H, I)."""
    t, h = x.shape
    i = w2.shape[2]
    y = torch.zeros((t, h), dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in range(w1.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        a = xf[tok]
        gate = a @ w1[e, :i].float().t()
        up = a @ w1[e, i:].float().t()
        act = torch.nn.functional.silu(gate) * up
        y.index_add_(0, tok, (act @ w2[e].float().t()) * topk_weights[tok, slot].float()[:, None])
    return y


def moe_same_dtype(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor) -> torch.Tensor:
    """The same loop with every tensor kept in x's dtype, as PyTorch computes it (fp32 accumulation inside
    matmuls, rounding between ops): the error scale a correct fp16/bf16 MoE makes."""
    t, h = x.shape
    i = w2.shape[2]
    y = torch.zeros((t, h), dtype=torch.float32, device=x.device)
    for e in range(w1.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        a = x[tok]
        act = torch.nn.functional.silu(a @ w1[e, :i].t()) * (a @ w1[e, i:].t())
        o = (act @ w2[e].t()) * topk_weights[tok, slot].to(x.dtype)[:, None]
        y.index_add_(0, tok, o.float())
    return y.to(x.dtype)


def moe_check(y: torch.Tensor, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, ref: torch.Tensor | None = None) -> dict:
    """|y - moe_ref| <= 2 * max |moe_same_dtype - moe_ref| + one ulp of max |moe_ref| (the style guide's
    derived tolerance: twice what PyTorch itself misses in the same dtype). NaN or Inf fails."""
    ref = moe_ref(x, w1, w2, topk_weights, topk_ids) if ref is None else ref
    if y.numel() == 0:
        return {"ok": True, "max_abs_err": 0.0, "allowed": 0.0}
    torch_err = (moe_same_dtype(x, w1, w2, topk_weights, topk_ids).float() - ref).abs().max().item()
    allowed = 2 * torch_err + 2.0 ** -mantissa_bits(y.dtype) * ref.abs().max().item()
    finite = bool(torch.isfinite(y).all())
    err = (y.float() - ref).abs().max().item() if finite else math.inf
    return {"ok": finite and err <= allowed, "max_abs_err": err, "allowed": allowed, "torch_err": torch_err}
