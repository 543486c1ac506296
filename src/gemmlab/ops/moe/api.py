"""Mixture of Experts, the public module: ``route``, ``grouped_gemm``, ``pack_moe_weights``, ``moe_forward``.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed (token, slot) rows.

    route(logits (T, E), k)                     -> weights (T, k) fp32, ids (T, k) int32
    grouped_gemm(x (S, K), w (E, N, K), offsets) -> (S, N); rows of group e times w[e]^T
    moe_forward(x (T, H), w1 (E, 2I, H), w2 (E, H, I), weights, ids) -> y (T, H)
        y[t] = sum_j weights[t, j] * (silu(x[t] @ gate_e^T) * (x[t] @ up_e^T)) @ w2_e^T,  e = ids[t, j]

moe_forward: (1) sort the (token, slot) pairs by expert on the GPU, stably, with no host sync (``ops.moe.routing``:
one launch up to ``ALIGN_MAX_S`` pairs, a counting sort in three launches above), (2) first GEMM over all experts in
one persistent launch on x's rows in expert order (gathered once, or read by token index inside the GEMM:
``gather``), SiLU(gate) * up in the epilogue (the 2I-wide intermediate is never written), (3) second GEMM with each
row's top-k weight applied in its epilogue, (4) a deterministic combine back to token order (each token sums its k
rows in slot order). fp16 and bf16, fp32 accumulation. Every decision of a call is planned once per signature of
its inputs and options (``ops.moe.plan``: one plan whose options are the plain body, the gate/up-saving body that
autograd runs and the FP8 experts' body, in one bounded cache); later calls allocate one scratch buffer (routing
tables, gathered x, intermediate, routed outputs) and y, and launch the kept kernels with device addresses
(``gemmlab.ops.launch``). The path of a repeat eager call: this module, ``ops.moe.plan`` (the plan and its
launches; ``ops.cache`` keeps it), ``ops.launch`` (is the call eager? then the kept kernel's launcher), then the
kernels.
``validate=True`` checks ids and offsets against E and S on the device (no host sync: a device-side assert on
a GPU, so it works in CUDA graphs too); ``validate=False`` skips those few small launches.

The lab's way into the details: ``MoEConfig``, ``Mode``/``MODES``, ``moe_config``/``moe_choice`` (the config
tables' choice), ``sort_routes`` (the routing table), ``launch_config``/``epilogue_flags`` (what a grouped launch
compiles), ``moe_grouped_kernel`` and ``last_kernel`` (the grouped kernel, and its compiled form last run by
``grouped_gemm``, or by a moe_forward plan's first call: a plan keeps its compiled kernels in its steps),
``moe_backward`` (the fused backward), ``MoEBackwardConfig``/``backward_config`` (its launch parameters and
whether the autograd forward keeps gate/up, from the "moe_backward" config tables).
"""

from __future__ import annotations

import torch

from gemmlab.ops import dispatch, launch
from gemmlab.ops.layout import DTYPES
from gemmlab.ops.moe import custom
from gemmlab.ops.moe.activation import ACTIVATIONS, check_act_args, moe_forward_act
from gemmlab.ops.moe.backward import moe_backward, weight_grad
from gemmlab.ops.moe.checks import check_gather, check_moe_args, check_route_args, check_tensor, check_weights
from gemmlab.ops.moe.config import (
    MODES,
    Mode,
    MoEBackwardConfig,
    MoEConfig,
    backward_config,
    moe_choice,
    moe_config,
    saves_gate_up,
)
from gemmlab.ops.moe.grouped import (
    epilogue_flags,
    grid_programs,
    last_kernel,
    launch_config,
    launch_grouped_gemm,
    moe_grouped_kernel,
)
from gemmlab.ops.moe.plan import launch_moe_forward
from gemmlab.ops.moe.routing import Routes, route_kind, sort_routes
from gemmlab.ops.moe.scores import route_scores
from gemmlab.ops.moe_fp8 import PackedMoEFP8, moe_forward_fp8
from gemmlab.ops.packing import PackedMoE, deinterleave_gate_up, pack_moe_weights

__all__ = [
    "ACTIVATIONS",
    "DTYPES",
    "MODES",
    "Mode",
    "MoEBackwardConfig",
    "MoEConfig",
    "PackedMoE",
    "Routes",
    "backward_config",
    "check_tensor",
    "check_weights",
    "deinterleave_gate_up",
    "epilogue_flags",
    "grid_programs",
    "grouped_gemm",
    "last_kernel",
    "launch_config",
    "moe_backward",
    "moe_choice",
    "moe_config",
    "moe_forward",
    "moe_forward_saving",
    "moe_grouped_kernel",
    "pack_moe_weights",
    "route",
    "route_kind",
    "sort_routes",
    "weight_grad",
]


def route(
    router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True, scoring: str = "softmax"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing. (T, E) logits -> (T, k) float32 weights and (T, k) int32 expert ids ((..., E) -> (..., k)).
    ``scoring``: "softmax" (probabilities over E, then top-k) or "sigmoid" (DeepSeek-V3: independent sigmoid scores,
    top-k; no group limit). ``renormalize``: the k weights of a token sum to 1. Differentiable w.r.t. the
    logits through the weights (the selection held fixed, as torch.topk's backward); the ids are not.
    A custom op (``torch.ops.gemmlab.route``) under torch.compile and autograd."""
    check_route_args(router_logits, top_k, scoring)
    e, lead = router_logits.shape[-1], router_logits.shape[:-1]
    logits = router_logits if router_logits.dim() == 2 else router_logits.reshape(-1, e)
    if launch.direct(logits):
        weights, ids = route_scores(logits, top_k, renormalize, scoring)
    else:
        weights, ids = custom.route(logits, top_k, bool(renormalize), scoring)
    if router_logits.dim() != 2:
        weights, ids = weights.view(*lead, top_k), ids.view(*lead, top_k)
    return weights, ids


def grouped_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    offsets: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    validate: bool = True,
    config: MoEConfig | None = None,
) -> torch.Tensor:
    """out (S, N): rows offsets[e-1]:offsets[e] of x (S, K) times w[e]^T, w (E, N, K) in nn.Linear layout;
    offsets (E,) int32 cumulative group ends, as ``torch._grouped_mm``'s ``offs`` (empty groups allowed,
    any sizes; rows past offsets[-1] are left untouched). One persistent launch over all groups.
    ``validate``: check the offsets (non-decreasing, within [0, S]) without a host sync: on a GPU by a device-side
    assert (a bad value stops the program at its next synchronization, as a bad index into a torch op does), on the
    CPU at once (ValueError). ``out``: written in place; refused when it overlaps x, w or offsets, or its rows
    share memory (stride 0). Differentiable in x and w (``gemmlab.ops.moe.custom``; rows past offsets[-1] get zero
    gradient). ``config``: launch parameters instead of ``moe_config``'s (tuning; eager only, no autograd)."""
    if config is not None:
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (x, w)):
            raise RuntimeError("grouped_gemm: config= is the tuner's eager path and has no autograd")
        if not isinstance(config, MoEConfig):
            raise TypeError(f"grouped_gemm: config must be a MoEConfig, got {type(config).__name__}")
        dispatch.refuse_neg_out("grouped_gemm", out)
        x, w, offsets = (t.resolve_neg() if isinstance(t, torch.Tensor) else t for t in (x, w, offsets))
        return launch_grouped_gemm(x, w, offsets, out, validate, config)
    if out is not None:
        dispatch.refuse_neg_out("grouped_gemm", out)
        if isinstance(out, torch.Tensor):
            dispatch.refuse_grad_out("grouped_gemm", out, *(t for t in (x, w) if isinstance(t, torch.Tensor)))
        if launch.direct(x, w, offsets, out):
            return launch_grouped_gemm(x, w, offsets, out, validate)
        dispatch.need_tensors("grouped_gemm", x=x, w=w, offsets=offsets, out=out)
        custom.grouped_gemm_out(x, w, offsets, out, bool(validate))
        return out
    if launch.direct(x, w, offsets):
        return launch_grouped_gemm(x, w, offsets, None, validate)
    dispatch.need_tensors("grouped_gemm", x=x, w=w, offsets=offsets)
    return custom.grouped_gemm(x, w, offsets, bool(validate))


def moe_forward(
    x: torch.Tensor,
    w1: torch.Tensor | PackedMoE | PackedMoEFP8,
    w2: torch.Tensor | None,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    validate: bool = True,
    gather: str = "auto",
    configs: tuple[MoEConfig, MoEConfig] | None = None,
    save_gate_up: bool | None = None,
    activation: str = "silu",
    alpha: float | None = None,
    limit: float | None = None,
    w1_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    interleaved: bool = False,
) -> torch.Tensor:
    """The MoE layer body (see the module docstring). ``w1`` may be a ``PackedMoE`` (then ``w2`` is None
    or ignored); a ``PackedMoEFP8`` (``pack_moe_fp8``) runs the FP8 experts (``ops.moe_fp8.moe_forward_fp8``:
    inference only, ``validate`` as here, the other keywords ignored). x (T, H) or (..., H); returns y of x's
    shape and dtype. ``gather``: how the first GEMM gets
    x's rows in expert order: "copy" (x[token] gathered once, then read through TMA: pipelined wgmma; 2*S*H
    bytes of extra traffic), "fused" (pointer loads of x rows by token index inside the GEMM: no copy, but on
    sm_90 those loads are not software-pipelined), "auto" (copy when x's rows are 16-byte aligned on a TMA
    target). ``validate``: check topk_ids in [0, E) without a host sync (a device-side assert on a GPU, a
    ValueError on the CPU; see ``grouped_gemm``). Differentiable in x, w1, w2 and topk_weights
    (``gemmlab.ops.moe.custom``; topk_ids (T, k) must then be 2-D like topk_weights). ``configs``: (first GEMM,
    second GEMM) launch parameters instead of ``moe_config``'s (tuning; eager only, no autograd); the second
    takes the first's BLOCK_M (one tile schedule). ``save_gate_up`` (when a gradient is needed): True keeps the
    gate/up pre-activations (S, 2I) from the forward for the backward (``moe_forward_saving``, Liger's trade:
    faster, S*2I more elements held until the backward), False has the backward recompute them; None: as the
    "moe_backward" config tables say (``ops.moe.backward.backward_config``).

    ``activation``: "silu" (SiLU(gate) * up, the fused body above) or "swiglu_oai" (gpt-oss's clamped SwiGLU:
    (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit); ``alpha`` 1.702 and
    ``limit`` 7.0 unless given; they are refused with "silu"). ``w1_bias`` (E, 2I) and ``w2_bias`` (E, H): expert
    biases added after each GEMM (w1's dtype). ``interleaved``: w1's 2I rows (and w1_bias) hold gate and up
    interleaved (gate rows 0, 2, 4, ..., up rows 1, 3, 5, ...: gpt-oss's gate_up_proj transposed), not in halves
    (``pack_moe_weights(..., interleaved=True)`` de-interleaves once instead). Any of these runs
    ``ops.moe.activation``'s body: the grouped GEMM twice with the activation in torch ops between (not the
    fused epilogue), differentiable in x, w1, w2, the biases and topk_weights; ``configs`` and
    ``save_gate_up`` do not apply to it."""
    if (
        activation != "silu"
        or w1_bias is not None
        or w2_bias is not None
        or interleaved is not False
        or (alpha is not None or limit is not None)
    ):
        return _moe_act(
            x,
            w1,
            w2,
            topk_weights,
            topk_ids,
            validate,
            gather,
            configs,
            activation,
            alpha,
            limit,
            w1_bias,
            w2_bias,
            interleaved,
        )
    if isinstance(w1, PackedMoEFP8):
        return moe_forward_fp8(x, w1, topk_weights, topk_ids, validate=validate)
    if isinstance(w1, PackedMoE):
        w1, w2 = w1.w1, w1.w2
    if configs is not None:
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (x, w1, w2, topk_weights)):
            raise RuntimeError("moe_forward: configs= is the tuner's eager path and has no autograd")
        if not (
            isinstance(configs, (tuple, list)) and len(configs) == 2 and all(isinstance(c, MoEConfig) for c in configs)
        ):
            raise TypeError(f"moe_forward: configs must be a (MoEConfig, MoEConfig) pair, got {configs!r:.80}")
        x, w1, w2, topk_weights, topk_ids = (
            t.resolve_neg() if isinstance(t, torch.Tensor) else t for t in (x, w1, w2, topk_weights, topk_ids)
        )
        return launch_moe_forward(x, w1, w2, topk_weights, topk_ids, validate, gather, configs)
    lead = None
    if isinstance(x, torch.Tensor) and x.dim() != 2 and x.dim() >= 1:
        lead, x = x.shape, x.reshape(-1, x.shape[-1])
        # (T, k) from (..., k); the k is named, not -1, so an empty batch (T = 0) reshapes too
        if isinstance(topk_weights, torch.Tensor) and topk_weights.dim() >= 1:
            topk_weights = topk_weights.reshape(x.shape[0], topk_weights.shape[-1])
        if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() >= 1:
            topk_ids = topk_ids.reshape(x.shape[0], topk_ids.shape[-1])
    if launch.direct(x, w1, w2, topk_weights, topk_ids):  # the plan checks a new signature in full (gather too)
        return _lead(launch_moe_forward(x, w1, w2, topk_weights, topk_ids, validate, gather, None), lead)
    check_gather(gather)
    eager = launch.eager(x, w1, w2, topk_weights, topk_ids)  # needs autograd only: no dispatcher (host time)
    dims = None if eager else check_moe_args(x, w1, w2, topk_weights, topk_ids)  # errors before the op's fake
    save = bool(save_gate_up)
    if (
        save_gate_up is None
        and torch.is_grad_enabled()
        and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (x, w1, w2, topk_weights))
    ):
        save = saves_gate_up(x, dims or check_moe_args(x, w1, w2, topk_weights, topk_ids))
    args = (x, w1, w2, topk_weights, topk_ids, bool(validate), gather)
    if eager:
        y = (custom.MoEForwardSaving if save else custom.MoEForward).apply(*args)
    else:
        y = custom.moe_forward_saving(*args)[0] if save else custom.moe_forward(*args)
    return _lead(y, lead)


def _moe_act(x, w1, w2, tw, ids, validate, gather, configs, activation, alpha, limit, b1, b2, interleaved):
    """``moe_forward`` with another activation, biases or the interleaved layout (``ops.moe.activation``)."""
    if isinstance(w1, PackedMoEFP8):
        raise ValueError("moe_forward: the FP8 experts (PackedMoEFP8) run SiLU(gate) * up without biases only")
    if configs is not None:
        raise ValueError("moe_forward: configs= applies to activation='silu' without biases only")
    if isinstance(w1, PackedMoE):
        w1, w2 = w1.w1, w1.w2
    check_gather(gather)
    lead = None
    if isinstance(x, torch.Tensor) and x.dim() != 2 and x.dim() >= 1:
        lead, x = x.shape, x.reshape(-1, x.shape[-1])
        if isinstance(tw, torch.Tensor) and tw.dim() >= 1:
            tw = tw.reshape(x.shape[0], tw.shape[-1])
        if isinstance(ids, torch.Tensor) and ids.dim() >= 1:
            ids = ids.reshape(x.shape[0], ids.shape[-1])
    dims = check_moe_args(x, w1, w2, tw, ids)
    _, h, i, e, _ = dims
    alpha, limit = check_act_args(activation, alpha, limit, b1, b2, interleaved, e, h, i, w1)
    y = moe_forward_act(x, w1, w2, tw, ids, b1, b2, activation, alpha, limit, interleaved, bool(validate), dims)
    return _lead(y, lead)


def _lead(y: torch.Tensor, lead: torch.Size | None) -> torch.Tensor:
    return y if lead is None else y.view(lead)


def moe_forward_saving(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """``moe_forward(..., save_gate_up=True)``: its autograd keeps the gate/up pre-activations for the backward
    whatever the tables say (``torch.ops.gemmlab.moe_forward_saving`` under tracing)."""
    check_moe_args(x, w1, w2, topk_weights, topk_ids)
    return moe_forward(x, w1, w2, topk_weights, topk_ids, validate=validate, save_gate_up=True)
