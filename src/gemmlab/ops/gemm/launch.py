"""The dense GEMM's launcher: runs a ``ops.gemm.planner.Plan`` exactly as planned, reading it only.

    launch_gemm(a, b, out)       gemm's 2-D launcher: checks and plans once per signature (``CACHE``), then
                                 allocates C and launches the kept kernel
    execute(p, a, b, c)          run a plan on kernel-view operands (c row-major, allocated)
    last_kernel(path)            the compiled kernel of the latest launch of a path (what the tuner inspects)
    launch_mode(a, b, out)       how the next call with this signature launches (what benchmarks report)

A launch (``Launch``) is a plan's ``LaunchSpec`` with its kernel and, once compiled, the kept compiled kernel
(``ops.launch``): later calls of the signature skip the JIT's binding, specialization and cache lookup, and go
to Triton's C launcher itself with device addresses and TMA descriptors encoded once per buffer (``ops.launch``).
Operands the plan stages are copied into fresh 16-byte-aligned buffers per call; the split-K and stream-K
workspace and arrival counters are kept per (device, stream), fresh inside a CUDA-graph capture.

A hot call (a signature seen before, its kernel kept) does: the signature key and one dict lookup, the check
of out's overlap with a and b (from byte extents kept with the key), C's allocation, the stream, and the launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.kernels.gemm import gemm_portable_kernel, gemm_tma_persistent_kernel, gemm_tma_splitk_kernel
from gemmlab.kernels.gemv import gemv_kernel
from gemmlab.ops import cache
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.gemm.checks import operands
from gemmlab.ops.gemm.planner import Plan, choose
from gemmlab.ops.gemm.spec import LaunchSpec
from gemmlab.ops.launch import HostDesc, Kept
from gemmlab.ops.layout import extent

KERNELS = {
    "tma_persistent": gemm_tma_persistent_kernel,
    "tma_splitk": gemm_tma_splitk_kernel,
    "gemv": gemv_kernel,
    "portable": gemm_portable_kernel,
}
# path -> the CompiledKernel of its latest launch (what the tuner inspects). Bounded by construction, one entry per
# kernel path (KERNELS' keys), and a plain dict: the hot path's write stays one store.
_LAST: dict[str, object] = {}


def last_kernel(path: str):
    """The compiled kernel the latest launch of ``path`` ran (None under the interpreter or before any)."""
    k = _LAST.get(path)
    return k if hasattr(k, "asm") else None


@dataclass
class Launch:
    """One plan's launch, reused by every call with its signature: the plan's ``LaunchSpec`` read into the
    form a launch takes, the kernel, and the compiled kernel's launcher once kept."""

    path: str
    kernel: object  # the @triton.jit function
    grid: tuple[int, int, int]
    descs: tuple  # per operand (a, b, c): (shape, strides, block) of its TMA descriptor, or None (a pointer)
    ints: tuple
    consts: dict  # constexpr name -> value
    opts: dict  # num_warps, num_stages, maxnreg
    scratch: tuple | None = None  # split-K, stream-K: (workspace fp32 elements, counters); None: no such arguments
    staged: tuple = ()  # LaunchSpec.staged
    keep: bool = False  # keep the compiled kernel after the first launch and launch it directly from then on
    kept: Kept | None = None  # the compiled kernel's launcher, once kept (gemmlab.ops.launch)
    direct: kept_launch.Direct | None = None  # Triton's C launcher itself, once kept (gemmlab.ops.launch)


def prepare(p: Plan, keep: bool = False) -> Launch:
    """The ``Launch`` of a (non-empty) plan: its ``LaunchSpec`` as it is."""
    s: LaunchSpec = p.launch
    descs = tuple(None if d is None else (list(d[0]), list(d[1]), list(d[2])) for d in s.descs)
    return Launch(
        p.path,
        KERNELS[p.path],
        s.grid,
        descs,
        s.ints,
        dict(s.constexprs),
        dict(s.options),
        s.scratch,
        s.staged,
        keep=keep,
    )


# ------------------------------------------------------------------------------------------- staging


def _scratch(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A staging buffer: a fresh tensor from the caching allocator, per call (so safe under CUDA-graph capture
    and across streams); its contents are overwritten or never read."""
    return torch.empty(shape, dtype=dtype, device=device)


def stage(t: torch.Tensor, inner: int, shape: tuple[int, int]) -> torch.Tensor:
    """A copy of the 2-D operand ``t`` (dim ``inner`` unit-stride) in a buffer of ``shape`` (rows, row length
    padded to 16 bytes): same values and layout, a 16-byte-aligned base and outer stride, so TMA can describe
    it. The pad columns are left as they are: the descriptor's shape is the logical one, TMA zero-fills past it."""
    view = _scratch(shape, t.dtype, t.device)[:, : t.shape[inner]]
    view = view if inner == 1 else view.t()
    view.copy_(t)
    return view


def launch_staged(L: Launch, a, b, c) -> None:
    """Launch ``L`` for a plan that stages: copy the operands it stages into aligned buffers, launch on them,
    and for a staged C copy the kernel's aligned scratch C into ``c``."""
    cs = None
    for name, inner, shape in L.staged:
        if name == "a":
            a = stage(a, inner, shape)
        elif name == "b":
            b = stage(b, inner, shape)
        else:
            cs = _scratch(shape, c.dtype, c.device)[:, : c.shape[1]]
    launch(L, a, b, c if cs is None else cs)
    if cs is not None:
        c.copy_(cs)


# ------------------------------------------------------------------------------------------ arguments


# (device, stream) -> (workspace, counters, their addresses, their sizes). Bounded like every cache: a stream's
# buffers dropped while a launch on it is in flight go back to the caching allocator, which hands them out again
# only in that stream's order, and a stream seen again gets fresh (zeroed) ones.
SCRATCH = cache.bounded("gemm.scratch", clear_on_reload=False)


def _splitk_scratch(scratch: tuple, c: torch.Tensor, where: tuple[int, int] | None = None) -> tuple:
    """The split-K / stream-K arguments (``scratch`` = (workspace fp32 elements, output tiles), the first not 0):
    (workspace, arrival counters, their addresses, their sizes). Both are kept per (device, stream) and grown as
    needed: launches on one stream run in order, and each launch leaves the counters zero (the last split to
    arrive resets its tile), so they are zeroed only when allocated. During a CUDA-graph capture both are fresh
    (the counters' memset a node of the graph): a buffer allocated inside a capture belongs to the graph's pool
    and must not serve eager calls. ``where``: (c's device index, its current stream), when the caller has it."""
    ws_elems, tiles = scratch
    if c.is_cuda:
        if torch._C._cuda_isCurrentStreamCapturing():
            ws = torch.empty(ws_elems, dtype=torch.float32, device=c.device)
            cnt = torch.zeros(tiles, dtype=torch.int32, device=c.device)
            return ws, cnt, ws.data_ptr(), cnt.data_ptr(), ws_elems, tiles
        if where is None:
            index = c.get_device()
            where = (index, torch._C._cuda_getCurrentRawStream(index))
    else:
        where = (-1, 0)
    bufs = SCRATCH.get(where)
    if bufs is None or bufs[4] < ws_elems or bufs[5] < tiles:
        ws_elems, tiles = max(ws_elems, bufs[4] if bufs else 0), max(tiles, bufs[5] if bufs else 0, 1024)
        ws = torch.empty(ws_elems, dtype=torch.float32, device=c.device)
        cnt = torch.zeros(tiles, dtype=torch.int32, device=c.device)
        bufs = SCRATCH[where] = (ws, cnt, ws.data_ptr(), cnt.data_ptr(), ws_elems, tiles)
    return bufs


splitk_scratch = _splitk_scratch  # (the one per-stream workspace and counters, shared with ops.fp8's decode path)


def _scratch_args(scratch: tuple, c: torch.Tensor) -> list:
    """The workspace and counters as tensors (JIT and kept launches); SPLIT_K = 1: unused (c twice)."""
    return [c, c] if not scratch[0] else list(_splitk_scratch(scratch, c)[:2])


def counters() -> list[torch.Tensor]:
    """The split-K arrival counters kept so far (each launch leaves them zero)."""
    return [bufs[1] for bufs in SCRATCH.values()]


def direct_args(L: Launch, a, b, c) -> list:
    """The runtime arguments of a kept launch, as the JIT binds them (descriptors as ``HostDesc``)."""
    da, db, dc = L.descs
    args = [
        a if da is None else HostDesc(a, da[0], da[1]),
        b if db is None else HostDesc(b, db[0], db[1]),
        c if dc is None else HostDesc(c, dc[0], dc[1]),
    ]
    if L.scratch is not None:
        args += _scratch_args(L.scratch, c)
    args += L.ints
    return args


def jit_args(L: Launch, a, b, c) -> list:
    """The runtime arguments of a JIT launch (the constexprs go as keywords)."""
    args = [t if spec is None else TensorDescriptor(t, *spec) for t, spec in zip((a, b, c), L.descs, strict=True)]
    if L.scratch is not None:
        args += _scratch_args(L.scratch, c)
    args += L.ints
    return args


def launch(L: Launch, a, b, c) -> None:
    """Launch ``L`` on these operands: the first time through the JIT (which compiles), then, when ``L.keep``
    and not under the interpreter, the compiled kernel directly (``gemmlab.ops.launch``: no argument binding,
    specialization or cache lookup; the signature key fixed everything the JIT specializes on: shapes,
    strides, dtypes, 16-byte alignment)."""
    if kept_launch.usable(L.kept):
        if L.direct is not None:
            fire_direct(L, a, b, c)
        else:
            kept_launch.run(L.kept, L.grid, direct_args(L, a, b, c))
            _LAST[L.path] = L.kept.compiled
        return
    args = jit_args(L, a, b, c)
    compiled = L.kernel[L.grid](*args, **L.consts, **L.opts)
    _LAST[L.path] = compiled
    if L.keep:
        L.kept = kept_launch.keep(L.kernel, compiled, len(args), L.consts)
        L.direct = kept_launch.direct_launcher(L.kept, sum(d is not None for d in L.descs))


def fire_direct(L: Launch, a, b, c, ptrs: tuple[int, int, int] | None = None) -> None:
    """A kept launch through Triton's C launcher (``ops.launch``): addresses for pointers (``ptrs``: those of a,
    b and c when the caller has them), each descriptor encoded once per base address, the split-K scratch kept
    per stream."""
    d, stream, params, i = L.direct, torch._C._cuda_getCurrentRawStream(L.kept.device), [], 0
    ptrs = ptrs or (a.data_ptr(), b.data_ptr(), c.data_ptr())
    for ptr, spec in zip(ptrs, L.descs, strict=True):
        if spec is None:
            params.append(ptr)
        else:
            params += kept_launch.desc_args(d, i, ptr, spec[0], spec[1])
            i += 1
    if L.scratch is not None:
        params += _splitk_scratch(L.scratch, c, (L.kept.device, stream))[2:4] if L.scratch[0] else (ptrs[2], ptrs[2])
    params += L.ints
    kept_launch.fire_launcher(d, L.grid, stream, params)
    _LAST[L.path] = L.kept.compiled


def execute(p: Plan, a, b, c, L: Launch | None = None) -> None:
    """Run plan ``p`` on kernel-view operands (``c`` row-major, allocated): zeros for an empty plan with K = 0,
    else its launch (``L``, or one prepared now), staging first where the plan says so."""
    if p.launch is None:
        if c.numel():
            c.zero_()  # K = 0: a sum over nothing
        return
    L = L or prepare(p)
    if L.staged:
        launch_staged(L, a, b, c)
    else:
        launch(L, a, b, c)


# ------------------------------------------------------------------------------- the signature cache


# Per signature (shapes, strides, dtypes, devices, 16-byte alignment of each base, out's layout): the plan and its
# prepared launch (with its compiled kernel once launched). Filled on first use of a signature, after every check;
# a hit skips the checks the key already proves. Plans come from the config tables as loaded when the signature
# was first seen; ``configs.reload()`` (tests, ``gemmlab tune``) clears the cache. Least recently used out first,
# at the bound of ``ops.cache`` (GEMMLAB_CACHE_SIZE): training's per-expert weight gradients vary K every step.
CACHE = cache.bounded("gemm.plans")


@dataclass(eq=False, slots=True)
class Entry:
    """A signature's plan and launch, and what a hit needs to allocate C and check out's overlap."""

    plan: Plan
    launch: Launch
    shape: tuple[int, int]  # C (M, N) as the caller sees it (a fresh C is row-major)
    dtype: torch.dtype
    device: torch.device
    swap: bool  # column-major out: the kernel computes C^T = B^T A^T
    extents: tuple[int, int, int] | None  # bytes spanned by a, b and out (out given), for the overlap check


def clear_cache() -> None:
    """Forget every cached plan and launch (``configs.reload()`` does this too, through ``ops.cache``)."""
    CACHE.clear()


def signature(a, b, out, ptrs: tuple[int, int, int] | None = None) -> tuple:
    """The cache key of a call (``ptrs``: the addresses of a, b and out (0 without), when the caller has them)."""
    ap, bp, op = ptrs or (a.data_ptr(), b.data_ptr(), 0 if out is None else out.data_ptr())
    if out is None:
        return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device, ap % 16, bp % 16)
    return (
        a.shape,
        a.stride(),
        b.shape,
        b.stride(),
        a.dtype,
        b.dtype,
        a.device,
        b.device,
        ap % 16,
        bp % 16,
        out.shape,
        out.stride(),
        out.dtype,
        out.device,
        op % 16,
    )


def _admit(a, b, out, key) -> Entry | torch.Tensor:
    """A signature's first call: every check, the plan, its launch; cached when ``key`` (None: not hashable, and
    ``operands`` raises). An empty plan runs here and returns C."""
    ka, kb, kc, swap = operands(a, b, out)
    p = choose(ka, kb, kc, swap)
    if p.launch is None:
        c = kc if kc is not None else torch.empty((p.m, p.n), dtype=p.dtype, device=a.device)
        execute(p, ka, kb, c)
        return c if out is None else out
    extents = (extent(a), extent(b), extent(out)) if out is not None else None
    entry = Entry(p, prepare(p, keep=key is not None), (a.shape[0], b.shape[1]), p.dtype, a.device, swap, extents)
    if key is not None:
        CACHE[key] = entry  # (the least recently used signature goes beyond the bound)
    return entry


def launch_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The 2-D launcher behind ``gemm``: a (M, K) @ b (K, N) -> out (M, N) (allocated when None). Checks, plans
    and prepares once per signature (``_admit``); after that a call checks only what the signature cannot prove
    (out's overlap with a and b, from byte extents kept with the signature), allocates C and launches the kept
    kernel."""
    try:
        ptrs = (a.data_ptr(), b.data_ptr(), 0 if out is None else out.data_ptr())
        key = signature(a, b, out, ptrs)
    except (AttributeError, TypeError):  # not tensors: operands() says what is wrong
        key = None
    e = CACHE.get(key) if key is not None else None
    if e is None:
        e = _admit(a, b, out, key)
    if type(e) is not Entry:  # an empty plan ran
        return e
    ap, bp, op = ptrs
    if out is None:
        out = torch.empty(e.shape, dtype=e.dtype, device=e.device)
        op = out.data_ptr()
    else:
        ea, eb, eo = e.extents
        if (op < ap + ea and ap < op + eo) or (op < bp + eb and bp < op + eo):
            operands(a, b, out)  # raises the overlap error
    L = e.launch
    a, b, c, ptrs = (b.t(), a.t(), out.t(), (bp, ap, op)) if e.swap else (a, b, out, (ap, bp, op))
    if L.direct is not None and not L.staged and kept_launch.usable(L.kept):
        fire_direct(L, a, b, c, ptrs)  # the hot path: straight to Triton's C launcher
    else:
        execute(e.plan, a, b, c, L)
    return out


def launch_mode(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> str:
    """How a ``launch_gemm(a, b, out)`` call with operands laid out like these launches now: "uncached" (the
    first call of the signature plans), "empty" (nothing to launch), "jit" (through Triton's JIT: under the
    interpreter, before the first launch compiled, or kept kernels switched off), "kept" (CompiledKernel.run), or
    "direct" (Triton's C launcher, descriptors kept per buffer); "staged" is added where operands are copied first."""
    e = CACHE.get(signature(a, b, out))
    if e is None:
        return "uncached"
    L = e.launch
    mode = "jit" if L.kept is None else "direct" if L.direct is not None else "kept"
    return mode + (" staged" if L.staged else "")
