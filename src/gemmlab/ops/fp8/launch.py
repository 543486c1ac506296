"""FP8 dense GEMM, the details behind ``ops.gemm_fp8``: the config, the planner ``plan_fp8`` and the launcher.

    C (M, N) = (A * a_scale) @ (B * b_scale)     A (M, K), B (K, N) float8_e4m3fn; scales fp32; fp32 accumulation;
                                                 C in out_dtype (bf16, fp16 or fp32)

The scale granularity is read from the scale shapes (``ops.fp8.checks.scale_mode``): per tensor () and (); per row of
A (M, 1) and column of B (1, N); block (M, cdiv(K, 128)) over 1x128 blocks of A and (cdiv(K, 128), cdiv(N, 128))
over 128x128 blocks of B (DeepSeek-V3's layout). B is (K, N) either way round: row-major, or K-major, i.e. ``w.t()``
of an nn.Linear weight w (N, K), no copy (quantize w (N, K) and pass ``q.t()``, ``scale.t()``: the scales transpose
with it). One kernel, ``kernels.gemm_fp8.gemm_fp8_tma_kernel`` (persistent, TMA, wgmma on e4m3).

Alignment (TMA needs 16-byte aligned bases and row strides; fp8 is one byte per element): A needs K % 16 == 0, a
K-major B K % 16 == 0, a row-major B N % 16 == 0, all bases 16-byte aligned. There is no portable path: anything
else is a ValueError that says which operand and why (quantize into fresh tensors with K padded to 16, or pass B
K-major). C is stored by TMA where its row stride allows, else through masked pointers (any N). Needs sm_90 (or the
CPU under Triton's interpreter). Configs: the "gemm_fp8" section of the config tables (``ops.configs``).

The launcher (``launch_gemm_fp8``) goes as ``gemm``'s does: a call's signature (each tensor's shape, strides, dtype,
device and 16-byte alignment; out_dtype) looks up its ``Fp8Entry`` in ``PLANS`` (bounded, ``ops.cache``); a miss runs
every check and plans, a hit checks only out's overlap with the inputs. The first launch goes through the JIT, later
ones to the kept compiled kernel (``ops.launch``), through Triton's C launcher with each TMA descriptor encoded once
per buffer (``ops.direct``) where it can.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gemmlab.device import Target, target_for
from gemmlab.ops import cache, configs
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.fp8.checks import SCALE_BLOCK, check_gemm_fp8_args, fp8_out_dtype
from gemmlab.ops.gemm.checks import check_out
from gemmlab.ops.launch import HostDesc
from gemmlab.ops.layout import descriptor_layout, extent, is_kmajor, tma_ok

SCALES = ("tensor", "row/col", "block")  # by scale mode 0, 1, 2


@dataclass(frozen=True)
class Fp8Config:
    """Launch parameters of the FP8 kernel. ``promote`` (per-tensor and row/col scales): move the tensor cores' sum
    into the fp32 accumulator every BLOCK_K (the block-scaled path always does). Code variants, the same sums
    (``kernels.gemm_fp8``): ``b_scale_scalar`` (block scales, block_n dividing 128: B's scale loaded once per step
    as a scalar), ``warp_specialize`` (Triton's Hopper producer/consumer warp groups; C then goes by masked
    pointers, which that pass takes), ``flatten`` (tile and K loops pipelined as one)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    epilogue_subtile: bool = False
    promote: bool = True
    b_scale_scalar: bool = False
    warp_specialize: bool = False
    flatten: bool = False

    def __post_init__(self) -> None:
        configs.check_fields(
            self, pow2=("block_m", "block_n", "block_k", "num_warps"), positive=("group_m", "num_stages")
        )

    @classmethod
    def from_dict(cls, d: dict) -> Fp8Config:
        return configs.config_of(cls, d)


@dataclass(frozen=True)
class Fp8Plan:
    """What ``gemm_fp8`` runs: the config, where it came from, the scale mode and the layouts."""

    config: Fp8Config
    reason: str
    m: int
    n: int
    k: int
    scale: int  # 0 per tensor, 1 row/col, 2 block
    b_kmajor: bool
    c_tma: bool
    num_sms: int


def plan_fp8(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    config: Fp8Config | None = None,
    target: Target | None = None,
) -> Fp8Plan:
    """The plan of ``gemm_fp8(a, b, a_scale, b_scale, out_dtype=..., out=...)``: checks (alignment included), the
    config (pinned, else the table's first matching rule), the layouts. ``target`` overrides the operands' device
    (the inspector plans for an H200 from "meta" tensors). Pure: no allocation."""
    out_dtype = fp8_out_dtype("gemm_fp8", out_dtype, out, torch.bfloat16)
    mode = check_gemm_fp8_args(a, b, a_scale, b_scale, out_dtype, out)
    (m, k), n = a.shape, b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return Fp8Plan(Fp8Config(), f"M={m} N={n} K={k}: nothing to multiply", m, n, k, mode, True, False, 0)
    target = target or target_for(a.device)
    if not target.has_tma:
        raise ValueError(
            f"gemm_fp8: needs sm_90 (TMA and e4m3 wgmma); {target.name} is "
            f"sm_{target.capability[0]}{target.capability[1]}"
        )
    b_kmajor = bool(is_kmajor(b, 0))
    if not tma_ok(a, 1):
        raise ValueError(
            f"gemm_fp8: a (M={m}, K={k}, strides {a.stride()}) is not TMA-aligned: needs a 16-byte "
            "aligned base and K % 16 == 0 (one byte per e4m3 element); there is no portable FP8 path"
        )
    if not tma_ok(b, 0 if b_kmajor else 1):
        need = "K % 16 == 0 for a K-major b" if b_kmajor else "N % 16 == 0 for a row-major b (or pass b K-major)"
        raise ValueError(
            f"gemm_fp8: b (K={k}, N={n}, strides {b.stride()}) is not TMA-aligned: needs a 16-byte "
            f"aligned base and {need}; there is no portable FP8 path"
        )
    if config is None:
        rule = configs.pick(
            target.name, "gemm_fp8", "tma", Fp8Config.from_dict, "float8_e4m3fn", m=m, n=n, k=k, scale=mode
        )
        config, source = rule.config, "config " + rule.source
    else:
        source = "config given by the caller"
    if mode == 2 and SCALE_BLOCK % config.block_k:
        raise ValueError(f"gemm_fp8: block scales need block_k dividing {SCALE_BLOCK}, config has {config.block_k}")
    if mode == 2 and config.b_scale_scalar and SCALE_BLOCK % config.block_n:
        raise ValueError(f"gemm_fp8: b_scale_scalar needs block_n dividing {SCALE_BLOCK}, config has {config.block_n}")
    size = torch.empty((), dtype=out_dtype).element_size()
    c_tma = tma_ok(out, 1) if out is not None else (m == 1 or (n * size) % 16 == 0)
    c_tma = c_tma and not config.warp_specialize  # (Triton 3.6's Hopper warp specialization fails on a TMA store)
    tiles = -(-m // config.block_m) * -(-n // config.block_n)
    reason = (
        f"persistent TMA kernel, {SCALES[mode]} scales, B {'K' if b_kmajor else 'N'}-major, C by "
        f"{'TMA' if c_tma else 'masked pointers'}, {tiles} tiles; {source}"
    )
    return Fp8Plan(config, reason, m, n, k, mode, b_kmajor, c_tma, target.num_sms)


def constexprs_fp8(p: Fp8Plan) -> dict:
    """The compile-time parameters of a plan's kernel (shared with the inspector)."""
    cfg = p.config
    return dict(
        SCALE=p.scale,
        B_KMAJOR=p.b_kmajor,
        C_TMA=p.c_tma,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        NUM_SMS=p.num_sms,
        EPILOGUE_SUBTILE=cfg.epilogue_subtile,
        PROMOTE=cfg.promote,
        SB_SCALAR=p.scale == 2 and cfg.b_scale_scalar,
        WARP_SPEC=cfg.warp_specialize,
        FLATTEN=cfg.flatten,
    )


def launch_options_fp8(cfg: Fp8Config) -> dict:
    return {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def _desc(t: torch.Tensor, inner: int, block: tuple[int, int]):
    """A TMA descriptor over the 2-D view of ``t`` whose unit-stride dim is ``inner`` (shape (outer, inner))."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    view = t if inner == 1 else t.t()
    return TensorDescriptor(view, *descriptor_layout(view.shape, view.stride(), 1, block, t.element_size()))


def _scale_strides(s: torch.Tensor) -> tuple[int, int]:
    return (s.stride(0), s.stride(1)) if s.dim() == 2 else (0, 0)


def execute_fp8(p: Fp8Plan, a, b, a_scale, b_scale, c):
    """Launch a plan on its operands (``c`` (M, N) row-major, allocated); returns Triton's launched kernel (its
    ``n_regs``, ``n_spills``), None where nothing was launched."""
    from gemmlab.kernels.gemm_fp8 import gemm_fp8_tma_kernel  # (the first call loads the kernel)

    if p.m == 0 or p.n == 0 or p.k == 0:
        if c.numel():
            c.zero_()  # K = 0: a sum over nothing
        return None
    cfg = p.config
    a_desc = _desc(a, 1, (cfg.block_m, cfg.block_k))
    b_desc = _desc(b, 0, (cfg.block_n, cfg.block_k)) if p.b_kmajor else _desc(b, 1, (cfg.block_k, cfg.block_n))
    c_arg = _desc(c, 1, (cfg.block_m, cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n)) if p.c_tma else c
    tiles = -(-p.m // cfg.block_m) * -(-p.n // cfg.block_n)
    grid = (min(p.num_sms, tiles),)
    return gemm_fp8_tma_kernel[grid](
        a_desc,
        b_desc,
        c_arg,
        a_scale,
        b_scale,
        p.m,
        p.n,
        p.k,
        c.stride(0),
        *_scale_strides(a_scale),
        *_scale_strides(b_scale),
        **constexprs_fp8(p),
        **launch_options_fp8(cfg),
    )


# ------------------------------------------------------------------------------- the signature cache


@dataclass(eq=False, slots=True)
class Fp8Entry:
    """A signature's plan and its launch, and what a hit needs: C's shape, dtype and device, and the byte extents
    of a, b, the scales and out (out given) for the one check a signature cannot prove, out's overlap."""

    plan: Fp8Plan
    slot: kept_launch.Planned | None  # None: nothing to launch (M, N or K is 0)
    descs: tuple  # per operand (a, b, c): (inner, shape, strides, block) of its TMA descriptor, or None (a pointer)
    ints: tuple  # M, N, K, stride_cm and the scales' strides
    shape: tuple[int, int]
    dtype: torch.dtype
    device: torch.device
    extents: tuple | None
    direct: kept_launch.Direct | None = None  # Triton's C launcher itself, once the kernel is kept


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
    else:
        from gemmlab.kernels.gemm_fp8 import gemm_fp8_tma_kernel  # (the first call loads the kernel)

        size = torch.empty((), dtype=out_dtype).element_size()
        c_strides = out.stride() if out is not None else (p.n, 1)
        cfg = p.config
        tiles = -(-p.m // cfg.block_m) * -(-p.n // cfg.block_n)
        slot = kept_launch.Planned(
            gemm_fp8_tma_kernel, (min(p.num_sms, tiles), 1, 1), constexprs_fp8(p), launch_options_fp8(cfg)
        )
        ints = (p.m, p.n, p.k, c_strides[0], *_scale_strides(a_scale), *_scale_strides(b_scale))
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
    return [*ops, a_scale, b_scale, *e.ints]


def kept_args(e: Fp8Entry, a, b, a_scale, b_scale, c) -> list:
    """The runtime arguments of a kept launch (``CompiledKernel.run``), descriptors as ``HostDesc``."""
    ops = [t if s is None else HostDesc(t, s[1], s[2]) for t, s in zip((a, b, c), e.descs, strict=True)]
    return [*ops, a_scale, b_scale, *e.ints]


def direct_params(e: Fp8Entry, ptrs: tuple) -> list:
    """The C launcher's parameters (``ops.direct``): ``ptrs`` the addresses of a, b, a_scale, b_scale and C; each
    descriptor encoded once per base address."""
    params, i = [], 0
    for ptr, s in zip((ptrs[0], ptrs[1], ptrs[4]), e.descs, strict=True):
        if s is None:
            params.append(ptr)
        else:
            params += kept_launch.desc_args(e.direct, i, ptr, s[1], s[2])
            i += 1
    return [*params, ptrs[2], ptrs[3], *e.ints]


def launch_fp8(e: Fp8Entry, a, b, a_scale, b_scale, c, ptrs: tuple) -> None:
    """Launch a cached signature's kernel: through the JIT the first time (and always under the interpreter), then
    the kept compiled kernel through Triton's C launcher (``ops.direct``), or its ``CompiledKernel.run``."""
    slot = e.slot
    if kept_launch.usable(slot.kept):
        if e.direct is not None:
            kept_launch.fire_launcher(
                e.direct, slot.grid, torch._C._cuda_getCurrentRawStream(slot.kept.device), direct_params(e, ptrs)
            )
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
    "Fp8Config",
    "Fp8Entry",
    "Fp8Plan",
    "constexprs_fp8",
    "execute_fp8",
    "last_kernel",
    "launch_gemm_fp8",
    "launch_mode",
    "launch_options_fp8",
    "plan_fp8",
]
