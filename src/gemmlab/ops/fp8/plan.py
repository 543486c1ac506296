"""FP8 dense GEMM's plan (``ops.fp8.launch`` keeps one per signature and launches it): the config, the planner
``plan_fp8`` and what a plan's kernel is compiled with; ``execute_fp8`` runs a plan through Triton's JIT (the
tuner's and the inspector's way).

    C (M, N) = (A * a_scale) @ (B * b_scale)     A (M, K), B (K, N) float8_e4m3fn; scales fp32; fp32 accumulation;
                                                 C in out_dtype (bf16, fp16 or fp32)

The scale granularity is read from the scale shapes (``ops.fp8.checks.scale_mode``); the alignment rules and the
config tables are as ``ops.fp8.launch`` says. Two paths: "decode" where a "decode" rule of the config table holds
the shape (small M: ``ops.fp8.decode``, the kernel ``kernels.gemv_fp8``), else "tma" (the persistent TMA kernel,
``kernels.gemm_fp8``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gemmlab.device import Target, target_for
from gemmlab.ops import configs
from gemmlab.ops.fp8.checks import SCALE_BLOCK, check_gemm_fp8_args, fp8_out_dtype
from gemmlab.ops.fp8.decode import (
    Fp8DecodeConfig,
    constexprs_decode,
    decode_grid,
    decode_ints,
    decode_refusal,
    decode_rule,
    decode_scratch,
    decode_split,
)
from gemmlab.ops.layout import descriptor_layout, is_kmajor, tma_ok

SCALES = ("tensor", "row/col", "block")  # by scale mode 0, 1, 2


@dataclass(frozen=True)
class Fp8Config:
    """Launch parameters of the FP8 kernel. ``promote`` (per-tensor and row/col scales): move the tensor cores' sum
    into the fp32 accumulator every BLOCK_K (the block-scaled path always does). Code variants, the same sums
    (``kernels.gemm_fp8``): ``b_scale_scalar`` (block scales, block_n dividing 128: B's scale loaded once per step
    as a scalar), ``warp_specialize`` (Triton's Hopper producer/consumer warp groups; C then goes by masked
    pointers, which that pass takes), ``flatten`` (tile and K loops pipelined as one). ``ctas_per_sm``: the
    persistent grid's programs per SM (2: two CTAs share an SM where registers and shared memory allow, so one's
    promotion can overlap the other's wgmma)."""

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
    ctas_per_sm: int = 1

    def __post_init__(self) -> None:
        configs.check_fields(
            self,
            pow2=("block_m", "block_n", "block_k", "num_warps"),
            positive=("group_m", "num_stages", "ctas_per_sm"),
        )

    @classmethod
    def from_dict(cls, d: dict) -> Fp8Config:
        return configs.config_of(cls, d)


@dataclass(frozen=True)
class Fp8Plan:
    """What ``gemm_fp8`` runs: the path ("tma" or "decode"), its config (``Fp8Config`` or ``Fp8DecodeConfig``,
    the decode one with its split_k resolved), where it came from, the scale mode and the layouts."""

    config: Fp8Config | Fp8DecodeConfig
    reason: str
    m: int
    n: int
    k: int
    scale: int  # 0 per tensor, 1 row/col, 2 block
    b_kmajor: bool
    c_tma: bool
    num_sms: int
    path: str = "tma"


def plan_fp8(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    config: Fp8Config | Fp8DecodeConfig | None = None,
    target: Target | None = None,
) -> Fp8Plan:
    """The plan of ``gemm_fp8(a, b, a_scale, b_scale, out_dtype=..., out=...)``: checks (alignment included), the
    path and config (pinned: an ``Fp8Config`` pins the TMA path, an ``Fp8DecodeConfig`` the decode path; else the
    table's first "decode" rule holding the shape, else its first "tma" one), the layouts. ``target`` overrides the
    operands' device (the inspector plans for an H200 from "meta" tensors). Pure: no allocation."""
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
    c_strides = tuple(out.stride()) if out is not None else (n, 1)
    decode_note = ""
    if isinstance(config, Fp8DecodeConfig):
        why = decode_refusal(config, mode, a, b, c_strides, n)
        if why:
            raise ValueError(f"gemm_fp8: decode config: {why}")
        return _decode_plan(config, "config given by the caller", m, n, k, mode, b_kmajor, target.num_sms)
    if config is None:
        drule = decode_rule(target, m, n, k, mode)
        if drule is not None:
            why = decode_refusal(drule.config, mode, a, b, c_strides, n)
            if why is None:
                source = "config " + drule.source
                return _decode_plan(drule.config, source, m, n, k, mode, b_kmajor, target.num_sms)
            decode_note = f"; not the decode path ({drule.source}): {why}"
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
    tiles = tma_tiles(m, n, config)
    reason = (
        f"persistent TMA kernel, {SCALES[mode]} scales, B {'K' if b_kmajor else 'N'}-major, C by "
        f"{'TMA' if c_tma else 'masked pointers'}, {tiles} tiles"
        f"{f', {config.ctas_per_sm} programs per SM' if config.ctas_per_sm > 1 else ''}; {source}{decode_note}"
    )
    return Fp8Plan(config, reason, m, n, k, mode, b_kmajor, c_tma, target.num_sms)


def _decode_plan(
    cfg: Fp8DecodeConfig, source: str, m: int, n: int, k: int, mode: int, b_kmajor: bool, num_sms: int
) -> Fp8Plan:
    """The decode path's plan: the config with its split-K resolved (``ops.fp8.decode.decode_split``)."""
    cfg = dataclasses.replace(cfg, split_k=decode_split(cfg, m, n, k, num_sms))
    gm, gn, split = decode_grid(cfg, m, n)
    kind = "FFMA, one-row tiles" if cfg.block_m == 1 else f"tensor cores, {cfg.block_m}-row tiles"
    reason = (
        f"decode kernel ({kind}; pointer loads), {SCALES[mode]} scales, B {'K' if b_kmajor else 'N'}-major, "
        f"split-K {split}, {gm * gn * split} programs; {source}"
    )
    return Fp8Plan(cfg, reason, m, n, k, mode, b_kmajor, False, num_sms, "decode")


def constexprs_fp8(p: Fp8Plan) -> dict:
    """The compile-time parameters of a plan's kernel (shared with the inspector)."""
    cfg = p.config
    if p.path == "decode":
        return constexprs_decode(p.scale, cfg)
    return dict(
        SCALE=p.scale,
        B_KMAJOR=p.b_kmajor,
        C_TMA=p.c_tma,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        NUM_PROGRAMS=programs(p),
        EPILOGUE_SUBTILE=cfg.epilogue_subtile,
        PROMOTE=cfg.promote,
        SB_SCALAR=p.scale == 2 and cfg.b_scale_scalar,
        WARP_SPEC=cfg.warp_specialize,
        FLATTEN=cfg.flatten,
    )


def programs(p: Fp8Plan) -> int:
    """The persistent kernel's tile stride: ``ctas_per_sm`` programs per SM."""
    return p.num_sms * p.config.ctas_per_sm


def tma_tiles(m: int, n: int, cfg: Fp8Config) -> int:
    """The output tiles of the persistent kernel."""
    return -(-m // cfg.block_m) * -(-n // cfg.block_n)


def tma_grid(p: Fp8Plan) -> tuple[int, int, int]:
    """The persistent kernel's grid: ``programs``, or one program a tile where there are fewer tiles."""
    return (min(programs(p), tma_tiles(p.m, p.n, p.config)), 1, 1)


def launch_options_fp8(cfg: Fp8Config | Fp8DecodeConfig) -> dict:
    return {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def _desc(t: torch.Tensor, inner: int, block: tuple[int, int]):
    """A TMA descriptor over the 2-D view of ``t`` whose unit-stride dim is ``inner`` (shape (outer, inner))."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    view = t if inner == 1 else t.t()
    return TensorDescriptor(view, *descriptor_layout(view.shape, view.stride(), 1, block, t.element_size()))


def scale_strides(s: torch.Tensor) -> tuple[int, int]:
    return (s.stride(0), s.stride(1)) if s.dim() == 2 else (0, 0)


def execute_fp8(p: Fp8Plan, a, b, a_scale, b_scale, c):
    """Launch a plan on its operands (``c`` (M, N) row-major, allocated); returns Triton's launched kernel (its
    ``n_regs``, ``n_spills``), None where nothing was launched."""
    from gemmlab.kernels.gemm_fp8 import gemm_fp8_tma_kernel  # (the first call loads the kernel)
    from gemmlab.kernels.gemv_fp8 import gemv_fp8_kernel

    if p.m == 0 or p.n == 0 or p.k == 0:
        if c.numel():
            c.zero_()  # K = 0: a sum over nothing
        return None
    cfg = p.config
    if p.path == "decode":  # a fresh workspace and zeroed counters per call (the launcher keeps them per stream)
        ws_elems, tiles = decode_scratch(cfg, p.m, p.n)
        ws = torch.empty(max(ws_elems, 1), dtype=torch.float32, device=c.device)
        cnt = torch.zeros(max(tiles, 1), dtype=torch.int32, device=c.device)
        ints = decode_ints(cfg, a, b, tuple(c.stride()), scale_strides(a_scale), scale_strides(b_scale))
        return gemv_fp8_kernel[decode_grid(cfg, p.m, p.n)](
            a, b, c, a_scale, b_scale, ws, cnt, *ints, **constexprs_fp8(p), **launch_options_fp8(cfg)
        )
    a_desc = _desc(a, 1, (cfg.block_m, cfg.block_k))
    b_desc = _desc(b, 0, (cfg.block_n, cfg.block_k)) if p.b_kmajor else _desc(b, 1, (cfg.block_k, cfg.block_n))
    c_arg = _desc(c, 1, (cfg.block_m, cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n)) if p.c_tma else c
    return gemm_fp8_tma_kernel[tma_grid(p)](
        a_desc,
        b_desc,
        c_arg,
        a_scale,
        b_scale,
        p.m,
        p.n,
        p.k,
        c.stride(0),
        *scale_strides(a_scale),
        *scale_strides(b_scale),
        **constexprs_fp8(p),
        **launch_options_fp8(cfg),
    )


__all__ = [
    "Fp8Config",
    "Fp8DecodeConfig",
    "Fp8Plan",
    "SCALES",
    "constexprs_fp8",
    "execute_fp8",
    "launch_options_fp8",
    "plan_fp8",
    "scale_strides",
]
