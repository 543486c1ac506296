"""FP8 dense GEMM's decode path (small M): its config, when the planner takes it, its split-K and its launch
arguments. The kernel is ``kernels.gemv_fp8.gemv_fp8_kernel`` (pointer loads, split-K, FFMA or tensor cores).

    C (M, N) = (A * a_scale) @ (B * b_scale)     A (M, K), B (K, N) e4m3; the scales as ``ops.fp8.plan`` says

The path is data: the "decode" rules of the "gemm_fp8" section of a target's config table (``ops.configs``), ranged
over m, n, k and scale like the "tma" rules. A call whose shape a decode rule holds runs the decode kernel with that
rule's config; no rule holding it: the persistent TMA kernel. ``plan_fp8(config=Fp8DecodeConfig(...))`` pins it.

Split-K (``split_k = 0``: from the shape): the smallest power of two that puts ``waves`` programs on every SM, kept
while each split has ``min_steps`` BLOCK_K steps and the split's workspace traffic stays within ``scratch_share`` of
B's bytes, then trimmed so no split is empty. A decode GEMM streams all of B once; its speed is the loads in flight,
which are the programs in flight. The workspace traffic is each split's fp32 partial tile written and read back once,
8 * split * cdiv(M, BLOCK_M) * BLOCK_M * N bytes against B's N * K: nothing at M = 1, as much as B itself at M = 64,
K = 7168 and 14 splits, so it bounds the split where M is large next to K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gemmlab.device import Target
from gemmlab.ops import configs
from gemmlab.ops.fp8.checks import SCALE_BLOCK


@dataclass(frozen=True)
class Fp8DecodeConfig:
    """Launch parameters of the FP8 decode kernel: tiles (``block_m`` 1 for FFMA on one row, else a power of two
    >= 16 for tensor cores), ``split_k`` (0: from the shape, aiming at ``waves`` programs per SM while each split
    keeps ``min_steps`` BLOCK_K steps and its fp32 partials' traffic at most ``scratch_share`` of B's bytes), warps and
    software-pipeline stages."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 128
    split_k: int = 0
    waves: int = 4
    min_steps: int = 1
    scratch_share: float = 0.5
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        configs.check_fields(
            self,
            pow2=("block_m", "block_n", "block_k", "num_warps"),
            positive=("waves", "min_steps", "num_stages"),
            nonneg=("split_k",),
        )
        if self.block_m != 1 and self.block_m < 16:
            raise ValueError(f"Fp8DecodeConfig: block_m {self.block_m}: 1 (FFMA) or a power of two >= 16 (tensor core)")
        if isinstance(self.scratch_share, bool) or not isinstance(self.scratch_share, (int, float)):
            raise TypeError(f"Fp8DecodeConfig: scratch_share must be a number, got {self.scratch_share!r}")
        if not self.scratch_share >= 0:
            raise ValueError(f"Fp8DecodeConfig: scratch_share must be >= 0, got {self.scratch_share}")
        if min(self.block_n, self.block_k) < 16:
            raise ValueError(f"Fp8DecodeConfig: block_n {self.block_n}, block_k {self.block_k}: at least 16")

    @classmethod
    def from_dict(cls, d: dict) -> Fp8DecodeConfig:
        return configs.config_of(cls, d)


def decode_rule(target: Target, m: int, n: int, k: int, mode: int) -> configs.Rule | None:
    """The first "decode" rule of the target's tables that holds the shape, or None (the TMA path)."""
    for rule in configs.rules(target.name, "gemm_fp8", "decode", Fp8DecodeConfig.from_dict):
        if rule.matches("float8_e4m3fn", {"m": m, "n": n, "k": k, "scale": mode}):
            return rule
    return None


def decode_split(cfg: Fp8DecodeConfig, m: int, n: int, k: int, num_sms: int) -> int:
    """The split-K of a decode launch (the module docstring's rule); a pinned ``split_k`` trimmed so no split is
    empty."""
    k_tiles = -(-k // cfg.block_k)
    split = cfg.split_k
    if not split:
        rows = -(-m // cfg.block_m)
        tiles = rows * -(-n // cfg.block_n)
        split = 1
        while (
            tiles * split < cfg.waves * num_sms
            and k_tiles >= 2 * split * cfg.min_steps
            and 8 * 2 * split * rows * cfg.block_m <= cfg.scratch_share * k  # (both sides per column of B)
        ):
            split *= 2
    per_split = -(-k_tiles // max(split, 1))
    return -(-k_tiles // per_split)


def decode_refusal(
    cfg: Fp8DecodeConfig, mode: int, a: torch.Tensor, b: torch.Tensor, c_strides: tuple[int, int], n: int
) -> str | None:
    """Why the decode kernel cannot run ``cfg`` on these operands, or None. Block scales need block_k and block_n
    dividing 128 (a step inside one scale block, a tile inside one column block of B); the in-tile offsets are 32-bit
    (block x stride < 2^31); the grid's second and third dims at most 65535."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if mode == 2 and (SCALE_BLOCK % bk or SCALE_BLOCK % bn):
        return f"block scales need block_k and block_n dividing {SCALE_BLOCK}, config has {bk} and {bn}"
    spans = (  # the largest in-tile offset of a, b and C
        bm * abs(a.stride(0)) + bk,
        bk * abs(b.stride(0)) + bn * abs(b.stride(1)),
        bm * abs(c_strides[0]) + bn * abs(c_strides[1]),
    )
    if max(spans) >= 2**31:
        return "a stride times its block passes 2^31 (the decode kernel's in-tile offsets are 32-bit)"
    if -(-n // bn) > 65535 or cfg.split_k > 65535:
        return f"N {n} in {bn}-wide tiles, or split {cfg.split_k}: more than 65535 programs along a grid dim"
    return None


def decode_grid(cfg: Fp8DecodeConfig, m: int, n: int) -> tuple[int, int, int]:
    return (-(-m // cfg.block_m), -(-n // cfg.block_n), cfg.split_k)


def decode_scratch(cfg: Fp8DecodeConfig, m: int, n: int) -> tuple[int, int]:
    """(workspace fp32 elements, arrival counters) of a launch; (0, 0) without split-K."""
    gm, gn, split = decode_grid(cfg, m, n)
    return (split * gm * gn * cfg.block_m * cfg.block_n, gm * gn) if split > 1 else (0, 0)


def decode_ints(cfg: Fp8DecodeConfig, a, b, c_strides: tuple[int, int], sa_strides: tuple, sb_strides: tuple) -> tuple:
    """The kernel's integer arguments: M, N, K, the strides of a, b, C and the scales, and BLOCK_K steps per split."""
    (m, k), n = a.shape, b.shape[1]
    k_tiles = -(-k // cfg.block_k)
    per_split = -(-k_tiles // cfg.split_k)
    return (m, n, k, a.stride(0), *b.stride(), *c_strides, *sa_strides, *sb_strides, per_split)


def constexprs_decode(mode: int, cfg: Fp8DecodeConfig) -> dict:
    return dict(SCALE=mode, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k)


__all__ = [
    "Fp8DecodeConfig",
    "constexprs_decode",
    "decode_grid",
    "decode_ints",
    "decode_refusal",
    "decode_rule",
    "decode_scratch",
    "decode_split",
]
