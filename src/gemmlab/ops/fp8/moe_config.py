"""FP8 experts' launch decisions, shared by ``grouped_gemm_fp8`` (``ops.fp8.moe_launch``) and the FP8 option of the
MoE forward's plan (``ops.moe.plan``): the config tables' choice, the sm_90 and TMA checks, and one grouped launch
of ``kernels.moe_fp8.moe_fp8_grouped_kernel`` as a ``Planned`` launch with its descriptors' layouts.

Legend: S routed rows, E experts, N output width, K reduction; Xb = cdiv(X, 128).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from gemmlab.device import Target
from gemmlab.kernels.moe_fp8 import moe_fp8_grouped_kernel
from gemmlab.ops import configs
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.fp8.checks import SCALE_BLOCK
from gemmlab.ops.layout import descriptor_layout, tma_ok
from gemmlab.ops.moe.config import Mode
from gemmlab.ops.moe.grouped import w2d


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
        configs.check_fields(
            self, pow2=("block_m", "block_n", "block_k", "num_warps"), positive=("group_m", "num_stages")
        )
        if SCALE_BLOCK % self.block_k:
            raise ValueError(
                f"MoEFp8Config: block_k {self.block_k} must divide {SCALE_BLOCK} (one scale block per K step)"
            )

    @classmethod
    def from_dict(cls, d: dict) -> MoEFp8Config:
        return configs.config_of(cls, d)


def moe_fp8_config(target: Target, mode: Mode, s: int, e: int, n: int, k: int) -> MoEFp8Config:
    """The config of a launch of ``mode`` over S routed rows in E groups, N x K weights: the first rule of the
    target's "moe_fp8" tables (``ops.configs``, path ``mode.table``) whose ranges hold them. The two MoE GEMMs of
    one call share one tile schedule: the down GEMM takes the gate/up GEMM's block_m (``ops.moe.plan``)."""
    rule = configs.pick(
        target.name,
        "moe_fp8",
        mode.table,
        MoEFp8Config.from_dict,
        "float8_e4m3fn",
        rows_per_expert=s // max(e, 1),
        rows=s,
        experts=e,
        n=n,
        k=k,
    )
    return rule.config


def need_tma(op: str, target: Target) -> None:
    if not target.has_tma:
        raise ValueError(
            f"{op}: needs sm_90 (TMA and e4m3 wgmma); {target.name} is sm_{target.capability[0]}{target.capability[1]}"
        )


def check_weights_tma(op: str, **weights: torch.Tensor) -> None:
    """Expert weights (E, N, K) that TMA can read as (E*N, K) rows: a 16-byte aligned base and row stride."""
    for name, w in weights.items():
        if w.numel() and not tma_ok(w2d(w), 1):
            raise ValueError(
                f"{op}: {name} (shape {tuple(w.shape)}, strides {w.stride()}) is not TMA-aligned: needs "
                "a 16-byte aligned base and a row stride of a multiple of 16 bytes (pass it contiguous)"
            )


def desc_layout(t: torch.Tensor, block: tuple[int, int]) -> tuple[list, list, list]:
    """(shape, strides, block) of the TMA descriptor over the rows of ``t`` (2-D, unit column stride)."""
    return descriptor_layout(t.shape, t.stride(), 1, block, t.element_size())


def fp8_grouped_spec(
    mode: Mode,
    a: torch.Tensor,
    w_rows: torch.Tensor,
    e: int,
    n: int,
    cfg: MoEFp8Config,
    target: Target,
    rows_bound: int,
) -> tuple[kept_launch.Planned, tuple, tuple]:
    """One persistent launch over every expert's tiles, for an A (S, K) e4m3 and W rows (E * N_w, K) e4m3 laid out
    like these: (the planned launch, A's descriptor layout, W's). Its runtime arguments, in order: A's descriptor,
    a_scale (S, Kb), W's descriptor, w_scale (E, cdiv(N_w, 128), Kb) contiguous, out (S, n), the per-row factor
    (MODE 2, else out), offsets, tile_offsets, n, K, E, a_scale's row stride, out's row stride."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    items_bound = (triton.cdiv(rows_bound, bm) + e) * triton.cdiv(n, bn)
    programs = max(1, min(target.num_sms, items_bound))
    log2_e = max(1, math.ceil(math.log2(max(e, 2)))) + 1
    slot = kept_launch.Planned(
        moe_fp8_grouped_kernel,
        (programs, 1, 1),
        dict(
            MODE=int(mode),
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=cfg.group_m,
            NUM_PROGRAMS=programs,
            LOG2_E=log2_e,
        ),
        dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
    )
    return slot, desc_layout(a, (bm, bk)), desc_layout(w_rows, (bn, bk))


__all__ = ["MoEFp8Config", "check_weights_tma", "desc_layout", "fp8_grouped_spec", "moe_fp8_config", "need_tma"]
