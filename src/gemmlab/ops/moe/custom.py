"""gemmlab's MoE ops as ``torch.library`` custom ops (``torch.ops.gemmlab.*``): fake (meta) implementations for
``torch.compile`` and autograd formulas. Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k,
S = T*k routed rows.

    gemmlab::grouped_gemm(x (S, K), w (E, N, K), offsets, validate=True) -> (S, N)
    gemmlab::grouped_gemm_out(x, w, offsets, out!, validate=True) out= variant (no autograd)
    gemmlab::grouped_gemm_backward(dy, x, w, offsets) -> (dx (S, K), dw (E, N, K))
    gemmlab::moe_forward(x (T, H), w1 (E, 2I, H), w2 (E, H, I), topk_weights (T, k), topk_ids (T, k),
                         validate=True, gather="auto") -> y (T, H)
    gemmlab::moe_backward(dy, x, w1, w2, topk_weights, topk_ids, need_w1=True, need_w2=True, gate_up=None)
                         -> (dx, dw1, dw2, dtw)
    gemmlab::moe_forward_saving(x, w1, w2, topk_weights, topk_ids, validate=True, gather="auto")
                         -> (y, gate_up (S, 2I))
    gemmlab::route(logits (T, E), top_k, renormalize=True, scoring="softmax") -> (weights (T, k) fp32, ids (T, k) int32)

Registered on ``import gemmlab`` (this module imports torch and the checks only): each op's body imports its
launcher on first call, so no Triton kernel loads before one runs (Triton decides at a kernel's import whether it
runs compiled or under its CPU interpreter). Every op checks its own arguments, in the real implementation (the
launchers' checks) and, on metadata, in the fake one: a direct ``torch.ops.gemmlab.*`` call gets the same one
clear error as the Python function.

The public functions (``gemmlab.moe_forward`` ...) call these ops whenever the call is traced (torch.compile), needs
autograd, or runs under a dispatch mode or functorch transform; a plain eager call with no grad goes straight to
the same implementation (``ops.launch.direct``), so it does not pay the dispatcher's and autograd wrapper's host cost.
Each op is opaque to the compiler: inside a compiled graph it runs gemmlab's launcher as in eager.

Backward kernels (the dense GEMM's are ``ops.gemm.custom``'s): the grouped input gradient dX on
``ops.moe.backward``'s grouped kernel that reads w in place as the (N, K) operand. The per-expert weight gradient
dW[e] = dY_e^T X_e reduces over the expert's rows: one launch of ``ops.moe.backward``'s weight-gradient kernel over
all experts (offsets read on the device). moe_forward's backward is ``ops.moe.backward.moe_backward`` (fused; no
host sync, capturable): after ``moe_forward``, which recomputes gate/up; after ``moe_forward_saving``, which keeps
them (``moe_forward`` under autograd takes one or the other as the "moe_backward" config tables say). ``MoEForward``
/ ``MoEForwardSaving``: the same formulas as autograd.Functions for plain eager calls.
"""

import torch
from torch import Tensor

from gemmlab.ops.dispatch import negative_kernel, unit
from gemmlab.ops.moe.checks import (
    check_gather,
    check_grouped_args,
    check_grouped_backward_args,
    check_moe_args,
    check_moe_backward_args,
    check_route_args,
)
from gemmlab.ops.moe.scores import route_scores


def _launch_grouped_gemm(x, w, offsets, out, validate):
    from gemmlab.ops.moe.grouped import launch_grouped_gemm

    return launch_grouped_gemm(x, w, offsets, out, validate)


def _launch_moe_forward(x, w1, w2, topk_weights, topk_ids, validate, gather):
    from gemmlab.ops.moe.plan import launch_moe_forward

    check_gather(gather)
    return launch_moe_forward(x, w1, w2, topk_weights, topk_ids, validate, gather, None)


# ----------------------------------------------------------------------------------------- grouped_gemm


@torch.library.custom_op("gemmlab::grouped_gemm", mutates_args=())
def grouped_gemm(x: Tensor, w: Tensor, offsets: Tensor, validate: bool = True) -> Tensor:
    return _launch_grouped_gemm(x, w, offsets, None, validate)


@grouped_gemm.register_fake
def _(x, w, offsets, validate=True):
    check_grouped_args(x, w, offsets, None)
    return x.new_empty((x.shape[0], w.shape[1]))


@torch.library.custom_op("gemmlab::grouped_gemm_out", mutates_args=("out",))
def grouped_gemm_out(x: Tensor, w: Tensor, offsets: Tensor, out: Tensor, validate: bool = True) -> None:
    _launch_grouped_gemm(x, w, offsets, out, validate)


@grouped_gemm_out.register_fake
def _(x, w, offsets, out, validate=True):
    check_grouped_args(x, w, offsets, out, memory=False)
    return None


negative_kernel("grouped_gemm_out", 3)


def weight_grad(dy: Tensor, x: Tensor, offsets: Tensor, dw: Tensor) -> Tensor:
    """dw[e] (N, K) = dy[rows_e]^T (N, S_e) @ x[rows_e] (S_e, K): one launch over every expert
    (``ops.moe.backward.weight_grad``; no host sync). An expert with no rows gets zeros."""
    from gemmlab.ops.moe.backward import weight_grad as launch_weight_grad

    return launch_weight_grad(dy, None, x, None, offsets, dw)


@torch.library.custom_op("gemmlab::grouped_gemm_backward", mutates_args=())
def grouped_gemm_backward(dy: Tensor, x: Tensor, w: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    from gemmlab.ops.moe.backward import grouped_input_grad

    check_grouped_backward_args(dy, x, w, offsets)
    dy = dy if dy.stride(-1) == 1 else dy.contiguous()
    dx = torch.zeros_like(x, memory_format=torch.contiguous_format)  # rows past offsets[-1] get no gradient
    grouped_input_grad(dy, w, offsets, dx)  # dy (S, N) @ w_e (N, K), w read in place
    dw = weight_grad(
        dy,
        x if x.stride(-1) == 1 else x.contiguous(),
        offsets,
        torch.empty_like(w, memory_format=torch.contiguous_format),
    )
    return dx, dw


@grouped_gemm_backward.register_fake
def _(dy, x, w, offsets):
    check_grouped_backward_args(dy, x, w, offsets)
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        w, memory_format=torch.contiguous_format
    )


def _grouped_setup(ctx, inputs, output):
    x, w, offsets, _ = inputs
    ctx.save_for_backward(x, w, offsets)


def _grouped_backward(ctx, dy):
    x, w, offsets = ctx.saved_tensors
    dx, dw = grouped_gemm_backward(dy, x, w, offsets)
    return (dx if ctx.needs_input_grad[0] else None), (dw if ctx.needs_input_grad[1] else None), None, None


grouped_gemm.register_autograd(_grouped_backward, setup_context=_grouped_setup)


# ------------------------------------------------------------------------------------------ moe_forward


@torch.library.custom_op("gemmlab::moe_forward", mutates_args=())
def moe_forward(
    x: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    validate: bool = True,
    gather: str = "auto",
) -> Tensor:
    return _launch_moe_forward(x, w1, w2, topk_weights, topk_ids, validate, gather)


@moe_forward.register_fake
def _(x, w1, w2, topk_weights, topk_ids, validate=True, gather="auto"):
    check_moe_args(x, w1, w2, topk_weights, topk_ids)
    check_gather(gather)
    return x.new_empty((x.shape[0], w2.shape[1]))


@torch.library.custom_op("gemmlab::moe_backward", mutates_args=())
def moe_backward(
    dy: Tensor,
    x: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    need_w1: bool = True,
    need_w2: bool = True,
    gate_up: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The fused backward (``gemmlab.ops.moe.backward``): the routes sorted again, the first GEMM recomputed
    from x inside the kernel that computes dy W2 (nothing but the inputs is saved; or, with ``gate_up`` from
    ``moe_forward_saving``, loaded instead), d topk_weights folded into that kernel's epilogue, dX by a grouped
    GEMM on W1 in place and a deterministic combine, dW1 and dW2 by one grouped weight-gradient launch each
    (skipped, and returned as (0,) tensors, when not needed). No host sync, no host loop over experts."""
    from gemmlab.ops.moe.backward import moe_backward as launch_moe_backward

    check_moe_backward_args(dy, x, w1, w2, topk_weights, topk_ids, gate_up)
    return launch_moe_backward(dy, x, w1, w2, topk_weights, topk_ids, need_w1=need_w1, need_w2=need_w2, gate_up=gate_up)


@moe_backward.register_fake
def _(dy, x, w1, w2, topk_weights, topk_ids, need_w1=True, need_w2=True, gate_up=None):
    check_moe_backward_args(dy, x, w1, w2, topk_weights, topk_ids, gate_up)
    return (
        x.new_empty(x.shape),
        w1.new_empty(w1.shape if need_w1 else (0,)),
        w2.new_empty(w2.shape if need_w2 else (0,)),
        topk_weights.new_empty(topk_weights.shape),
    )


def _moe_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5])


def _moe_backward(ctx, dy):
    need = ctx.needs_input_grad
    dx, dw1, dw2, dtw = moe_backward(unit(dy), *ctx.saved_tensors, need[1], need[2], None)
    return (
        dx if need[0] else None,
        dw1 if need[1] else None,
        dw2 if need[2] else None,
        dtw if need[3] else None,
        None,
        None,
        None,
    )


moe_forward.register_autograd(_moe_backward, setup_context=_moe_setup)


class MoEForward(torch.autograd.Function):
    """``gemmlab::moe_forward`` with its autograd formula, for plain eager calls that need a gradient (``eager``):
    the same launcher and backward, without the dispatcher and the custom op's wrappers (host time per call)."""

    @staticmethod
    def forward(ctx, x, w1, w2, topk_weights, topk_ids, validate, gather):
        ctx.save_for_backward(x, w1, w2, topk_weights, topk_ids)
        return _launch_moe_forward(x, w1, w2, topk_weights, topk_ids, validate, gather)

    @staticmethod
    def backward(ctx, dy):
        return _moe_backward(ctx, dy)


def _launch_forward_saving(x, w1, w2, topk_weights, topk_ids, validate, gather):
    from gemmlab.ops.moe.plan import launch_forward_saving

    return launch_forward_saving(x, w1, w2, topk_weights, topk_ids, validate, gather)


@torch.library.custom_op("gemmlab::moe_forward_saving", mutates_args=())
def moe_forward_saving(
    x: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    validate: bool = True,
    gather: str = "auto",
) -> tuple[Tensor, Tensor]:
    """y and the gate/up pre-activations (S, 2I, routed order) that its backward loads instead of recomputing."""
    return _launch_forward_saving(x, w1, w2, topk_weights, topk_ids, validate, gather)


@moe_forward_saving.register_fake
def _(x, w1, w2, topk_weights, topk_ids, validate=True, gather="auto"):
    check_moe_args(x, w1, w2, topk_weights, topk_ids)
    check_gather(gather)
    s, i2 = x.shape[0] * topk_ids.shape[1], w1.shape[1]
    return x.new_empty((x.shape[0], w2.shape[1])), x.new_empty((s, i2))


def _saving_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5], output[1])


def _saving_backward(ctx, dy, _dgate_up):
    need = ctx.needs_input_grad
    *saved, gate_up = ctx.saved_tensors
    dx, dw1, dw2, dtw = moe_backward(unit(dy), *saved, need[1], need[2], gate_up)
    return (
        dx if need[0] else None,
        dw1 if need[1] else None,
        dw2 if need[2] else None,
        dtw if need[3] else None,
        None,
        None,
        None,
    )


moe_forward_saving.register_autograd(_saving_backward, setup_context=_saving_setup)


class MoEForwardSaving(torch.autograd.Function):
    """``gemmlab::moe_forward_saving``'s y with its autograd formula, for plain eager calls that need a gradient
    (as ``MoEForward``): gate/up kept for the backward, without the dispatcher and the custom op's wrappers."""

    @staticmethod
    def forward(ctx, x, w1, w2, topk_weights, topk_ids, validate, gather):
        y, gate_up = _launch_forward_saving(x, w1, w2, topk_weights, topk_ids, validate, gather)
        ctx.save_for_backward(x, w1, w2, topk_weights, topk_ids, gate_up)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _saving_backward(ctx, dy, None)


# ------------------------------------------------------------------------------------------------ route


@torch.library.custom_op("gemmlab::route", mutates_args=())
def route(
    router_logits: Tensor, top_k: int, renormalize: bool = True, scoring: str = "softmax"
) -> tuple[Tensor, Tensor]:
    check_route_args(router_logits, top_k, scoring, nd=False)
    return route_scores(router_logits, top_k, renormalize, scoring)


@route.register_fake
def _(router_logits, top_k, renormalize=True, scoring="softmax"):
    check_route_args(router_logits, top_k, scoring, nd=False)
    t = router_logits.shape[0]
    return (
        router_logits.new_empty((t, top_k), dtype=torch.float32),
        router_logits.new_empty((t, top_k), dtype=torch.int32),
    )


def _route_setup(ctx, inputs, output):
    logits, _, renormalize, scoring = inputs
    ctx.renormalize, ctx.scoring = renormalize, scoring
    ctx.save_for_backward(logits, *output)


def _route_backward(ctx, dweights, _dids):
    """Gradient w.r.t. the logits with the selection (ids) held fixed, as torch's topk backward does:
    renormalized w = s_sel / sum(s_sel) -> ds_sel = (dw - sum(dw * w)) / sum(s_sel); then the softmax or
    sigmoid backward of the scattered ds (zero off the selected experts)."""
    logits, weights, ids = ctx.saved_tensors
    lf = logits.float()
    s = torch.softmax(lf, dim=-1) if ctx.scoring == "softmax" else torch.sigmoid(lf)
    ids = ids.long()
    dw = dweights.float()
    if ctx.renormalize:
        dw = (dw - (dw * weights).sum(-1, keepdim=True)) / s.gather(1, ids).sum(-1, keepdim=True)
    ds = torch.zeros_like(s).scatter(1, ids, dw)
    if ctx.scoring == "softmax":
        dl = s * (ds - (ds * s).sum(-1, keepdim=True))
    else:
        dl = ds * s * (1 - s)
    return dl.to(logits.dtype), None, None, None


route.register_autograd(_route_backward, setup_context=_route_setup)
