"""The MoE forward's launcher and its plan cache: every decision of a ``moe_forward`` call made once per
signature of its inputs, then launched with kept kernels and device addresses.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed (token, slot) rows.

    launch_moe_forward(x (T, H), w1 (E, 2I, H), w2 (E, H, I), weights (T, k), ids (T, k), validate, gather,
                       configs) -> y (T, H)

Steps of a call: (1) sort the (token, slot) pairs by expert on the device, stably, with no host sync
(``ops.moe_routing``), (2) the first grouped GEMM over all experts on x's rows in expert order (gathered once,
or read by token index inside the GEMM: ``gather``), SiLU(gate) * up in the epilogue, (3) the second grouped
GEMM with each row's top-k weight applied in its epilogue, (4) a deterministic combine back to token order (each
token sums its k rows in slot order). A plan (``MoEPlan``, built by ``plan_moe``) fixes the configs, the routing
launches, the grids, constexprs and the layout of one scratch buffer (routing tables, gathered x, intermediate,
routed outputs); a call allocates that buffer and y and launches.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import torch
import triton
from triton.runtime.errors import OutOfResources

from gemmlab.device import target_for
from gemmlab.kernels.moe import moe_combine_kernel, moe_gather_kernel
from gemmlab.ops import configs as config_tables
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.grouped import (
    GroupedLaunch,
    ensure_allocator,
    fire_grouped,
    grouped_args,
    grouped_spec,
    host_desc,
    jit_desc,
    w2d,
)
from gemmlab.ops.layout import padded_k
from gemmlab.ops.moe_checks import check_moe_args, device_check
from gemmlab.ops.moe_config import Mode, MoEConfig, moe_config
from gemmlab.ops.moe_routing import (
    route_args,
    route_kind,
    route_launches,
    routing_broken,
    sort_blocks,
    sort_routes_torch,
)

# Per signature of a moe_forward call (shapes, strides, dtypes, devices and 16-byte alignment of the five inputs,
# validate, gather, configs): its plan and kept kernels. Filled on first use, after the checks; a hit skips the
# checks the key proves and launches the kept kernels with device addresses (``gemmlab.ops.launch``). Bounded
# like gemm's cache; ``configs.reload()`` clears it.
PLANS: dict[tuple, MoEPlan] = {}
PLANS_SIZE = 1024
ALIGN = 128  # bytes: each scratch region starts on this (TMA needs 16)


@config_tables.on_reload
def clear_plans() -> None:
    """Forget every cached moe_forward plan (``configs.reload()`` calls this)."""
    PLANS.clear()


class Body(enum.Enum):
    """What a call computes past the routing."""

    NONE = "none"  # H = 0: y (T, 0) holds nothing
    ZEROS = "zeros"  # I = 0: y is zero
    GEMMS = "gemms"  # the two grouped GEMMs and the combine


@dataclass
class Region:
    name: str
    dtype: torch.dtype
    shape: tuple
    strides: tuple
    offset: int  # bytes into the scratch buffer


@dataclass
class MoEPlan:
    """Every decision of a moe_forward call with inputs laid out like these (``plan_moe``). ``route`` and
    ``route_slots`` fall back to torch ops if a routing kernel cannot build; ``kept`` turns True once every
    launch has kept its compiled kernel (later calls launch directly)."""

    t: int
    h: int
    i: int
    e: int
    k: int
    nbytes: int  # scratch bytes (a multiple of the element size)
    regions: list[Region]
    route: str  # route_kind's answer
    route_slots: list[kept_launch.Planned]
    block_m: int
    validate: str | None  # the message of the ids check, None: no check
    body: Body
    x_copy: bool  # x's rows are not unit-stride: copied per call
    flat_copy: bool  # topk_ids / topk_weights not contiguous: flattened copies per call
    w_copy: tuple[bool, bool]  # w1 / w2 not in the (E * N_w, K) layout: copied per call (``w2d``)
    ok_at: int  # byte offset of the ok flag
    gather: kept_launch.Planned | None = None  # the copy of x's rows in expert order (gather "copy")
    g1: GroupedLaunch | None = None
    g2: GroupedLaunch | None = None
    combine: kept_launch.Planned | None = None
    kept: bool = False  # every launch kept: later calls launch directly


def moe_key(x, w1, w2, tw, ids, validate, gather, configs) -> tuple:
    return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16, w1.shape, w1.stride(), w1.dtype, w1.device,
            w1.data_ptr() % 16, w2.shape, w2.stride(), w2.dtype, w2.device, w2.data_ptr() % 16, tw.shape, tw.stride(),
            tw.dtype, tw.device, tw.data_ptr() % 16, ids.shape, ids.stride(), ids.dtype, ids.device,
            ids.data_ptr() % 16, validate, gather, configs)


def _layout(t: int, h: int, i: int, e: int, k: int, dtype: torch.dtype, route: str, copy: bool,
            gemms: bool) -> tuple[list[Region], int]:
    """The scratch regions of a call and the buffer's size: the routing tables, x's rows in expert order
    (gather "copy"), the intermediate act (S, I) in rows padded to 16 bytes and the routed outputs o (S, H)."""
    s, elt = t * k, torch.empty((), dtype=dtype).element_size()
    nb = sort_blocks(s)[1] if route == "count" else 0
    want = [("order", torch.int32, (s,), (1,)), ("inv", torch.int32, (s,), (1,)), ("token", torch.int32, (s,), (1,)),
            ("offsets", torch.int32, (e,), (1,)), ("tile_offsets", torch.int32, (e + 1,), (1,)),
            ("scale", torch.float32, (s,), (1,)), ("ok", torch.bool, (1,), (1,)),
            ("hist", torch.int32, ((e + 1) * nb,), (1,)), ("local", torch.int32, ((e + 1) * nb,), (1,))]
    if gemms:
        i_pad = padded_k(i)
        want += ([("xg", dtype, (s, h), (h, 1))] if copy else []) + [("act", dtype, (s, i), (i_pad, 1)),
                                                                     ("o", dtype, (s, h), (h, 1))]
    regions, at = [], 0
    for name, dt, shape, strides in want:
        regions.append(Region(name, dt, shape, strides, at))
        size = (shape[0] * strides[0] if shape[0] else 0) * torch.empty((), dtype=dt).element_size()
        at += -(-size // ALIGN) * ALIGN
    return regions, max(at, elt)


def _views(regions: list[Region], buf: torch.Tensor) -> dict:
    """The scratch regions of ``buf`` (x's dtype) as tensors (a JIT launch specializes on them)."""
    raw = buf.view(torch.uint8)
    out = {}
    for r in regions:
        size = r.shape[0] * r.strides[0] if r.shape[0] else 0
        esz = torch.empty((), dtype=r.dtype).element_size()
        flat = raw[r.offset:r.offset + max(size, 1) * esz].view(r.dtype)
        out[r.name] = flat.as_strided(r.shape, r.strides)
    return out


def _addrs(regions: list[Region], base: int) -> dict:
    return {r.name: base + r.offset for r in regions}


def plan_moe(x, w1, w2, tw, ids, validate, gather, configs, dims) -> MoEPlan:
    """Every decision of a moe_forward call with inputs laid out like these (after ``check_moe_args``, whose
    answer ``dims`` is): (1) the two GEMMs' configs (one tile schedule), (2) the routing launches, (3) the
    scratch layout, (4) the gather, GEMM and combine launches."""
    t, h, i, e, k = dims
    s = t * k
    target = target_for(x.device)
    elt = x.element_size()
    cfg1, cfg2 = configs or (moe_config(target, s, e, Mode.GATE_UP, elt, dtype=x.dtype, n=i, k=h, max_group=t),
                             moe_config(target, s, e, Mode.DOWN, elt, dtype=x.dtype, n=h, k=i, max_group=t))
    cfg2 = replace(cfg2, block_m=cfg1.block_m)  # one tile schedule for both GEMMs
    route = route_kind(s, e)
    slots = [] if route == "torch" else [kept_launch.Planned(*spec) for spec in
                                         route_launches(route, s, e, k, cfg1.block_m, True)]
    if gather == "auto":
        gather = "copy" if target.has_tma and (h * elt) % 16 == 0 else "fused"
    body = Body.NONE if h == 0 else Body.ZEROS if i == 0 else Body.GEMMS
    regions, nbytes = _layout(t, h, i, e, k, x.dtype, route, gather == "copy", body is Body.GEMMS)
    w1k, w2k = w2d(w1), w2d(w2)
    p = MoEPlan(t=t, h=h, i=i, e=e, k=k, nbytes=nbytes, regions=regions, route=route, route_slots=slots,
                block_m=cfg1.block_m, validate=f"moe: topk_ids must be in [0, E={e})" if validate else None,
                body=body, x_copy=x.stride(1) != 1, flat_copy=not (ids.is_contiguous() and tw.is_contiguous()),
                w_copy=(w1k.data_ptr() != w1.data_ptr(), w2k.data_ptr() != w2.data_ptr()),
                ok_at=next(r.offset for r in regions if r.name == "ok"))
    if body is not Body.GEMMS:
        return p
    v = _views(regions, torch.empty(nbytes // elt, dtype=x.dtype, device="meta"))  # layouts only
    xk = x if x.stride(1) == 1 else x.contiguous()
    block_h = min(1024, triton.next_power_of_2(h))
    if gather == "copy":
        p.gather = kept_launch.Planned(moe_gather_kernel, (s, triton.cdiv(h, block_h), 1), dict(BLOCK_H=block_h), {})
    p.g1 = grouped_spec(Mode.GATE_UP, v["xg"] if gather == "copy" else xk, gather != "copy", w1k, v["act"], i, e,
                        cfg1, target, s)
    p.g2 = grouped_spec(Mode.DOWN, v["act"], False, w2k, v["o"], h, e, cfg2, target, s)
    p.combine = kept_launch.Planned(moe_combine_kernel, (t, triton.cdiv(h, block_h), 1),
                                    dict(TOP_K=k, BLOCK_H=block_h), {})
    return p


def launch_moe_forward(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor, validate: bool, gather: str,
                       configs: tuple[MoEConfig, MoEConfig] | None) -> torch.Tensor:
    """``moe_forward``'s launcher on 2-D x: checks, routes, two grouped launches and the combine (no autograd).
    Plans once per signature (``PLANS``); a hit allocates one scratch buffer and y and launches the kept kernels
    directly."""
    try:
        key = moe_key(x, w1, w2, topk_weights, topk_ids, validate, gather, configs)
        p = PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors (or unhashable configs): check_moe_args says what is wrong
        key, p = None, None
    if p is None:
        dims = check_moe_args(x, w1, w2, topk_weights, topk_ids)
        if dims[0] == 0:
            return torch.empty((0, dims[1]), dtype=x.dtype, device=x.device)
        p = plan_moe(x, w1, w2, topk_weights, topk_ids, validate, gather, configs, dims)
        if key is not None:
            if len(PLANS) >= PLANS_SIZE:
                PLANS.pop(next(iter(PLANS)))  # the oldest signature goes (dicts keep insertion order)
            PLANS[key] = p
    return run_plan(p, x, w1, w2, topk_weights, topk_ids)


def _route(p: MoEPlan, v: dict, ids, tw, direct: bool) -> dict:
    """Step (1): the routing launches into the scratch regions (or torch ops, whose tables replace them)."""
    if p.route != "torch":
        try:
            for slot, args in zip(p.route_slots, route_args(
                    p.route, ids, tw, v["order"], v["inv"], v["token"], v["offsets"], v["tile_offsets"], v["scale"],
                    v["ok"], v["hist"], v["local"], p.t * p.k, p.e), strict=True):
                kept_launch.fire(slot, args, direct)
        except (triton.CompilationError, OutOfResources) as err:  # cannot build it: torch ops from now on
            routing_broken(err)
            p.route, p.route_slots, p.kept = "torch", [], False
    if p.route == "torch":
        r = sort_routes_torch(ids.view(p.t, p.k), p.e, p.block_m, tw.view(p.t, p.k))
        v = dict(v, order=r.order, inv=r.inv, token=r.token, offsets=r.offsets, tile_offsets=r.tile_offsets,
                 scale=r.scale)
    return v


def run_plan(p: MoEPlan, x, w1, w2, tw, ids) -> torch.Tensor:
    """Run a plan: one scratch buffer (x's dtype, so a poisoned torch.empty reaches every region) and y."""
    dev = x.device
    buf = torch.empty(p.nbytes // x.element_size(), dtype=x.dtype, device=dev)
    y = torch.empty((p.t, p.h), dtype=x.dtype, device=dev)
    direct = p.kept and kept_launch.usable(p.route_slots[0].kept if p.route_slots else p.combine.kept)
    if direct:
        v, desc = _addrs(p.regions, buf.data_ptr()), host_desc
    else:
        v, desc = _views(p.regions, buf), jit_desc
    if p.flat_copy:
        ids, tw = ids.reshape(-1).contiguous(), tw.reshape(-1).contiguous()
    v = _route(p, v, ids, tw, direct)
    if p.validate is not None:  # no host sync: one check on the flag the routing kernel set (or on min/max)
        if p.route == "torch":
            lo, hi = torch.aminmax(ids)
            device_check((lo >= 0) & (hi < p.e), p.validate)
        else:
            device_check(buf.view(torch.uint8)[p.ok_at], p.validate)
    if p.body is not Body.GEMMS:
        return y if p.body is Body.NONE else y.zero_()
    if p.x_copy:
        x = x.contiguous()
    w1k = w2d(w1) if p.w_copy[0] or not direct else w1
    w2k = w2d(w2) if p.w_copy[1] or not direct else w2
    ensure_allocator(p.g1)
    ensure_allocator(p.g2)
    if p.gather is not None:  # step (2): x's rows gathered, then the first GEMM on them
        kept_launch.fire(p.gather, [x, v["token"], v["xg"], p.h, x.stride(0), p.h], direct)
        fire_grouped(p.g1, grouped_args(p.g1, v["xg"], None, w1k, v["act"], None, v["offsets"], v["tile_offsets"],
                                        desc), direct)
    else:
        fire_grouped(p.g1, grouped_args(p.g1, x, v["token"], w1k, v["act"], None, v["offsets"], v["tile_offsets"],
                                        desc), direct)
    fire_grouped(p.g2, grouped_args(p.g2, v["act"], None, w2k, v["o"], v["scale"], v["offsets"], v["tile_offsets"],
                                    desc), direct)  # step (3)
    kept_launch.fire(p.combine, [v["o"], v["inv"], y, p.h, p.h, y.stride(0)], direct)  # step (4)
    if not direct:
        p.kept = all(q.kept is not None for q in [*p.route_slots, p.gather or p.combine, p.g1.slot, p.g2.slot,
                                                   p.combine])
    return y
