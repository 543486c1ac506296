"""Kept kernels: launch a compiled Triton kernel directly, without the JIT's per-call dispatch.

``kernel[grid](*args, **constexprs)`` binds every argument, specializes it (integer value 1 and divisibility by 16,
pointer alignment, descriptor block types), hashes that into a cache key and looks the compiled kernel up, on
every call. When the caller's own key already fixes everything the JIT specializes on, the compiled kernel of
the first launch is kept and later launches call its launcher (``CompiledKernel.run``) directly: the header
(grid, stream, function, metadata, hooks) and then every parameter in order, constexprs included (the launcher
skips them), as the JIT itself does. Under the CPU interpreter, with a launch hook set (profilers), on another
device than the kernel was loaded on, or with GEMMLAB_DIRECT_LAUNCH=0, every launch goes through the JIT.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import torch
from triton import knobs
from triton.knobs import HookChain
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

DIRECT = os.environ.get("GEMMLAB_DIRECT_LAUNCH", "1") != "0"


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
