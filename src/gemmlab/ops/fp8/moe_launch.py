"""FP8 experts, the details behind ``ops.moe_fp8``: the grouped launch ``grouped_gemm_fp8`` runs. The MoE body
with FP8 experts is an option of the MoE forward's one plan (``ops.moe.plan``, option ``scales``); the configs and
the launch decisions both share are ``ops.fp8.moe_config``'s.

Legend: S routed rows, E experts, N output width, K reduction; Xb = cdiv(X, 128).

    launch_grouped_gemm_fp8(x, w, offsets, x_scale, w_scale, out_dtype, validate, out) -> out (S, N)

Needs sm_90 (TMA and e4m3 wgmma) or the CPU under Triton's interpreter. No autograd.
"""

from __future__ import annotations

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from gemmlab.device import Target, target_for
from gemmlab.kernels.moe_route import moe_tiles_kernel
from gemmlab.ops import cache
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.fp8.checks import FP8, SCALE_BLOCK
from gemmlab.ops.fp8.moe_checks import check_grouped_fp8_args
from gemmlab.ops.fp8.moe_config import (
    MoEFp8Config,
    check_weights_tma,
    fp8_grouped_spec,
    moe_fp8_config,
    need_tma,
)
from gemmlab.ops.fp8.quantize import launch_quantize_fp8
from gemmlab.ops.layout import overlap, tma_ok
from gemmlab.ops.moe.checks import device_check
from gemmlab.ops.moe.config import Mode
from gemmlab.ops.moe.grouped import w2d
from gemmlab.ops.moe.plan import launch_moe_forward_fp8

KEPT = cache.bounded("moe_fp8.kept")  # kept compiled kernels, per specialization (gemmlab.ops.launch.start)


def launch_fp8_grouped(
    mode: Mode,
    a: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out: torch.Tensor,
    scale: torch.Tensor | None,
    offsets: torch.Tensor,
    tile_offsets: torch.Tensor,
    n: int,
    cfg: MoEFp8Config,
    target: Target,
    rows_bound: int,
) -> None:
    """One persistent launch of ``moe_fp8_grouped_kernel`` over every expert's tiles: a (S, K) e4m3 with a_scale
    (S, Kb); w (E, N_w, K) e4m3 with w_scale (E, cdiv(N_w, 128), Kb); out (S, n)."""
    e, k = offsets.numel(), a.shape[1]
    w_rows = w2d(w)
    slot, a_desc, w_desc = fp8_grouped_spec(mode, a, w_rows, e, n, cfg, target, rows_bound)
    args = [
        TensorDescriptor(a, *a_desc),
        a_scale,
        TensorDescriptor(w_rows, *w_desc),
        w_scale.contiguous(),
        out,
        out if scale is None else scale,
        offsets,
        tile_offsets,
        n,
        k,
        e,
        a_scale.stride(0),
        out.stride(0),
    ]
    kept_launch.start(KEPT, slot.kernel, slot.grid, args, slot.consts, slot.opts)


def launch_grouped_gemm_fp8(x, w, offsets, x_scale, w_scale, out_dtype, validate, out=None) -> torch.Tensor:
    """``grouped_gemm_fp8``'s launcher: checks, quantizes x when it is bf16/fp16, plans the tiles, launches."""
    s, k, e, n = check_grouped_fp8_args(x, w, offsets, x_scale, w_scale, out_dtype, out)
    if out is None:
        out = torch.empty((s, n), dtype=out_dtype, device=x.device)
    elif any(
        t.numel() and overlap(out, t) for t in (x, w, offsets, w_scale) + ((x_scale,) if x_scale is not None else ())
    ):
        raise ValueError("grouped_gemm_fp8: out overlaps an input; pass a fresh out")
    if e == 0 or s == 0 or n == 0:
        return out
    target = target_for(x.device)
    need_tma("grouped_gemm_fp8", target)
    check_weights_tma("grouped_gemm_fp8", w=w)
    offsets = offsets.contiguous()  # (the schedule kernel reads it densely)
    if x.dtype != FP8:
        x, x_scale = launch_quantize_fp8(x, "block", (1, SCALE_BLOCK))  # one scale per 1x128 block, on the fly
    elif k and not tma_ok(x, 1):
        raise ValueError(
            f"grouped_gemm_fp8: x (S={s}, K={k}, strides {x.stride()}) is not TMA-aligned: needs a "
            "16-byte aligned base, unit K stride and a row stride of a multiple of 16 bytes"
        )
    else:
        x_scale = x_scale.contiguous()  # (the kernel reads one scale per 1x128 block along a unit-stride row)
    cfg = moe_fp8_config(target, Mode.GROUPED, s, e, n, k)
    tile_offsets = torch.empty(e + 1, dtype=torch.int32, device=x.device)
    ok = torch.empty(1, dtype=torch.bool, device=x.device)
    kept_launch.start(
        KEPT,
        moe_tiles_kernel,
        (1,),
        [offsets, tile_offsets, ok, e, s],  # schedule + check
        dict(BLOCK_M=cfg.block_m, BLOCK_E=max(16, triton.next_power_of_2(e))),
        {},
    )
    if validate:
        device_check(ok[0], f"grouped_gemm_fp8: offsets must be non-decreasing cumulative ends within [0, S={s}]")
    if k == 0:
        out[:s].zero_() if out.numel() else None
        return out
    launch_fp8_grouped(Mode.GROUPED, x, x_scale, w, w_scale, out, None, offsets, tile_offsets, n, cfg, target, s)
    return out


__all__ = ["MoEFp8Config", "launch_fp8_grouped", "launch_grouped_gemm_fp8", "launch_moe_forward_fp8", "moe_fp8_config"]
