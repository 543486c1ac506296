"""Statistics of timings, pure Python (no GPU): summaries, per-round ratios with a bootstrap interval,
verdicts and the clock-normalized efficiency (the dense tensor peak per architecture is ``gemmlab.device``'s).

    summarize([ms, ...])            -> {median_ms, p20_ms, p80_ms, min_ms, max_ms, cv, n}
    ratio_summary(cand, base)       -> {ratio, ci95, per_round, verdict}   ratio = base time / cand time
    efficiency(flops, ms, mhz, sms, arch, dtype) -> achieved FLOP/s / (peak FLOP/clock/SM * SMs * clock)
"""

from __future__ import annotations

import random
import statistics

from gemmlab.device import tensor_peak_tflops


def quantile(xs: list[float], p: float) -> float:
    """Linear-interpolation quantile of ``xs`` (0 <= p <= 1), as numpy's default."""
    if not xs:
        raise ValueError("quantile of no values")
    s = sorted(xs)
    pos = p * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(times_ms: list[float]) -> dict[str, float]:
    """Median, p20, p80, min, max and coefficient of variation (pstdev / mean) of times in ms."""
    if not times_ms:
        raise ValueError("no timings to summarize")
    mean = statistics.fmean(times_ms)
    return {"median_ms": statistics.median(times_ms), "p20_ms": quantile(times_ms, 0.2),
            "p80_ms": quantile(times_ms, 0.8), "min_ms": min(times_ms), "max_ms": max(times_ms),
            "cv": statistics.pstdev(times_ms) / mean if mean else 0.0, "n": len(times_ms)}


def bootstrap_ci(values: list[float], stat=statistics.median, n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over ``values`` (resampled with replacement)."""
    if not values:
        raise ValueError("bootstrap of no values")
    rng = random.Random(seed)
    boots = sorted(stat(rng.choices(values, k=len(values))) for _ in range(n_boot))
    tail = (1.0 - level) / 2
    return boots[int(tail * n_boot)], boots[min(n_boot - 1, int((1.0 - tail) * n_boot))]


def verdict(ci: tuple[float, float], noise: float = 0.0) -> str:
    """'faster' when the whole interval of base/cand is above 1 + noise, 'slower' below 1 - noise, else
    'within noise'."""
    lo, hi = ci
    return "faster" if lo > 1.0 + noise else "slower" if hi < 1.0 - noise else "within noise"


def ratio_summary(cand: list[list[float]], base: list[list[float]], seed: int = 0) -> dict:
    """Speed ratio base time / candidate time (> 1: candidate faster). ``cand`` and ``base`` are times per
    round ([[ms x reps] x rounds], rounds run interleaved); each round gives the ratio of the round medians;
    the result is their median with a bootstrap 95% interval, and a verdict."""
    if len(cand) != len(base) or not cand:
        raise ValueError(f"need the same number (> 0) of rounds, got {len(cand)} and {len(base)}")
    per_round = [statistics.median(b) / statistics.median(c) for c, b in zip(cand, base, strict=True)]
    ci = bootstrap_ci(per_round, seed=seed)
    return {"ratio": statistics.median(per_round), "ci95": list(ci), "per_round": per_round,
            "verdict": verdict(ci)}


def efficiency(flops: float, median_ms: float, clock_mhz: float | None, sm_count: int | None,
               arch: tuple[int, int] | None, dtype: str) -> float | None:
    """Achieved FLOP/s over the dense tensor peak at the clock observed while it ran (0..1); None when the
    peak is unknown (no NVML clock, unknown architecture or dtype)."""
    peak = tensor_peak_tflops(arch, dtype, sm_count, clock_mhz)
    if peak is None or median_ms <= 0:
        return None
    return flops / (median_ms * 1e-3) / 1e12 / peak


def clock_flags(clock_means: list[float], clock_mins: list[float], clock_maxs: list[float],
                spread: float = 0.20, drift: float = 0.03) -> list[str]:
    """Warnings about the SM clock across runs (processes): a run whose clock moved by more than ``spread``
    of its maximum while timing (oscillation under the power cap), or run means that differ by a
    coefficient of variation above ``drift``."""
    flags = []
    for i, (lo, hi) in enumerate(zip(clock_mins, clock_maxs, strict=True)):
        if hi > 0 and (hi - lo) / hi > spread:
            flags.append(f"clock oscillation in run {i}: SM clock {lo:.0f}-{hi:.0f} MHz while timing")
    if len(clock_means) > 1:
        mean = statistics.fmean(clock_means)
        cv = statistics.pstdev(clock_means) / mean if mean else 0.0
        if cv > drift:
            flags.append(f"clock differs between runs: mean SM clock {min(clock_means):.0f}-"
                         f"{max(clock_means):.0f} MHz (cv {cv:.1%})")
    return flags
