"""The GEMM planner: which kernel path, which config and which launch ``gemm`` runs for given operands.

``choose`` is pure and cheap (no allocation, no launch): it reads shapes, strides, dtype, device and the
config table, and returns a frozen ``Plan`` that holds every decision of the call, its launch included
(``LaunchSpec``: grid, descriptor layouts, integer arguments, constexprs, options, scratch and staging
sizes; made by ``ops.gemm.spec``). The launcher (``ops.gemm.launch``) only reads it.

Paths (``paths()``):
    empty           M, N or K is 0: nothing to multiply (C is empty, or zeros when K = 0)
    tma_persistent  Hopper fast path: persistent grid, TMA descriptors, grouped tile order, wgmma
    tma_splitk      small M (<= SMALL_M): small tiles, K split across programs, deterministic reduction
    gemv            few rows (decode): pointer loads at any alignment, FFMA or HMMA, split-K (kernels.gemv)
    portable        pointer loads with masks: any alignment, any layout, any GPU, the CPU interpreter

Which path: the one pinned by the caller (``path``), else the first "route" rule of the config tables that holds
the shape (``ops.gemm.route``: data measured per GPU), else M <= SMALL_M split-K over TMA and the persistent
kernel above, with operands TMA cannot describe staged or sent to the portable kernel as below.

Staging (``Plan.staged``): when A or B cannot be described by TMA (an odd K or N makes the leading stride
not a multiple of 16 bytes; a misaligned base; a broadcast stride 0) but copying it is cheap next to the
GEMM, the launcher copies it into a fresh buffer with 16-byte-aligned rows (same values, same layout) and runs
tma_persistent or tma_splitk on the copy. The descriptor keeps the logical shape, so TMA zero-fills past K
(or N) and the pad columns are never read (no memset). ``staging_decision`` (``ops.gemm.staging``) is the cost rule; its
constants are data (the "staging" object of the config file). A C that TMA cannot describe is stored through masked
pointers, or, with ``GemmConfig.stage_c``, by TMA into an aligned scratch C copied out after the kernel.

Config tables are data: the "gemm" section of ``<gpu-slug>.json`` ("interpreter" under TRITON_INTERPRET=1),
the user's file (``$GEMMLAB_HOME/configs/``, written by ``gemmlab tune``) tried before the bundled one
(``configs/``, ``configs/default.json`` for GPUs without one); ``ops.configs`` says how. Each path maps to
a list of rules ``{"m": [lo, hi], "n": [lo, hi], "k": [lo, hi], "dtype": "float16", "config": {...}}``;
every key but ``config`` is optional, bounds are inclusive, the first matching rule wins. ``Plan.reason``
names the file and rule its config came from.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import torch

from gemmlab.device import Target, target_for
from gemmlab.ops import configs
from gemmlab.ops.gemm.route import ROUTABLE, gemv_refusal, gemv_split_for, route, tail_split_for
from gemmlab.ops.gemm.spec import LaunchSpec, launch_spec
from gemmlab.ops.gemm.staging import staging_decision
from gemmlab.ops.layout import is_kmajor, tma_ok

PATHS = ("empty", "tma_persistent", "tma_splitk", "gemv", "portable")
SMALL_M = 256  # at or below this many output rows the small-M path is chosen
PINNED = "config given by the caller"


@dataclass(frozen=True)
class GemmConfig:
    """Launch parameters of one kernel path. ``split_k = 0`` means "choose from the shape" (tma_splitk, gemv).
    ``tail_split`` (tma_persistent): at most this many K pieces per tile of the partial last wave, the number
    chosen from the shape (``ops.gemm.route.tail_split_for``; a plan holds the number chosen, 0 for none).
    ``stage_c`` only acts where C's stride or base rules out a TMA store: C then goes out through TMA into a
    16-byte-aligned scratch C and one copy into the caller's C (M N elements read and written once more),
    instead of masked pointer stores (which spill registers at 128x256 tiles)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    epilogue_subtile: bool = False
    warp_specialize: bool = False
    max_nreg: int = 0  # Triton's maxnreg compile option (registers per thread); 0: the compiler's choice
    stage_c: bool = False  # TMA paths, C not TMA-aligned: TMA-store into an aligned copy, then copy into C
    stream_k: bool = False  # tma_persistent: data-parallel + stream-K hybrid for the last waves (stream_k_tiles)
    tail_split: int = 0  # tma_persistent: data-parallel waves + the partial last wave split in K (< 2: off)

    def __post_init__(self) -> None:
        configs.check_fields(
            self,
            pow2=("block_m", "block_n", "block_k", "num_warps"),
            positive=("group_m", "num_stages"),
            nonneg=("split_k", "max_nreg", "tail_split"),
        )

    @classmethod
    def from_dict(cls, d: dict) -> GemmConfig:
        return configs.config_of(cls, d)


@dataclass(frozen=True)
class Plan:
    """What ``gemm`` will run. ``m, n, k`` and the operand majors are as the kernel sees them: with
    ``swap_ab`` (column-major C) the kernel computes C^T = B^T A^T, so m is the caller's N."""

    path: str
    config: GemmConfig | None
    reason: str
    m: int
    n: int
    k: int
    dtype: torch.dtype
    swap_ab: bool = False
    a_kmajor: bool = True
    b_kmajor: bool = False
    c_tma: bool = False
    num_sms: int = 0
    staged: tuple[str, ...] = ()  # kernel-view operands ("a", "b") copied into 16-byte-aligned buffers first;
    # "c": C written into an aligned scratch C by TMA, then copied out (GemmConfig.stage_c)
    launch: LaunchSpec | None = field(default=None, repr=False)  # None: the "empty" path launches nothing


def paths() -> tuple[str, ...]:
    """Every path the dispatcher can take."""
    return PATHS


def _pick(target: Target, path: str, m: int, n: int, k: int, dtype: torch.dtype) -> tuple[GemmConfig, str]:
    """The config of the first rule for ``path`` (the user's file, then the bundled one) whose ranges hold
    m, n, k and whose dtype fits, and where it came from."""
    rule = configs.pick(
        target.name, "gemm", path, GemmConfig.from_dict, str(dtype).removeprefix("torch."), m=m, n=n, k=k
    )
    return rule.config, "config " + rule.source


def split_k_for(cfg: GemmConfig, m: int, n: int, k: int, num_sms: int) -> int:
    """The split a tma_splitk launch uses. ``cfg.split_k = 0`` (auto): the smallest power of two that gives
    at least one program per two SMs while every split keeps at least 4 BLOCK_K steps (below that the
    reduction costs more than the parallelism buys: docs/history.md). Then trimmed so no split is empty."""
    k_tiles = -(-k // cfg.block_k)
    split = cfg.split_k
    if not split:
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        split = 1
        while 2 * tiles * split < num_sms and k_tiles >= 2 * split * 4:
            split *= 2
    per_split = -(-k_tiles // split)
    return -(-k_tiles // per_split)


def _stage_c(cfg: GemmConfig, common: dict, c_note: str) -> str:
    """Apply ``cfg.stage_c`` to a TMA plan's fields: a C TMA cannot store to goes through an aligned copy."""
    if not cfg.stage_c or common["c_tma"]:
        return c_note
    common.update(c_tma=True, staged=(*common.get("staged", ()), "c"))
    return c_note.replace(
        "C stored with masked pointers (its stride is not 16-byte aligned)",
        "C not TMA-aligned: stored by TMA into an aligned copy, then copied into C (stage_c)",
    )


def choose(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    swap_ab: bool,
    config: GemmConfig | None = None,
    target: Target | None = None,
    stage: bool | None = None,
    path: str | None = None,
) -> Plan:
    """Plan for the kernel-view problem C (M, N) row-major = a (M, K) @ b (K, N); operands validated,
    ``c`` is None when ``gemm`` will allocate a contiguous C. ``config`` pins the config (else the table's);
    ``target`` overrides the operands' device (the inspector plans for an H200 from "meta" tensors);
    ``stage`` pins the staging decision for operands TMA cannot describe (None: ``staging_decision``'s rule);
    ``path`` pins the kernel path (None: the route rules, then the planner's own choice).
    Steps: (1) the path, config and layout decisions (``decide``), (2) the launch they make (``launch_spec``)."""
    p = decide(a, b, c, swap_ab, config, target, stage, path)
    if (
        config is not None
        and p.path in ("portable", "tma_persistent", "tma_splitk")
        and min(config.block_m, config.block_n, config.block_k) < 16
    ):  # (the GEMV kernel's own rule: gemv_refusal)
        raise ValueError(
            f"plan: the {p.path} kernel needs block_m, block_n and block_k >= 16 (tl.dot's smallest "
            f"tile), config has {config.block_m}, {config.block_n}, {config.block_k}"
        )
    return p if p.path == "empty" else dataclasses.replace(p, launch=launch_spec(p, a, b, c))


def decide(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    swap_ab: bool,
    config: GemmConfig | None = None,
    target: Target | None = None,
    stage: bool | None = None,
    path: str | None = None,
) -> Plan:
    """``choose``'s step 1: the path, the config and the operand layouts (a Plan without its launch). Steps:
    (1) empty problems; (2) the path wanted: pinned, routed by a rule, or none; (3) the GEMV kernel or the
    portable one when wanted; (4) else TMA: operands it cannot describe staged where the cost rule says so (a
    TMA path pinned for operands left unstaged is an error), else the portable kernel."""
    if path is not None and path not in ROUTABLE:
        raise ValueError(f"path {path!r}: one of {list(ROUTABLE)}")
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"plan: config must be a GemmConfig (or None), got {type(config).__name__} {config!r:.40}")
    if stage is not None and not isinstance(stage, bool):
        raise TypeError(f"plan: stage must be True, False or None, got {stage!r:.40}")
    m, k = a.shape
    n = b.shape[1]
    a_kmajor = bool(is_kmajor(a, 1))
    b_kmajor = bool(is_kmajor(b, 0))
    common = dict(m=m, n=n, k=k, dtype=a.dtype, swap_ab=swap_ab, a_kmajor=a_kmajor, b_kmajor=b_kmajor)
    if m == 0 or n == 0 or k == 0:
        return Plan("empty", None, f"M={m} N={n} K={k}: nothing to multiply", **common)
    target = target or target_for(a.device)
    if c is None:  # a fresh contiguous C: its row stride is N
        c_tma = m == 1 or (n * a.element_size()) % 16 == 0
    else:
        c_tma = tma_ok(c, 1)
    common.update(c_tma=c_tma, num_sms=target.num_sms)
    unaligned = [
        (name, t)
        for name, t, inner in (("a", a, 1 if a_kmajor else 0), ("b", b, 0 if b_kmajor else 1))
        if not tma_ok(t, inner)
    ]
    want, via = (
        (path, "path pinned by the caller") if path else (route(target, m, n, k, a.dtype, not unaligned) or (None, ""))
    )
    if stage and path is None and want in ("gemv", "portable"):  # staging pinned on: a TMA path is wanted
        want, via = None, ""
    if want == "gemv":
        p = _gemv_plan(a, b, c, config, target, common, via, pinned=path is not None)
        if p is not None:
            return p
        want, via = None, ""  # a route to a GEMV that cannot take these operands: the planner's own choice
    if want == "portable":
        cfg, source = (config, PINNED) if config else _pick(target, "portable", m, n, k, a.dtype)
        return Plan("portable", cfg, f"portable kernel, {via}; {source}", **common)
    stage_note = ""
    if unaligned and target.has_tma:
        go, why_stage = staging_decision(target, m, n, k, a.element_size(), [t.numel() for _, t in unaligned], stage)
        names = " and ".join(name.upper() for name, _ in unaligned)
        if go:
            common["staged"] = tuple(name for name, _ in unaligned)
            stage_note = f"; {names} staged into 16-byte-aligned buffers: {why_stage}"
            unaligned = []
        else:
            why = f"{names} not 16-byte aligned for TMA (base or leading stride), not staged: {why_stage}"
    if not target.has_tma:
        why = f"sm_{target.capability[0]}{target.capability[1]} has no TMA"
    elif not unaligned:
        tma_path = want or ("tma_splitk" if m <= SMALL_M else "tma_persistent")
        return _tma_plan(tma_path, config, target, common, stage_note, via)
    if path is not None:
        raise ValueError(f"path {path!r} needs A and B TMA can describe (16-byte aligned base and rows): {why}")
    cfg, source = (config, PINNED) if config else _pick(target, "portable", m, n, k, a.dtype)
    return Plan("portable", cfg, f"{why}; {source}", **common)


def _gemv_plan(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    config: GemmConfig | None,
    target: Target,
    common: dict,
    via: str,
    pinned: bool,
) -> Plan | None:
    """The GEMV kernel's plan (C through pointers, nothing staged), or None where it cannot take the operands
    and was only routed (pinned: ValueError)."""
    m, n, k = common["m"], common["n"], common["k"]
    cfg, source = (config, PINNED) if config else _pick(target, "gemv", m, n, k, a.dtype)
    why = gemv_refusal(cfg, a, b, c.stride() if c is not None else (n, 1), m, n)
    if why:
        if pinned:
            raise ValueError(f"path 'gemv': {why}")
        return None
    split = gemv_split_for(cfg, m, n, k, target.num_sms)
    cfg = dataclasses.replace(cfg, split_k=split)
    kind = "FFMA, one-row tiles" if cfg.block_m == 1 else f"tensor cores, {cfg.block_m}-row tiles"
    return Plan(
        "gemv",
        cfg,
        f"GEMV kernel ({kind}; pointer loads at any alignment), split-K {split}, {via}; {source}",
        **dict(common, c_tma=False),
    )


def _tma_plan(path: str, config: GemmConfig | None, target: Target, common: dict, stage_note: str, via: str) -> Plan:
    """A TMA path's plan for operands TMA can describe (as given, or once staged)."""
    m, n, k, c_tma = common["m"], common["n"], common["k"], common["c_tma"]
    c_note = ("" if c_tma else "; C stored with masked pointers (its stride is not 16-byte aligned)") + stage_note
    via = f"; {via}" if via else ""
    if path == "tma_splitk":
        cfg, source = (config, PINNED) if config else _pick(target, "tma_splitk", m, n, k, common["dtype"])
        split = split_k_for(cfg, m, n, k, target.num_sms)
        cfg = dataclasses.replace(cfg, split_k=split)
        c_note = _stage_c(cfg, common, c_note)
        head = f"M={m}" if via else f"M={m} <= {SMALL_M}"
        return Plan("tma_splitk", cfg, f"{head}: small tiles, split-K {split}{c_note}{via}; {source}", **common)
    cfg, source = (config, PINNED) if config else _pick(target, "tma_persistent", m, n, k, common["dtype"])
    if cfg.warp_specialize and not os.environ.get("GEMMLAB_ALLOW_WS"):
        raise ValueError(
            "warp_specialize: the persistent kernel with Triton 3.6's Hopper warp "
            "specialization hung on the H200 (benchmarks/results/nvidia-h200-ws-probe-timeout.log); "
            "set GEMMLAB_ALLOW_WS=1 to try it anyway"
        )
    if cfg.warp_specialize and (cfg.stream_k or cfg.tail_split):
        raise ValueError(
            "stream_k or tail_split with warp_specialize: not supported (the last wave's part is not specialized)"
        )
    if cfg.stream_k and cfg.tail_split:
        raise ValueError("stream_k and tail_split: one of them (both share out the partial last wave)")
    if cfg.tail_split:
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        tail, pieces = tail_split_for(tiles, target.num_sms, -(-k // cfg.block_k), cfg.tail_split)
        cfg = dataclasses.replace(cfg, tail_split=pieces)
        c_note += f"; split tail: the last {tail} tiles in {pieces} K pieces each" if pieces else ""
    if cfg.warp_specialize and c_tma:
        # Triton 3.6's Hopper warp specialization splits the accumulator over two consumer warpgroups
        # but not a TMA store's block; its C goes out through pointers instead.
        common["c_tma"], c_note = False, "; warp-specialized, C stored with pointers" + stage_note
    elif not cfg.warp_specialize:
        c_note = _stage_c(cfg, common, c_note)
    head = "TMA-aligned on sm_90+" if not stage_note else "TMA-aligned on sm_90+ once staged"
    return Plan("tma_persistent", cfg, f"{head}: persistent TMA kernel{c_note}{via}; {source}", **common)
