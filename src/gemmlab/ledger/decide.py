"""The accept/reject rule (the TileLang story's): an entry is accepted against its parent only if

1. it is correct (verified at the timed shape),
2. its SASS still has tensor-core instructions (inspected, count > 0), except the GEMV kernel's one-row tiles,
   which run on FFMA by design (a GEMV streams B once, memory-bound; a 16-row MMA would be 15/16 padding),
3. its median latency dropped, and
4. the paired speedup's 95% interval excludes "no change" (its lower bound is above 1).

"Paired": a speedup over the parent measured interleaved in the same run when there is one (the tuner
times each candidate against its incumbent); otherwise each entry's per-round ratios to cuBLAS, which was
interleaved with it in its own run, so clock differences between the two runs cancel; the interval is a
bootstrap of the ratio of the two medians. The first correct, inspected, timed entry for a shape has no
parent and becomes its baseline. Every rejection says which condition failed.
"""

from __future__ import annotations

import random
import statistics

MIN_ROUNDS = 4  # fewer per-round ratios than this give no interval worth the name


def paired_speedup(child, parent, n_boot: int = 2000, seed: int = 0) -> tuple[float, list[float], str] | None:
    """(speedup of child over parent, 95% interval, how it was paired), or None when it cannot be paired
    (no common measurement, or fewer than ``MIN_ROUNDS`` rounds)."""
    if child.vs_parent and child.vs_parent.get("ci95") and len(child.vs_parent.get("per_round", [])) >= MIN_ROUNDS:
        return child.vs_parent["ratio"], list(child.vs_parent["ci95"]), "interleaved with the parent in one run"
    if len(child.per_round or []) >= MIN_ROUNDS and len(parent.per_round or []) >= MIN_ROUNDS:
        rng = random.Random(seed)
        c, p = child.per_round, parent.per_round
        boots = sorted(statistics.median(rng.choices(c, k=len(c))) / statistics.median(rng.choices(p, k=len(p)))
                       for _ in range(n_boot))
        ci = [boots[int(0.025 * n_boot)], boots[int(0.975 * n_boot) - 1]]
        return statistics.median(c) / statistics.median(p), ci, "each against cuBLAS interleaved in its own run"
    return None


def ffma_by_design(e) -> bool:
    """The GEMV kernel's one-row tiles: CUDA-core FFMA is their design, not a lost tensor core."""
    return e.path == "gemv" and (e.config or {}).get("block_m") == 1


def decide(child, parent) -> tuple[str, str]:
    """("accepted" | "rejected", reason)."""
    if not child.correct:
        return "rejected", f"incorrect: {child.error or 'failed verification'}"
    if child.tensor_core_ops is None:
        return "rejected", "tensor cores not verified: no SASS was inspected"
    if child.tensor_core_ops <= 0 and not ffma_by_design(child):
        return "rejected", "no tensor-core instruction in its SASS (HGMMA/HMMA)"
    if child.median_ms is None:
        return "rejected", "not timed"
    if parent is None:
        return "accepted", "first correct entry for this shape: the baseline"
    # the parent's median from the same run when the two were interleaved, else from its own entry
    parent_ms = (child.vs_parent or {}).get("parent_median_ms", parent.median_ms)
    if parent_ms is not None and child.median_ms >= parent_ms:
        return "rejected", (f"median latency did not drop: {child.median_ms:.4f} ms against "
                            f"{parent_ms:.4f} ms (#{parent.id})")
    paired = paired_speedup(child, parent)
    if paired is None:
        return "rejected", (f"no paired interval: not measured with the parent, nor {MIN_ROUNDS}+ per-round ratios "
                            "to cuBLAS in both")
    speedup, (lo, hi), how = paired
    if lo <= 1.0:
        return "rejected", (f"within noise: speedup {speedup:.3f}, 95% interval [{lo:.3f}, {hi:.3f}] includes "
                            f"no change ({how})")
    return "accepted", f"{speedup:.3f}x faster than #{parent.id}, 95% interval [{lo:.3f}, {hi:.3f}] ({how})"
