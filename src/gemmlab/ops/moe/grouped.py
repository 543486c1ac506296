"""The grouped GEMM: one persistent launch of ``kernels.moe.moe_grouped_kernel`` over every group's tiles, and
the launch decisions the MoE forward and backward share.

Legend: S routed rows, E experts (groups), N output width, K reduction.

    launch_grouped_gemm(x (S, K), w (E, N, K), offsets (E,), out, validate, config) -> out (S, N)
    grouped_spec(mode, a, a_gather, w2d, out, n, e, cfg, target, rows_bound, pre) -> GroupedLaunch (planned once)
    launch_grouped(mode, a, a_rows, w, out, scale, offsets, tile_offsets, n, cfg, target, rows_bound, pre)
    w2d(w (E, N_w, K)) -> (E * N_w, K)   the rows the kernel reads
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
from triton import knobs
from triton.runtime._allocation import NullAllocator, _allocator
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.device import Target, target_for
from gemmlab.kernels.moe import moe_grouped_kernel
from gemmlab.kernels.moe_route import moe_tiles_kernel
from gemmlab.ops import cache
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.layout import rows_tma_ok
from gemmlab.ops.moe.checks import check_grouped_args, device_check
from gemmlab.ops.moe.config import Mode, MoEConfig, moe_config

_KEPT = cache.bounded("grouped.kept")  # kept compiled kernels of these launches, per specialization (launch.start)
_LAST: dict[str, object] = {}  # "grouped" -> its latest launch's compiled kernel (one key: bounded, a plain store)


def w2d(w: torch.Tensor) -> torch.Tensor:
    """(E, N_w, K) with unit K stride and rows evenly spaced -> the (E * N_w, K) view the kernel reads."""
    e, n_w, k = w.shape
    if w.stride(2) != 1 or (e > 1 and w.stride(0) != n_w * w.stride(1)):
        w = w.contiguous()
    return w.as_strided((e * n_w, k), (w.stride(1), 1))


def launch_config(cfg: MoEConfig, a_tma: bool, a_gather: bool, w_tma: bool) -> MoEConfig:
    """The config a launch uses given how A and W are read (checked in the sm_90 SASS by
    tests/instruments/test_inspect.py: no spills). BLOCK_M stays: the tile schedule was built with it."""
    if not (a_tma or a_gather) or not w_tma:  # pointer loads (odd K): smaller W tiles, 2 stages
        return replace(cfg, block_n=64, block_k=32, num_warps=8 if cfg.block_m >= 64 else 4, num_stages=2)
    if a_gather:  # gathered A rows pass through registers: 4 stages, or the GROUP_M tile order, spill at 128 rows
        return replace(cfg, num_stages=min(cfg.num_stages, 3), group_m=1)
    return cfg


def epilogue_flags(cfg: MoEConfig, a_tma: bool, w_tma: bool, out_ok: bool) -> tuple[bool, bool]:
    """(CLIP, OUT_TMA) of a launch: either needs A and W through TMA and a 16-byte aligned output."""
    clip = cfg.clip and a_tma and w_tma and out_ok
    return clip, cfg.out_tma and not clip and a_tma and w_tma and out_ok


def grid_programs(cfg: MoEConfig, target: Target, items_bound: int) -> int:
    """Programs of a grouped launch: num_sms * programs_per_sm, fewer when fewer work items can exist
    (``items_bound``, known on the host; the real count is read on the device). With several programs per SM
    the count is a power of two (NUM_PROGRAMS is a compile-time constant: a few specializations, not one per
    T); surplus programs find no item and exit."""
    cap = target.num_sms * cfg.programs_per_sm
    return min(cap, items_bound if cfg.programs_per_sm == 1 else triton.next_power_of_2(items_bound))


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator for kernels that make TMA descriptors on the device (set only when none is)."""
    return torch.empty(size, dtype=torch.int8, device="cpu" if knobs.runtime.interpret else "cuda")


@dataclass
class GroupedLaunch:
    """One grouped launch's decisions: the planned kernel and how A, W and out are passed (descriptor
    (shape, strides, block) or None: a pointer)."""

    slot: kept_launch.Planned
    a_desc: tuple | None
    w_desc: tuple | None
    out_desc: tuple | None
    ints: tuple  # N, K, E, stride_am, stride_wn, stride_om, stride_pre
    clip: bool


def grouped_spec(
    mode: Mode,
    a: torch.Tensor,
    a_gather: bool,
    w2d: torch.Tensor,
    out: torch.Tensor,
    n: int,
    e: int,
    cfg: MoEConfig,
    target: Target,
    rows_bound: int,
    pre: torch.Tensor | None = None,
) -> GroupedLaunch:
    """The decisions of a grouped launch for operands laid out like these (their shapes, strides, alignment).
    ``pre`` (S, 2N), MODE 1 only: the gate/up pre-activations are stored there too (SAVE_PRE)."""
    k = a.shape[1]
    a_tma = not a_gather and target.has_tma and rows_tma_ok(a)
    w_tma = target.has_tma and rows_tma_ok(w2d)
    cfg = launch_config(cfg, a_tma, a_gather, w_tma)
    clip, out_tma = epilogue_flags(cfg, a_tma, w_tma, rows_tma_ok(out))
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    items_bound = (triton.cdiv(rows_bound, bm) + e) * triton.cdiv(n, bn)
    log2_e = max(1, math.ceil(math.log2(max(e, 2)))) + 1
    programs = max(1, grid_programs(cfg, target, items_bound))
    upcast = bool(knobs.runtime.interpret) and a.dtype == torch.bfloat16
    slot = kept_launch.Planned(
        moe_grouped_kernel,
        (programs, 1, 1),
        dict(
            MODE=int(mode),
            A_TMA=a_tma,
            A_GATHER=a_gather,
            W_TMA=w_tma,
            CLIP=clip,
            OUT_TMA=out_tma,
            SAVE_PRE=pre is not None,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=cfg.group_m,
            NUM_PROGRAMS=programs,
            LOG2_E=log2_e,
            DOT_UPCAST=upcast,
        ),
        dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
    )
    return GroupedLaunch(
        slot,
        ((list(a.shape), [a.stride(0), 1], [bm, bk]) if a_tma and not clip else None),
        ((list(w2d.shape), [w2d.stride(0), 1], [bn, bk]) if w_tma else None),
        ((list(out.shape), [out.stride(0), 1], [bm, bn // 2]) if out_tma else None),
        (n, k, e, a.stride(0), w2d.stride(0), out.stride(0), 0 if pre is None else pre.stride(0)),
        clip,
    )


def jit_desc(base, shape, strides, block):
    return TensorDescriptor(base, shape, strides, block)


def host_desc(base, shape, strides, block):
    return kept_launch.HostDesc(base if isinstance(base, torch.Tensor) else kept_launch.Addr(base), shape, strides)


def grouped_args(g: GroupedLaunch, a, a_rows, w, out, scale, offsets, tile_offsets, desc, pre=None) -> list:
    """The runtime arguments of ``g``'s launch: tensors (``desc`` = ``jit_desc``), or for a kept launch device
    addresses and ``host_desc``s."""
    return [
        a if g.a_desc is None else desc(a, *g.a_desc),
        offsets if a_rows is None else a_rows,
        w if g.w_desc is None else desc(w, *g.w_desc),
        out,
        out if g.out_desc is None else desc(out, *g.out_desc),
        out if scale is None else scale,
        out if pre is None else pre,
        offsets,
        tile_offsets,
        *g.ints,
    ]


def ensure_allocator(g: GroupedLaunch) -> None:
    if g.clip and isinstance(_allocator.get(), NullAllocator):  # scratch for the descriptors made on the device
        triton.set_allocator(_scratch)


def launch_grouped(
    mode: Mode,
    a: torch.Tensor,
    a_rows: torch.Tensor | None,
    w: torch.Tensor,
    out: torch.Tensor,
    scale: torch.Tensor | None,
    offsets: torch.Tensor,
    tile_offsets: torch.Tensor,
    n: int,
    cfg: MoEConfig,
    target: Target,
    rows_bound: int,
    pre: torch.Tensor | None = None,
) -> None:
    """One persistent launch of ``moe_grouped_kernel`` over every expert's tiles (``pre``: see ``grouped_spec``)."""
    w_rows = w2d(w)
    g = grouped_spec(mode, a, a_rows is not None, w_rows, out, n, offsets.numel(), cfg, target, rows_bound, pre)
    ensure_allocator(g)
    args = grouped_args(g, a, a_rows, w_rows, out, scale, offsets, tile_offsets, jit_desc, pre)
    compiled = kept_launch.start(_KEPT, g.slot.kernel, g.slot.grid, args, g.slot.consts, g.slot.opts)
    if compiled is not None:
        _LAST["grouped"] = compiled


def fire_grouped(g: GroupedLaunch, args: list, direct: bool) -> None:
    """Launch a planned grouped launch (``ops.launch.fire``), recording the compiled kernel."""
    _LAST["grouped"] = kept_launch.fire(g.slot, args, direct)


def last_kernel():
    """The compiled grouped kernel of the latest launch (None under the interpreter or before any)."""
    k = _LAST.get("grouped")
    return k if hasattr(k, "asm") else None


def launch_grouped_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    offsets: torch.Tensor,
    out: torch.Tensor | None,
    validate: bool,
    config: MoEConfig | None = None,
) -> torch.Tensor:
    """``grouped_gemm``'s launcher: checks, allocates, launches (no autograd)."""
    s, k, e, n = check_grouped_args(x, w, offsets, out)
    if out is None:
        out = torch.empty((s, n), dtype=x.dtype, device=x.device)
    if e == 0:
        return out
    target = target_for(x.device) if s else None
    cfg = (
        (config or moe_config(target, s, e, Mode.GROUPED, x.element_size(), dtype=x.dtype, n=n, k=k))
        if s
        else MoEConfig()
    )
    tile_offsets = torch.empty(e + 1, dtype=torch.int32, device=x.device)
    ok = torch.empty(1, dtype=torch.bool, device=x.device)
    offsets = offsets.contiguous()  # (the schedule kernel reads it densely)
    kept_launch.start(
        _KEPT,
        moe_tiles_kernel,
        (1,),
        [offsets, tile_offsets, ok, e, s],  # schedule + check
        dict(BLOCK_M=cfg.block_m, BLOCK_E=max(16, triton.next_power_of_2(e))),
        {},
    )
    if validate:
        device_check(ok[0], f"grouped_gemm: offsets must be non-decreasing cumulative ends within [0, S={s}]")
    if s == 0 or n == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    if k == 0:
        return out.zero_()
    launch_grouped(Mode.GROUPED, x, None, w, out, None, offsets, tile_offsets, n, cfg, target, s)
    return out
