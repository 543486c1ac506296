"""The bars a MoE forward is held to besides its peers, and a call's peak memory (``bench moe --baseline liger``).

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows.

    hbm_bound(model, ids, weights, elt, gbps)   the least bytes a forward moves (the experts hit, x, y, the
                                                routing) over the device-to-device copy bandwidth: a time no
                                                kernel beats (T <= 64 in the suite)
    dense_call(model, T, dtype, w1, w2, seed)   torch.mm (S, H) @ (H, 2I) then (S, I) @ (I, H): the routed
                                                work's FLOPs as two dense GEMMs, and its check (T >= 4096)
    peak_memory(fn)                             peak bytes allocated during one call, outside timing
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gemmlab.problems import MoEModel, generator, matrix
from gemmlab.ref import gemm_check


def hbm_bound(model: MoEModel, topk_ids: torch.Tensor, topk_weights: torch.Tensor, elt: int, gbps: float) -> dict:
    """The least bytes a forward moves, over the measured copy bandwidth: every expert hit reads its
    w1 (2I, H) and w2 (H, I) once, x (T, H) is read and y (T, H) written once, and the routing is read."""
    t = topk_ids.shape[0]
    hit = int(torch.unique(topk_ids).numel())
    weight = hit * 3 * model.intermediate * model.hidden * elt
    act = 2 * t * model.hidden * elt
    route = topk_ids.numel() * topk_ids.element_size() + topk_weights.numel() * topk_weights.element_size()
    total = weight + act + route
    return {
        "experts_hit": hit,
        "weight_bytes": weight,
        "activation_bytes": act,
        "routing_bytes": route,
        "bytes": total,
        "hbm_gbps": gbps,
        "hbm_bound_ms": total / (gbps * 1e9) * 1e3,
    }


@dataclass
class DenseOut:
    """The dense bar's two outputs (S, 2I) and (S, H)."""

    c1: torch.Tensor
    c2: torch.Tensor


def dense_call(
    model: MoEModel, tokens: int, dtype: torch.dtype, w1: torch.Tensor, w2: torch.Tensor, seed: int
) -> tuple[Callable[[], DenseOut], Callable[[DenseOut], dict]]:
    """The dense bar: (S, H) @ w1[0]^T (H, 2I) then (S, I) @ w2[0]^T (I, H), the same FLOPs as the routed
    work in two torch.mm calls, and its check (three rows of each product against float64)."""
    s, h, i = tokens * model.top_k, model.hidden, model.intermediate
    g = generator(seed + 1, w1.device)
    a1 = matrix(s, h, "centered", g, dtype)
    a2 = matrix(s, i, "centered", g, dtype)
    b1, b2 = w1[0].t(), w2[0].t()
    out = DenseOut(
        torch.full((s, 2 * i), math.nan, dtype=dtype, device=w1.device),
        torch.full((s, h), math.nan, dtype=dtype, device=w1.device),
    )

    def call() -> DenseOut:
        torch.mm(a1, b1, out=out.c1)
        torch.mm(a2, b2, out=out.c2)
        return out

    def check(o: DenseOut) -> dict:
        rows = torch.tensor(sorted({0, s // 2, s - 1}), device=w1.device)
        c1, c2 = gemm_check(o.c1[rows], a1[rows], b1), gemm_check(o.c2[rows], a2[rows], b2)
        return {
            "ok": c1["ok"] and c2["ok"],
            "max_abs_err": max(c1["max_abs_err"], c2["max_abs_err"]),
            "note": "rows 0, S/2, S-1 of both products against float64",
        }

    return call, check


def peak_memory(fn: Callable[[], object]) -> dict | None:
    """Peak bytes allocated during one call of ``fn`` (after one unmeasured call: autotuning, lazy buffers),
    absolute and above what was allocated before it. None without CUDA."""
    if not torch.cuda.is_available():
        return None
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return {"peak_bytes": peak, "peak_above_inputs_bytes": peak - base}
