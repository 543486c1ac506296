"""FP8 dense GEMM, the details behind ``ops.gemm_fp8``: the launcher (the config and the planner ``plan_fp8`` are
``ops.fp8.plan``).

    C (M, N) = (A * a_scale) @ (B * b_scale)     A (M, K), B (K, N) float8_e4m3fn; scales fp32; fp32 accumulation;
                                                 C in out_dtype (bf16, fp16 or fp32)

The scale granularity is read from the scale shapes (``ops.fp8.checks.scale_mode``): per tensor () and (); per row of
A (M, 1) and column of B (1, N); block (M, cdiv(K, 128)) over 1x128 blocks of A and (cdiv(K, 128), cdiv(N, 128))
over 128x128 blocks of B (DeepSeek-V3's layout). B is (K, N) either way round: row-major, or K-major, i.e. ``w.t()``
of an nn.Linear weight w (N, K), no copy (quantize w (N, K) and pass ``q.t()``, ``scale.t()``: the scales transpose
with it). Two kernels: ``kernels.gemm_fp8.gemm_fp8_tma_kernel`` (persistent, TMA, wgmma on e4m3) and, at small M,
``kernels.gemv_fp8.gemv_fp8_kernel`` (the decode path, below).

Alignment (TMA needs 16-byte aligned bases and row strides; fp8 is one byte per element): A needs K % 16 == 0, a
K-major B K % 16 == 0, a row-major B N % 16 == 0, all bases 16-byte aligned. There is no portable path: anything
else is a ValueError that says which operand and why (quantize into fresh tensors with K padded to 16, or pass B
K-major). C is stored by TMA where its row stride allows, else through masked pointers (any N). Needs sm_90 (or the
CPU under Triton's interpreter). Configs: the "gemm_fp8" section of the config tables (``ops.configs``). Small M: the
decode kernel (``kernels.gemv_fp8``, pointer loads and split-K) where a "decode" rule of the table holds the shape
(``ops.fp8.decode``); its split-K workspace and arrival counters are the dense GEMM's, kept per (device, stream)
(``ops.gemm.launch.splitk_scratch``), fresh inside a CUDA-graph capture.

The launcher (``launch_gemm_fp8``) goes as ``gemm``'s does: a call's signature (each tensor's shape, strides, dtype,
device and 16-byte alignment; out_dtype) looks up its ``Fp8Entry`` in ``PLANS`` (bounded, ``ops.cache``); a miss runs
every check and plans, a hit checks only out's overlap with the inputs. The first launch goes through the JIT, later
ones to the kept compiled kernel (``ops.launch``), through Triton's C launcher with each TMA descriptor encoded once
per buffer (``ops.launch``) where it can.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gemmlab.ops import cache
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.fp8.decode import decode_grid, decode_ints, decode_scratch
from gemmlab.ops.fp8.plan import (
    Fp8Plan,
    constexprs_fp8,
    launch_options_fp8,
    plan_fp8,
    scale_strides,
    tma_grid,
)
from gemmlab.ops.gemm.checks import check_out
from gemmlab.ops.gemm.launch import splitk_scratch
from gemmlab.ops.launch import HostDesc
from gemmlab.ops.layout import descriptor_layout, extent

# ------------------------------------------------------------------------------- the signature cache


@dataclass(eq=False, slots=True)
class Fp8Entry:
    """A signature's plan and its launch, and what a hit needs: C's shape, dtype and device, and the byte extents
    of a, b, the scales and out (out given) for the one check a signature cannot prove, out's overlap."""

    plan: Fp8Plan
    slot: kept_launch.Planned | None  # None: nothing to launch (M, N or K is 0)
    descs: tuple  # per operand (a, b, c): (inner, shape, strides, block) of its TMA descriptor, or None (a pointer)
    ints: tuple  # the integer arguments: M, N, K, strides (``kernels.gemm_fp8`` or ``kernels.gemv_fp8``)
    shape: tuple[int, int]
    dtype: torch.dtype
    device: torch.device
    extents: tuple | None
    direct: kept_launch.Direct | None = None  # Triton's C launcher itself, once the kernel is kept
    scratch: tuple | None = None  # decode path: (workspace fp32 elements, counters), (0, 0) without split-K


# Per signature (each tensor's shape, strides, dtype, device and 16-byte alignment, out_dtype): the plan and its
# launch. Filled on a signature's first call after every check; least recently used out first (``ops.cache``).
PLANS = cache.bounded("gemm_fp8.plans")
_LAST: dict[str, object] = {}  # "gemm_fp8" -> the latest launch's compiled kernel (one key: bounded, a plain store)


def clear_plans() -> None:
    """Forget every cached plan and kept kernel (``configs.reload()`` does this too, through ``ops.cache``)."""
    PLANS.clear()


def last_kernel():
    """The compiled kernel of the latest ``gemm_fp8`` launch (None under the interpreter or before any)."""
    k = _LAST.get("gemm_fp8")
    return k if hasattr(k, "asm") else None


def signature(a, b, a_scale, b_scale, out_dtype, out, ptrs: tuple | None = None) -> tuple:
    """The cache key of a call (``ptrs``: the addresses of a, b, a_scale, b_scale and out (0 without))."""
    ptrs = ptrs or tuple(0 if t is None else t.data_ptr() for t in (a, b, a_scale, b_scale, out))
    key = tuple((t.shape, t.stride(), t.dtype, t.device, ptrs[i] % 16) for i, t in enumerate((a, b, a_scale, b_scale)))
    return key + (out_dtype, None if out is None else (out.shape, out.stride(), out.dtype, out.device, ptrs[4] % 16))


def _specs(p: Fp8Plan, a, b, c_shape: tuple[int, int], c_strides: tuple[int, int], c_size: int) -> tuple:
    """Per operand (a, b, c): (inner, shape, strides, block) of its TMA descriptor, or None: a pointer."""
    cfg = p.config

    def spec(t_shape, t_strides, inner, block, size):
        shape = t_shape if inner == 1 else t_shape[::-1]
        strides = t_strides if inner == 1 else t_strides[::-1]
        return (inner, *descriptor_layout(shape, strides, 1, block, size))

    sa = spec(tuple(a.shape), a.stride(), 1, (cfg.block_m, cfg.block_k), 1)
    sb = (
        spec(tuple(b.shape), b.stride(), 0, (cfg.block_n, cfg.block_k), 1)
        if p.b_kmajor
        else spec(tuple(b.shape), b.stride(), 1, (cfg.block_k, cfg.block_n), 1)
    )
    block_n = cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n
    sc = spec(c_shape, c_strides, 1, (cfg.block_m, block_n), c_size) if p.c_tma else None
    return sa, sb, sc


def _admit(a, b, a_scale, b_scale, out_dtype, out, key) -> Fp8Entry:
    """A signature's first call: every check (alignment and out's included), the plan, its launch; cached when
    ``key`` is (None: not hashable, and the checks raise)."""
    p = plan_fp8(a, b, a_scale, b_scale, out_dtype=out_dtype, out=out)
    if out is not None:
        check_out("gemm_fp8", out, a=a, b=b, a_scale=a_scale, b_scale=b_scale)
    extents = None if out is None else tuple(extent(t) for t in (a, b, a_scale, b_scale, out))
    if p.m == 0 or p.n == 0 or p.k == 0:
        e = Fp8Entry(p, None, (), (), (p.m, p.n), out_dtype, a.device, extents)
    elif p.path == "decode":
        from gemmlab.kernels.gemv_fp8 import gemv_fp8_kernel  # (the first call loads the kernel)

        c_strides = tuple(out.stride()) if out is not None else (p.n, 1)
        cfg = p.config
        slot = kept_launch.Planned(
            gemv_fp8_kernel, decode_grid(cfg, p.m, p.n), constexprs_fp8(p), launch_options_fp8(cfg)
        )
        ints = decode_ints(cfg, a, b, c_strides, scale_strides(a_scale), scale_strides(b_scale))
        e = Fp8Entry(p, slot, (None, None, None), ints, (p.m, p.n), out_dtype, a.device, extents)
        e.scratch = decode_scratch(cfg, p.m, p.n)
    else:
        from gemmlab.kernels.gemm_fp8 import gemm_fp8_tma_kernel  # (the first call loads the kernel)

        size = torch.empty((), dtype=out_dtype).element_size()
        c_strides = out.stride() if out is not None else (p.n, 1)
        cfg = p.config
        slot = kept_launch.Planned(gemm_fp8_tma_kernel, tma_grid(p), constexprs_fp8(p), launch_options_fp8(cfg))
        ints = (p.m, p.n, p.k, c_strides[0], *scale_strides(a_scale), *scale_strides(b_scale))
        e = Fp8Entry(
            p, slot, _specs(p, a, b, (p.m, p.n), c_strides, size), ints, (p.m, p.n), out_dtype, a.device, extents
        )
    if key is not None:
        PLANS[key] = e
    return e


def jit_args(e: Fp8Entry, a, b, a_scale, b_scale, c) -> list:
    """The runtime arguments of a JIT launch (the constexprs go as keywords), descriptors as TensorDescriptors."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    ops = [
        t if s is None else TensorDescriptor(t if s[0] == 1 else t.t(), *s[1:])
        for t, s in zip((a, b, c), e.descs, strict=True)
    ]
    return [*ops, a_scale, b_scale, *scratch_tensors(e, c), *e.ints]


def scratch_tensors(e: Fp8Entry, c) -> list:
    """The decode path's workspace and arrival counters (C twice without split-K: unused); nothing for TMA."""
    if e.scratch is None:
        return []
    return [c, c] if not e.scratch[0] else list(splitk_scratch(e.scratch, c)[:2])


def kept_args(e: Fp8Entry, a, b, a_scale, b_scale, c) -> list:
    """The runtime arguments of a kept launch (``CompiledKernel.run``), descriptors as ``HostDesc``."""
    ops = [t if s is None else HostDesc(t, s[1], s[2]) for t, s in zip((a, b, c), e.descs, strict=True)]
    return [*ops, a_scale, b_scale, *scratch_tensors(e, c), *e.ints]


def direct_params(e: Fp8Entry, ptrs: tuple, c=None, stream: int = 0) -> list:
    """The C launcher's parameters (``ops.launch``): ``ptrs`` the addresses of a, b, a_scale, b_scale and C; each
    descriptor encoded once per base address; the decode path's workspace and counters kept per (device,
    ``stream``) (``c``: the output tensor, for its device)."""
    params, i = [], 0
    for ptr, s in zip((ptrs[0], ptrs[1], ptrs[4]), e.descs, strict=True):
        if s is None:
            params.append(ptr)
        else:
            params += kept_launch.desc_args(e.direct, i, ptr, s[1], s[2])
            i += 1
    params += [ptrs[2], ptrs[3]]
    if e.scratch is not None:
        if e.scratch[0]:
            params += splitk_scratch(e.scratch, c, (e.slot.kept.device, stream))[2:4]
        else:
            params += [ptrs[4], ptrs[4]]
    return [*params, *e.ints]


def launch_fp8(e: Fp8Entry, a, b, a_scale, b_scale, c, ptrs: tuple) -> None:
    """Launch a cached signature's kernel: through the JIT the first time (and always under the interpreter), then
    the kept compiled kernel through Triton's C launcher (``ops.launch``), or its ``CompiledKernel.run``."""
    slot = e.slot
    if kept_launch.usable(slot.kept):
        if e.direct is not None:
            stream = torch._C._cuda_getCurrentRawStream(slot.kept.device)
            kept_launch.fire_launcher(e.direct, slot.grid, stream, direct_params(e, ptrs, c, stream))
        else:
            kept_launch.run(slot.kept, slot.grid, kept_args(e, a, b, a_scale, b_scale, c))
        _LAST["gemm_fp8"] = slot.kept.compiled
        return
    _LAST["gemm_fp8"] = kept_launch.fire(slot, jit_args(e, a, b, a_scale, b_scale, c), False)
    e.direct = kept_launch.direct_launcher(slot.kept, sum(s is not None for s in e.descs))


def launch_gemm_fp8(a, b, a_scale, b_scale, out_dtype, out) -> torch.Tensor:
    """The launcher behind ``gemm_fp8`` and its custom ops: checks and plans once per signature (``PLANS``); after
    that a call checks only out's overlap with the inputs (from byte extents kept with the signature), allocates C
    and launches the kept kernel."""
    try:
        ptrs = tuple(0 if t is None else t.data_ptr() for t in (a, b, a_scale, b_scale, out))
        key = signature(a, b, a_scale, b_scale, out_dtype, out, ptrs)
    except (AttributeError, TypeError):
        key = None  # not tensors (or out_dtype not hashable): the checks say what is wrong
    e = PLANS.get(key) if key is not None else None
    if e is None:
        e = _admit(a, b, a_scale, b_scale, out_dtype, out, key)
    elif out is not None:
        op, eo = ptrs[4], e.extents[4]
        if any(op < ptrs[i] + e.extents[i] and ptrs[i] < op + eo for i in range(4)):
            check_out("gemm_fp8", out, a=a, b=b, a_scale=a_scale, b_scale=b_scale)  # raises the overlap error
    if out is None:
        out = torch.empty(e.shape, dtype=e.dtype, device=e.device)
        ptrs = ptrs[:4] + (out.data_ptr(),)
    if e.slot is None:
        if out.numel():
            out.zero_()  # K = 0: a sum over nothing
        return out
    launch_fp8(e, a, b, a_scale, b_scale, out, ptrs)
    return out


def launch_mode(a, b, a_scale, b_scale, out_dtype=torch.bfloat16, out=None) -> str:
    """How the next ``gemm_fp8`` call with operands laid out like these launches: "uncached" (it plans), "empty",
    "jit" (under the interpreter, or before the first launch compiled), "kept" (CompiledKernel.run) or "direct"
    (Triton's C launcher, descriptors kept per buffer)."""
    e = PLANS.get(signature(a, b, a_scale, b_scale, out_dtype, out))
    if e is None:
        return "uncached"
    if e.slot is None:
        return "empty"
    return "jit" if e.slot.kept is None else "direct" if e.direct is not None else "kept"


__all__ = [
    "Fp8Entry",
    "last_kernel",
    "launch_gemm_fp8",
    "launch_mode",
]
