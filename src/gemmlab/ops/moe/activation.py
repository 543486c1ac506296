"""The MoE body with another activation or biases: gpt-oss's clamped SwiGLU (``activation="swiglu_oai"``),
expert biases, the interleaved gate/up layout. Legend: T tokens, H hidden, I expert intermediate, E experts,
k top-k, S = T*k routed (token, slot) rows.

    moe_forward_act(x (T, H), w1 (E, 2I, H), w2 (E, H, I), weights (T, k), ids (T, k), b1 (E, 2I) | None,
                    b2 (E, H) | None, activation, alpha, limit, interleaved, validate) -> y (T, H)
        [gate | up] = x[t] @ w1_e^T + b1_e      (gate rows [0, I) then up rows [I, 2I); ``interleaved``: gate rows
                                                 0, 2, 4, ..., up rows 1, 3, 5, ..., gpt-oss's layout)
        act = swiglu_oai: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit)
              silu:       silu(gate) * up
        y[t] = sum_j weights[t, j] * (act @ w2_e^T + b2_e),  e = ids[t, j]

How: the (token, slot) pairs sorted by expert with torch ops (``routing.sort_routes_torch``: no host sync, and
traceable), x's rows gathered, then gemmlab's grouped GEMM twice (``grouped_gemm``'s kernel and its autograd), the
biases, the activation (in float32) and the top-k weights in torch ops between them, and a deterministic combine
(each token sums its k rows in slot order). The (S, 2I) pre-activations are written (the plain SiLU body keeps them
in the GEMM's epilogue). Differentiable in x, w1, w2, the biases and the weights, through torch's autograd over
the grouped GEMM's custom op.
"""

from __future__ import annotations

import math

import torch

from gemmlab.ops import launch
from gemmlab.ops.moe import custom
from gemmlab.ops.moe.checks import check_tensor, device_check
from gemmlab.ops.moe.grouped import launch_grouped_gemm
from gemmlab.ops.moe.routing import sort_routes_torch

ACTIVATIONS = ("silu", "swiglu_oai")
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0  # gpt-oss's swiglu_alpha and swiglu_limit


def check_act_args(activation, alpha, limit, w1_bias, w2_bias, interleaved, e: int, h: int, i: int, w1):
    """One clear error per bad activation argument; returns (alpha, limit) with swiglu_oai's defaults filled."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"moe_forward: activation {activation!r}: {' or '.join(ACTIVATIONS)}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"moe_forward: interleaved must be a bool, got {interleaved!r}")
    if activation == "silu":
        if alpha is not None or limit is not None:
            raise ValueError("moe_forward: alpha and limit apply to activation='swiglu_oai' only")
    else:
        alpha = OAI_ALPHA if alpha is None else alpha
        limit = OAI_LIMIT if limit is None else limit
        for name, v in (("alpha", alpha), ("limit", limit)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"moe_forward: {name} must be a real number, got {v!r}")
            if not math.isfinite(v):
                raise ValueError(f"moe_forward: {name} must be finite, got {v!r}")
        if limit <= 0:
            raise ValueError(f"moe_forward: limit must be > 0, got {limit!r}")
    for name, b, shape in (("w1_bias", w1_bias, (e, 2 * i)), ("w2_bias", w2_bias, (e, h))):
        if b is None:
            continue
        check_tensor(name, b, 2)
        if tuple(b.shape) != shape:
            raise ValueError(
                f"moe_forward: {name} must be {shape} (E, {'2I' if name == 'w1_bias' else 'H'}), got {tuple(b.shape)}"
            )
        if b.dtype != w1.dtype:
            raise TypeError(f"moe_forward: {name} has dtype {b.dtype}, the weights {w1.dtype}")
        if b.device != w1.device:
            raise ValueError(f"moe_forward: {name} is on {b.device}, the weights on {w1.device}")
    return (float(alpha), float(limit)) if activation == "swiglu_oai" else (None, None)


def _gemm(a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The grouped GEMM (offsets come from the routing table: not checked again)."""
    if launch.direct(a, w, offsets):
        return launch_grouped_gemm(a, w, offsets, None, False)
    return custom.grouped_gemm(a, w, offsets, False)


def moe_forward_act(
    x, w1, w2, topk_weights, topk_ids, w1_bias, w2_bias, activation, alpha, limit, interleaved, validate, dims
) -> torch.Tensor:
    """The body of the module docstring on checked arguments (``dims`` = (T, H, I, E, k)); y in x's dtype."""
    t, h, i, e, k = dims
    if validate and t * k:
        ok = ((topk_ids >= 0) & (topk_ids < e)).all()
        msg = f"moe_forward: topk_ids must be in [0, E={e})"
        if torch.compiler.is_compiling():  # traced: an assert in the graph (no data-dependent branch)
            torch._assert_async(ok, msg)
        else:
            device_check(ok, msg)
    routes = sort_routes_torch(topk_ids, e, 1)  # block_m: the tile table is unused here
    order, inv, token = routes.order.long(), routes.inv.long(), routes.token.long()
    eid = topk_ids.reshape(-1)[order].long()  # the expert of each routed row
    g = _gemm(x[token], w1, routes.offsets).float()  # (S, 2I)
    if w1_bias is not None:
        g = g + w1_bias.float()[eid]  # gathered in fp32: its gradient is summed over the rows in fp32
    gate, up = (g[:, 0::2], g[:, 1::2]) if interleaved else (g[:, :i], g[:, i:])
    if activation == "swiglu_oai":
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        act = (up + 1) * (gate * torch.sigmoid(gate * alpha))
    else:
        act = torch.nn.functional.silu(gate) * up
    o = _gemm(act.to(x.dtype), w2, routes.offsets).float()  # (S, H)
    if w2_bias is not None:
        o = o + w2_bias.float()[eid]
    o = o * topk_weights.reshape(-1)[order].float()[:, None]
    return o[inv].view(t, k, h).sum(1).to(x.dtype)  # slot order per token: deterministic
