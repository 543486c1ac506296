"""MoE launchers: ``route``, ``grouped_gemm``, ``pack_moe_weights``, ``moe_forward``.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed (token, slot) rows.

    route(logits (T, E), k)                     -> weights (T, k) fp32, ids (T, k) int32
    grouped_gemm(x (S, K), w (E, N, K), offsets) -> (S, N); rows of group e times w[e]^T
    moe_forward(x (T, H), w1 (E, 2I, H), w2 (E, H, I), weights, ids) -> y (T, H)
        y[t] = sum_j weights[t, j] * (silu(x[t] @ gate_e^T) * (x[t] @ up_e^T)) @ w2_e^T,  e = ids[t, j]

moe_forward: (1) sort the (token, slot) pairs by expert on the GPU, stably, with no host sync (one launch up to
``ALIGN_MAX_S`` pairs, a counting sort in three launches above), (2) first GEMM over all experts in one persistent
launch on x's rows in expert order (gathered once, or read by token index inside the GEMM: ``gather``), SiLU(gate) *
up in the epilogue (the 2I-wide intermediate is never written), (3) second GEMM with each row's top-k weight
applied in its epilogue, (4) a deterministic combine back to token order (each token sums its k rows in
slot order). fp16 and bf16, fp32 accumulation. Every decision of a call is planned once per signature of its
inputs (``_PLANS``); later calls allocate one scratch buffer (routing tables, gathered x, intermediate, routed
outputs) and y, and launch the kept kernels with device addresses (``gemmlab.ops.launch``).
``validate=True`` checks ids and offsets against E and S on the device (no host sync: a device-side assert on
a GPU, so it works in CUDA graphs too); ``validate=False`` skips those few small launches.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, fields, replace

import torch
import triton
from triton import knobs
from triton.runtime._allocation import NullAllocator, _allocator
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.kernels.moe import (
    _moe_align_kernel,
    _moe_combine_kernel,
    _moe_count_kernel,
    _moe_gather_kernel,
    _moe_grouped_kernel,
    _moe_scan_kernel,
    _moe_scatter_kernel,
    _moe_tiles_kernel,
)
from gemmlab.ops import configs as config_tables
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.plan import Target, padded_k, target_for

DTYPES = (torch.float16, torch.bfloat16)
SMEM_BYTES = 232448


@dataclass(frozen=True)
class MoEConfig:
    """Launch parameters of the grouped kernel."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 8  # m-tiles of one expert that walk the n-tiles together (W tiles shared in L2)
    clip: bool = False  # per-tile descriptors ending at the group's end: zeros past it, TMA-stored output
    out_tma: bool = True  # full tiles TMA-stored through a host descriptor (partial ones: masked stores)
    # persistent programs per SM: > 1 keeps several resident (more weight bytes in flight, one program's
    # prologue and epilogue under another's K loop; stages trimmed to fit shared memory / programs_per_sm)
    programs_per_sm: int = 1

    def __post_init__(self):
        if isinstance(self.programs_per_sm, bool) or not isinstance(self.programs_per_sm, int) or \
                self.programs_per_sm < 1:
            raise ValueError(f"MoEConfig: programs_per_sm must be an integer >= 1, got {self.programs_per_sm!r}")


MODES = ("grouped", "gate_up", "down")  # the kernel's MODE 0, 1, 2: its path in the "moe" config tables


def _moe_config_from_dict(d: dict) -> MoEConfig:
    known = {f.name for f in fields(MoEConfig)}
    if set(d) - known:
        raise ValueError(f"unknown MoEConfig keys {sorted(set(d) - known)}; known: {sorted(known)}")
    return MoEConfig(**d)


def moe_choice(target: Target, rows: int, experts: int, mode: int, elt: int = 2, *,
               dtype: torch.dtype | None = None, n: int = 0, k: int = 0,
               max_group: int = 0) -> tuple[MoEConfig, str]:
    """The grouped kernel's config for ``rows`` routed rows over ``experts`` experts in ``mode`` (0 grouped,
    1 gate/up, 2 down; output width ``n``, reduction ``k``), and which file and rule it came from: the first
    rule of the target's "moe" tables (the user's file, then the bundled one; ``ops.configs``) whose ranges
    hold rows_per_expert = ceil(rows / experts used), group_bound = min(rows, max_group) (``max_group``: an
    upper bound on the rows of the largest group known on the host, 0 for none; ``moe_forward`` passes T,
    as a token's k slots name k distinct experts; the group sizes themselves stay on the device), rows,
    experts, n, k (and ``dtype``: rules naming one match only it). Pipeline stages are then trimmed to fit
    shared memory. The bundled H200 choices and how they were made: ``configs/nvidia-h200.json``'s "about"."""
    used = max(1, min(experts, rows))
    dname = str(dtype).removeprefix("torch.") if dtype is not None else ""
    bound = min(rows, max_group) if max_group > 0 else rows
    rule = config_tables.pick(target.name, "moe", MODES[mode], _moe_config_from_dict, dname,
                              rows_per_expert=-(-rows // used), group_bound=bound, rows=rows, experts=experts,
                              n=n, k=k)
    return _fit_stages(rule.config, mode, elt), "config " + rule.source


@functools.lru_cache(maxsize=256)
def _fit_stages(cfg: MoEConfig, mode: int, elt: int) -> MoEConfig:
    """``cfg`` with its pipeline stages trimmed (not below 2) until ``programs_per_sm`` programs fit in an
    SM's shared memory."""
    w_tiles = 2 if mode == 1 else 1
    staging = cfg.block_m * cfg.block_n // 2 * elt  # the TMA store's buffer (half a tile)
    stages = cfg.num_stages
    budget = SMEM_BYTES // cfg.programs_per_sm - 1024
    while stages > 2 and stages * (cfg.block_m + w_tiles * cfg.block_n) * cfg.block_k * elt + staging > budget:
        stages -= 1
    return replace(cfg, num_stages=stages) if stages != cfg.num_stages else cfg


def moe_config(target: Target, rows: int, experts: int, mode: int, elt: int = 2, *,
               dtype: torch.dtype | None = None, n: int = 0, k: int = 0, max_group: int = 0) -> MoEConfig:
    """``moe_choice``'s config."""
    return moe_choice(target, rows, experts, mode, elt, dtype=dtype, n=n, k=k, max_group=max_group)[0]


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


ALIGN_MAX_S = 4096  # up to this many routed rows the routing table is one launch (_moe_align_kernel)
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
        return [(_moe_align_kernel, (1, 1, 1),
                 dict(TOP_K=k, BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_E=max(16, triton.next_power_of_2(e + 1)),
                      HAS_SCALE=has_scale), dict(num_warps=4 if block_s <= 1024 else 8))]
    block, nb = sort_blocks(s)
    block_e = max(16, triton.next_power_of_2(e + 1))
    warps = 4 if block <= 512 else 8
    return [(_moe_count_kernel, (nb, 1, 1), dict(BLOCK=block, BLOCK_E=block_e), dict(num_warps=warps)),
            (_moe_scan_kernel, (1, 1, 1), dict(BLOCK_M=block_m, BLOCK_E=block_e, BLOCK_B=max(1, 4096 // block_e),
                                               CHUNK=1024), dict(num_warps=8)),
            (_moe_scatter_kernel, (nb, 1, 1), dict(TOP_K=k, BLOCK=block, HAS_SCALE=has_scale),
             dict(num_warps=warps))]


def route_args(kind: str, ids, weights, order, inv, token, offsets, tile_offsets, scale, ok, hist, local,
               s: int, e: int) -> list[list]:
    """The runtime arguments of ``route_launches``' launches (tensors, or device addresses for a kept launch);
    ``weights``/``scale`` None: no routed weights."""
    if kind == "align":
        return [[ids, ids if scale is None else weights, order, inv, token, offsets, tile_offsets,
                 order if scale is None else scale, ok, s, e]]
    nb = sort_blocks(s)[1]
    return [[ids, hist, local, s, e, nb], [hist, local, offsets, tile_offsets, ok, e, nb],
            [ids, ids if scale is None else weights, local, order, inv, token, order if scale is None else scale,
             s, e, nb]]


def sort_routes(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                topk_weights: torch.Tensor | None = None) -> Routes:
    """Group the (token, slot) pairs of ``topk_ids`` (T, k) by expert, stably (token order within an
    expert), on the ids' device, without reading them on the host. Up to ``ALIGN_MAX_S`` pairs in one launch
    (``_moe_align_kernel``, which also gathers ``topk_weights`` into routed order and flags bad ids); more by a
    counting sort in three launches (same tables, same flag); torch ops (sort, scatter-add, cumsum) where
    ``route_kind`` says so."""
    t, k = topk_ids.shape
    s, e = t * k, num_experts
    kind = route_kind(s, e)
    if kind != "torch":
        dev = topk_ids.device
        nb = sort_blocks(s)[1] if kind == "count" else 0
        buf = torch.empty(3 * s + 2 * e + 1 + 2 * (e + 1) * nb, dtype=torch.int32, device=dev)
        order, inv, token = buf[:s], buf[s:2 * s], buf[2 * s:3 * s]
        offsets, tile_offsets = buf[3 * s:3 * s + e], buf[3 * s + e:3 * s + 2 * e + 1]
        hist, local = buf[3 * s + 2 * e + 1:3 * s + 2 * e + 1 + (e + 1) * nb], buf[3 * s + 2 * e + 1 + (e + 1) * nb:]
        ok = torch.empty(1, dtype=torch.bool, device=dev)
        scale = None if topk_weights is None else torch.empty(s, dtype=torch.float32, device=dev)
        ids = topk_ids.reshape(-1).contiguous()  # dense: a strided (T, 1) view reshapes to a strided view
        wts = None if topk_weights is None else topk_weights.reshape(-1).contiguous()
        try:
            for (kernel, grid, consts, opts), args in zip(
                    route_launches(kind, s, e, k, block_m, scale is not None),
                    route_args(kind, ids, wts, order, inv, token, offsets, tile_offsets, scale, ok, hist, local, s,
                               e), strict=True):
                kept_launch.start(_KEPT, kernel, grid, args, consts, opts)
            return Routes(order=order, inv=inv, token=token, offsets=offsets, tile_offsets=tile_offsets,
                          block_m=block_m, scale=scale, ok=ok)
        except (triton.CompilationError, OutOfResources) as err:  # cannot build it: say so once, use torch ops
            _routing_broken(err)
    return _sort_routes_torch(topk_ids, num_experts, block_m, topk_weights)


def _routing_broken(err: Exception) -> None:
    _ALIGN_BROKEN.append(str(err))
    warnings.warn(f"gemmlab: the MoE routing kernel failed to compile; routing with torch ops instead "
                  f"({type(err).__name__}: {str(err)[:200]})", RuntimeWarning, stacklevel=3)


def _sort_routes_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                       topk_weights: torch.Tensor | None = None) -> Routes:
    """``sort_routes`` in torch ops (ids must be in [0, E); ``ok`` None)."""
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).to(torch.int64)
    _, order = torch.sort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    scale = None if topk_weights is None else topk_weights.reshape(-1).float()[order]
    return Routes(order=order.to(torch.int32), inv=inv.to(torch.int32), token=(order // k).to(torch.int32),
                  offsets=torch.cumsum(counts, 0).to(torch.int32), tile_offsets=_tile_offsets(counts, block_m),
                  block_m=block_m, scale=scale)


def route(router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True,
          scoring: str = "softmax") -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing. (T, E) logits -> (T, k) float32 weights and (T, k) int32 expert ids ((..., E) -> (..., k)).
    ``scoring``: "softmax" (probabilities over E, then top-k) or "sigmoid" (DeepSeek-V3: independent sigmoid scores,
    top-k; no group limit). ``renormalize``: the k weights of a token sum to 1. Differentiable w.r.t. the
    logits through the weights (the selection held fixed, as torch.topk's backward); the ids are not.
    A custom op (``torch.ops.gemmlab.route``) under torch.compile and autograd."""
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() < 2:
        raise ValueError(f"route: router_logits must be a (T, E) (or (..., E)) tensor, got "
                         f"{getattr(router_logits, 'shape', type(router_logits).__name__)}")
    if not router_logits.is_floating_point():
        raise TypeError(f"route: router_logits must be floating point, got {router_logits.dtype}")
    e = router_logits.shape[-1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise ValueError(f"route: top_k must be an integer in [1, E={e}], got {top_k!r}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"route: scoring {scoring!r}: softmax or sigmoid")
    lead = router_logits.shape[:-1]
    logits = router_logits if router_logits.dim() == 2 else router_logits.reshape(-1, e)
    if custom.direct(logits):
        weights, ids = route_impl(logits, top_k, renormalize, scoring)
    else:
        weights, ids = custom.route(logits, top_k, bool(renormalize), scoring)
    if router_logits.dim() != 2:
        weights, ids = weights.view(*lead, top_k), ids.view(*lead, top_k)
    return weights, ids


def route_impl(router_logits: torch.Tensor, top_k: int, renormalize: bool, scoring: str):
    """``route`` on checked arguments, in torch ops."""
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    weights, ids = torch.topk(scores, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


# ------------------------------------------------------------------------------------------ checks


def _check(name: str, t: object, dims: int, dtypes=DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: {', '.join(str(d) for d in dtypes)}")


def _same_device(*named) -> None:
    devs = {str(t.device) for _, t in named}
    if len(devs) > 1:
        raise ValueError("tensors on different devices: " + ", ".join(f"{n} on {t.device}" for n, t in named))


def _tma_ok(t: torch.Tensor) -> bool:
    """2-D, unit inner stride, 16-byte aligned base and row stride, rows that do not overlap (an expanded
    gradient has row stride 0, which a TMA descriptor cannot describe)."""
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(-2) * t.element_size()) % 16 == 0
            and t.stride(-2) >= t.shape[-1])


def _w2d(w: torch.Tensor) -> torch.Tensor:
    """(E, N_w, K) with unit K stride and rows evenly spaced -> the (E * N_w, K) view the kernel reads."""
    e, n_w, k = w.shape
    if w.stride(2) != 1 or (e > 1 and w.stride(0) != n_w * w.stride(1)):
        w = w.contiguous()
    return w.as_strided((e * n_w, k), (w.stride(1), 1))


def launch_config(cfg: MoEConfig, a_tma: bool, a_gather: bool, w_tma: bool) -> MoEConfig:
    """The config a launch uses given how A and W are read (checked in the sm_90 SASS by
    tests/test_inspect.py: no spills). BLOCK_M stays: the tile schedule was built with it."""
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
class _Grouped:
    """One grouped launch's decisions: the planned kernel and how A, W and out are passed (descriptor
    (shape, strides, block) or None: a pointer)."""

    slot: kept_launch.Planned
    a_desc: tuple | None
    w_desc: tuple | None
    out_desc: tuple | None
    ints: tuple  # N, K, E, stride_am, stride_wn, stride_om
    clip: bool


def _grouped_spec(mode: int, a: torch.Tensor, a_gather: bool, w2d: torch.Tensor, out: torch.Tensor, n: int,
                  e: int, cfg: MoEConfig, target: Target, rows_bound: int) -> _Grouped:
    """The decisions of a grouped launch for operands laid out like these (their shapes, strides, alignment)."""
    k = a.shape[1]
    a_tma = not a_gather and target.has_tma and _tma_ok(a)
    w_tma = target.has_tma and _tma_ok(w2d)
    cfg = launch_config(cfg, a_tma, a_gather, w_tma)
    clip, out_tma = epilogue_flags(cfg, a_tma, w_tma, _tma_ok(out))
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    items_bound = (triton.cdiv(rows_bound, bm) + e) * triton.cdiv(n, bn)
    log2_e = max(1, math.ceil(math.log2(max(e, 2)))) + 1
    programs = max(1, grid_programs(cfg, target, items_bound))
    upcast = bool(knobs.runtime.interpret) and a.dtype == torch.bfloat16
    slot = kept_launch.Planned(
        _moe_grouped_kernel, (programs, 1, 1),
        dict(MODE=mode, A_TMA=a_tma, A_GATHER=a_gather, W_TMA=w_tma, CLIP=clip, OUT_TMA=out_tma, BLOCK_M=bm,
             BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, NUM_PROGRAMS=programs, LOG2_E=log2_e, DOT_UPCAST=upcast),
        dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return _Grouped(
        slot, ((list(a.shape), [a.stride(0), 1], [bm, bk]) if a_tma and not clip else None),
        ((list(w2d.shape), [w2d.stride(0), 1], [bn, bk]) if w_tma else None),
        ((list(out.shape), [out.stride(0), 1], [bm, bn // 2]) if out_tma else None),
        (n, k, e, a.stride(0), w2d.stride(0), out.stride(0)), clip)


def _jit_desc(base, shape, strides, block):
    return TensorDescriptor(base, shape, strides, block)


def _host_desc(base, shape, strides, block):
    return kept_launch.HostDesc(base if isinstance(base, torch.Tensor) else kept_launch.Addr(base), shape, strides)


def _grouped_args(g: _Grouped, a, a_rows, w, out, scale, offsets, tile_offsets, desc) -> list:
    """The runtime arguments of ``g``'s launch: tensors (``desc`` = ``_jit_desc``), or for a kept launch device
    addresses and ``_host_desc``s."""
    return [a if g.a_desc is None else desc(a, *g.a_desc), offsets if a_rows is None else a_rows,
            w if g.w_desc is None else desc(w, *g.w_desc), out, out if g.out_desc is None else desc(out, *g.out_desc),
            out if scale is None else scale, offsets, tile_offsets, *g.ints]


def _ensure_allocator(g: _Grouped) -> None:
    if g.clip and isinstance(_allocator.get(), NullAllocator):  # scratch for the descriptors made on the device
        triton.set_allocator(_scratch)


def _launch_grouped(mode: int, a: torch.Tensor, a_rows: torch.Tensor | None, w: torch.Tensor, out: torch.Tensor,
                    scale: torch.Tensor | None, offsets: torch.Tensor, tile_offsets: torch.Tensor, n: int,
                    cfg: MoEConfig, target: Target, rows_bound: int) -> None:
    """One persistent launch of ``_moe_grouped_kernel`` over every expert's tiles."""
    w2d = _w2d(w)
    g = _grouped_spec(mode, a, a_rows is not None, w2d, out, n, offsets.numel(), cfg, target, rows_bound)
    _ensure_allocator(g)
    args = _grouped_args(g, a, a_rows, w2d, out, scale, offsets, tile_offsets, _jit_desc)
    compiled = kept_launch.start(_KEPT, g.slot.kernel, g.slot.grid, args, g.slot.consts, g.slot.opts)
    if compiled is not None:
        _LAST["grouped"] = compiled


_KEPT: dict = {}  # kept compiled kernels of the MoE launches, per specialization (gemmlab.ops.launch.start)


_LAST: dict[str, object] = {}


def last_kernel():
    """The compiled grouped kernel of the latest launch (None under the interpreter or before any)."""
    k = _LAST.get("grouped")
    return k if hasattr(k, "asm") else None


# ------------------------------------------------------------------------------------------ public API


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *, out: torch.Tensor | None = None,
                 validate: bool = True, config: MoEConfig | None = None) -> torch.Tensor:
    """out (S, N): rows offsets[e-1]:offsets[e] of x (S, K) times w[e]^T, w (E, N, K) in nn.Linear layout;
    offsets (E,) int32 cumulative group ends, as ``torch._grouped_mm``'s ``offs`` (empty groups allowed,
    any sizes; rows past offsets[-1] are left untouched). One persistent launch over all groups.
    ``validate``: check the offsets (non-decreasing, within [0, S]) without a host sync: on a GPU by a device-side
    assert (a bad value stops the program at its next synchronization, as a bad index into a torch op does), on the
    CPU at once (ValueError). ``out``: written in place; refused when it overlaps x, w or offsets, or its rows
    share memory (stride 0). Differentiable in x and w (``gemmlab.ops.custom``; rows past offsets[-1] get zero
    gradient). ``config``: launch parameters instead of ``moe_config``'s (tuning; eager only, no autograd)."""
    if config is not None:
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (x, w)):
            raise RuntimeError("grouped_gemm: config= is the tuner's eager path and has no autograd")
        return launch_grouped_gemm(x, w, offsets, out, validate, config)
    if out is not None:
        if isinstance(out, torch.Tensor):
            custom.refuse_grad_out("grouped_gemm", out, *(t for t in (x, w) if isinstance(t, torch.Tensor)))
        if custom.direct(x, w, offsets, out):
            return launch_grouped_gemm(x, w, offsets, out, validate)
        custom.grouped_gemm_out(x, w, offsets, out, bool(validate))
        return out
    if custom.direct(x, w, offsets):
        return launch_grouped_gemm(x, w, offsets, None, validate)
    return custom.grouped_gemm(x, w, offsets, bool(validate))


def _device_check(ok: torch.Tensor, message: str) -> None:
    """Check a 0-d bool computed on the device without reading it on the host: on a GPU a device-side assert
    (fires asynchronously and ends the process's CUDA context, as torch's own index checks do), on the CPU a
    ValueError now."""
    if ok.is_cuda:
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise ValueError(message)


def launch_grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor | None,
                        validate: bool, config: MoEConfig | None = None) -> torch.Tensor:
    """``grouped_gemm``'s launcher: checks, allocates, launches (no autograd)."""
    _check("x", x, 2)
    _check("w", w, 3)
    _check("offsets", offsets, 1, dtypes=(torch.int32,))
    _same_device(("x", x), ("w", w), ("offsets", offsets))
    if x.dtype != w.dtype:
        raise TypeError(f"grouped_gemm: x and w must have the same dtype, got {x.dtype} and {w.dtype}")
    (s, k), (e, n, k2) = x.shape, w.shape
    if k != k2:
        raise ValueError(f"grouped_gemm: x has K = {k} but w has K = {k2}")
    if offsets.numel() != e:
        raise ValueError(f"grouped_gemm: offsets has {offsets.numel()} entries for E = {e} experts")
    if out is None:
        out = torch.empty((s, n), dtype=x.dtype, device=x.device)
    else:
        _check("out", out, 2)
        if tuple(out.shape) != (s, n) or out.dtype != x.dtype or out.device != x.device or out.stride(1) != 1:
            raise ValueError(f"grouped_gemm: out must be a row-major ({s}, {n}) {x.dtype} tensor on {x.device}")
        check_out("grouped_gemm", out, x=x, w=w, offsets=offsets)
    if e == 0:
        return out
    target = target_for(x.device) if s else None
    cfg = config or moe_config(target, s, e, 0, x.element_size(), dtype=x.dtype, n=n, k=k) if s else MoEConfig()
    tile_offsets = torch.empty(e + 1, dtype=torch.int32, device=x.device)
    ok = torch.empty(1, dtype=torch.bool, device=x.device)
    kept_launch.start(_KEPT, _moe_tiles_kernel, (1,), [offsets, tile_offsets, ok, e, s],  # schedule + check
                      dict(BLOCK_M=cfg.block_m, BLOCK_E=max(16, triton.next_power_of_2(e))), {})
    if validate:
        _device_check(ok[0], f"grouped_gemm: offsets must be non-decreasing cumulative ends within [0, S={s}]")
    if s == 0 or n == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    if k == 0:
        return out.zero_()
    _launch_grouped(0, x, None, w, out, None, offsets, tile_offsets, n, cfg, target, s)
    return out


@dataclass(frozen=True)
class PackedMoE:
    """MoE weights laid out once for ``moe_forward``: contiguous, rows padded to 16 bytes (so odd H or I
    keep TMA on the weights), gate rows [0, I) then up rows [I, 2I) as in w1."""

    w1: torch.Tensor  # (E, 2I, H) view of (E, 2I, H_pad)
    w2: torch.Tensor  # (E, H, I) view of (E, H, I_pad)


def _pad_rows(w: torch.Tensor) -> torch.Tensor:
    e, n, k = w.shape
    k_pad = padded_k(k)
    buf = torch.zeros((e, n, k_pad), dtype=w.dtype, device=w.device)
    buf[:, :, :k].copy_(w)
    return buf[:, :, :k]


def pack_moe_weights(w1: torch.Tensor, w2: torch.Tensor) -> PackedMoE:
    """Prepack w1 (E, 2I, H) and w2 (E, H, I) once, outside any timed region (like ``pack_b``)."""
    _check_weights(w1, w2)
    return PackedMoE(_pad_rows(w1), _pad_rows(w2))


def _check_weights(w1, w2) -> tuple[int, int, int]:
    _check("w1", w1, 3)
    _check("w2", w2, 3)
    (e, i2, h), (e2, h2, i) = w1.shape, w2.shape
    if e != e2:
        raise ValueError(f"moe: w1 has E = {e} experts but w2 has {e2}")
    if i2 != 2 * i or h2 != h:
        raise ValueError(f"moe: w1 must be (E, 2I, H) and w2 (E, H, I); got w1 {tuple(w1.shape)}, "
                         f"w2 {tuple(w2.shape)}")
    if w1.dtype != w2.dtype:
        raise TypeError(f"moe: w1 and w2 dtypes differ ({w1.dtype}, {w2.dtype})")
    return e, h, i


def moe_forward(x: torch.Tensor, w1: torch.Tensor | PackedMoE, w2: torch.Tensor | None, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, *, validate: bool = True, gather: str = "auto",
                configs: tuple[MoEConfig, MoEConfig] | None = None) -> torch.Tensor:
    """The MoE layer body (see the module docstring). ``w1`` may be a ``PackedMoE`` (then ``w2`` is None
    or ignored). x (T, H) or (..., H); returns y of x's shape and dtype. ``gather``: how the first GEMM gets
    x's rows in expert order: "copy" (x[token] gathered once, then read through TMA: pipelined wgmma; 2*S*H
    bytes of extra traffic), "fused" (pointer loads of x rows by token index inside the GEMM: no copy, but on
    sm_90 those loads are not software-pipelined), "auto" (copy when x's rows are 16-byte aligned on a TMA
    target). ``validate``: check topk_ids in [0, E) without a host sync (a device-side assert on a GPU, a
    ValueError on the CPU; see ``grouped_gemm``). Differentiable in x, w1, w2 and topk_weights
    (``gemmlab.ops.custom``; topk_ids (T, k) must then be 2-D like topk_weights). ``configs``: (first GEMM,
    second GEMM) launch parameters instead of ``moe_config``'s (tuning; eager only, no autograd); the second
    takes the first's BLOCK_M (one tile schedule)."""
    if gather not in ("auto", "copy", "fused"):
        raise ValueError(f"moe: gather {gather!r}: auto, copy or fused")
    if isinstance(w1, PackedMoE):
        w1, w2 = w1.w1, w1.w2
    if configs is not None:
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (x, w1, w2, topk_weights)):
            raise RuntimeError("moe_forward: configs= is the tuner's eager path and has no autograd")
        return launch_moe_forward(x, w1, w2, topk_weights, topk_ids, validate, gather, configs)
    lead = None
    if isinstance(x, torch.Tensor) and x.dim() != 2 and x.dim() >= 1:
        lead, x = x.shape, x.reshape(-1, x.shape[-1])
        # (T, k) from (..., k); the k is named, not -1, so an empty batch (T = 0) reshapes too
        if isinstance(topk_weights, torch.Tensor) and topk_weights.dim() >= 1:
            topk_weights = topk_weights.reshape(x.shape[0], topk_weights.shape[-1])
        if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() >= 1:
            topk_ids = topk_ids.reshape(x.shape[0], topk_ids.shape[-1])
    if custom.direct(x, w1, w2, topk_weights, topk_ids):
        y = launch_moe_forward(x, w1, w2, topk_weights, topk_ids, validate, gather, None)
    elif custom.eager(x, w1, w2, topk_weights, topk_ids):  # needs autograd only: no dispatcher (host time)
        y = custom.MoEForward.apply(x, w1, w2, topk_weights, topk_ids, bool(validate), gather)
    else:
        _check_args(x, w1, w2, topk_weights, topk_ids)  # clear errors before the op (and its fake) run
        y = custom.moe_forward(x, w1, w2, topk_weights, topk_ids, bool(validate), gather)
    return y if lead is None else y.view(lead)


def _check_args(x, w1, w2, topk_weights, topk_ids) -> tuple[int, int, int, int, int]:
    e, h, i = _check_weights(w1, w2)
    _check("x", x, 2)
    _check("topk_weights", topk_weights, 2, dtypes=(torch.float32, torch.float16, torch.bfloat16))
    _check("topk_ids", topk_ids, 2, dtypes=(torch.int32, torch.int64))
    _same_device(("x", x), ("w1", w1), ("w2", w2), ("topk_weights", topk_weights), ("topk_ids", topk_ids))
    if x.dtype != w1.dtype:
        raise TypeError(f"moe: x has dtype {x.dtype}, the weights {w1.dtype}")
    t, hx = x.shape
    if hx != h:
        raise ValueError(f"moe: x has H = {hx}, the weights H = {h}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != t:
        raise ValueError(f"moe: topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
                         f"must both be (T={t}, k)")
    k = topk_ids.shape[1]
    if not 1 <= k <= e:
        raise ValueError(f"moe: top-k = {k} must be in [1, E={e}]")
    return t, h, i, e, k


# Per signature of a moe_forward call (shapes, strides, dtypes, devices and 16-byte alignment of the five inputs,
# validate, gather, configs): every decision of the call (configs, routing launches, grids, constexprs, the
# scratch layout) and its kept kernels. Filled on first use, after the checks; a hit skips the checks the key
# proves and launches the kept kernels with device addresses (``gemmlab.ops.launch``). Bounded like gemm's cache;
# ``configs.reload()`` clears it.
_PLANS: dict[tuple, object] = {}
PLANS_SIZE = 1024
_ALIGN = 128  # bytes: each scratch region starts on this (TMA needs 16)


@config_tables.on_reload
def clear_plans() -> None:
    """Forget every cached moe_forward plan (``configs.reload()`` calls this)."""
    _PLANS.clear()


@dataclass
class _Region:
    name: str
    dtype: torch.dtype
    shape: tuple
    strides: tuple
    offset: int  # bytes into the scratch buffer


@dataclass
class _MoEPlan:
    t: int
    h: int
    i: int
    e: int
    k: int
    nbytes: int  # scratch bytes (a multiple of the element size)
    regions: list[_Region]
    route: str  # route_kind's answer
    route_slots: list[kept_launch.Planned]
    block_m: int
    validate: str | None  # the message of the ids check, None: no check
    body: int  # 0: y only routed (H = 0), 1: y zero (I = 0), 2: the GEMMs and the combine
    x_copy: bool  # x's rows are not unit-stride: copied per call
    flat_copy: bool  # topk_ids / topk_weights not contiguous: flattened copies per call
    w_copy: tuple[bool, bool]  # w1 / w2 not in the (E * N_w, K) layout: copied per call (``_w2d``)
    gather: kept_launch.Planned | None  # the copy of x's rows in expert order (gather "copy")
    g1: _Grouped | None
    g2: _Grouped | None
    combine: kept_launch.Planned | None
    ok_at: int = 0  # byte offset of the ok flag
    kept: bool = False  # every launch kept: later calls launch directly


def _moe_key(x, w1, w2, tw, ids, validate, gather, configs) -> tuple:
    return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16, w1.shape, w1.stride(), w1.dtype, w1.device,
            w1.data_ptr() % 16, w2.shape, w2.stride(), w2.dtype, w2.device, w2.data_ptr() % 16, tw.shape, tw.stride(),
            tw.dtype, tw.device, tw.data_ptr() % 16, ids.shape, ids.stride(), ids.dtype, ids.device,
            ids.data_ptr() % 16, validate, gather, configs)


def _layout(t: int, h: int, i: int, e: int, k: int, dtype: torch.dtype, route: str, copy: bool,
            body: bool) -> tuple[list[_Region], int]:
    """The scratch regions of a call and the buffer's size: the routing tables, x's rows in expert order
    (gather "copy"), the intermediate act (S, I) in rows padded to 16 bytes and the routed outputs o (S, H)."""
    s, elt = t * k, torch.empty((), dtype=dtype).element_size()
    nb = sort_blocks(s)[1] if route == "count" else 0
    want = [("order", torch.int32, (s,), (1,)), ("inv", torch.int32, (s,), (1,)), ("token", torch.int32, (s,), (1,)),
            ("offsets", torch.int32, (e,), (1,)), ("tile_offsets", torch.int32, (e + 1,), (1,)),
            ("scale", torch.float32, (s,), (1,)), ("ok", torch.bool, (1,), (1,)),
            ("hist", torch.int32, ((e + 1) * nb,), (1,)), ("local", torch.int32, ((e + 1) * nb,), (1,))]
    if body:
        i_pad = padded_k(i)
        want += ([("xg", dtype, (s, h), (h, 1))] if copy else []) + [("act", dtype, (s, i), (i_pad, 1)),
                                                                     ("o", dtype, (s, h), (h, 1))]
    regions, at = [], 0
    for name, dt, shape, strides in want:
        regions.append(_Region(name, dt, shape, strides, at))
        size = (shape[0] * strides[0] if shape[0] else 0) * torch.empty((), dtype=dt).element_size()
        at += -(-size // _ALIGN) * _ALIGN
    return regions, max(at, elt)


def _views(p: _MoEPlan, buf: torch.Tensor) -> dict:
    """The scratch regions of ``buf`` (x's dtype) as tensors (a JIT launch specializes on them)."""
    raw = buf.view(torch.uint8)
    out = {}
    for r in p.regions:
        size = r.shape[0] * r.strides[0] if r.shape[0] else 0
        esz = torch.empty((), dtype=r.dtype).element_size()
        flat = raw[r.offset:r.offset + max(size, 1) * esz].view(r.dtype)
        out[r.name] = flat.as_strided(r.shape, r.strides)
    return out


def _addrs(p: _MoEPlan, base: int) -> dict:
    return {r.name: base + r.offset for r in p.regions}


def _plan_moe(x, w1, w2, tw, ids, validate, gather, configs, dims) -> _MoEPlan:
    """Every decision of a moe_forward call with inputs laid out like these (after ``_check_args``)."""
    t, h, i, e, k = dims
    s = t * k
    target = target_for(x.device)
    elt = x.element_size()
    cfg1, cfg2 = configs or (moe_config(target, s, e, 1, elt, dtype=x.dtype, n=i, k=h, max_group=t),
                             moe_config(target, s, e, 2, elt, dtype=x.dtype, n=h, k=i, max_group=t))
    cfg2 = replace(cfg2, block_m=cfg1.block_m)  # one tile schedule for both GEMMs
    route = route_kind(s, e)
    if gather == "auto":
        gather = "copy" if target.has_tma and (h * elt) % 16 == 0 else "fused"
    body = 0 if h == 0 else 1 if i == 0 else 2
    regions, nbytes = _layout(t, h, i, e, k, x.dtype, route, gather == "copy", body == 2)
    slots = [] if route == "torch" else [kept_launch.Planned(*spec) for spec in
                                         route_launches(route, s, e, k, cfg1.block_m, True)]
    p = _MoEPlan(t, h, i, e, k, nbytes, regions, route, slots, cfg1.block_m,
                 f"moe: topk_ids must be in [0, E={e})" if validate else None, body, x.stride(1) != 1,
                 not (ids.is_contiguous() and tw.is_contiguous()),
                 (_w2d(w1).data_ptr() != w1.data_ptr(), _w2d(w2).data_ptr() != w2.data_ptr()), None, None, None, None,
                 next(r.offset for r in regions if r.name == "ok"))
    if body != 2:
        return p
    v = _views(p, torch.empty(nbytes // elt, dtype=x.dtype, device="meta"))  # layouts only
    xk = x if x.stride(1) == 1 else x.contiguous()
    if gather == "copy":
        block_h = min(1024, triton.next_power_of_2(h))
        p.gather = kept_launch.Planned(_moe_gather_kernel, (s, triton.cdiv(h, block_h), 1), dict(BLOCK_H=block_h),
                                       {})
    p.g1 = _grouped_spec(1, v["xg"] if gather == "copy" else xk, gather != "copy", _w2d(w1), v["act"], i, e, cfg1,
                         target, s)
    p.g2 = _grouped_spec(2, v["act"], False, _w2d(w2), v["o"], h, e, cfg2, target, s)
    block_h = min(1024, triton.next_power_of_2(h))
    p.combine = kept_launch.Planned(_moe_combine_kernel, (t, triton.cdiv(h, block_h), 1),
                                    dict(TOP_K=k, BLOCK_H=block_h), {})
    return p


def launch_moe_forward(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor, validate: bool, gather: str,
                       configs: tuple[MoEConfig, MoEConfig] | None) -> torch.Tensor:
    """``moe_forward``'s launcher on 2-D x: checks, routes, two grouped launches and the combine (no autograd).
    Plans once per signature (``_PLANS``); a hit allocates one scratch buffer and y and launches the kept kernels
    directly."""
    try:
        key = _moe_key(x, w1, w2, topk_weights, topk_ids, validate, gather, configs)
        p = _PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors (or unhashable configs): _check_args says what is wrong
        key, p = None, None
    if p is None:
        dims = _check_args(x, w1, w2, topk_weights, topk_ids)
        if dims[0] == 0:
            return torch.empty((0, dims[1]), dtype=x.dtype, device=x.device)
        p = _plan_moe(x, w1, w2, topk_weights, topk_ids, validate, gather, configs, dims)
        if key is not None:
            if len(_PLANS) >= PLANS_SIZE:
                _PLANS.pop(next(iter(_PLANS)))  # the oldest signature goes (dicts keep insertion order)
            _PLANS[key] = p
    return _run_plan(p, x, w1, w2, topk_weights, topk_ids)


def _run_grouped(mode: int, g: _Grouped, args: list, direct: bool) -> None:
    _LAST["grouped"] = kept_launch.fire(g.slot, args, direct)


def _run_plan(p: _MoEPlan, x, w1, w2, tw, ids) -> torch.Tensor:
    """Run a plan: one scratch buffer (x's dtype, so a poisoned torch.empty reaches every region) and y."""
    dev = x.device
    buf = torch.empty(p.nbytes // x.element_size(), dtype=x.dtype, device=dev)
    y = torch.empty((p.t, p.h), dtype=x.dtype, device=dev)
    direct = p.kept and kept_launch.usable(p.route_slots[0].kept if p.route_slots else p.combine.kept)
    if direct:
        v, desc = _addrs(p, buf.data_ptr()), _host_desc
    else:
        v, desc = _views(p, buf), _jit_desc
    s, e = p.t * p.k, p.e
    if p.flat_copy:
        ids, tw = ids.reshape(-1).contiguous(), tw.reshape(-1).contiguous()
    if p.route != "torch":
        try:
            for slot, args in zip(p.route_slots, route_args(
                    p.route, ids, tw, v["order"], v["inv"], v["token"], v["offsets"], v["tile_offsets"], v["scale"],
                    v["ok"], v["hist"], v["local"], s, e), strict=True):
                kept_launch.fire(slot, args, direct)
        except (triton.CompilationError, OutOfResources) as err:  # cannot build it: torch ops from now on
            _routing_broken(err)
            p.route, p.route_slots, p.kept = "torch", [], False
    if p.route == "torch":
        r = _sort_routes_torch(ids.view(p.t, p.k), e, p.block_m, tw.view(p.t, p.k))
        v = dict(v, order=r.order, inv=r.inv, token=r.token, offsets=r.offsets, tile_offsets=r.tile_offsets,
                 scale=r.scale)
    if p.validate is not None:  # no host sync: one check on the flag the routing kernel set (or on min/max)
        if p.route == "torch":
            lo, hi = torch.aminmax(ids)
            _device_check((lo >= 0) & (hi < e), p.validate)
        else:
            _device_check(buf.view(torch.uint8)[p.ok_at], p.validate)
    if p.body != 2:
        return y if p.body == 0 else y.zero_()
    if p.x_copy:
        x = x.contiguous()
    w1k = _w2d(w1) if p.w_copy[0] or not direct else w1
    w2k = _w2d(w2) if p.w_copy[1] or not direct else w2
    _ensure_allocator(p.g1)
    _ensure_allocator(p.g2)
    if p.gather is not None:
        kept_launch.fire(p.gather, [x, v["token"], v["xg"], p.h, x.stride(0), p.h], direct)
        _run_grouped(1, p.g1, _grouped_args(p.g1, v["xg"], None, w1k, v["act"], None, v["offsets"],
                                            v["tile_offsets"], desc), direct)
    else:
        _run_grouped(1, p.g1, _grouped_args(p.g1, x, v["token"], w1k, v["act"], None, v["offsets"],
                                            v["tile_offsets"], desc), direct)
    _run_grouped(2, p.g2, _grouped_args(p.g2, v["act"], None, w2k, v["o"], v["scale"], v["offsets"],
                                        v["tile_offsets"], desc), direct)
    kept_launch.fire(p.combine, [v["o"], v["inv"], y, p.h, p.h, y.stride(0)], direct)
    if not direct:
        p.kept = all(q.kept is not None for q in [*p.route_slots, p.gather or p.combine, p.g1.slot, p.g2.slot,
                                                   p.combine])
    return y


from gemmlab.ops import custom  # noqa: E402  (registers torch.ops.gemmlab.*; imports this module)
from gemmlab.ops.gemm import check_out  # noqa: E402
