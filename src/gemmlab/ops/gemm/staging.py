"""The staging cost rule of the GEMM planner: whether copying A or B (the operands TMA cannot describe) into
16-byte-aligned buffers is cheap next to the GEMM, and the shape of such a buffer. The rule's constants are data:
the "staging" object of the target's config file (``ops.configs.staging``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from gemmlab.device import Target
from gemmlab.ops import configs
from gemmlab.ops.layout import padded_k


def staged_shape(t: torch.Tensor, inner: int) -> tuple[int, int]:
    """(rows, row length) of the buffer an operand is staged into: its outer dim by its unit-stride dim padded
    to a multiple of 16 bytes (``padded_k``)."""
    return (t.shape[1 - inner], padded_k(t.shape[inner]))


@dataclass(frozen=True)
class Staging:
    """The constants of the staging cost rule (the "staging" object of a config file)."""

    flops_per_s: float  # the GEMM's compute rate
    dram_bytes_per_s: float  # HBM bandwidth (copies and memory-bound GEMMs)
    copy_fixed_s: float  # fixed cost of one copy kernel (launch, ramp)
    max_copy_fraction: float  # stage when the copies cost at most this fraction of the GEMM
    source: str


@functools.cache
def _staging(target: str) -> Staging | None:
    st, source = configs.staging(target)
    if "max_copy_fraction" not in st:
        return None
    missing = {"flops_per_s", "dram_bytes_per_s"} - set(st)
    if missing:
        raise ValueError(f"config {source}: staging lacks {sorted(missing)}")
    return Staging(
        float(st["flops_per_s"]),
        float(st["dram_bytes_per_s"]),
        float(st.get("copy_fixed_s", 0.0)),
        float(st["max_copy_fraction"]),
        source,
    )


configs.on_reload(_staging.cache_clear)


def staging_decision(
    target: Target, m: int, n: int, k: int, elt: int, copies: list[int], stage: bool | None = None
) -> tuple[bool, str]:
    """Whether to stage, and why. ``copies``: elements of each operand that would be copied. The rule:

        t_copy = sum(2 * elements * elt) / dram_bytes_per_s + len(copies) * copy_fixed_s   (read + write)
        t_gemm = max(2 M N K / flops_per_s, (M K + K N + M N) * elt / dram_bytes_per_s)   (compute or memory)
        stage when t_copy <= max_copy_fraction * t_gemm

    ``stage`` True or False overrides the rule (a sweep's way to time both)."""
    if stage is not None:
        return stage, "staging pinned by the caller" if stage else "staging refused by the caller"
    st = _staging(target.name)
    if st is None:
        return False, f"no staging constants for {target.name}"
    t_copy = sum(2 * e * elt for e in copies) / st.dram_bytes_per_s + len(copies) * st.copy_fixed_s
    t_gemm = max(2.0 * m * n * k / st.flops_per_s, (m * k + k * n + m * n) * elt / st.dram_bytes_per_s)
    frac = t_copy / t_gemm
    verdict = "<=" if frac <= st.max_copy_fraction else ">"
    return frac <= st.max_copy_fraction, (
        f"copy {frac:.1%} of the GEMM's estimated time {verdict} {st.max_copy_fraction:.0%} ({st.source} staging)"
    )
