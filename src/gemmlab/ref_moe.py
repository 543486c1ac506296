"""The grouped GEMM's and MoE's references, the MoE baseline (``moe_composite``: torch ops on
``torch._grouped_mm``) and their checks (``gemmlab.ref`` re-exports them: import them from there).

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k.
"""

from __future__ import annotations

import math

import torch

from gemmlab.ref_gemm import mantissa_bits


def grouped_gemm_ref(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """float32 loop over groups: rows offsets[e-1]:offsets[e] of x (S, K) times w[e]^T (w (E, N, K)).
    Rows past offsets[-1] are zero."""
    out = torch.zeros((x.shape[0], w.shape[1]), dtype=torch.float32, device=x.device)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        out[start:end] = x[start:end].float() @ w[e].float().t()
        start = end
    return out


def grouped_gemm_check(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """|out - grouped_gemm_ref| <= 2 * 2^-mantissa(out's dtype) * max |ref| + 1e-3: the grouped GEMM's tolerance
    (two roundings of the largest output in out's dtype, and a floor for all-small outputs), the one bench moe
    and the tuner use. NaN or Inf fails. Returns ok, max_abs_err, allowed and worst (err / allowed)."""
    allowed = 2 * 2.0 ** -mantissa_bits(out.dtype) * (ref.abs().max().item() if ref.numel() else 0.0) + 1e-3
    finite = bool(torch.isfinite(out).all())
    err = ((out.float() - ref).abs().max().item() if out.numel() else 0.0) if finite else math.inf
    return {"ok": finite and err <= allowed, "max_abs_err": err, "allowed": allowed, "worst": err / allowed}


def moe_ref(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
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


def moe_same_dtype(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
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


def moe_layer_ref(
    x: torch.Tensor,
    gate_w: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    same_dtype: bool = False,
) -> torch.Tensor:
    """A whole MoE layer (``gemmlab.nn.MoE``: router logits x gate_w^T (E, H), softmax or sigmoid scores, top-k
    weights, the experts) with the expert choice ``topk_ids`` (T, k) held fixed, as torch.topk's backward holds
    it: float32 (``moe_ref``), or with ``same_dtype`` in x's dtype as PyTorch computes it (``moe_same_dtype``;
    the router's scores in float32 as ``route`` makes them). Differentiable in x, gate_w, w1 and w2."""
    logits = torch.nn.functional.linear(x, gate_w) if same_dtype else x.float() @ gate_w.float().t()
    scores = torch.softmax(logits.float(), -1) if scoring == "softmax" else torch.sigmoid(logits.float())
    weights = scores.gather(1, topk_ids.long())
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return (moe_same_dtype if same_dtype else moe_ref)(x, w1, w2, weights, topk_ids)


def moe_composite(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """The MoE body from torch ops on ``torch._grouped_mm`` (the forward baseline): sort the (token, slot)
    pairs by expert, gather, grouped gate/up, SiLU * up, grouped down, weight, index_add back to tokens.
    x (T, H), w1 (E, 2I, H), w2 (E, H, I), weights (T, k), ids (T, k) -> y (T, H) in x's dtype."""
    t, k = ids.shape
    e, i = w1.shape[0], w2.shape[2]
    flat = ids.reshape(-1).long()
    _, order = torch.sort(flat, stable=True)
    counts = torch.zeros(e, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    token = order // k
    h = torch._grouped_mm(x[token], w1.transpose(1, 2), offs=offs)
    act = torch.nn.functional.silu(h[:, :i]) * h[:, i:]
    o = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs) * weights.reshape(-1)[order].to(x.dtype)[:, None]
    return torch.zeros_like(x, dtype=torch.float32).index_add_(0, token, o.float()).to(x.dtype)


def moe_check(
    y: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    ref: torch.Tensor | None = None,
) -> dict:
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


def _expert_grads(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, dy: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """torch.autograd of one expert's part of ``moe_ref`` computed in ``dtype``: rows x (R, H) routed to it,
    w1 (2I, H), w2 (H, I), their weights (R,), upstream dy (R, H) -> (dx, dw1, dw2, dweights)."""
    i = w2.shape[1]
    leaves = [t.detach().to(dtype).requires_grad_() for t in (x, w1, w2, weights)]
    a, g, d, s = leaves
    with torch.enable_grad():
        act = torch.nn.functional.silu(a @ g[:i].t()) * (a @ g[i:].t())
        o = (act @ d.t()) * s[:, None]
        return torch.autograd.grad(o, leaves, dy.to(dtype))


def moe_grad_check(
    grads: tuple[torch.Tensor, ...],
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> dict:
    """Gradients (dx (T, H), dw1 (E, 2I, H), dw2 (E, H, I), d topk_weights (T, k)) of sum(y * dy) checked
    against torch.autograd of the float32 loop (``moe_ref``), one expert at a time (no float32 copy of the
    whole weights is ever held). Per tensor, the tolerance of ``moe_check``: |g - ref| <= 2 * max |torch in
    x's dtype - ref| + one ulp of max |ref|. An expert with no rows must get zero weight gradients."""
    names = ("dx", "dw1", "dw2", "dweights")
    if len(grads) != 4 or any(g is None for g in grads):
        return {"ok": False, "error": f"expected 4 gradients {names}, got {[type(g).__name__ for g in grads]}"}
    for name, g, like in zip(names, grads, (x, w1, w2, topk_weights), strict=True):
        if tuple(g.shape) != tuple(like.shape):
            return {"ok": False, "error": f"{name} has shape {tuple(g.shape)}, expected {tuple(like.shape)}"}
    t, h = x.shape
    acc = {n: [0.0, 0.0, 0.0] for n in names}  # max |g - ref|, max |torch same dtype - ref|, max |ref|
    ref_x, same_x = torch.zeros((t, h), device=x.device), torch.zeros((t, h), device=x.device)
    ref_w, same_w = torch.zeros(topk_ids.shape, device=x.device), torch.zeros(topk_ids.shape, device=x.device)

    def note(name: str, got: torch.Tensor, ref: torch.Tensor, same: torch.Tensor) -> None:
        a = acc[name]
        got = got.float()
        a[0] = max(a[0], (got - ref).abs().max().item() if bool(torch.isfinite(got).all()) else math.inf)
        a[1] = max(a[1], (same.float() - ref).abs().max().item())
        a[2] = max(a[2], ref.abs().max().item())

    for e in range(w1.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            note("dw1", grads[1][e], torch.zeros_like(w1[e], dtype=torch.float32), w1.new_zeros(w1[e].shape))
            note("dw2", grads[2][e], torch.zeros_like(w2[e], dtype=torch.float32), w2.new_zeros(w2[e].shape))
            continue
        args = (x[tok], w1[e], w2[e], topk_weights[tok, slot], dy[tok])
        r, s = _expert_grads(*args, torch.float32), _expert_grads(*args, x.dtype)
        ref_x.index_add_(0, tok, r[0])
        same_x.index_add_(0, tok, s[0].float())
        ref_w[tok, slot], same_w[tok, slot] = r[3], s[3].float()
        note("dw1", grads[1][e], r[1], s[1])
        note("dw2", grads[2][e], r[2], s[2])
    note("dx", grads[0], ref_x, same_x.to(x.dtype))
    note("dweights", grads[3], ref_w, same_w.to(x.dtype))
    ulp = 2.0 ** -mantissa_bits(x.dtype)
    out = {n: {"max_abs_err": a[0], "torch_err": a[1], "allowed": 2 * a[1] + ulp * a[2]} for n, a in acc.items()}
    for c in out.values():  # error / allowed: <= 1 passes (NaN, Inf: inf)
        err, allowed = c["max_abs_err"], c["allowed"]
        c["worst"] = err / allowed if allowed > 0 else (0.0 if err == 0 else math.inf)
    bad = [n for n, c in out.items() if not c["max_abs_err"] <= c["allowed"]]
    return {
        "ok": not bad,
        "max_abs_err": max(c["max_abs_err"] for c in out.values()),
        "worst": max(c["worst"] for c in out.values()),
        "grads": out,
        **({"error": f"gradients off the float32 autograd reference: {', '.join(bad)}"} if bad else {}),
    }


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU: gate clamped above at ``limit``, up to [-limit, limit], then
    (up + 1) * gate * sigmoid(alpha * gate), in the inputs' dtype."""
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def moe_oai_ref(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w1_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    *,
    alpha: float = 1.702,
    limit: float = 7.0,
    interleaved: bool = False,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The gpt-oss MoE body (``moe_forward(..., activation="swiglu_oai")``) as a loop over experts in ``dtype``
    (float64: the reference; x's dtype: what PyTorch itself makes, as HF's GptOssExperts computes it):
    y[t] = sum_j weights[t, j] * (swiglu_oai(gate, up) @ w2_e^T + b2_e), [gate | up] = x[t] @ w1_e^T + b1_e.
    w1 (E, 2I, H): gate rows [0, I) then up rows [I, 2I), or with ``interleaved`` gate rows 0, 2, 4, ... and up
    rows 1, 3, 5, ... (gpt-oss's layout, transposed); w1_bias (E, 2I) in w1's layout; w2 (E, H, I); w2_bias
    (E, H). Differentiable in every float input; returns (T, H) in ``dtype``."""
    t, h = x.shape
    i = w2.shape[2]
    y = torch.zeros((t, h), dtype=dtype, device=x.device)
    xd = x.to(dtype)
    for e in range(w1.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        g = xd[tok] @ w1[e].to(dtype).t()
        if w1_bias is not None:
            g = g + w1_bias[e].to(dtype)
        gate, up = (g[:, 0::2], g[:, 1::2]) if interleaved else (g[:, :i], g[:, i:])
        o = swiglu_oai(gate, up, alpha, limit) @ w2[e].to(dtype).t()
        if w2_bias is not None:
            o = o + w2_bias[e].to(dtype)
        y = y.index_add(0, tok, o * topk_weights[tok, slot].to(dtype)[:, None])
    return y
