"""MoE routing tables: the (token, slot) pairs sorted by expert on the device (no host sync). The top-k scores
themselves are ``ops.moe.scores``'.

Legend: T tokens, E experts, k top-k, S = T*k routed (token, slot) pairs.

    sort_routes(ids (T, k), E, block_m, weights) -> Routes     the routing table, one launch up to ALIGN_MAX_S
                                                               pairs, a counting sort in three launches above
    route_kind(S, E), route_launches(...), route_args(...)     the launches, for a plan to keep
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import triton
from triton import knobs
from triton.runtime.errors import OutOfResources

from gemmlab.kernels.moe_route import (
    moe_align_kernel,
    moe_count_kernel,
    moe_scan_kernel,
    moe_scatter_kernel,
)
from gemmlab.ops import cache
from gemmlab.ops import launch as kept_launch

KEPT = cache.bounded("moe_routing.kept")  # kept compiled routing kernels, per specialization (ops.launch.start)


@dataclass(frozen=True)
class Routes:
    """The (token, slot) pairs sorted by expert. ``order[r]`` is the pair (t*k + j) of routed row r;
    ``inv`` its inverse; ``token[r] = order[r] // k``; ``offsets`` (E,) cumulative row ends per expert;
    ``tile_offsets`` (E + 1,) cumulative BLOCK_M-tile counts; all int32 on the device. ``scale`` (S,) fp32:
    the top-k weight of each routed row (when weights were given); ``ok`` (1,) bool: every id in [0, E) (from
    the routing kernels; None from the torch path)."""

    order: torch.Tensor
    inv: torch.Tensor
    token: torch.Tensor
    offsets: torch.Tensor
    tile_offsets: torch.Tensor
    block_m: int
    scale: torch.Tensor | None = None
    ok: torch.Tensor | None = None


ALIGN_MAX_S = 4096  # up to this many routed rows the routing table is one launch (moe_align_kernel)
INTERPRETER_ALIGN_MAX_S = 128  # the CPU interpreter runs tl.sort element by element: small tables only
SORT_BLOCK = 1024  # above that, a counting sort in three launches over blocks of this many pairs
INTERPRETER_SORT_BLOCK = 16
SORT_MAX_E = 4095  # experts the counting sort takes (its histograms have E + 1 bins); more: torch ops
_ALIGN_BROKEN: list[str] = []  # set if a routing kernel failed to compile: the torch path serves instead


def _tile_offsets(counts: torch.Tensor, block_m: int) -> torch.Tensor:
    tiles = (counts + block_m - 1) // block_m
    return torch.cat([tiles.new_zeros(1), torch.cumsum(tiles, 0)]).to(torch.int32)


def route_kind(s: int, e: int) -> str:
    """How ``sort_routes`` builds the table of S routed pairs over E experts: "align" (one launch), "count"
    (three launches: histograms, scan, scatter) or "torch" (torch ops: after a routing kernel failed to build, or
    for more than SORT_MAX_E experts)."""
    limit = INTERPRETER_ALIGN_MAX_S if knobs.runtime.interpret else ALIGN_MAX_S
    if _ALIGN_BROKEN or s == 0:
        return "torch"
    if s <= min(limit, ALIGN_MAX_S) and e < ALIGN_MAX_S:
        return "align"
    return "count" if e <= SORT_MAX_E else "torch"


def sort_blocks(s: int) -> tuple[int, int]:
    """(BLOCK, NB) of the counting sort."""
    block = INTERPRETER_SORT_BLOCK if knobs.runtime.interpret else SORT_BLOCK
    return block, triton.cdiv(s, block)


def route_launches(kind: str, s: int, e: int, k: int, block_m: int, has_scale: bool) -> list[tuple]:
    """(kernel, grid, constexprs, options) of each routing launch of ``kind`` ("align" or "count")."""
    if kind == "align":
        block_s = max(16, triton.next_power_of_2(s))
        return [
            (
                moe_align_kernel,
                (1, 1, 1),
                dict(
                    TOP_K=k,
                    BLOCK_M=block_m,
                    BLOCK_S=block_s,
                    BLOCK_E=max(16, triton.next_power_of_2(e + 1)),
                    HAS_SCALE=has_scale,
                ),
                dict(num_warps=4 if block_s <= 1024 else 8),
            )
        ]
    block, nb = sort_blocks(s)
    block_e = max(16, triton.next_power_of_2(e + 1))
    warps = 4 if block <= 512 else 8
    return [
        (moe_count_kernel, (nb, 1, 1), dict(BLOCK=block, BLOCK_E=block_e), dict(num_warps=warps)),
        (
            moe_scan_kernel,
            (1, 1, 1),
            dict(BLOCK_M=block_m, BLOCK_E=block_e, BLOCK_B=max(1, 4096 // block_e), CHUNK=1024),
            dict(num_warps=8),
        ),
        (moe_scatter_kernel, (nb, 1, 1), dict(TOP_K=k, BLOCK=block, HAS_SCALE=has_scale), dict(num_warps=warps)),
    ]


def route_args(
    kind: str, ids, weights, order, inv, token, offsets, tile_offsets, scale, ok, hist, local, s: int, e: int
) -> list[list]:
    """The runtime arguments of ``route_launches``' launches (tensors, or device addresses for a kept launch);
    ``weights``/``scale`` None: no routed weights."""
    if kind == "align":
        return [
            [
                ids,
                ids if scale is None else weights,
                order,
                inv,
                token,
                offsets,
                tile_offsets,
                order if scale is None else scale,
                ok,
                s,
                e,
            ]
        ]
    nb = sort_blocks(s)[1]
    return [
        [ids, hist, local, s, e, nb],
        [hist, local, offsets, tile_offsets, ok, e, nb],
        [ids, ids if scale is None else weights, local, order, inv, token, order if scale is None else scale, s, e, nb],
    ]


def sort_routes(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, topk_weights: torch.Tensor | None = None
) -> Routes:
    """Group the (token, slot) pairs of ``topk_ids`` (T, k) by expert, stably (token order within an
    expert), on the ids' device, without reading them on the host. Up to ``ALIGN_MAX_S`` pairs in one launch
    (``moe_align_kernel``, which also gathers ``topk_weights`` into routed order and flags bad ids); more by a
    counting sort in three launches (same tables, same flag); torch ops (sort, scatter-add, cumsum) where
    ``route_kind`` says so."""
    t, k = topk_ids.shape
    s, e = t * k, num_experts
    kind = route_kind(s, e)
    if kind != "torch":
        dev = topk_ids.device
        nb = sort_blocks(s)[1] if kind == "count" else 0
        buf = torch.empty(3 * s + 2 * e + 1 + 2 * (e + 1) * nb, dtype=torch.int32, device=dev)
        order, inv, token = buf[:s], buf[s : 2 * s], buf[2 * s : 3 * s]
        offsets, tile_offsets = buf[3 * s : 3 * s + e], buf[3 * s + e : 3 * s + 2 * e + 1]
        hist, local = buf[3 * s + 2 * e + 1 : 3 * s + 2 * e + 1 + (e + 1) * nb], buf[3 * s + 2 * e + 1 + (e + 1) * nb :]
        ok = torch.empty(1, dtype=torch.bool, device=dev)
        scale = None if topk_weights is None else torch.empty(s, dtype=torch.float32, device=dev)
        ids = topk_ids.reshape(-1).contiguous()  # dense: a strided (T, 1) view reshapes to a strided view
        wts = None if topk_weights is None else topk_weights.reshape(-1).contiguous()
        try:
            for (kernel, grid, consts, opts), args in zip(
                route_launches(kind, s, e, k, block_m, scale is not None),
                route_args(kind, ids, wts, order, inv, token, offsets, tile_offsets, scale, ok, hist, local, s, e),
                strict=True,
            ):
                kept_launch.start(KEPT, kernel, grid, args, consts, opts)
            return Routes(
                order=order,
                inv=inv,
                token=token,
                offsets=offsets,
                tile_offsets=tile_offsets,
                block_m=block_m,
                scale=scale,
                ok=ok,
            )
        except (triton.CompilationError, OutOfResources) as err:  # cannot build it: say so once, use torch ops
            routing_broken(err)
    return sort_routes_torch(topk_ids, num_experts, block_m, topk_weights)


def routing_broken(err: Exception) -> None:
    _ALIGN_BROKEN.append(str(err))
    warnings.warn(
        f"gemmlab: the MoE routing kernel failed to compile; routing with torch ops instead "
        f"({type(err).__name__}: {str(err)[:200]})",
        RuntimeWarning,
        stacklevel=3,
    )


def sort_routes_torch(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, topk_weights: torch.Tensor | None = None
) -> Routes:
    """``sort_routes`` in torch ops (ids must be in [0, E); ``ok`` None)."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).to(torch.int64)
    _, order = torch.sort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    scale = None if topk_weights is None else topk_weights.reshape(-1).float()[order]
    return Routes(
        order=order.to(torch.int32),
        inv=inv.to(torch.int32),
        token=(order // k).to(torch.int32),
        offsets=torch.cumsum(counts, 0).to(torch.int32),
        tile_offsets=_tile_offsets(counts, block_m),
        block_m=block_m,
        scale=scale,
    )
