"""How the dense GEMM's work is routed and cut: the route rules, the GEMV kernel's split and limits, and the
persistent kernel's split tail. Pure arithmetic over shapes and the config tables; ``ops.gemm.planner`` asks here.

    route(target, m, n, k, dtype, tma)        the path a "route" rule names for the shape, and the rule
    gemv_split_for(cfg, m, n, k, num_sms)     the split-K of a GEMV launch
    gemv_refusal(cfg, a, b, c_strides, m, n)  why the GEMV kernel cannot take these operands (None: it can)
    tail_split_for(tiles, num_sms, k_tiles, most)   (tail tiles, pieces) of the persistent kernel's split tail

Route rules are data (``{"route": {"gemm": [rule, ...]}}`` of a config file, ``ops.configs``): ranged over m, n,
k and "tma" (1 when A and B are TMA-aligned as given, 0 when not), each naming a path. No rule matching: the
planner's own choice (split-K over TMA at M <= 256, the persistent kernel above, portable or staged operands TMA
cannot describe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gemmlab.device import Target
from gemmlab.ops import configs

ROUTABLE = ("tma_persistent", "tma_splitk", "gemv", "portable")
GEMV_PROGRAMS_PER_SM = 8  # the GEMV's split-K aims at this many programs per SM: HBM needs loads in flight
GEMV_MIN_SPLIT_STEPS = 2  # BLOCK_K steps each GEMV split keeps at least
TAIL_MIN_PIECE_STEPS = 4  # BLOCK_K steps a piece of a split tail tile keeps at least
# What one piece of a split tail costs beyond its BLOCK_K steps, in BLOCK_K steps of the tile: its fp32 partial
# written and read back through L2 by the tile's last piece, the arrival. An estimate (a 128x256 fp32 partial is
# 128 KB; each BLOCK_K step of that tile moves 48 KB of operands); sweep_dense times the tail against the tile.
TAIL_FIXUP_STEPS = 6


@dataclass(frozen=True)
class Route:
    """A route rule's config: the kernel path."""

    path: str

    @classmethod
    def from_dict(cls, d: dict) -> Route:
        if set(d) != {"path"} or d["path"] not in ROUTABLE:
            raise ValueError(f'a route\'s config is {{"path": one of {list(ROUTABLE)}}}, got {d!r}')
        return cls(d["path"])


def route(target: Target, m: int, n: int, k: int, dtype: torch.dtype, tma: bool) -> tuple[str, str] | None:
    """(path, "route <rule source>") of the first route rule that holds the shape, or None."""
    for rule in configs.rules(target.name, "route", "gemm", Route.from_dict):
        if rule.matches(str(dtype).removeprefix("torch."), {"m": m, "n": n, "k": k, "tma": int(tma)}):
            return rule.config.path, "route " + rule.source
    return None


def gemv_split_for(cfg, m: int, n: int, k: int, num_sms: int) -> int:
    """The split-K of a GEMV launch. ``cfg.split_k = 0`` (auto): the smallest power of two that puts
    GEMV_PROGRAMS_PER_SM programs on every SM while each split keeps GEMV_MIN_SPLIT_STEPS BLOCK_K steps (a decode
    GEMV streams all of B once: its speed is the loads in flight); then trimmed so no split is empty."""
    k_tiles = -(-k // cfg.block_k)
    split = cfg.split_k
    if not split:
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        split = 1
        while tiles * split < GEMV_PROGRAMS_PER_SM * num_sms and k_tiles >= 2 * split * GEMV_MIN_SPLIT_STEPS:
            split *= 2
    per_split = -(-k_tiles // max(split, 1))
    return -(-k_tiles // per_split)


def gemv_refusal(cfg, a: torch.Tensor, b: torch.Tensor, c_strides: tuple[int, int], m: int, n: int) -> str | None:
    """Why ``gemv_kernel`` cannot run this config on these kernel-view operands, or None. Its tiles: one row
    (FFMA) or 16+ rows (tensor cores), power-of-two blocks of at least 16 columns and K steps; its offsets inside
    a tile are 32-bit (block x stride < 2^31); its grid's second and third dims at most 65535."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if bm != 1 and bm < 16 or bm & (bm - 1):
        return f"block_m {bm}: the GEMV kernel takes 1 (FFMA) or a power of two >= 16 (tensor cores)"
    if min(bn, bk) < 16 or bn & (bn - 1) or bk & (bk - 1):
        return f"block_n {bn}, block_k {bk}: powers of two >= 16"
    spans = (
        bm * abs(a.stride(0)),
        bk * abs(a.stride(1)),
        bk * abs(b.stride(0)),
        bn * abs(b.stride(1)),
        bm * abs(c_strides[0]),
        bn * abs(c_strides[1]),
    )
    if max(spans) >= 2**31:
        return "a stride times its block passes 2^31 (the GEMV kernel's in-tile offsets are 32-bit)"
    if -(-n // bn) > 65535 or cfg.split_k > 65535:
        return f"N {n} in {bn}-wide tiles, or split {cfg.split_k}: more than 65535 programs along a grid dim"
    return None


def tail_split_for(tiles: int, num_sms: int, k_tiles: int, most: int) -> tuple[int, int]:
    """(tail tiles, pieces per tail tile) of the persistent kernel's split tail, or (0, 0) for none.

    The tail is the partial last wave (tiles mod num_sms, or every tile when there are fewer than num_sms). Cut
    into s pieces of K, its tiles * s pieces run in ceil(tail * s / num_sms) rounds of ceil(k_tiles / s) steps,
    each piece TAIL_FIXUP_STEPS more for its partial; s = 1 is the tail as one more wave of whole tiles. The
    pieces s <= ``most`` (``GemmConfig.tail_split``) that keep TAIL_MIN_PIECE_STEPS steps each are weighed and
    the quickest kept (the fewest pieces on a tie)."""
    if most < 2 or tiles <= 0:
        return 0, 0
    tail = tiles % num_sms if tiles >= num_sms else tiles
    if tail == 0:
        return 0, 0
    best_s, best = 1, k_tiles
    for s in range(2, most + 1):
        per = -(-k_tiles // s)
        if per < TAIL_MIN_PIECE_STEPS:
            break
        t = -(-tail * s // num_sms) * (per + TAIL_FIXUP_STEPS)
        if t < best:
            best_s, best = s, t
    return (tail, best_s) if best_s > 1 else (0, 0)
