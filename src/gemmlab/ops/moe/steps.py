"""The parts of the MoE forward's plan (``ops.moe.plan`` makes, keeps and runs it). Legend: T tokens, H hidden,
I expert intermediate, E experts, k top-k, S = T*k routed (token, slot) rows.

    MoEPlan                 every decision of a call: its Body, configs, scratch Regions and Steps
    Step, Desc              one planned launch and its arguments by name (a TMA descriptor over a named tensor)
    scratch_layout(...)     the regions of the one scratch buffer (routing tables, gathered x, intermediate, routed
                            outputs; FP8: their e4m3 copies and scales), each ALIGN-aligned
    grouped_step, quantize_step   a grouped GEMM or 1x128 quantizer launch as a Step
    check(...)              the full argument check of a new signature -> (T, H, I, E, k)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from gemmlab.device import target_for
from gemmlab.kernels.gemm_fp8 import quantize_groups_kernel
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.fp8.checks import FP8, SCALE_BLOCK
from gemmlab.ops.fp8.moe_checks import check_moe_fp8_args
from gemmlab.ops.fp8.moe_config import check_weights_tma, need_tma
from gemmlab.ops.layout import padded_k
from gemmlab.ops.moe.checks import check_gather, check_moe_args
from gemmlab.ops.moe.grouped import GroupedLaunch
from gemmlab.ops.moe.routing import (
    sort_blocks,
)

ALIGN = 128  # bytes: each scratch region starts on this (TMA needs 16)


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
    offset: int  # bytes from the scratch buffer's start


@dataclass(frozen=True)
class Desc:
    """A TMA descriptor over the call's tensor or scratch region ``name``."""

    name: str
    shape: list
    strides: list
    block: list


@dataclass
class Step:
    """One launch of a plan: the planned kernel and its runtime arguments, each the name of a call tensor (x, ids,
    tw, w1, w2, w1_scale, w2_scale, y, gate_up) or scratch region, a ``Desc``, or a value. ``shrink``: fewer
    pipeline stages (not below 2) where the compiled kernel does not fit in shared memory (the gate/up stores)."""

    slot: kept_launch.Planned
    args: list
    shrink: bool = False
    named: tuple = ()  # (position, name) of each argument looked up per call
    descs: tuple = ()  # (position, Desc) of each descriptor made per call

    def __post_init__(self) -> None:
        self.named = tuple((j, a) for j, a in enumerate(self.args) if a.__class__ is str)
        self.descs = tuple((j, a) for j, a in enumerate(self.args) if a.__class__ is Desc)


@dataclass
class MoEPlan:
    """Every decision of a moe_forward call with inputs laid out like the ones it was made for. ``route`` turns
    "torch" if a routing kernel cannot build; ``kept`` turns True once every launch has kept its compiled kernel."""

    t: int
    h: int
    i: int
    e: int
    k: int
    nbytes: int  # scratch bytes (a multiple of the element size)
    regions: list[Region]
    route: str  # route_kind's answer
    block_m: int
    validate: str | None  # the message of the ids check, None: no check
    body: Body
    save: bool  # gate/up kept for the backward (a (S, 2I) output beside y)
    x_copy: bool  # x's rows are not unit-stride: copied per call
    flat_copy: bool  # topk_ids / topk_weights not contiguous: flattened copies per call
    w_copy: tuple[bool, bool]  # w1 / w2 not in the (E * N_w, K) layout: copied per call (``w2d``)
    scale_copy: bool  # FP8: a weight scale not contiguous: copied per call
    ok_at: int  # byte offset of the ok flag
    routing: list[Step] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)  # the body's launches
    clip: GroupedLaunch | None = None  # a grouped launch making descriptors on the device (needs Triton's allocator)
    kept: bool = False  # every launch kept: later calls launch directly


def scratch_layout(
    t: int, h: int, i: int, e: int, k: int, dtype: torch.dtype, route: str, copy: bool, gemms: bool, fp8: bool
) -> tuple[list[Region], int]:
    """The scratch regions of a call and the buffer's size: the routing tables, x's rows in expert order
    (gather "copy"), the intermediate act (S, I) in rows padded to 16 bytes and the routed outputs o (S, H); FP8:
    the e4m3 gathered x and intermediate and their 1x128 block scales."""
    s, elt = t * k, torch.empty((), dtype=dtype).element_size()
    nb = sort_blocks(s)[1] if route == "count" else 0
    want = [
        ("order", torch.int32, (s,), (1,)),
        ("inv", torch.int32, (s,), (1,)),
        ("token", torch.int32, (s,), (1,)),
        ("offsets", torch.int32, (e,), (1,)),
        ("tile_offsets", torch.int32, (e + 1,), (1,)),
        ("scale", torch.float32, (s,), (1,)),
        ("ok", torch.bool, (1,), (1,)),
        ("hist", torch.int32, ((e + 1) * nb,), (1,)),
        ("local", torch.int32, ((e + 1) * nb,), (1,)),
    ]
    if gemms:
        want += ([("xg", dtype, (s, h), (h, 1))] if copy else []) + [
            ("act", dtype, (s, i), (padded_k(i), 1)),
            ("o", dtype, (s, h), (h, 1)),
        ]
    if gemms and fp8:
        hb, ib = -(-h // SCALE_BLOCK), -(-i // SCALE_BLOCK)
        want += [
            ("qa", FP8, (s, h), (h, 1)),
            ("sa", torch.float32, (s, hb), (hb, 1)),
            ("qh", FP8, (s, i), (i, 1)),
            ("sh", torch.float32, (s, ib), (ib, 1)),
        ]
    regions, at = [], 0
    for name, dt, shape, strides in want:
        regions.append(Region(name, dt, shape, strides, at))
        size = (shape[0] * strides[0] if shape[0] else 0) * torch.empty((), dtype=dt).element_size()
        at += -(-size // ALIGN) * ALIGN
    return regions, max(at, elt)


def grouped_step(g, a: str, a_rows: str | None, w: str, out: str, scale: str | None, pre: str | None) -> Step:
    """A planned bf16/fp16 grouped launch (``ops.moe.grouped.grouped_spec``) as a Step over named tensors."""
    return Step(
        g.slot,
        [
            a if g.a_desc is None else Desc(a, *g.a_desc),
            a_rows or "offsets",
            w if g.w_desc is None else Desc(w, *g.w_desc),
            out,
            out if g.out_desc is None else Desc(out, *g.out_desc),
            scale or out,
            pre or out,
            "offsets",
            "tile_offsets",
            *g.ints,
        ],
        shrink=pre is not None,
    )


def quantize_step(src: str, q: str, sc: str, s: int, n: int, stride: int) -> Step:
    """Rows of ``src`` (S, n) quantized per 1x128 block into ``q`` (e4m3) and ``sc`` (S, nb) fp32, as
    ``quantize_fp8(x, "block", (1, 128))`` does (the same kernel and launch)."""
    nb = -(-n // SCALE_BLOCK)
    return Step(
        kept_launch.Planned(quantize_groups_kernel, (s, nb, 1), dict(BLOCK=SCALE_BLOCK), dict(num_warps=1)),
        [src, q, sc, n, stride, n, nb, SCALE_BLOCK],
    )


def check(x, w1, w2, tw, ids, gather, scales) -> tuple[int, int, int, int, int]:
    """The full check of a new signature -> (T, H, I, E, k)."""
    if scales is None:
        check_gather(gather)
        return check_moe_args(x, w1, w2, tw, ids)
    dims = check_moe_fp8_args(x, w1, scales[0], w2, scales[1], tw, ids)
    if dims[0] and dims[1] and dims[4]:
        need_tma("moe_forward (fp8)", target_for(x.device))
        check_weights_tma("moe_forward (fp8)", w1=w1, w2=w2)
    return dims
