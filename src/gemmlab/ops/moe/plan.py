"""The MoE forward's one plan: every decision of a ``moe_forward`` call made once per signature of its inputs and
options, then launched with kept kernels and device addresses. Its options are the three bodies that used to be
apart: plain, gate/up-saving (``save``: the first GEMM also stores the pre-activations for the backward) and FP8
experts (``scales``: e4m3 weights with 128x128 block scales, activations quantized per 1x128 block on the fly).

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed (token, slot) rows;
Xb = cdiv(X, 128).

    launch_moe_forward(x (T, H), w1 (E, 2I, H), w2 (E, H, I), weights (T, k), ids (T, k), validate, gather,
                       configs) -> y (T, H)
    launch_forward_saving(..., validate, gather) -> y, gate_up (S, 2I) in routed (expert) order
    launch_moe_forward_fp8(x, w1, w1_scale, w2, w2_scale, weights, ids, validate) -> y

Steps of a call: (1) sort the (token, slot) pairs by expert on the device, stably, with no host sync
(``ops.moe.routing``'s launches), (2) the first grouped GEMM over all experts on x's rows in expert order
(gathered once, or read by token index inside the GEMM: ``gather``; FP8: gathered, then quantized), SiLU(gate) * up
in the epilogue, (3) the second grouped GEMM with each row's top-k weight applied in its epilogue (FP8: on the
quantized intermediate), (4) a deterministic combine back to token order (each token sums its k rows in slot order).
A plan (``MoEPlan``, built by ``plan_moe`` after one full argument check) fixes the configs, the layout of one
scratch buffer (routing tables, gathered x, intermediate, routed outputs; FP8: their e4m3 copies and scales) and
every launch as a ``Step``: a planned kernel and its arguments by name. A call allocates that buffer and y, and
fires the steps; after the first call their compiled kernels are kept and launched directly
(``gemmlab.ops.launch``). Plans live in ``PLANS``, one bounded LRU cache (``gemmlab.ops.cache``).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.device import target_for
from gemmlab.kernels.moe import moe_combine_kernel
from gemmlab.kernels.moe_route import moe_gather_kernel
from gemmlab.ops import cache
from gemmlab.ops import configs as config_tables
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.fp8.moe_config import fp8_grouped_spec, moe_fp8_config
from gemmlab.ops.layout import padded_k
from gemmlab.ops.moe.config import Mode, MoEConfig, moe_config
from gemmlab.ops.moe.grouped import ensure_allocator, grouped_spec, w2d
from gemmlab.ops.moe.routing import (
    route_args,
    route_kind,
    route_launches,
    routing_broken,
    sort_routes_torch,
)
from gemmlab.ops.moe.steps import (
    Body,
    Desc,
    MoEPlan,
    Region,
    Step,
    check,
    grouped_step,
    quantize_step,
    scratch_layout,
)

# Per signature of a call (shapes, strides, dtypes, devices and 16-byte alignment of its tensors) and its options
# (validate, gather, configs, save, FP8): its plan and kept kernels. Filled on first use, after the full checks; a hit
# skips the checks the key proves. configs.reload() clears it.
PLANS = cache.bounded("moe_forward")


@config_tables.on_reload
def clear_plans() -> None:
    """Forget every cached moe_forward plan (``configs.reload()`` calls this)."""
    PLANS.clear()


def _views(regions: list[Region], buf: torch.Tensor) -> dict:
    """The scratch regions of ``buf`` (x's dtype) as tensors (a JIT launch specializes on them)."""
    raw = buf.view(torch.uint8)
    out = {}
    for r in regions:
        size = r.shape[0] * r.strides[0] if r.shape[0] else 0
        esz = torch.empty((), dtype=r.dtype).element_size()
        flat = raw[r.offset : r.offset + max(size, 1) * esz].view(r.dtype)
        out[r.name] = flat.as_strided(r.shape, r.strides)
    return out


def plan_moe(x, w1, w2, tw, ids, validate, gather, configs, save, scales, dims) -> MoEPlan:
    """Every decision of a call with inputs laid out like these (after ``check``, whose answer ``dims`` is): (1) the
    two GEMMs' configs (one tile schedule), (2) the routing launches, (3) the scratch layout, (4) the gather,
    quantization (FP8), GEMM and combine launches."""
    t, h, i, e, k = dims
    s, fp8 = t * k, scales is not None
    target = target_for(x.device)
    elt = x.element_size()
    if fp8:
        cfg1, cfg2 = (
            moe_fp8_config(target, Mode.GATE_UP, s, e, 2 * i, h),
            moe_fp8_config(target, Mode.DOWN, s, e, h, i),
        )
        gather = "copy"  # e4m3 rows through TMA
    else:
        cfg1, cfg2 = configs or (
            moe_config(target, s, e, Mode.GATE_UP, elt, dtype=x.dtype, n=i, k=h, max_group=t),
            moe_config(target, s, e, Mode.DOWN, elt, dtype=x.dtype, n=h, k=i, max_group=t),
        )
        if gather == "auto":
            gather = "copy" if target.has_tma and (h * elt) % 16 == 0 else "fused"
    cfg2 = replace(cfg2, block_m=cfg1.block_m)  # one tile schedule for both GEMMs
    route = route_kind(s, e)
    body = Body.NONE if h == 0 else Body.ZEROS if i == 0 else Body.GEMMS
    copy = gather == "copy"
    regions, nbytes = scratch_layout(t, h, i, e, k, x.dtype, route, copy, body is Body.GEMMS, fp8)
    w1k, w2k = w2d(w1), w2d(w2)
    p = MoEPlan(
        t=t,
        h=h,
        i=i,
        e=e,
        k=k,
        nbytes=nbytes,
        regions=regions,
        route=route,
        block_m=cfg1.block_m,
        validate=(
            f"moe_forward (fp8): topk_ids must lie in [0, E={e})" if fp8 else f"moe: topk_ids must be in [0, E={e})"
        )
        if validate
        else None,
        body=body,
        save=save,
        x_copy=x.stride(1) != 1,
        flat_copy=not (ids.is_contiguous() and tw.is_contiguous()),
        w_copy=(w1k.data_ptr() != w1.data_ptr(), w2k.data_ptr() != w2.data_ptr()),
        scale_copy=fp8 and not (scales[0].is_contiguous() and scales[1].is_contiguous()),
        ok_at=next(r.offset for r in regions if r.name == "ok"),
    )
    if route != "torch":
        p.routing = [
            Step(kept_launch.Planned(*spec), args)
            for spec, args in zip(
                route_launches(route, s, e, k, cfg1.block_m, True),
                route_args(
                    route,
                    "ids",
                    "tw",
                    "order",
                    "inv",
                    "token",
                    "offsets",
                    "tile_offsets",
                    "scale",
                    "ok",
                    "hist",
                    "local",
                    s,
                    e,
                ),
                strict=True,
            )
        ]
    if body is not Body.GEMMS:
        return p
    v = _views(regions, torch.empty(nbytes // elt, dtype=x.dtype, device="meta"))  # layouts only
    xk = x if x.stride(1) == 1 else x.contiguous()
    block_h = min(1024, triton.next_power_of_2(h))
    if copy:
        p.steps.append(
            Step(
                kept_launch.Planned(moe_gather_kernel, (s, triton.cdiv(h, block_h), 1), dict(BLOCK_H=block_h), {}),
                ["x", "token", "xg", h, xk.stride(0), h],
            )
        )
    if fp8:
        slot1, a1, wd1 = fp8_grouped_spec(Mode.GATE_UP, v["qa"], w1k, e, i, cfg1, target, s)
        slot2, a2, wd2 = fp8_grouped_spec(Mode.DOWN, v["qh"], w2k, e, h, cfg2, target, s)
        act, o = v["act"], v["o"]
        p.steps += [
            quantize_step("xg", "qa", "sa", s, h, h),
            Step(
                slot1,
                [
                    Desc("qa", *a1),
                    "sa",
                    Desc("w1", *wd1),
                    "w1_scale",
                    "act",
                    "act",
                    "offsets",
                    "tile_offsets",
                    i,
                    h,
                    e,
                    v["sa"].stride(0),
                    act.stride(0),
                ],
            ),
            quantize_step("act", "qh", "sh", s, i, act.stride(0)),
            Step(
                slot2,
                [
                    Desc("qh", *a2),
                    "sh",
                    Desc("w2", *wd2),
                    "w2_scale",
                    "o",
                    "scale",
                    "offsets",
                    "tile_offsets",
                    h,
                    i,
                    e,
                    v["sh"].stride(0),
                    o.stride(0),
                ],
            ),
        ]
    else:
        pre = torch.empty((s, padded_k(2 * i)), dtype=x.dtype, device="meta")[:, : 2 * i] if save else None
        g1 = grouped_spec(Mode.GATE_UP, v["xg"] if copy else xk, not copy, w1k, v["act"], i, e, cfg1, target, s, pre)
        g2 = grouped_spec(Mode.DOWN, v["act"], False, w2k, v["o"], h, e, cfg2, target, s)
        p.clip = g1 if g1.clip else g2 if g2.clip else None
        p.steps += [
            grouped_step(
                g1, "xg" if copy else "x", None if copy else "token", "w1", "act", None, "gate_up" if save else None
            ),
            grouped_step(g2, "act", None, "w2", "o", "scale", None),
        ]
    p.steps.append(
        Step(
            kept_launch.Planned(
                moe_combine_kernel, (t, triton.cdiv(h, block_h), 1), dict(TOP_K=k, BLOCK_H=block_h), {}
            ),
            ["o", "inv", "y", h, h, h],
        )
    )
    return p


def forward(
    x,
    w1,
    w2,
    tw,
    ids,
    validate: bool,
    gather: str,
    configs: tuple[MoEConfig, MoEConfig] | None,
    save: bool = False,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every option's launcher on 2-D x (no autograd): y, and gate_up (S, 2I) when ``save``. A new signature is
    checked in full and planned (``PLANS``); a hit allocates one scratch buffer and y and fires the kept launches."""
    try:
        key = (
            x.shape,
            x.stride(),
            x.dtype,
            x.device,
            x.data_ptr() % 16,
            w1.shape,
            w1.stride(),
            w1.dtype,
            w1.device,
            w1.data_ptr() % 16,
            w2.shape,
            w2.stride(),
            w2.dtype,
            w2.device,
            w2.data_ptr() % 16,
            tw.shape,
            tw.stride(),
            tw.dtype,
            tw.device,
            tw.data_ptr() % 16,
            ids.shape,
            ids.stride(),
            ids.dtype,
            ids.device,
            ids.data_ptr() % 16,
            validate,
            gather,
            configs,
            save,
            None
            if scales is None
            else tuple((c.shape, c.stride(), c.dtype, c.device, c.data_ptr() % 16) for c in scales),
        )
        p = PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors (or unhashable configs): the checks say what is wrong
        key, p = None, None
    if p is None:
        dims = check(x, w1, w2, tw, ids, gather, scales)
        if dims[0] == 0 or dims[4] == 0:  # no rows to route (FP8 takes k = 0 too): nothing to plan
            y = torch.zeros((dims[0], dims[1]), dtype=x.dtype, device=x.device)
            return y, (torch.zeros((0, 2 * dims[2]), dtype=x.dtype, device=x.device) if save else None)
        p = plan_moe(x, w1, w2, tw, ids, validate, gather, configs, save, scales, dims)
        if key is not None:
            PLANS[key] = p
    return run_plan(p, x, w1, w2, tw, ids, scales)


def launch_moe_forward(
    x, w1, w2, topk_weights, topk_ids, validate: bool, gather: str, configs: tuple[MoEConfig, MoEConfig] | None
) -> torch.Tensor:
    """``moe_forward``'s plain body: y (T, H)."""
    return forward(x, w1, w2, topk_weights, topk_ids, validate, gather, configs)[0]


def launch_forward_saving(
    x, w1, w2, topk_weights, topk_ids, validate: bool, gather: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """y (T, H) as ``moe_forward`` computes it (the same configs, routing and launches: the same values), and the
    pre-activations gate_up (S, 2I) in routed order, kept for the backward (Liger's trade: S*2I more memory held
    from forward to backward, no recompute): the first GEMM stores them beside SiLU(gate) * up (SAVE_PRE)."""
    return forward(x, w1, w2, topk_weights, topk_ids, validate, gather, None, save=True)


def launch_moe_forward_fp8(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, validate: bool) -> torch.Tensor:
    """``moe_forward`` with FP8 experts on 2-D x (steps (1)-(4) with e4m3 GEMMs): y (T, H)."""
    return forward(x, w1, w2, topk_weights, topk_ids, validate, "copy", None, scales=(w1_scale, w2_scale))[0]


def _fire(st: Step, env: dict, direct: bool) -> None:
    """Launch a step: its arguments looked up by name in ``env`` (tensors, or device addresses when ``direct``)."""
    args = list(st.args)
    for j, name in st.named:
        args[j] = env[name]
    for j, d in st.descs:
        base = env[d.name]
        if not direct:
            args[j] = TensorDescriptor(base, d.shape, d.strides, d.block)
        else:  # a scratch region's address, or a call tensor
            args[j] = kept_launch.HostDesc(
                kept_launch.Addr(base) if base.__class__ is int else base, d.shape, d.strides
            )
    while True:
        try:
            kept_launch.fire(st.slot, args, direct)
            return
        except OutOfResources:  # the gate/up stores' layout conversion needs shared memory too: fewer stages
            stages = st.slot.opts.get("num_stages", 3)
            if direct or not st.shrink or stages <= 2:
                raise
            st.slot.opts = dict(st.slot.opts, num_stages=stages - 1)


def _route(p: MoEPlan, env: dict, direct: bool) -> None:
    """Step (1): the routing launches into the scratch regions (or torch ops, whose tables replace them)."""
    if p.route != "torch":
        try:
            for st in p.routing:
                _fire(st, env, direct)
        except (triton.CompilationError, OutOfResources) as err:  # cannot build it: torch ops from now on
            routing_broken(err)
            p.route, p.routing, p.kept = "torch", [], False
    if p.route == "torch":
        r = sort_routes_torch(env["ids"].view(p.t, p.k), p.e, p.block_m, env["tw"].view(p.t, p.k))
        env.update(
            order=r.order, inv=r.inv, token=r.token, offsets=r.offsets, tile_offsets=r.tile_offsets, scale=r.scale
        )


def _rows(w: torch.Tensor, copy: bool) -> torch.Tensor:
    """The (E * N_w, K) rows of w (E, N_w, K) the kernel reads: a view, or ``w2d``'s copy of an odd layout."""
    return w2d(w) if copy else w.as_strided((w.shape[0] * w.shape[1], w.shape[2]), (w.stride(1), 1))


def run_plan(p: MoEPlan, x, w1, w2, tw, ids, scales=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run a plan: one scratch buffer (x's dtype, so a poisoned torch.empty reaches every region), y, and
    gate_up when the plan saves it."""
    dev = x.device
    buf = torch.empty(p.nbytes // x.element_size(), dtype=x.dtype, device=dev)
    y = torch.empty((p.t, p.h), dtype=x.dtype, device=dev)
    gate_up = torch.empty((p.t * p.k, padded_k(2 * p.i)), dtype=x.dtype, device=dev)[:, : 2 * p.i] if p.save else None
    direct = p.kept and kept_launch.usable((p.routing or p.steps)[0].slot.kept)
    if direct:
        base = buf.data_ptr()
        env = {r.name: base + r.offset for r in p.regions}
    else:
        env = _views(p.regions, buf)
    if p.flat_copy:
        ids, tw = ids.reshape(-1).contiguous(), tw.reshape(-1).contiguous()
    env.update(ids=ids, tw=tw, y=y, gate_up=gate_up)
    _route(p, env, direct)
    if p.validate is not None:  # no host sync: one check on the flag the routing kernel set (or on min/max)
        if p.route == "torch":
            lo, hi = torch.aminmax(ids)
            ok = (lo >= 0) & (hi < p.e)
        else:
            ok = buf.view(torch.uint8)[p.ok_at]
        if ok.is_cuda:  # a device-side assert (as ``ops.moe.checks.device_check``)
            torch._assert_async(ok, p.validate)
        elif not bool(ok):
            raise ValueError(p.validate)
    if p.body is not Body.GEMMS:
        return (y if p.body is Body.NONE else y.zero_()), (gate_up.zero_() if p.save else None)
    env.update(
        x=x.contiguous() if p.x_copy else x,
        w1=_rows(w1, p.w_copy[0]) if p.w_copy[0] or not direct else w1,
        w2=_rows(w2, p.w_copy[1]) if p.w_copy[1] or not direct else w2,
    )
    if scales is not None:
        env.update(
            w1_scale=scales[0].contiguous() if p.scale_copy else scales[0],
            w2_scale=scales[1].contiguous() if p.scale_copy else scales[1],
        )
    if p.clip is not None:
        ensure_allocator(p.clip)
    for st in p.steps:  # steps (2)-(4)
        _fire(st, env, direct)
    if not direct:
        p.kept = all(st.slot.kept is not None for st in [*p.routing, *p.steps])
    return y, gate_up
