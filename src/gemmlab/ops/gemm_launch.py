"""The dense GEMM's launcher: runs a ``gemm_plan.Plan`` exactly as planned, reading it only.

    launch_gemm(a, b, out)       gemm's 2-D launcher: checks and plans once per signature (``CACHE``), then
                                 allocates C and launches the kept kernel
    execute(p, a, b, c)          run a plan on kernel-view operands (c row-major, allocated)
    last_kernel(path)            the compiled kernel of the latest launch of a path (what the tuner inspects)

A launch (``Launch``) is a plan's ``LaunchSpec`` with its kernel and, once compiled, the kept compiled kernel
(``ops.launch``): later calls of the signature skip the JIT's binding, specialization and cache lookup.
Operands the plan stages are copied into fresh 16-byte-aligned buffers per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.kernels.gemm import gemm_portable_kernel, gemm_tma_persistent_kernel, gemm_tma_splitk_kernel
from gemmlab.ops import configs
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.gemm_checks import operands
from gemmlab.ops.gemm_plan import LaunchSpec, Plan, choose
from gemmlab.ops.launch import HostDesc, Kept
from gemmlab.ops.layout import extent

KERNELS = {
    "tma_persistent": gemm_tma_persistent_kernel,
    "tma_splitk": gemm_tma_splitk_kernel,
    "portable": gemm_portable_kernel,
}
_LAST: dict[str, object] = {}  # path -> the CompiledKernel of its latest launch (what the tuner inspects)


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


def prepare(p: Plan, keep: bool = False) -> Launch:
    """The ``Launch`` of a (non-empty) plan: its ``LaunchSpec`` as it is."""
    s: LaunchSpec = p.launch
    descs = tuple(None if d is None else (list(d[0]), list(d[1]), list(d[2])) for d in s.descs)
    return Launch(p.path, KERNELS[p.path], s.grid, descs, s.ints, dict(s.constexprs), dict(s.options), s.scratch,
                  s.staged, keep=keep)


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


_COUNTERS: dict[tuple, torch.Tensor] = {}


def _split_counters(c: torch.Tensor, tiles: int) -> torch.Tensor:
    """Arrival counters for split-K, one per output tile, kept per (device, stream). Each launch leaves
    them zero (the last split to arrive resets its tile), so they are allocated and zeroed only once.
    During CUDA graph capture a fresh zeroed buffer (its memset a node of the graph) is used instead: a buffer
    allocated inside a capture is zeroed only when the graph replays, so it must not serve eager calls."""
    if c.is_cuda:
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(tiles, dtype=torch.int32, device=c.device)
        index = c.get_device()
        key = (index, torch._C._cuda_getCurrentRawStream(index))
    else:
        key = (-1, 0)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < tiles:
        buf = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=c.device)
        _COUNTERS[key] = buf
    return buf


def counters() -> list[torch.Tensor]:
    """The split-K arrival counters kept so far (each launch leaves them zero)."""
    return list(_COUNTERS.values())


def _scratch_args(scratch: tuple, c: torch.Tensor) -> list:
    ws_elems, tiles = scratch
    if not ws_elems:
        return [c, c]  # SPLIT_K = 1: unused
    return [torch.empty(ws_elems, dtype=torch.float32, device=c.device), _split_counters(c, tiles)]


def direct_args(L: Launch, a, b, c) -> list:
    """The runtime arguments of a kept launch, as the JIT binds them (descriptors as ``HostDesc``)."""
    da, db, dc = L.descs
    args = [a if da is None else HostDesc(a, da[0], da[1]), b if db is None else HostDesc(b, db[0], db[1]),
            c if dc is None else HostDesc(c, dc[0], dc[1])]
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
        kept_launch.run(L.kept, L.grid, direct_args(L, a, b, c))
        _LAST[L.path] = L.kept.compiled
        return
    args = jit_args(L, a, b, c)
    compiled = L.kernel[L.grid](*args, **L.consts, **L.opts)
    _LAST[L.path] = compiled
    if L.keep:
        L.kept = kept_launch.keep(L.kernel, compiled, len(args), L.consts)


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


# Per signature (shapes, strides, dtypes, devices, 16-byte alignment of each base, out's layout): the plan, the
# operand swap and the prepared launch (with its compiled kernel once launched). Filled on first use of a
# signature, after every check; a hit skips the checks the key already proves. Plans come from the config tables
# as loaded when the signature was first seen; ``configs.reload()`` (tests, ``gemmlab tune``) clears the cache.
CACHE: dict[tuple, tuple] = {}
CACHE_SIZE = 4096  # signatures kept


@configs.on_reload
def clear_cache() -> None:
    """Forget every cached plan and launch (``configs.reload()`` calls this)."""
    CACHE.clear()


def signature(a, b, out) -> tuple:
    if out is None:
        return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
                a.data_ptr() % 16, b.data_ptr() % 16)
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
            a.data_ptr() % 16, b.data_ptr() % 16, out.shape, out.stride(), out.dtype, out.device, out.data_ptr() % 16)


def launch_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The 2-D launcher behind ``gemm``: a (M, K) @ b (K, N) -> out (M, N) (allocated when None). Checks, plans
    and prepares once per signature; after that a call checks only what the signature cannot prove (out's
    overlap with a and b, from byte extents kept with the signature), allocates C and launches the compiled
    kernel."""
    try:
        key = signature(a, b, out)
        hit = CACHE.get(key)
    except (AttributeError, TypeError):  # not tensors: operands() says what is wrong
        key, hit = None, None
    if hit is None:
        ka, kb, kc, swap = operands(a, b, out)
        p = choose(ka, kb, kc, swap)
        if p.launch is None:
            c = kc if kc is not None else torch.empty((p.m, p.n), dtype=p.dtype, device=a.device)
            execute(p, ka, kb, c)
            return c if out is None else out
        extents = (extent(a), extent(b), extent(out)) if out is not None else None
        hit = (p, swap, prepare(p, keep=key is not None), extents)
        if key is not None:
            if len(CACHE) >= CACHE_SIZE:  # a bound: training's per-expert weight gradients vary K every step
                CACHE.pop(next(iter(CACHE)))  # the oldest signature goes (dicts keep insertion order)
            CACHE[key] = hit
    p, swap, L, extents = hit
    if out is None:
        out = c = torch.empty((p.m, p.n), dtype=p.dtype, device=a.device)
    else:
        ap, bp, op = a.data_ptr(), b.data_ptr(), out.data_ptr()
        ea, eb, eo = extents
        if (op < ap + ea and ap < op + eo) or (op < bp + eb and bp < op + eo):
            operands(a, b, out)  # raises the overlap error
        c = out
    if swap:
        a, b, c = b.t(), a.t(), c.t()
    execute(p, a, b, c, L)
    return out
