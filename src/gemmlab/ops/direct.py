"""A kept kernel launched through Triton's C launcher itself, its TMA descriptors encoded once per buffer.

On every call, ``CompiledKernel.run`` (Triton 3.6's ``CudaLauncher``) allocates global and profile scratch when
the kernel needs some, then its ``wrap_handle_tensordesc`` wrapper walks every argument in Python and encodes each
host TMA descriptor (``make_tensordesc_arg``: a ``cuTensorMapEncodeTiled`` call), then calls the C launcher, which
asks the driver about every tensor it is handed as a pointer (``cuPointerGetAttribute``). A ``Direct`` does what
those layers do for one launch whose argument layout is fixed (the signature cache's key fixes it): pointers go
as addresses, and each encoded descriptor is kept per base address. A descriptor is a pure function of its base
address, shape, strides, block, dtype and swizzle, so the one encoded for an address serves every later call on
it: a weight's always, an activation's or an output's whenever the caching allocator hands the block back.

    direct(kept, n_desc) -> Direct | None     None (keep ``CompiledKernel.run``) where the compiled kernel is not
                                              what this mirrors: another launcher, scratch memory, an odd wrapper
    desc_args(d, i, base, shape, strides)     the launcher's arguments for descriptor ``i`` at address ``base``
    fire(d, grid, stream, params)             launch: params are the runtime arguments, descriptors expanded
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from triton.backends.nvidia import driver as nvidia

from gemmlab.ops.launch import Addr, HostDesc, Kept

MAPS_PER_OPERAND = 16  # encoded descriptors kept per descriptor argument (then the dict starts over)


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


def direct(k: Kept | None, n_desc: int) -> Direct | None:
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


def fire(d: Direct, grid: tuple[int, int, int], stream: int, params: list) -> None:
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
