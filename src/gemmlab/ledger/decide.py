"""The accept/reject rule (the TileLang story's): an entry is accepted against its parent only if

1. it is correct (verified at the timed shape),
2. its SASS still has tensor-core instructions (inspected, count > 0), except the GEMV kernel's one-row tiles,
   which run on FFMA by design (a GEMV streams B once, memory-bound; a 16-row MMA would be 15/16 padding),
3. its median latency dropped, and
4. the speedup's 95% interval excludes "no change" (``instruments.stats.is_faster``: the tuner's test too).

The interval comes from the statistics module, whose intervals hold their coverage (tests/instruments/test_stats.py):
paired when the entry was measured interleaved with its parent in one run (the tuner times each candidate
against its incumbent: the median of the per-round speedups, sign-test interval); otherwise unpaired, from each
entry's per-round ratios to cuBLAS, which was interleaved with it in its own run, so clock differences between
the two runs cancel (the rank-sum interval of the shift in log ratio). Too few rounds give no interval, and no
interval is no acceptance. The first correct, inspected, timed entry for a shape has no parent and becomes its
baseline. Every rejection says which condition failed.
"""

from __future__ import annotations

from gemmlab.instruments import stats


def speedup_summary(child, parent) -> tuple[dict, str] | None:
    """(the stats summary of child's speedup over parent, how it was paired), or None when there is no common
    measurement: no per-round ratios measured with the parent, nor per-round ratios to cuBLAS in both."""
    if child.vs_parent and child.vs_parent.get("per_round"):
        return stats.ratio_of_rounds(child.vs_parent["per_round"]), "interleaved with the parent in one run"
    if child.per_round and parent.per_round:
        return stats.ratio_between(child.per_round, parent.per_round), "each against cuBLAS interleaved in its own run"
    return None


def paired_speedup(child, parent) -> tuple[float, list[float], str] | None:
    """(speedup of child over parent, its 95% interval, how it was paired), or None when there is no interval
    (no common measurement, or too few rounds for one)."""
    found = speedup_summary(child, parent)
    if found is None or found[0]["ci95"] is None:
        return None
    s, how = found
    return s["ratio"], s["ci95"], how


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
        return "rejected", (
            f"median latency did not drop: {child.median_ms:.4f} ms against {parent_ms:.4f} ms (#{parent.id})"
        )
    found = speedup_summary(child, parent)
    if found is None or found[0]["ci95"] is None:
        rounds = "" if found is None else f" ({found[0]['rounds']} rounds: too few for a 95% interval)"
        return "rejected", (
            f"no paired interval: not measured with the parent, nor enough per-round ratios to cuBLAS in both{rounds}"
        )
    s, how = found
    lo, hi = s["ci95"]
    if not stats.is_faster(s):
        return "rejected", (
            f"within noise: speedup {s['ratio']:.3f}, 95% interval [{lo:.3f}, {hi:.3f}] includes no change ({how})"
        )
    return "accepted", f"{s['ratio']:.3f}x faster than #{parent.id}, 95% interval [{lo:.3f}, {hi:.3f}] ({how})"
