"""FP8 experts, the details behind ``ops.moe_fp8``: the configs, the grouped launch and the MoE body.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows; Xb = cdiv(X, 128).

    launch_grouped_gemm_fp8(x, w, offsets, x_scale, w_scale, out_dtype, validate, out) -> out (S, N)
    launch_moe_forward_fp8(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, validate) -> y (T, H)

The MoE body, step by step (what is quantized where: docs/fp8.md, "MoE experts"):
    (1) route: the (token, slot) pairs sorted by expert (``ops.moe_routing.sort_routes``, the bf16 path's tables);
    (2) x (T, H) quantized per 1x128 block (``ops.fp8_quantize``), then its e4m3 rows and scales gathered into
        expert order (S, H), (S, Hb);
    (3) first GEMM, FP8 (MODE 1): act (S, I) = SiLU(gate) * up from the two fp32 sums, stored in x's dtype;
    (4) act quantized per 1x128 block, (S, I) e4m3 and (S, Ib) scales;
    (5) second GEMM, FP8 (MODE 2): o (S, H) = act @ w2[e]^T times each row's top-k weight, in x's dtype;
    (6) the combine of the bf16 path (``kernels.moe.moe_combine_kernel``): y[t] = sum over j of o's rows of t, in
        slot order, fp32.
Needs sm_90 (TMA and e4m3 wgmma) or the CPU under Triton's interpreter. No autograd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.device import Target, target_for
from gemmlab.kernels.moe import moe_combine_kernel, moe_tiles_kernel
from gemmlab.kernels.moe_fp8 import moe_fp8_grouped_kernel
from gemmlab.ops import configs
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.fp8_checks import FP8, SCALE_BLOCK
from gemmlab.ops.fp8_quantize import launch_quantize_fp8
from gemmlab.ops.grouped import w2d
from gemmlab.ops.layout import descriptor_layout, overlap, tma_ok
from gemmlab.ops.moe_checks import device_check
from gemmlab.ops.moe_config import Mode
from gemmlab.ops.moe_fp8_checks import check_grouped_fp8_args, check_moe_fp8_args
from gemmlab.ops.moe_routing import sort_routes

_KEPT: dict = {}  # kept compiled kernels, per specialization (gemmlab.ops.launch.start)


@dataclass(frozen=True)
class MoEFp8Config:
    """Launch parameters of ``moe_fp8_grouped_kernel``; block_k divides 128 (one scale block per K step)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        configs.check_fields(self, pow2=("block_m", "block_n", "block_k", "num_warps"),
                             positive=("group_m", "num_stages"))
        if SCALE_BLOCK % self.block_k:
            raise ValueError(f"MoEFp8Config: block_k {self.block_k} must divide {SCALE_BLOCK} (one scale block per "
                             "K step)")

    @classmethod
    def from_dict(cls, d: dict) -> MoEFp8Config:
        return configs.config_of(cls, d)


def moe_fp8_config(target: Target, mode: Mode, s: int, e: int, n: int, k: int) -> MoEFp8Config:
    """The config of a launch of ``mode`` over S routed rows in E groups, N x K weights: the first rule of the
    target's "moe_fp8" tables (``ops.configs``, path ``mode.table``) whose ranges hold them. The two MoE GEMMs of
    one call share one tile schedule: the down GEMM takes the gate/up GEMM's block_m (``launch_moe_forward_fp8``)."""
    rule = configs.pick(target.name, "moe_fp8", mode.table, MoEFp8Config.from_dict, "float8_e4m3fn",
                        rows_per_expert=s // max(e, 1), rows=s, experts=e, n=n, k=k)
    return rule.config


def _need_tma(op: str, target: Target) -> None:
    if not target.has_tma:
        raise ValueError(f"{op}: needs sm_90 (TMA and e4m3 wgmma); {target.name} is "
                         f"sm_{target.capability[0]}{target.capability[1]}")


def _check_weights_tma(op: str, **weights: torch.Tensor) -> None:
    """Expert weights (E, N, K) that TMA can read as (E*N, K) rows: a 16-byte aligned base and row stride."""
    for name, w in weights.items():
        if w.numel() and not tma_ok(w2d(w), 1):
            raise ValueError(f"{op}: {name} (shape {tuple(w.shape)}, strides {w.stride()}) is not TMA-aligned: needs "
                             "a 16-byte aligned base and a row stride of a multiple of 16 bytes (pass it contiguous)")


def _desc(t: torch.Tensor, block: tuple[int, int]) -> TensorDescriptor:
    return TensorDescriptor(t, *descriptor_layout(t.shape, t.stride(), 1, block, t.element_size()))


def launch_fp8_grouped(mode: Mode, a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                       out: torch.Tensor, scale: torch.Tensor | None, offsets: torch.Tensor,
                       tile_offsets: torch.Tensor, n: int, cfg: MoEFp8Config, target: Target, rows_bound: int) -> None:
    """One persistent launch of ``moe_fp8_grouped_kernel`` over every expert's tiles: a (S, K) e4m3 with a_scale
    (S, Kb); w (E, N_w, K) e4m3 with w_scale (E, cdiv(N_w, 128), Kb); out (S, n)."""
    e, k = offsets.numel(), a.shape[1]
    w_rows = w2d(w)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    items_bound = (triton.cdiv(rows_bound, bm) + e) * triton.cdiv(n, bn)
    programs = max(1, min(target.num_sms, items_bound))
    log2_e = max(1, math.ceil(math.log2(max(e, 2)))) + 1
    args = [_desc(a, (bm, bk)), a_scale, _desc(w_rows, (bn, bk)), w_scale.contiguous(), out,
            out if scale is None else scale, offsets, tile_offsets, n, k, e, a_scale.stride(0), out.stride(0)]
    consts = dict(MODE=int(mode), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, NUM_PROGRAMS=programs,
                  LOG2_E=log2_e)
    kept_launch.start(_KEPT, moe_fp8_grouped_kernel, (programs,), args, consts,
                      dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, C) bf16/fp16 -> (e4m3 (R, C), fp32 (R, Cb)): one scale per 1x128 block (activations, on the fly)."""
    return launch_quantize_fp8(x, "block", (1, SCALE_BLOCK))


def launch_grouped_gemm_fp8(x, w, offsets, x_scale, w_scale, out_dtype, validate, out=None) -> torch.Tensor:
    """``grouped_gemm_fp8``'s launcher: checks, quantizes x when it is bf16/fp16, plans the tiles, launches."""
    s, k, e, n = check_grouped_fp8_args(x, w, offsets, x_scale, w_scale, out_dtype, out)
    if out is None:
        out = torch.empty((s, n), dtype=out_dtype, device=x.device)
    elif any(t.numel() and overlap(out, t) for t in (x, w, offsets, w_scale) + ((x_scale,) if x_scale is not None
                                                                                  else ())):
        raise ValueError("grouped_gemm_fp8: out overlaps an input; pass a fresh out")
    if e == 0 or s == 0 or n == 0:
        return out
    target = target_for(x.device)
    _need_tma("grouped_gemm_fp8", target)
    _check_weights_tma("grouped_gemm_fp8", w=w)
    offsets = offsets.contiguous()  # (the schedule kernel reads it densely)
    if x.dtype != FP8:
        x, x_scale = _quantize_rows(x)
    elif k and not tma_ok(x, 1):
        raise ValueError(f"grouped_gemm_fp8: x (S={s}, K={k}, strides {x.stride()}) is not TMA-aligned: needs a "
                         "16-byte aligned base, unit K stride and a row stride of a multiple of 16 bytes")
    else:
        x_scale = x_scale.contiguous()  # (the kernel reads one scale per 1x128 block along a unit-stride row)
    cfg = moe_fp8_config(target, Mode.GROUPED, s, e, n, k)
    tile_offsets = torch.empty(e + 1, dtype=torch.int32, device=x.device)
    ok = torch.empty(1, dtype=torch.bool, device=x.device)
    kept_launch.start(_KEPT, moe_tiles_kernel, (1,), [offsets, tile_offsets, ok, e, s],  # schedule + check
                      dict(BLOCK_M=cfg.block_m, BLOCK_E=max(16, triton.next_power_of_2(e))), {})
    if validate:
        device_check(ok[0], f"grouped_gemm_fp8: offsets must be non-decreasing cumulative ends within [0, S={s}]")
    if k == 0:
        out[:s].zero_() if out.numel() else None
        return out
    launch_fp8_grouped(Mode.GROUPED, x, x_scale, w, w_scale, out, None, offsets, tile_offsets, n, cfg, target, s)
    return out


def launch_moe_forward_fp8(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, validate) -> torch.Tensor:
    """``moe_forward``'s launcher for FP8 experts on 2-D x: steps (1)-(6) of the module docstring."""
    t, h, i, e, k = check_moe_fp8_args(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids)
    y = torch.empty((t, h), dtype=x.dtype, device=x.device)
    if t == 0 or h == 0 or k == 0:
        return y.zero_()
    target = target_for(x.device)
    _need_tma("moe_forward (fp8)", target)
    _check_weights_tma("moe_forward (fp8)", w1=w1, w2=w2)
    s = t * k
    cfg1 = moe_fp8_config(target, Mode.GATE_UP, s, e, 2 * i, h)
    cfg2 = replace(moe_fp8_config(target, Mode.DOWN, s, e, h, i), block_m=cfg1.block_m)  # one tile schedule
    routes = sort_routes(topk_ids, e, cfg1.block_m, topk_weights)  # (1)
    if validate:
        ok = routes.ok[0] if routes.ok is not None else ((topk_ids >= 0) & (topk_ids < e)).all()
        device_check(ok, f"moe_forward (fp8): topk_ids must lie in [0, E={e})")
    if i == 0:
        return y.zero_()
    qx, sx = _quantize_rows(x)  # (2)
    qa = qx.view(torch.uint8).index_select(0, routes.token).view(FP8)
    sa = sx.index_select(0, routes.token)
    act = torch.empty((s, i), dtype=x.dtype, device=x.device)
    launch_fp8_grouped(Mode.GATE_UP, qa, sa, w1, w1_scale, act, None, routes.offsets, routes.tile_offsets, i, cfg1,
                       target, s)  # (3)
    qh, sh = _quantize_rows(act)  # (4)
    o = torch.empty((s, h), dtype=x.dtype, device=x.device)
    launch_fp8_grouped(Mode.DOWN, qh, sh, w2, w2_scale, o, routes.scale, routes.offsets, routes.tile_offsets, h, cfg2,
                       target, s)  # (5)
    block_h = min(1024, triton.next_power_of_2(h))
    kept_launch.start(_KEPT, moe_combine_kernel, (t, triton.cdiv(h, block_h)),
                      [o, routes.inv, y, h, o.stride(0), y.stride(0)], dict(TOP_K=k, BLOCK_H=block_h), {})  # (6)
    return y


__all__ = ["MoEFp8Config", "launch_fp8_grouped", "launch_grouped_gemm_fp8", "launch_moe_forward_fp8",
           "moe_fp8_config"]
