"""The FP8 GEMM's and FP8 experts' references, error bounds and checks (``gemmlab.ref`` re-exports them: import
them from there).

Legend: M, N, K as for gemm; Kb = cdiv(K, 128), Nb = cdiv(N, 128).
"""

from __future__ import annotations

import math

import torch

import gemmlab
from gemmlab.ref_gemm import mantissa_bits

FP8_SCALE_BLOCK = 128


# The FP8 tensor cores' own accumulation (``fp8_mma_gamma``): Hopper's e4m3 wgmma adds FP8_MMA_CHUNK products per
# instruction (k32) into its accumulator with less than fp32's precision; gemmlab's kernel (and the contract) move
# that sum into an fp32 one at least every FP8_MMA_WINDOW of K. FP8_MMA_UNIT is the error of one such add, relative
# to the magnitudes it adds (accumulator and products): 2^-15, a placeholder until benchmarks/fp8_variants.py's
# "mma" measurement on the H200 replaces it (docs/fp8.md, "The tensor cores' accumulation").
FP8_MMA_CHUNK = 32


FP8_MMA_WINDOW = 128


FP8_MMA_UNIT = 2.0**-15


def fp8_mma_gamma(k: int) -> float:
    """The error the FP8 tensor cores may add to one element of an (M, K) @ (K, N) product, relative to D = |A| @
    |B|: FP8_MMA_UNIT per instruction add of a promotion window, w = cdiv(min(K, FP8_MMA_WINDOW), FP8_MMA_CHUNK) of
    them. Each add errs by at most FP8_MMA_UNIT times the magnitudes it adds, the accumulator's at most the window's
    share of D so far, so a window errs by at most w FP8_MMA_UNIT times its share of D; the windows' shares sum to D.
    The placeholder 2^-15: the H200 made 1.14x the fp32-only bound at 37x53x144 (bf16 C, uniform inputs); a model
    tensor core that aligns each add's terms to the largest and keeps p bits below it reaches 1.14x there from
    p = 16 down (tests/fp8/test_fp8_variants.py emulates it), so 2^-15 is one bit below the fewest consistent."""
    return -(-min(k, FP8_MMA_WINDOW) // FP8_MMA_CHUNK) * FP8_MMA_UNIT if k > 0 else 0.0


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] = (1, 1)) -> torch.Tensor:
    """q * scale in float64, the scale broadcast over its group: () per tensor, (M, 1) or (1, N) per row or column,
    else one per ``block`` (rows, cols) block of q (the last blocks may be partial)."""
    s = scale.to(torch.float64)
    if s.dim() == 2 and tuple(s.shape) not in ((q.shape[0], 1), (1, q.shape[1])):
        s = s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: q.shape[0], : q.shape[1]]
    return q.to(torch.float64) * s


def gemm_fp8_ref(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    """C = (A * a_scale) @ (B * b_scale) in float64 on the dequantized inputs: a (M, K), b (K, N) e4m3; scales per
    tensor, per row/column, or block (1x128 blocks of A, 128x128 of B), as ``gemm_fp8`` takes them;
    -> (M, N) float64."""
    blk = FP8_SCALE_BLOCK
    return dequantize_fp8(a, a_scale, (1, blk)) @ dequantize_fp8(b, b_scale, (blk, blk))


def gemm_fp8_bound(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    dtype: torch.dtype,
    ref: torch.Tensor | None = None,
) -> torch.Tensor:
    """The largest error ``gemm_fp8`` may make per element of C (M, N) in ``dtype``, against ``gemm_fp8_ref``:

        |C - ref| <= g + u (|ref| + g) + eta,   g = (gamma(n) + fp8_mma_gamma(K)) D,  gamma(n) = n 2^-24 / (1 - n 2^-24)

    - D = |A * a_scale| @ |B * b_scale| (float64, elementwise absolute values). An e4m3 value has 4 significant bits,
      so a product of two has at most 8 and is exact in fp32: the only errors are the fp32 additions and the scale
      multiplications, each one rounding of relative size <= 2^-24. Whatever the order of the sum, the error of
      adding n' terms is at most gamma(n' - 1) times the sum of their magnitudes (Higham, Accuracy and Stability of
      Numerical Algorithms, 2nd ed., eq. 4.4).
    - n = K + 2 + cdiv(K, 16): K - 1 additions inside the tensor-core dots, at most 2 scale multiplications per term,
      and, with block scales, one addition of a scaled partial per BLOCK_K step (BLOCK_K >= 16), one more rounding.
    - The fp32 result is rounded once into ``dtype``, to nearest on the GPU (half an ulp); Triton 3.6's CPU
      interpreter truncates to bf16 in its own casts (one ulp; gemmlab's stores round first, a candidate's may not),
      so the contract allows any faithful rounding: u = 2^-p (p its stored
      mantissa bits; 2^-7 for bf16, 2^-10 for fp16, 2^-23 for fp32) relative, or eta (its smallest subnormal)
      absolute near zero.
    - The tensor cores' own accumulation, ``fp8_mma_gamma(K) * D``: within a promotion window they add in less than
      fp32 (the H200's FP8 wgmma; the CPU interpreter adds in fp32, inside the bound).
    Assumes no scaled value under- or overflows fp32 or ``dtype``.
    A dropped or repeated K step, a wrong scale, or a wrong block index is orders of magnitude above this bound."""
    k = a.shape[1]
    blk = FP8_SCALE_BLOCK
    ref = gemm_fp8_ref(a, b, a_scale, b_scale) if ref is None else ref
    d = dequantize_fp8(a, a_scale, (1, blk)).abs() @ dequantize_fp8(b, b_scale, (blk, blk)).abs()
    n = k + 2 + -(-k // 16)
    gamma = n * 2.0**-24 / (1 - n * 2.0**-24) + fp8_mma_gamma(k)
    g = gamma * d
    u = 2.0 ** -mantissa_bits(dtype)
    eta = torch.finfo(dtype).smallest_normal * 2.0 ** -mantissa_bits(dtype)
    return g + u * (ref.abs() + g) + eta


def gemm_fp8_check(
    c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor
) -> dict:
    """Compare a ``gemm_fp8`` result with the float64 reference under ``gemm_fp8_bound``. Returns max_abs_err, the
    worst ratio of error to bound (<= 1 passes; NaN or Inf anywhere fails), and ok."""
    ref = gemm_fp8_ref(a, b, a_scale, b_scale)
    if c.numel() == 0:
        return {"max_abs_err": 0.0, "worst": 0.0, "ok": True}
    bound = gemm_fp8_bound(a, b, a_scale, b_scale, c.dtype, ref)
    err = (c.to(torch.float64) - ref).abs()
    finite = bool(torch.isfinite(c).all())
    worst = (err / bound).max().item() if finite else math.inf
    return {"max_abs_err": err.max().item() if finite else math.inf, "worst": worst, "ok": finite and worst <= 1.0}


# ------------------------------------------------------------------------------------------------ FP8 experts
# Legend: S routed rows, E experts, N, K as for grouped_gemm; T, H, I, k as for MoE; Xb = cdiv(X, 128).


def _gamma(k: int) -> float:
    n = k + 2 + -(-k // 16)  # as gemm_fp8_bound: the dot's additions, two scale products, one add per step
    return n * 2.0**-24 / (1 - n * 2.0**-24)  # (without gemm_fp8_bound's tensor-core term: docs/fp8.md says why)


def _act_quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, C) bf16/fp16 quantized per 1x128 block by gemmlab's own quantizer (the op's activation contract; equal
    to the torch rule, ``ops.fp8.quantize.quantize_torch``, bit for bit: tests/fp8)."""
    return gemmlab.quantize_fp8(x, "block", (1, FP8_SCALE_BLOCK))


def grouped_gemm_fp8_check(
    out: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    offsets: torch.Tensor,
    x_scale: torch.Tensor | None,
    w_scale: torch.Tensor,
) -> dict:
    """``grouped_gemm_fp8`` against ``gemm_fp8_ref`` group by group, under ``gemm_fp8_bound`` (a bf16/fp16 x is
    first quantized per 1x128 block as the op does). Rows past offsets[-1] are not compared. -> worst, ok."""
    if x_scale is None:
        x, x_scale = _act_quantized(x)
    worst, start, finite = 0.0, 0, True
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            a, sa, b, sb = x[start:end], x_scale[start:end], w[e].t(), w_scale[e].t()
            ref = gemm_fp8_ref(a, b, sa, sb)
            c = out[start:end]
            finite = finite and bool(torch.isfinite(c).all())
            bound = gemm_fp8_bound(a, b, sa, sb, out.dtype, ref)
            worst = max(worst, ((c.double() - ref).abs() / bound).max().item())
        start = end
    worst = worst if finite else math.inf
    return {"worst": worst, "ok": worst <= 1.0}


def _requantized_spread(lo: torch.Tensor, hi: torch.Tensor, d_ref: torch.Tensor) -> torch.Tensor:
    """How far the op's dequantized intermediate may be from the reference's ``d_ref``, elementwise, when the op's
    stored value lies in [lo, hi]: each 1x128 block's scale is its amax / 448, so it lies in [s_lo, s_hi] from the
    block's amax range; e4m3 rounding is monotone, so the op's q lies between the roundings of the extreme ratios
    (widened by 2^-20 for fp32 division), and its s * q between the four corners."""
    rows, cols = lo.shape
    blk = FP8_SCALE_BLOCK
    nb = -(-cols // blk)

    def block_max(v):
        v = torch.nn.functional.pad(v, (0, nb * blk - cols)).view(rows, nb, blk).amax(2)
        return v.repeat_interleave(blk, 1)[:, :cols]

    fmax = float(torch.finfo(torch.float8_e4m3fn).max)
    least = torch.where((lo <= 0) & (hi >= 0), torch.zeros_like(lo), torch.minimum(lo.abs(), hi.abs()))
    s_lo = block_max(least).clamp_min(1e-30) / fmax * (1 - 2.0**-20)
    s_hi = block_max(torch.maximum(lo.abs(), hi.abs())) / fmax * (1 + 2.0**-20)
    ratios = torch.stack([lo / s_lo, lo / s_hi, hi / s_lo, hi / s_hi])
    q_lo, q_hi = ratios.amin(0), ratios.amax(0)
    q_lo, q_hi = q_lo - 2.0**-20 * q_lo.abs(), q_hi + 2.0**-20 * q_hi.abs()

    def rne(v):
        return v.clamp(-fmax, fmax).float().to(torch.float8_e4m3fn).double()

    corners = torch.stack([s * q for s in (s_lo, s_hi) for q in (rne(q_lo), rne(q_hi))])
    return (corners - d_ref).abs().amax(0)


def _moe_fp8_expert(xq, xs, packed, e: int, tok, wts, dtype, out_bound: bool):
    """Reference rows o (R, H) of expert e for routed rows of tokens ``tok`` with weights ``wts`` (float64), and
    with ``out_bound`` the bound of |o_op - o| (before o's rounding to ``dtype``)."""
    blk, i = FP8_SCALE_BLOCK, packed.w2.shape[2]
    a = dequantize_fp8(xq[tok], xs[tok], (1, blk))
    w1 = dequantize_fp8(packed.w1[e], packed.w1_scale[e], (blk, blk))
    w2 = dequantize_fp8(packed.w2[e], packed.w2_scale[e], (blk, blk))
    g, u = a @ w1[:i].t(), a @ w1[i:].t()
    silu = torch.nn.functional.silu(g)
    h = silu * u
    hq, hs = _act_quantized(h.to(dtype))  # the intermediate, as the op stores and quantizes it
    d = dequantize_fp8(hq, hs, (1, blk))
    o = (d @ w2.t()) * wts[:, None]
    if not out_bound:
        return o, None
    dg, du = _gamma(a.shape[1]) * (a.abs() @ w1[:i].abs().t()), _gamma(a.shape[1]) * (a.abs() @ w1[i:].abs().t())
    delta = 1.1 * dg * (u.abs() + du) + (silu.abs() + 1.1 * dg) * du + 2.0**-20 * h.abs()  # 1.1 > max |silu'|
    eps = _requantized_spread((h - delta).to(dtype).double(), (h + delta).to(dtype).double(), d)  # stored: RNE
    spread = eps @ w2.abs().t() + _gamma(i) * ((d.abs() + eps) @ w2.abs().t())
    return o, wts.abs()[:, None] * spread * (1 + 2.0**-22)


def moe_fp8_ref(x: torch.Tensor, packed, topk_weights: torch.Tensor, topk_ids: torch.Tensor, bound: bool = False):
    """The FP8 experts' reference, float64 on the dequantized weights (docs/fp8.md, "MoE experts"): x quantized per
    1x128 block by gemmlab's quantizer; per expert, act = silu(x w_gate^T) * (x w_up^T) in float64, rounded to x's
    dtype and quantized per 1x128 block (``quantize_fp8``'s rule), its dequantized value times w2^T, times the
    top-k weight, summed over the k slots. -> y (T, H) float64; with ``bound`` also the per-element bound of
    ``moe_fp8_check``."""
    t, h = x.shape
    xq, xs = _act_quantized(x)
    y = torch.zeros((t, h), dtype=torch.float64, device=x.device)
    slack = torch.zeros_like(y)  # sum over slots of the bound of the op's routed row before and after its rounding
    mag = torch.zeros_like(y)  # sum over slots of |o|
    ulp, eta = 2.0 ** -mantissa_bits(x.dtype), torch.finfo(x.dtype).smallest_normal * 2.0 ** -mantissa_bits(x.dtype)
    for e in range(packed.w1.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        o, b = _moe_fp8_expert(xq, xs, packed, e, tok, topk_weights[tok, slot].double(), x.dtype, bound)
        y.index_add_(0, tok, o)
        mag.index_add_(0, tok, o.abs())
        if bound:
            slack.index_add_(0, tok, b + 2.0**-23 * o.abs() + ulp * (o.abs() + b) + eta)
    if not bound:
        return y
    k = topk_ids.shape[1]
    slack = slack + k * 2.0**-24 * (slack + mag)  # the combine's fp32 sum of k rows
    return y, slack + ulp * (y.abs() + slack) + eta


def moe_fp8_check(y: torch.Tensor, x: torch.Tensor, packed, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> dict:
    """An FP8 ``moe_forward`` result against ``moe_fp8_ref`` under its bound, elementwise. -> max_abs_err, worst
    (error / bound; <= 1 passes; NaN or Inf anywhere fails), err and bound at that worst element, ok."""
    if y.numel() == 0:
        return {"max_abs_err": 0.0, "worst": 0.0, "err": 0.0, "bound": 0.0, "ok": True}
    ref, bound = moe_fp8_ref(x, packed, topk_weights, topk_ids, bound=True)
    err = (y.double() - ref).abs()
    if not bool(torch.isfinite(y).all()):
        return {"max_abs_err": math.inf, "worst": math.inf, "err": math.inf, "bound": 0.0, "ok": False}
    at = (err / bound).argmax()
    worst = (err / bound).flatten()[at].item()
    return {
        "max_abs_err": err.max().item(),
        "worst": worst,
        "err": err.flatten()[at].item(),
        "bound": bound.flatten()[at].item(),
        "ok": worst <= 1.0,
    }
