"""The MoE ops' argument checks (torch only, no kernel): one clear error per bad argument. The public functions
and the ``torch.ops.gemmlab`` ops (real and fake implementations) run the same checks.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows.

    check_tensor(name, t, dims, dtypes)      a tensor of that rank and dtype
    check_weights(w1, w2) -> (E, H, I)       w1 (E, 2I, H) and w2 (E, H, I)
    check_moe_args(x, w1, w2, weights, ids) -> (T, H, I, E, k)
    check_grouped_args(x, w, offsets, out, memory) -> (S, K, E, N)
    check_route_args(logits, top_k, scoring, nd)
    check_gather(gather)
    check_grouped_backward_args(dy, x, w, offsets)
    check_moe_backward_args(dy, x, w1, w2, weights, ids, gate_up)
    device_check(ok, message)                a 0-d bool on the device, checked without a host sync
"""

from __future__ import annotations

import torch

from gemmlab.ops.gemm.checks import check_out
from gemmlab.ops.layout import DTYPES

SCORINGS = ("softmax", "sigmoid")
GATHERS = ("auto", "copy", "fused")


def check_tensor(name: str, t: object, dims: int, dtypes=DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in dtypes)}")


def same_device(*named) -> None:
    devs = {str(t.device) for _, t in named}
    if len(devs) > 1:
        raise ValueError("tensors on different devices: " + ", ".join(f"{n} on {t.device}" for n, t in named))


def check_weights(w1, w2) -> tuple[int, int, int]:
    check_tensor("w1", w1, 3)
    check_tensor("w2", w2, 3)
    (e, i2, h), (e2, h2, i) = w1.shape, w2.shape
    if e != e2:
        raise ValueError(f"moe: w1 has E = {e} experts but w2 has {e2}")
    if i2 != 2 * i or h2 != h:
        raise ValueError(f"moe: w1 must be (E, 2I, H) and w2 (E, H, I); got w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}")
    if w1.dtype != w2.dtype:
        raise TypeError(f"moe: w1 and w2 dtypes differ ({w1.dtype}, {w2.dtype})")
    return e, h, i


def check_moe_args(x, w1, w2, topk_weights, topk_ids) -> tuple[int, int, int, int, int]:
    """Every check of ``moe_forward``'s tensors; returns (T, H, I, E, k)."""
    e, h, i = check_weights(w1, w2)
    check_tensor("x", x, 2)
    check_tensor("topk_weights", topk_weights, 2, dtypes=(torch.float32, torch.float16, torch.bfloat16))
    check_tensor("topk_ids", topk_ids, 2, dtypes=(torch.int32, torch.int64))
    same_device(("x", x), ("w1", w1), ("w2", w2), ("topk_weights", topk_weights), ("topk_ids", topk_ids))
    if x.dtype != w1.dtype:
        raise TypeError(f"moe: x has dtype {x.dtype}, the weights {w1.dtype}")
    t, hx = x.shape
    if hx != h:
        raise ValueError(f"moe: x has H = {hx}, the weights H = {h}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != t:
        raise ValueError(
            f"moe: topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
            f"must both be (T={t}, k)"
        )
    k = topk_ids.shape[1]
    if not 1 <= k <= e:
        raise ValueError(f"moe: top-k = {k} must be in [1, E={e}]")
    return t, h, i, e, k


def check_gather(gather: object) -> None:
    if gather not in GATHERS:
        raise ValueError(f"moe: gather {gather!r}: auto, copy or fused")


def check_grouped_args(x, w, offsets, out, memory: bool = True) -> tuple[int, int, int, int]:
    """Every check of ``grouped_gemm``'s tensors (``out`` None: allocated); returns (S, K, E, N). ``memory``
    False: not whether out overlaps the inputs (fake tensors have no memory)."""
    check_tensor("x", x, 2)
    check_tensor("w", w, 3)
    check_tensor("offsets", offsets, 1, dtypes=(torch.int32,))
    same_device(("x", x), ("w", w), ("offsets", offsets))
    if x.dtype != w.dtype:
        raise TypeError(f"grouped_gemm: x and w must have the same dtype, got {x.dtype} and {w.dtype}")
    (s, k), (e, n, k2) = x.shape, w.shape
    if k != k2:
        raise ValueError(f"grouped_gemm: x has K = {k} but w has K = {k2}")
    if offsets.numel() != e:
        raise ValueError(f"grouped_gemm: offsets has {offsets.numel()} entries for E = {e} experts")
    if out is not None:
        check_tensor("out", out, 2)
        if tuple(out.shape) != (s, n) or out.dtype != x.dtype or out.device != x.device or out.stride(1) != 1:
            raise ValueError(f"grouped_gemm: out must be a row-major ({s}, {n}) {x.dtype} tensor on {x.device}")
        if memory:
            check_out("grouped_gemm", out, x=x, w=w, offsets=offsets)
    return s, k, e, n


def check_route_args(router_logits: object, top_k: object, scoring: object, nd: bool = True) -> None:
    """``route``'s checks, on (T, E) logits (``nd``: or (..., E))."""
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() < 2 or (not nd and router_logits.dim() != 2):
        raise ValueError(
            f"route: router_logits must be a (T, E) {'(or (..., E)) ' if nd else ''}tensor, got "
            f"{getattr(router_logits, 'shape', type(router_logits).__name__)}"
        )
    if not router_logits.is_floating_point():
        raise TypeError(f"route: router_logits must be floating point, got {router_logits.dtype}")
    e = router_logits.shape[-1]
    if isinstance(top_k, bool) or not isinstance(top_k, (int, torch.SymInt)) or not 1 <= top_k <= e:
        raise ValueError(f"route: top_k must be an integer in [1, E={e}], got {top_k!r}")
    if scoring not in SCORINGS:
        raise ValueError(f"route: scoring {scoring!r}: softmax or sigmoid")


def check_grouped_backward_args(dy, x, w, offsets) -> None:
    """``grouped_gemm``'s backward: the forward's tensors, and dy (S, N) like its output."""
    s, _, _, n = check_grouped_args(x, w, offsets, None)
    check_tensor("dy", dy, 2)
    if tuple(dy.shape) != (s, n) or dy.dtype != x.dtype or dy.device != x.device:
        raise ValueError(
            f"grouped_gemm backward: dy must be a ({s}, {n}) {x.dtype} tensor on {x.device}, got "
            f"{tuple(dy.shape)} {dy.dtype} on {dy.device}"
        )


def check_moe_backward_args(dy, x, w1, w2, topk_weights, topk_ids, gate_up) -> None:
    """``moe_forward``'s backward: the forward's tensors, dy (T, H) like y, and gate_up (S, 2I) when given."""
    t, h, i, e, k = check_moe_args(x, w1, w2, topk_weights, topk_ids)
    check_tensor("dy", dy, 2)
    if tuple(dy.shape) != (t, h) or dy.dtype != x.dtype or dy.device != x.device:
        raise ValueError(
            f"moe_backward: dy must be a ({t}, {h}) {x.dtype} tensor on {x.device}, got "
            f"{tuple(dy.shape)} {dy.dtype} on {dy.device}"
        )
    if gate_up is not None:
        check_tensor("gate_up", gate_up, 2)
        if tuple(gate_up.shape) != (t * k, 2 * i) or gate_up.dtype != x.dtype or gate_up.device != x.device:
            raise ValueError(
                f"moe_backward: gate_up must be a ({t * k}, {2 * i}) {x.dtype} tensor on {x.device}, "
                f"got {tuple(gate_up.shape)} {gate_up.dtype}"
            )


def device_check(ok: torch.Tensor, message: str) -> None:
    """Check a 0-d bool computed on the device without reading it on the host: on a GPU a device-side assert
    (fires asynchronously and ends the process's CUDA context, as torch's own index checks do), on the CPU a
    ValueError now."""
    if ok.is_cuda:
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise ValueError(message)
