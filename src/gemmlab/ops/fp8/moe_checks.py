"""The FP8 experts' argument checks, on metadata only (shapes, dtypes, devices), so the custom ops' fake
implementations run them too. Torch only. Legend: S routed rows, E experts, N output width, K reduction, T tokens,
H hidden, I expert intermediate, k top-k; Xb = cdiv(X, 128) the 128-blocks of a dimension X.
"""

from __future__ import annotations

import torch

from gemmlab.ops.fp8.checks import FP8, SCALE_BLOCK

ACT_DTYPES = (torch.bfloat16, torch.float16)  # activations quantized on the fly, and the outputs


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def _tensor(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def check_expert_weight(op: str, name: str, w, w_scale) -> tuple[int, int, int]:
    """w (E, N, K) float8_e4m3fn with unit K stride, w_scale (E, Nb, Kb) fp32 (one per 128x128 block) -> (E, N, K)."""
    _tensor(op, name, w)
    _tensor(op, f"{name}_scale", w_scale)
    if w.dim() != 3 or w.dtype != FP8:
        raise TypeError(
            f"{op}: {name} must be a 3-D (E, N, K) torch.float8_e4m3fn tensor, got {w.dtype} of shape "
            f"{tuple(w.shape)} (gemmlab.pack_moe_fp8 makes it)"
        )
    if w.is_neg():
        raise ValueError(
            f"{op}: {name} is a negated view (torch._neg_view) of e4m3 data, which torch cannot negate; "
            "negate its scale instead"
        )
    e, n, k = w.shape
    want = (e, _cdiv(n, SCALE_BLOCK), _cdiv(k, SCALE_BLOCK))
    if w_scale.dtype != torch.float32 or tuple(w_scale.shape) != want:
        raise ValueError(
            f"{op}: {name}_scale must be fp32 of shape {want} (one per 128x128 block of each expert's "
            f"{name}), got {w_scale.dtype} of shape {tuple(w_scale.shape)}"
        )
    if k % 16 or (k > 1 and w.stride(2) != 1):
        raise ValueError(
            f"{op}: {name} (E={e}, N={n}, K={k}, strides {w.stride()}) needs K % 16 == 0 and unit K "
            "stride (TMA rows of e4m3 must be 16-byte aligned); there is no portable FP8 path"
        )
    if w.device != w_scale.device:
        raise ValueError(f"{op}: {name} and {name}_scale must be on one device, got {w.device}, {w_scale.device}")
    return e, n, k


def check_grouped_fp8_args(x, w, offsets, x_scale, w_scale, out_dtype, out=None) -> tuple[int, int, int, int]:
    """``grouped_gemm_fp8``'s arguments -> (S, K, E, N). x (S, K) e4m3 with x_scale (S, Kb) fp32, or bf16/fp16 with
    x_scale None (quantized by the op); w (E, N, K) e4m3 with w_scale (E, Nb, Kb); offsets (E,) int32; out, if
    given, (S, N) in out_dtype with unit column stride and distinct rows."""
    op = "grouped_gemm_fp8"
    _tensor(op, "x", x)
    _tensor(op, "offsets", offsets)
    e, n, k = check_expert_weight(op, "w", w, w_scale)
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be 2-D (S, K), got shape {tuple(x.shape)}")
    s = x.shape[0]
    if x.shape[1] != k:
        raise ValueError(f"{op}: x has K={x.shape[1]}, w has K={k}")
    if x.dtype == FP8:
        _tensor(op, "x_scale", x_scale)
        if x_scale.dtype != torch.float32 or tuple(x_scale.shape) != (s, _cdiv(k, SCALE_BLOCK)):
            raise ValueError(
                f"{op}: x_scale must be fp32 of shape {(s, _cdiv(k, SCALE_BLOCK))} (one per 1x128 "
                f"block of x), got {x_scale.dtype} of shape {tuple(x_scale.shape)}"
            )
    elif x.dtype in ACT_DTYPES:
        if x_scale is not None:
            raise ValueError(f"{op}: x is {x.dtype} and is quantized by the op; pass x_scale only with an e4m3 x")
    else:
        raise TypeError(f"{op}: x has dtype {x.dtype}; expected float8_e4m3fn (with x_scale), bfloat16 or float16")
    if out_dtype not in ACT_DTYPES:
        raise TypeError(f"{op}: out_dtype {out_dtype}; supported: bfloat16, float16")
    if offsets.dtype != torch.int32 or tuple(offsets.shape) != (e,):
        raise ValueError(
            f"{op}: offsets must be int32 of shape ({e},) (cumulative group ends), got {offsets.dtype} "
            f"of shape {tuple(offsets.shape)}"
        )
    devices = {t.device for t in (x, w, offsets) + ((x_scale,) if x_scale is not None else ())}
    if len(devices) > 1 or w_scale.device not in devices:
        raise ValueError(f"{op}: x, w, offsets and the scales must be on one device, got {sorted(map(str, devices))}")
    if out is not None:
        _tensor(op, "out", out)
        if tuple(out.shape) != (s, n) or out.dtype != out_dtype or out.device != x.device:
            raise ValueError(
                f"{op}: out must be ({s}, {n}) {out_dtype} on {x.device}, got {tuple(out.shape)} "
                f"{out.dtype} on {out.device}"
            )
        if n > 1 and out.stride(1) != 1 or s > 1 and out.stride(0) < max(n, 1):
            raise ValueError(
                f"{op}: out needs unit column stride and rows that do not share memory, got strides {out.stride()}"
            )
    return s, k, e, n


def check_moe_fp8_args(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids) -> tuple[int, int, int, int, int]:
    """``moe_forward`` with FP8 experts -> (T, H, I, E, k): x (T, H) bf16/fp16; w1 (E, 2I, H), w2 (E, H, I) e4m3
    with their 128x128 block scales; topk_weights (T, k) float, topk_ids (T, k) int32/int64, all on one device."""
    op = "moe_forward (fp8)"
    _tensor(op, "x", x)
    if x.dim() != 2 or x.dtype not in ACT_DTYPES:
        raise TypeError(f"{op}: x must be 2-D (T, H) bfloat16 or float16, got {x.dtype} of shape {tuple(x.shape)}")
    t, h = x.shape
    e, i2, h1 = check_expert_weight(op, "w1", w1, w1_scale)
    e2, h2, i = check_expert_weight(op, "w2", w2, w2_scale)
    if e2 != e or h1 != h or h2 != h or i2 != 2 * i:
        raise ValueError(
            f"{op}: x (T, H={h}) needs w1 (E, 2I, H) and w2 (E, H, I); got w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}"
        )
    if x.stride(1) != 1 and h > 1:
        raise ValueError(f"{op}: x must have unit stride along H, got strides {x.stride()}")
    for name, tt in (("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        _tensor(op, name, tt)
        if tt.dim() != 2 or tt.shape[0] != t:
            raise ValueError(f"{op}: {name} must be (T={t}, k), got shape {tuple(tt.shape)}")
    k = topk_ids.shape[1]
    if k > e:
        raise ValueError(f"{op}: top-k = {k} must be at most E={e}")
    if tuple(topk_weights.shape) != (t, k):
        raise ValueError(f"{op}: topk_weights {tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} differ")
    if topk_ids.dtype not in (torch.int32, torch.int64) or not topk_weights.dtype.is_floating_point:
        raise TypeError(
            f"{op}: topk_ids must be int32/int64 and topk_weights floating, got {topk_ids.dtype}, {topk_weights.dtype}"
        )
    devices = {tt.device for tt in (x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids)}
    if len(devices) > 1:
        raise ValueError(f"{op}: every tensor must be on one device, got {sorted(map(str, devices))}")
    return t, h, i, e, k


def refuse_grad(op: str, *tensors) -> None:
    """FP8 experts have no autograd: one clear error where a gradient would be needed."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(
            f"{op}: FP8 experts have no autograd (inference only); call under torch.no_grad() or detach the inputs"
        )
