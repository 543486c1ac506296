"""Config spaces as data, and the pruning that rejects a config before anything is compiled.

SPACE[path] = {field: [values]}                 every config field the tuner may change, per GEMM
                                                path and per MoE mode (grouped, gate_up, down)
neighbours(config, path) -> [config]            one field changed at a time (the loop's discipline)
sample(path, rng, base) -> config               a random point, once no neighbour wins
prune(config, path, m, n, k, elt, smem) -> reason or None                    (GemmConfig)
prune_moe(config, mode, rows_per_expert, n, k, elt, smem) -> reason or None  (MoEConfig)
"""

from __future__ import annotations

import dataclasses
import os

from gemmlab.device import SM90_SMEM_BYTES
from gemmlab.ops.gemm import GemmConfig

SPACE: dict[str, dict[str, list]] = {
    "tma_persistent": {
        "block_m": [64, 128, 256],
        "block_n": [64, 128, 256],
        "block_k": [32, 64, 128],
        "group_m": [4, 8, 16],
        "num_warps": [4, 8],
        "num_stages": [2, 3, 4, 5],
        "epilogue_subtile": [False, True],
        "warp_specialize": [False, True],
        "max_nreg": [0, 168, 232],
        "tail_split": [0, 4, 8],
    },
    "tma_splitk": {
        "block_m": [16, 64, 128],
        "block_n": [32, 64, 128, 256],
        "block_k": [64, 128, 256],
        "num_warps": [4, 8],
        "num_stages": [3, 4, 5, 6],
        "split_k": [0, 1, 2, 4, 8, 16],
        "epilogue_subtile": [False, True],
        "max_nreg": [0, 168],
    },
    "gemv": {  # block_m 1: FFMA one-row tiles; 16 and 64: tensor cores
        "block_m": [1, 16, 64],
        "block_n": [16, 32, 64, 128],
        "block_k": [64, 128, 256, 512],
        "num_warps": [2, 4, 8],
        "num_stages": [1, 2, 3],
        "split_k": [0, 1, 2, 4, 8, 16],
    },
    "portable": {
        "block_m": [64, 128],
        "block_n": [64, 128, 256],
        "block_k": [32, 64],
        "group_m": [8],
        "num_warps": [4, 8],
        "num_stages": [2, 3, 4],
        "max_nreg": [0],
    },
}
_MOE = {
    "block_m": [16, 32, 64, 128],
    "block_n": [64, 128, 256],
    "block_k": [32, 64, 128],
    "num_warps": [4, 8],
    "num_stages": [2, 3, 4, 5],
    "group_m": [1, 4, 8, 16],
    "clip": [False, True],
    "out_tma": [False, True],
}
SPACE["grouped"] = SPACE["gate_up"] = dict(_MOE)
SPACE["down"] = {key: v for key, v in _MOE.items() if key != "block_m"}  # BLOCK_M is the gate/up GEMM's

SMEM_BYTES = SM90_SMEM_BYTES  # H100/H200 (sm_90) opt-in shared memory per block; the device's own value when known
MAX_ACC_REGS = 192  # fp32 accumulator registers per thread above which a tile spills on sm_90


def neighbours(cfg: GemmConfig, path: str) -> list[GemmConfig]:
    """Every config that differs from ``cfg`` in exactly one field of the path's space."""
    out = []
    for name, values in SPACE[path].items():
        for v in values:
            if getattr(cfg, name) != v:
                out.append(dataclasses.replace(cfg, **{name: v}))
    return out


def sample(path: str, rng, base: GemmConfig) -> GemmConfig:
    """A random point of the path's space (fields outside the space keep ``base``'s values)."""
    return dataclasses.replace(base, **{name: rng.choice(values) for name, values in SPACE[path].items()})


def key(cfg: GemmConfig) -> str:
    """A stable text key of a config (ledger lookups when resuming)."""
    return ",".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))


def prune(cfg: GemmConfig, path: str, m: int, n: int, k: int, elt: int = 2, smem: int = SMEM_BYTES) -> str | None:
    """Why ``cfg`` cannot run (or cannot be worth running) at this shape, before compiling; None if it may."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if path == "gemv":  # pointer loads, no shared-memory ring to size; registers: the one-row tile's fp32 products
        if bm == 1 and bk * bn // (32 * cfg.num_warps) > MAX_ACC_REGS:
            return f"one-row tile {bk}x{bn} keeps {bk * bn // (32 * cfg.num_warps)} fp32 products per thread"
        if bm > max(16, 1 << (max(m, 1) - 1).bit_length()):
            return f"block_m {bm} is more than twice M = {m}: wasted rows"
        if bm == 1 and m > 4:
            return f"one-row tiles for M = {m}: each row reads all of B"
        k_tiles = -(-k // bk)
        if cfg.split_k and cfg.split_k > k_tiles:
            return f"split_k {cfg.split_k} > {k_tiles} K tiles: empty splits"
        return None
    if path in ("tma_persistent", "tma_splitk"):
        for name, d in (("block_m", bm), ("block_n", bn), ("block_k", bk)):
            if d > 256:
                return f"TMA box dims are at most 256 ({name} = {d})"
        if bk * elt < 16 or (bn // (2 if cfg.epilogue_subtile else 1)) * elt < 16:
            return "TMA needs boxes whose inner dimension spans at least 16 bytes"
    stages = max(cfg.num_stages - (1 if path == "portable" else 0), 1)
    need = stages * (bm * bk + bk * bn) * elt
    if path != "portable":
        need += bm * (bn // 2 if cfg.epilogue_subtile else bn) * elt  # C staging for the TMA store
    if need > smem:
        return f"shared memory: {need} bytes for {cfg.num_stages} stages > {smem}"
    acc = bm * bn // (32 * cfg.num_warps)
    if acc > MAX_ACC_REGS:
        return f"accumulator needs {acc} registers per thread (> {MAX_ACC_REGS}): it would spill"
    if cfg.max_nreg and cfg.max_nreg < acc + 40:
        return f"maxnreg {cfg.max_nreg} leaves too few registers beyond the {acc}-register accumulator"
    if path == "tma_persistent":
        if cfg.warp_specialize and not os.environ.get("GEMMLAB_ALLOW_WS"):
            return "warp specialization hung on the H200 with Triton 3.6 (set GEMMLAB_ALLOW_WS=1 to try)"
        if cfg.split_k != 1:
            return "the persistent kernel does not split K"
    if path == "tma_splitk":
        k_tiles = -(-k // bk)
        if cfg.split_k and cfg.split_k > k_tiles:
            return f"split_k {cfg.split_k} > {k_tiles} K tiles: empty splits"
        if bm > max(16, 1 << (max(m, 1) - 1).bit_length()):
            return f"block_m {bm} is more than twice M = {m}: wasted rows"
    if path != "tma_splitk" and bm >= 2 * max(m, 16) and bm > 64:
        return f"block_m {bm} is more than twice M = {m}: wasted rows"
    return None


def prune_moe(cfg, mode: str, rows_per_expert: int, n: int, k: int, elt: int = 2, smem: int = SMEM_BYTES) -> str | None:
    """Why a grouped-kernel config (``ops.moe.MoEConfig``) cannot run, or cannot be worth running, for
    ``mode`` with groups of ``rows_per_expert`` rows on average; None if it may."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    for name, d in (("block_m", bm), ("block_n", bn), ("block_k", bk)):
        if d > 256:
            return f"TMA box dims are at most 256 ({name} = {d})"
    if bk * elt < 16 or (bn // 2) * elt < 16:
        return "TMA needs boxes whose inner dimension spans at least 16 bytes"
    w_tiles = 2 if mode == "gate_up" else 1  # gate and up tiles side by side
    need = cfg.num_stages * (bm + w_tiles * bn) * bk * elt + bm * bn // 2 * elt  # stages + TMA-store staging
    if need > smem - 1024:
        return f"shared memory: {need} bytes for {cfg.num_stages} stages > {smem - 1024}"
    acc = w_tiles * bm * bn // (32 * cfg.num_warps)
    if acc > MAX_ACC_REGS:
        return f"accumulator needs {acc} registers per thread (> {MAX_ACC_REGS}): it would spill"
    if mode != "down" and bm > 2 * (1 << (max(rows_per_expert, 16) - 1).bit_length()):
        return (
            f"block_m {bm} is more than twice the {rows_per_expert} rows an expert gets on average (rounded "
            "up to a power of two): wasted rows"
        )
    if n and bn > 2 * max(n, 32):
        return f"block_n {bn} is more than twice N = {n}: wasted columns"
    return None
