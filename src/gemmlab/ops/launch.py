"""Kept kernels: launch a compiled Triton kernel directly, without the JIT's per-call dispatch.

``kernel[grid](*args, **constexprs)`` binds every argument, specializes it (integer value 1 and divisibility by 16,
pointer alignment, descriptor block types), hashes that into a cache key and looks the compiled kernel up, on
every call. When the caller's own key already fixes everything the JIT specializes on, the compiled kernel of
the first launch is kept and later launches call its launcher (``CompiledKernel.run``) directly: the header
(grid, stream, function, metadata, hooks) and then every parameter in order, constexprs included (the launcher
skips them), as the JIT itself does. Under the CPU interpreter, with a launch hook set (profilers), on another
device than the kernel was loaded on, or with GEMMLAB_DIRECT_LAUNCH=0, every launch goes through the JIT.

Three steps of the one launch path every op takes:

    direct(*tensors), eager(*tensors)   may an eager call skip the ``torch.library`` dispatcher (torch only)
    keep, usable, run, start, fire      kept compiled kernels, launched through ``CompiledKernel.run``
    direct_launcher, desc_args, fire_launcher   Triton's C launcher called directly (below)

A plain eager call with no grad goes straight to the launcher, so it does not pay the dispatcher's and the
autograd wrapper's host cost; everything else goes through the custom ops (``ops.*.custom``, with the rest of the
dispatcher's side in ``ops.dispatch``). A tensor with the negative bit (``torch._neg_view``) is not plain: the
kernels read raw memory, so such inputs go through the dispatcher, whose Negative fallback materializes them first.

**The C launcher.** A kept kernel launched through Triton's C launcher itself, its TMA descriptors encoded once per
buffer. On every call, ``CompiledKernel.run`` (Triton 3.6's ``CudaLauncher``) allocates global and profile scratch
when the kernel needs some, then its ``wrap_handle_tensordesc`` wrapper walks every argument in Python and encodes
each host TMA descriptor (``make_tensordesc_arg``: a ``cuTensorMapEncodeTiled`` call), then calls the C launcher,
which asks the driver about every tensor it is handed as a pointer (``cuPointerGetAttribute``). A ``Direct`` does
what those layers do for one launch whose argument layout is fixed (the signature cache's key fixes it): pointers go
as addresses, and each encoded descriptor is kept per base address. A descriptor is a pure function of its base
address, shape, strides, block, dtype and swizzle, so the one encoded for an address serves every later call on it:
a weight's always, an activation's or an output's whenever the caching allocator hands the block back.

    direct_launcher(kept, n_desc) -> Direct | None   None (keep ``CompiledKernel.run``) where the compiled kernel
                                              is not what this mirrors: another launcher, scratch memory, an odd wrapper
    desc_args(d, i, base, shape, strides)     the launcher's arguments for descriptor ``i`` at address ``base``
    fire_launcher(d, grid, stream, params)    launch: params are the runtime arguments, descriptors expanded
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import torch
from triton import knobs
from triton.backends.nvidia import driver as nvidia
from triton.knobs import HookChain
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

DIRECT = os.environ.get("GEMMLAB_DIRECT_LAUNCH", "1") != "0"
MAPS_PER_OPERAND = 16  # encoded descriptors kept per descriptor argument (then the dict starts over)

_PLAIN = (torch.Tensor, torch.nn.Parameter)
compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch = torch._C._are_functorch_transforms_active


def direct(*tensors) -> bool:
    """True when a call may skip the dispatcher: eager (not traced), plain tensors, no dispatch mode or functorch
    transform active, and no autograd needed."""
    if compiling() or _dispatch_modes() or _functorch():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or (grad and t.requires_grad) or t.is_neg()):
            return False
    return True


def eager(*tensors) -> bool:
    """True when a call that needs autograd may still skip the dispatcher (``direct`` but for the gradient): an
    autograd.Function with the custom op's formula serves it."""
    if compiling() or _dispatch_modes() or _functorch():
        return False
    return all(t is None or (type(t) in _PLAIN and not t.is_neg()) for t in tensors)


class HostDesc:
    """What Triton's CUDA launcher reads from a TensorDescriptor (base, shape, strides, padding), without the
    dataclass's per-call checks: a kept launch's shapes, strides and alignment were checked when it was planned."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, base, shape, strides):
        self.base, self.shape, self.strides, self.padding = base, shape, strides, "zero"


@dataclass
class Kept:
    """A compiled kernel's launcher and what it needs besides the runtime arguments."""

    run: object  # CompiledKernel.run
    function: object
    packed: object  # packed metadata
    tail: tuple  # the constexpr values in parameter order
    device: int
    compiled: object = None  # the CompiledKernel (what inspectors read)


def constexpr_tail(kernel, runtime_args: int, consts: dict) -> tuple:
    """The constexpr values in the kernel's parameter order; they must all come after the runtime arguments."""
    names = list(inspect.signature(kernel.fn).parameters)[runtime_args:]
    if sorted(names) != sorted(consts):
        raise AssertionError(
            f"kernel parameters after the runtime ones {names} are not its constexprs {sorted(consts)}"
        )
    return tuple(consts[n] for n in names)


def keep(kernel, compiled, runtime_args: int, consts: dict) -> Kept | None:
    """The Kept of a JIT launch's compiled kernel, or None where launches must stay with the JIT."""
    if (
        not DIRECT
        or knobs.runtime.interpret
        or not isinstance(kernel, JITFunction)
        or not hasattr(compiled, "packed_metadata")
    ):
        return None
    tail = constexpr_tail(kernel, runtime_args, consts)
    run = compiled.run  # (loads the module first)
    return Kept(run, compiled.function, compiled.packed_metadata, tail, torch.cuda.current_device(), compiled)


def usable(k: Kept | None) -> bool:
    """A kept kernel, no launch hook to call (Triton 3.6's hooks are HookChains, empty unless a profiler added one;
    tested inline: this runs on every hot call) and the current device the one it was loaded on."""
    if k is None:
        return False
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return (
        (enter is None or (type(enter) is HookChain and not enter.calls))
        and (leave is None or (type(leave) is HookChain and not leave.calls))
        and torch._C._cuda_getDevice() == k.device
    )


def run(k: Kept, grid: tuple[int, int, int], args: list) -> None:
    """Launch a kept kernel on the current stream: ``args`` are the runtime arguments, in order."""
    k.run(
        grid[0],
        grid[1],
        grid[2],
        torch._C._cuda_getCurrentRawStream(k.device),
        k.function,
        k.packed,
        None,
        None,
        None,
        *args,
        *k.tail,
    )


def _arg_key(x) -> object:
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.data_ptr() % 16)
    if isinstance(x, TensorDescriptor):
        return (x.base.dtype, x.base.data_ptr() % 16, tuple(x.shape), tuple(x.strides), tuple(x.block_shape))
    return x  # ints (specialized by value), bools, None


def start(cache, kernel, grid: tuple, args: list, consts: dict, opts: dict):
    """``kernel[grid](*args, **consts, **opts)``: directly when a kernel was kept for this specialization (the
    argument dtypes, 16-byte alignments, integer values, descriptor layouts, constexprs and options), else
    through the JIT, keeping what it compiled. Returns the compiled kernel that ran (None under the interpreter).
    ``cache``: the caller's ``ops.cache.bounded`` cache (its key holds integer values, so a token count is a key:
    only a bounded cache keeps that from growing forever)."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    key = (kernel, grid, tuple(_arg_key(x) for x in args), tuple(consts.items()), tuple(opts.items()))
    kept = cache.get(key)
    if usable(kept):
        run(kept, grid, args)
        return kept.compiled
    compiled = kernel[grid](*args, **consts, **opts)
    k = keep(kernel, compiled, len(args), consts)
    if k is not None:
        cache[key] = k
    return compiled


class Addr:
    """A device address where Triton's launcher wants an object with ``data_ptr()`` (a descriptor's base, a
    region of a scratch buffer): a kept launch takes addresses, with no tensor view made per call."""

    __slots__ = ("p",)

    def __init__(self, p: int):
        self.p = p

    def data_ptr(self) -> int:
        return self.p


@dataclass
class Planned:
    """One launch of a cached plan: kernel, grid, constexprs and options fixed by the plan's signature; ``kept``
    once its first (JIT) launch compiled. The plan's key must fix everything the JIT specializes on."""

    kernel: object
    grid: tuple[int, int, int]
    consts: dict
    opts: dict
    kept: Kept | None = None


def fire(p: Planned, args: list, direct: bool) -> object:
    """Launch ``p``: directly (``args`` may hold device addresses and ``HostDesc``s) when ``direct``, else through
    the JIT (tensors and TensorDescriptors), keeping what it compiled. Returns the compiled kernel (None under the
    interpreter)."""
    if direct:
        run(p.kept, p.grid, args)
        return p.kept.compiled
    compiled = p.kernel[p.grid](*args, **p.consts, **p.opts)
    p.kept = keep(p.kernel, compiled, len(args), p.consts)
    return compiled


# ----------------------------------------------------------------- Triton's C launcher, called directly
@dataclass
class Direct:
    """What ``CompiledKernel.run`` hands its C launcher besides the runtime arguments, and the encoded
    descriptors kept so far (per descriptor argument, in parameter order: base address -> arguments)."""

    launch: object  # the C launcher (the compiled module's ``launch``)
    function: int
    packed: object  # packed metadata
    cooperative: bool
    pdl: bool
    tail: tuple  # the constexpr values in parameter order (the launcher parses and skips them)
    metas: tuple  # per descriptor argument: Triton's tensordesc metadata (swizzle, element type, block), or None
    maps: tuple  # per descriptor argument: {base address: its expanded launcher arguments}


def direct_launcher(k: Kept | None, n_desc: int) -> Direct | None:
    """The ``Direct`` of a kept kernel with ``n_desc`` host TMA descriptor arguments, or None where its launcher
    is not Triton 3.6's CudaLauncher as this module mirrors it."""
    run = getattr(k, "run", None)
    if (
        type(run) is not nvidia.CudaLauncher
        or run.global_scratch_size
        or run.profile_scratch_size
        or getattr(run, "num_ctas", 1) != 1
    ):
        return None
    metas = getattr(k.compiled.metadata, "tensordesc_meta", None) or [None] * n_desc
    raw = run.launch
    if n_desc:  # wrap_handle_tensordesc's inner(): the C launcher is its closure's ``launcher``
        try:
            cells = inspect.getclosurevars(raw).nonlocals
        except TypeError:
            return None
        raw = cells.get("launcher")
        if raw is None or len(metas) != n_desc or len(cells.get("tensordesc_indices", ())) != n_desc:
            return None
    return Direct(
        raw,
        k.function,
        k.packed,
        bool(run.launch_cooperative_grid),
        bool(run.launch_pdl),
        k.tail,
        tuple(metas),
        tuple({} for _ in range(n_desc)),
    )


def desc_args(d: Direct, i: int, base: int, shape, strides) -> list:
    """The C launcher's arguments for descriptor argument ``i`` over the memory at ``base`` (Triton's own
    ``make_tensordesc_arg``, once per address)."""
    maps = d.maps[i]
    got = maps.get(base)
    if got is None:
        if len(maps) >= MAPS_PER_OPERAND:
            maps.clear()
        got = maps[base] = nvidia.make_tensordesc_arg(HostDesc(Addr(base), shape, strides), d.metas[i])
    return got


def fire_launcher(d: Direct, grid: tuple[int, int, int], stream: int, params: list) -> None:
    """Launch on ``stream``: the header ``CudaLauncher.__call__`` passes (no scratch, no launch metadata, no
    hooks: callers launch directly only while no hook is set), then the parameters and the constexprs."""
    d.launch(
        grid[0],
        grid[1],
        grid[2],
        stream,
        d.function,
        d.cooperative,
        d.pdl,
        None,
        None,
        d.packed,
        None,
        None,
        None,
        *params,
        *d.tail,
    )
