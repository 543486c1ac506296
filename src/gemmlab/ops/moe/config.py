"""The grouped kernel's config: ``MoEConfig``, its ``Mode``s, and the choice from the "moe" config tables.

moe_choice(target, rows, experts, mode, elt, dtype=, n=, k=, max_group=) -> (MoEConfig, where it came from)
moe_config(...)                                                         -> MoEConfig
fit_stages(cfg, mode, elt, smem_bytes)     pipeline stages trimmed to fit shared memory
backward_config(target, rows, experts, dtype=, n=, k=) -> MoEBackwardConfig   the fused backward's tiles, and
saves_gate_up(x, dims)                     whether moe_forward under autograd keeps gate/up for it
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, fields, replace

import torch

from gemmlab.device import SM90_SMEM_BYTES, Target, target_for
from gemmlab.ops import configs


class Mode(enum.IntEnum):
    """The grouped kernel's MODE (its epilogue); ``table`` names its path in the "moe" config tables."""

    GROUPED = 0  # a plain grouped GEMM: out = rows of group e @ w[e]^T
    GATE_UP = 1  # the first MoE GEMM: SiLU(x W_gate^T) * (x W_up^T) in the epilogue (N = I)
    DOWN = 2  # the second MoE GEMM: each row's top-k weight applied in the epilogue

    @property
    def table(self) -> str:
        return self.name.lower()


MODES = tuple(m.table for m in Mode)  # ("grouped", "gate_up", "down"): the paths of the "moe" config tables


@dataclass(frozen=True)
class MoEConfig:
    """Launch parameters of the grouped kernel."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 8  # m-tiles of one expert that walk the n-tiles together (W tiles shared in L2)
    clip: bool = False  # per-tile descriptors ending at the group's end: zeros past it, TMA-stored output
    out_tma: bool = True  # full tiles TMA-stored through a host descriptor (partial ones: masked stores)
    # persistent programs per SM: > 1 keeps several resident (more weight bytes in flight, one program's
    # prologue and epilogue under another's K loop; stages trimmed to fit shared memory / programs_per_sm)
    programs_per_sm: int = 1

    def __post_init__(self):
        if (
            isinstance(self.programs_per_sm, bool)
            or not isinstance(self.programs_per_sm, int)
            or self.programs_per_sm < 1
        ):
            raise ValueError(f"MoEConfig: programs_per_sm must be an integer >= 1, got {self.programs_per_sm!r}")
        configs.check_fields(
            self, pow2=("block_m", "block_n", "block_k", "num_warps"), positive=("num_stages", "group_m")
        )

    @classmethod
    def from_dict(cls, d: dict) -> MoEConfig:
        return configs.config_of(cls, d)


def moe_choice(
    target: Target,
    rows: int,
    experts: int,
    mode: int,
    elt: int = 2,
    *,
    dtype: torch.dtype | None = None,
    n: int = 0,
    k: int = 0,
    max_group: int = 0,
) -> tuple[MoEConfig, str]:
    """The grouped kernel's config for ``rows`` routed rows over ``experts`` experts in ``mode`` (a ``Mode``;
    output width ``n``, reduction ``k``), and which file and rule it came from: the first rule of the target's
    "moe" tables (the user's file, then the bundled one; ``ops.configs``) whose ranges hold rows_per_expert =
    ceil(rows / experts used), group_bound = min(rows, max_group) (``max_group``: an upper bound on the rows of
    the largest group known on the host, 0 for none; ``moe_forward`` passes T, as a token's k slots name k
    distinct experts; the group sizes themselves stay on the device), rows, experts, n, k (and ``dtype``: rules
    naming one match only it). Pipeline stages are then trimmed to fit the target's shared memory. How the bundled
    H200 choices were made: docs/history.md."""
    used = max(1, min(experts, rows))
    dname = str(dtype).removeprefix("torch.") if dtype is not None else ""
    bound = min(rows, max_group) if max_group > 0 else rows
    rule = configs.pick(
        target.name,
        "moe",
        Mode(mode).table,
        MoEConfig.from_dict,
        dname,
        rows_per_expert=-(-rows // used),
        group_bound=bound,
        rows=rows,
        experts=experts,
        n=n,
        k=k,
    )
    return fit_stages(rule.config, mode, elt, target.smem_bytes), "config " + rule.source


@functools.lru_cache(maxsize=256)
def fit_stages(cfg: MoEConfig, mode: int, elt: int, smem_bytes: int = SM90_SMEM_BYTES) -> MoEConfig:
    """``cfg`` with its pipeline stages trimmed (not below 2) until ``programs_per_sm`` programs fit in
    ``smem_bytes`` of shared memory."""
    w_tiles = 2 if mode == Mode.GATE_UP else 1
    staging = cfg.block_m * cfg.block_n // 2 * elt  # the TMA store's buffer (half a tile)
    stages = cfg.num_stages
    budget = smem_bytes // cfg.programs_per_sm - 1024
    while stages > 2 and stages * (cfg.block_m + w_tiles * cfg.block_n) * cfg.block_k * elt + staging > budget:
        stages -= 1
    return replace(cfg, num_stages=stages) if stages != cfg.num_stages else cfg


def moe_config(
    target: Target,
    rows: int,
    experts: int,
    mode: int,
    elt: int = 2,
    *,
    dtype: torch.dtype | None = None,
    n: int = 0,
    k: int = 0,
    max_group: int = 0,
) -> MoEConfig:
    """``moe_choice``'s config."""
    return moe_choice(target, rows, experts, mode, elt, dtype=dtype, n=n, k=k, max_group=max_group)[0]


@dataclass(frozen=True)
class MoEBackwardConfig:
    """Launch parameters of the backward kernels (``dh``: kernel 1, ``dx``: kernel 3, ``wg``: 2 and 5; the dh and
    dx kernels share one tile schedule, so one BLOCK_M), and ``save_gate_up``: whether ``moe_forward`` under
    autograd keeps the gate/up pre-activations (S, 2I) for the backward (``ops.moe.plan.launch_forward_saving``)
    instead of the backward recomputing them. Chosen per call from the "moe_backward" config tables
    (``backward_config``)."""

    block_m: int = 128
    group_m: int = 8
    dh_block_n: int = 64
    dh_block_k: int = 64
    dh_warps: int = 8
    dh_stages: int = 3
    dx_block_n: int = 128
    dx_block_k: int = 64
    dx_warps: int = 8
    dx_stages: int = 3
    wg_block_m: int = 128
    wg_block_n: int = 128
    wg_block_k: int = 32
    wg_warps: int = 8
    wg_stages: int = 3
    save_gate_up: bool = True

    def __post_init__(self) -> None:
        configs.check_fields(
            self,
            pow2=(
                "block_m",
                "dh_block_n",
                "dh_block_k",
                "dh_warps",
                "dx_block_n",
                "dx_block_k",
                "dx_warps",
                "wg_block_m",
                "wg_block_n",
                "wg_block_k",
                "wg_warps",
            ),
            positive=("group_m", "dh_stages", "dx_stages", "wg_stages"),
        )

    @classmethod
    def from_dict(cls, d: dict) -> MoEBackwardConfig:
        known = {f.name for f in fields(cls)}
        if set(d) - known:
            raise ValueError(f"unknown MoEBackwardConfig keys {sorted(set(d) - known)}; known: {sorted(known)}")
        bad = [
            k
            for k, v in d.items()
            if type(v) is not (bool if k == "save_gate_up" else int) or (k != "save_gate_up" and v < 1)
        ]
        if bad:
            raise ValueError(f"MoEBackwardConfig: {bad[0]} = {d[bad[0]]!r} (integers >= 1; save_gate_up a bool)")
        return cls(**d)


def backward_config(
    target: Target, rows: int, experts: int, *, dtype: torch.dtype | None = None, n: int = 0, k: int = 0
) -> MoEBackwardConfig:
    """The backward's config for ``rows`` routed rows over ``experts`` experts (``n`` = I, ``k`` = H): the first
    rule of the target's "moe_backward" tables (the user's file, then the bundled one; ``ops.configs``) whose
    ranges hold rows_per_expert = ceil(rows / experts used), rows, experts, n and k (and ``dtype``: rules naming
    one match only it)."""
    used = max(1, min(experts, rows))
    dname = str(dtype).removeprefix("torch.") if dtype is not None else ""
    return configs.pick(
        target.name,
        "moe_backward",
        "fused",
        MoEBackwardConfig.from_dict,
        dname,
        rows_per_expert=-(-rows // used),
        rows=rows,
        experts=experts,
        n=n,
        k=k,
    ).config


def saves_gate_up(x: torch.Tensor, dims: tuple[int, int, int, int, int]) -> bool:
    """Whether ``moe_forward`` under autograd keeps gate/up for the backward, per the tables, for checked
    arguments (``dims`` = check_moe_args' (T, H, I, E, k)) on x's device. While torch.compile traces (sizes may
    be symbolic; the tables are not traceable): the default config's answer."""
    if torch.compiler.is_compiling():
        return MoEBackwardConfig.save_gate_up
    t, h, i, e, k = dims
    return backward_config(target_for(x.device), t * k, e, dtype=x.dtype, n=i, k=h).save_gate_up
