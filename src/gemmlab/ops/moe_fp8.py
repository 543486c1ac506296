"""FP8 (e4m3) experts, the public module: ``pack_moe_fp8``, ``grouped_gemm_fp8`` and the FP8 ``moe_forward`` body.

Legend: S routed rows, E experts, N output width, K reduction; T tokens, H hidden, I expert intermediate, k top-k;
Xb = cdiv(X, 128). The serving form of DeepSeek-V3: weights quantized once to e4m3 with one fp32 scale per 128x128
block of each expert; activations quantized on the fly with one scale per 1x128 block of a row.

    pack_moe_fp8(w1 (E, 2I, H), w2 (E, H, I)) -> PackedMoEFP8    (or the caller's own (q, scale) pairs, checked)
    grouped_gemm_fp8(x (S, K), w (E, N, K), offsets, x_scale, w_scale) -> (S, N) bf16/fp16
    moe_forward_fp8(x (T, H), packed, topk_weights, topk_ids) -> y (T, H)   (``moe_forward`` dispatches here)

Each call checks its operands, then goes to the launchers (``ops.fp8.moe_launch``; the MoE body is the FP8 option of
the forward's one plan, ``ops.moe.plan``) directly when eager, or through
the ``torch.ops.gemmlab`` custom ops (``ops.fp8.custom``) when traced. No autograd: a RuntimeError where a gradient
would be needed. Alignment: every K (H and I) a multiple of 16 (TMA rows of e4m3), else ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gemmlab.ops import dispatch, launch
from gemmlab.ops.fp8 import custom as custom_fp8
from gemmlab.ops.fp8.checks import SCALE_BLOCK, fp8_out_dtype
from gemmlab.ops.fp8.moe_checks import ACT_DTYPES, check_expert_weight, refuse_grad
from gemmlab.ops.fp8.moe_launch import MoEFp8Config, launch_grouped_gemm_fp8
from gemmlab.ops.fp8.quantize import quantize_torch
from gemmlab.ops.moe.plan import launch_moe_forward_fp8


@dataclass(frozen=True)
class PackedMoEFP8:
    """FP8 expert weights laid out once for ``moe_forward``: e4m3, contiguous, gate rows [0, I) then up rows
    [I, 2I) in w1 as in ``PackedMoE``; fp32 scales, one per 128x128 block of each expert (the last blocks may be
    partial)."""

    w1: torch.Tensor  # (E, 2I, H) e4m3
    w1_scale: torch.Tensor  # (E, cdiv(2I, 128), cdiv(H, 128)) fp32
    w2: torch.Tensor  # (E, H, I) e4m3
    w2_scale: torch.Tensor  # (E, cdiv(H, 128), cdiv(I, 128)) fp32


def quantize_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (E, N, K) bf16/fp16/fp32 -> (e4m3 (E, N, K), fp32 (E, Nb, Kb)): each expert by ``quantize_fp8``'s "block"
    rule over 128x128 blocks (amax / 448 per block, saturating)."""
    pairs = [quantize_torch(w[e], "block", (SCALE_BLOCK, SCALE_BLOCK)) for e in range(w.shape[0])]
    if not pairs:
        e, n, k = w.shape
        return (
            torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device),
            torch.ones((0, -(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK)), dtype=torch.float32, device=w.device),
        )
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


def _one(name: str, w) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(w, (tuple, list)):
        if len(w) != 2:
            raise ValueError(f"pack_moe_fp8: {name} as a (q, scale) pair needs two tensors, got {len(w)}")
        q, s = w
        check_expert_weight("pack_moe_fp8", name, q, s)
        return q.contiguous(), s.contiguous()
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.dtype not in ACT_DTYPES + (torch.float32,):
        raise TypeError(
            f"pack_moe_fp8: {name} must be a 3-D bf16/fp16/fp32 tensor or an (e4m3 q, fp32 scale) pair, "
            f"got {getattr(w, 'dtype', type(w).__name__)} of shape {tuple(getattr(w, 'shape', ()))}"
        )
    q, s = quantize_experts(w.detach())
    check_expert_weight("pack_moe_fp8", name, q, s)
    return q, s


def pack_moe_fp8(w1, w2) -> PackedMoEFP8:
    """Quantize and lay out the experts once, outside any timed region: w1 (E, 2I, H) and w2 (E, H, I) in bf16,
    fp16 or fp32, or each as the caller's own (q e4m3, scale fp32 (E, Nb, Kb)) pair (checked: dtypes, the scale
    shapes, H % 16 == 0 and I % 16 == 0)."""
    q1, s1 = _one("w1", w1)
    q2, s2 = _one("w2", w2)
    (e, i2, h), (e2, h2, i) = q1.shape, q2.shape
    if e2 != e or h2 != h or i2 != 2 * i:
        raise ValueError(
            f"pack_moe_fp8: w1 must be (E, 2I, H) and w2 (E, H, I); got {tuple(q1.shape)} and {tuple(q2.shape)}"
        )
    if q1.device != q2.device:
        raise ValueError(f"pack_moe_fp8: w1 and w2 must be on one device, got {q1.device}, {q2.device}")
    return PackedMoEFP8(q1, s1, q2, s2)


def grouped_gemm_fp8(
    x: torch.Tensor,
    w: torch.Tensor,
    offsets: torch.Tensor,
    x_scale: torch.Tensor | None,
    w_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """out (S, N) = rows offsets[e-1]:offsets[e] of (x * x_scale) times (w[e] * w_scale[e])^T, fp32 accumulation,
    in ``out_dtype`` (default: out's dtype if given, else x's for a bf16/fp16 x, else bf16). x (S, K) either e4m3
    with x_scale (S, Kb) (one per 1x128 block) or bf16/fp16 with x_scale None (quantized by the op per 1x128 block,
    as ``quantize_fp8(x, "block")``); w (E, N, K) e4m3 with w_scale (E, Nb, Kb) (one per 128x128 block of each
    expert: ``pack_moe_fp8``'s layout); offsets (E,) int32 cumulative group ends, as ``grouped_gemm``. ``out``
    (S, N), if given, is written and returned; rows past offsets[-1] are left untouched (without ``out``, they are
    unspecified). ``validate``: the offsets are checked as ``grouped_gemm`` checks them. K % 16 == 0, else
    ValueError.

    A separate function rather than scale keywords on ``grouped_gemm``: its scales are operands, not options, and
    it has no autograd and no ``config=``, so ``grouped_gemm``'s signature and contract stay the fp16/bf16 ones (a
    benchmark swaps the two by name). A ``torch.library`` custom op (``torch.ops.gemmlab.grouped_gemm_fp8``, and
    ``grouped_gemm_fp8_out`` with ``out``) under tracing."""
    refuse_grad("grouped_gemm_fp8", x, w)
    out_dtype = fp8_out_dtype(
        "grouped_gemm_fp8", out_dtype, out, x.dtype if getattr(x, "dtype", None) in ACT_DTYPES else torch.bfloat16
    )
    dispatch.refuse_neg_out("grouped_gemm_fp8", out)
    dispatch.refuse_neg_fp8("grouped_gemm_fp8", x=x, w=w)
    if launch.direct(x, w, offsets, x_scale, w_scale, out):
        return launch_grouped_gemm_fp8(x, w, offsets, x_scale, w_scale, out_dtype, validate, out)
    dispatch.need_tensors(
        "grouped_gemm_fp8",
        x=x,
        w=w,
        offsets=offsets,
        w_scale=w_scale,
        **({} if x_scale is None else {"x_scale": x_scale}),
        **({} if out is None else {"out": out}),
    )
    if out is None:
        return custom_fp8.grouped_gemm_fp8(x, w, offsets, x_scale, w_scale, out_dtype, bool(validate))
    custom_fp8.grouped_gemm_fp8_out(x, w, offsets, x_scale, w_scale, out, bool(validate))
    return out


def moe_forward_fp8(
    x: torch.Tensor, packed: PackedMoEFP8, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *, validate: bool = True
) -> torch.Tensor:
    """The MoE body with FP8 experts (``moe_forward(x, packed, None, topk_weights, topk_ids)`` comes here): the
    routing, gather and combine of the bf16 path, both GEMMs in e4m3 with block scales (``ops.moe.plan``, its
    FP8 option). x (T, H) or (..., H) bf16/fp16 -> y of x's shape and dtype."""
    if not isinstance(packed, PackedMoEFP8):
        raise TypeError(
            f"moe_forward (fp8): expected a PackedMoEFP8 (gemmlab.pack_moe_fp8), got {type(packed).__name__}"
        )
    refuse_grad("moe_forward (fp8)", x, topk_weights)
    dispatch.refuse_neg_fp8("moe_forward (fp8)", w1=packed.w1, w2=packed.w2)
    lead = None
    if isinstance(x, torch.Tensor) and x.dim() != 2 and x.dim() >= 1:
        lead, x = x.shape, x.reshape(-1, x.shape[-1])
        if isinstance(topk_weights, torch.Tensor) and topk_weights.dim() >= 1:
            topk_weights = topk_weights.reshape(x.shape[0], topk_weights.shape[-1])
        if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() >= 1:
            topk_ids = topk_ids.reshape(x.shape[0], topk_ids.shape[-1])
    args = (x, packed.w1, packed.w1_scale, packed.w2, packed.w2_scale, topk_weights, topk_ids)
    if launch.direct(*args):
        y = launch_moe_forward_fp8(*args, validate)
    else:
        dispatch.need_tensors("moe_forward (fp8)", x=x, topk_weights=topk_weights, topk_ids=topk_ids)
        y = custom_fp8.moe_forward_fp8(*args, bool(validate))
    return y if lead is None else y.view(lead)


__all__ = ["MoEFp8Config", "PackedMoEFP8", "grouped_gemm_fp8", "moe_forward_fp8", "pack_moe_fp8", "quantize_experts"]
