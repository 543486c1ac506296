"""Step (2) of the GEMM planner (``ops.gemm.planner``): the launch a plan's decisions make. ``launch_spec`` turns a
plan and kernel-view operands into a ``LaunchSpec`` (grid, descriptor layouts, integer arguments, constexprs,
options, scratch and staging sizes) that the launcher (``ops.gemm.launch``) only reads.

    launch_spec(plan, a, b, c) -> LaunchSpec    the launch of a non-empty plan
    constexprs(plan), launch_options(config)    what the plan's kernel is compiled with (shared with the inspector)
    stream_k_tiles(tiles, num_sms)              the tiles a stream-K launch shares out
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from triton import knobs

from gemmlab.ops.gemm.staging import staged_shape
from gemmlab.ops.layout import descriptor_layout

if TYPE_CHECKING:
    from gemmlab.ops.gemm.planner import GemmConfig, Plan


@dataclass(frozen=True)
class LaunchSpec:
    """A plan's kernel launch, as the operands' shapes and strides fix it (the kernel is ``Plan.path``'s).
    ``descs`` says per kernel-view operand (a, b, c) whether it goes as a TMA descriptor ((shape, strides,
    block) over the buffer the kernel reads: the staged copy for a staged operand) or a pointer (None).
    ``staged``: per staged operand (name, its unit-stride dim, (rows, row length) of its aligned buffer)."""

    grid: tuple[int, int, int]
    descs: tuple
    ints: tuple  # the runtime integer arguments after the tensors
    constexprs: tuple[tuple[str, object], ...]  # (name, value), the kernel's compile-time parameters
    options: tuple[tuple[str, int], ...]  # num_warps, num_stages, maxnreg
    scratch: tuple[int, int] | None  # split-K, stream-K: (workspace fp32 elements, counters); None: no such args
    staged: tuple[tuple[str, int, tuple[int, int]], ...] = ()


def stream_k_tiles(tiles: int, num_sms: int) -> int:
    """Tiles a stream_k launch shares out by BLOCK_K steps: none when the tiles fill whole waves; else the
    partial last wave plus one full wave (so each program's share is 1-2 tiles of work, and the data-parallel
    part keeps whole waves), or every tile when there is less than one wave."""
    rem = tiles % num_sms
    if rem == 0:
        return 0
    return rem + num_sms if tiles > num_sms else tiles


def constexprs(p: Plan) -> dict:
    """The compile-time parameters the plan's kernel is specialized on (shared with the inspector)."""
    cfg = p.config
    upcast = bool(knobs.runtime.interpret) and p.dtype == torch.bfloat16  # see kernels.gemm.dot
    if p.path == "portable":
        return dict(
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, DOT_UPCAST=upcast
        )
    if p.path == "gemv":
        return dict(
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, DOT_UPCAST=upcast
        )
    common = dict(
        A_KMAJOR=p.a_kmajor,
        B_KMAJOR=p.b_kmajor,
        C_TMA=p.c_tma,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EPILOGUE_SUBTILE=cfg.epilogue_subtile,
        DOT_UPCAST=upcast,
    )
    if p.path == "tma_persistent":
        return dict(
            common,
            GROUP_M=cfg.group_m,
            NUM_SMS=p.num_sms,
            WARP_SPECIALIZE=cfg.warp_specialize,
            STREAM_K=cfg.stream_k or cfg.tail_split > 0,
            TAIL_SPLIT=cfg.tail_split,
        )
    return dict(common, SPLIT_K=cfg.split_k)


def launch_options(cfg: GemmConfig) -> dict:
    """Triton launch options of a config (shared with the inspector's compile)."""
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.max_nreg:
        opts["maxnreg"] = cfg.max_nreg
    return opts


def _layout(t: torch.Tensor, staged: tuple[int, int] | None, inner: int) -> tuple[tuple, tuple]:
    """(shape, strides) of the buffer the kernel reads for operand ``t``: ``t`` itself, or its staged copy
    (rows padded to ``staged[1]`` elements, dim ``inner`` unit-stride)."""
    if staged is None:
        return tuple(t.shape), tuple(t.stride())
    strides = [0, 0]
    strides[inner], strides[1 - inner] = 1, staged[1]
    return tuple(t.shape), tuple(strides)


def launch_spec(p: Plan, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None) -> LaunchSpec:
    """The launch of a (non-empty) plan for kernel-view operands shaped and strided like these (c None: a
    fresh contiguous (M, N)); the layouts of staged copies are derived here."""
    cfg, cdiv = p.config, (lambda x, y: -(-x // y))
    consts, opts = tuple(constexprs(p).items()), tuple(launch_options(cfg).items())
    inner = {"a": 1 if p.a_kmajor else 0, "b": 0 if p.b_kmajor else 1, "c": 1}
    ops = {"a": a, "b": b, "c": c if c is not None else torch.empty((p.m, p.n), dtype=p.dtype, device="meta")}
    staged = tuple(
        (name, inner[name], staged_shape(ops[name], inner[name])) for name in ("a", "b", "c") if name in p.staged
    )
    where = {name: shape for name, _, shape in staged}
    la, lb, lc = (_layout(ops[name], where.get(name), inner[name]) for name in ("a", "b", "c"))
    if p.path == "portable":
        grid = (cdiv(p.m, cfg.block_m) * cdiv(p.n, cfg.block_n), 1, 1)
        ints = (p.m, p.n, p.k, *la[1], *lb[1], *lc[1])
        return LaunchSpec(grid, (None, None, None), ints, consts, opts, None)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if p.path == "gemv":
        tiles = cdiv(p.m, bm) * cdiv(p.n, bn)
        ints = (p.m, p.n, p.k, *la[1], *lb[1], *lc[1], cdiv(cdiv(p.k, bk), cfg.split_k))
        scratch = (cfg.split_k * tiles * bm * bn, tiles) if cfg.split_k > 1 else (0, 0)
        return LaunchSpec((cdiv(p.m, bm), cdiv(p.n, bn), cfg.split_k), (None, None, None), ints, consts, opts, scratch)
    desc = descriptor_layout  # (shape, strides, inner, block) -> the descriptor's shape, strides, block
    descs = (
        desc(*la, 1, (bm, bk)) if p.a_kmajor else desc(*la, 0, (bk, bm)),
        desc(*lb, 0, (bn, bk)) if p.b_kmajor else desc(*lb, 1, (bk, bn)),
        desc(*lc, 1, (bm, bn // 2 if cfg.epilogue_subtile else bn)) if p.c_tma else None,
    )
    descs = tuple(None if d is None else (tuple(d[0]), tuple(d[1]), tuple(d[2])) for d in descs)
    if p.path == "tma_persistent":
        tiles = cdiv(p.m, bm) * cdiv(p.n, bn)
        if cfg.tail_split:  # the partial last wave, each tile in tail_split pieces with a slot each
            sk = tiles % p.num_sms if tiles >= p.num_sms else tiles
            grid, scratch = (p.num_sms, 1, 1), (sk * cfg.tail_split * bm * bn, sk)
        else:
            sk = stream_k_tiles(tiles, p.num_sms) if cfg.stream_k else 0
            grid = (p.num_sms if sk else min(p.num_sms, tiles), 1, 1)
            scratch = (p.num_sms * 2 * bm * bn, sk) if sk else (0, 0)
        return LaunchSpec(grid, descs, (p.m, p.n, p.k, lc[1][0], sk), consts, opts, scratch, staged)
    grid_n, grid_m = cdiv(p.n, bn), cdiv(p.m, bm)
    per_split = cdiv(cdiv(p.k, bk), cfg.split_k)
    scratch = (cfg.split_k * grid_n * grid_m * bm * bn, grid_n * grid_m) if cfg.split_k > 1 else (0, 0)
    return LaunchSpec(
        (grid_n, grid_m, cfg.split_k), descs, (p.m, p.n, p.k, lc[1][0], per_split), consts, opts, scratch, staged
    )
