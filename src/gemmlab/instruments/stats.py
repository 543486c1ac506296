"""Statistics of timings, pure Python (no GPU): summaries, speed ratios with intervals that hold their coverage,
the one accept test and the clock-normalized efficiency (the dense tensor peak per architecture is
``gemmlab.device``'s).

    summarize([ms, ...])              -> {median_ms, p20_ms, p80_ms, min_ms, max_ms, cv, n}
    median_interval(xs)               -> (lo, hi) or None: distribution-free 95% interval of the median
    shift_interval(xs, ys)            -> (lo, hi) or None: of the shift between two independent samples
    ratio_summary(cand, base)         -> {ratio, ci95, per_round, verdict, half_width}  paired rounds, base/cand
    ratio_between(child, parent)      -> the same for two sets of per-round ratios measured in different runs
    is_faster(summary)                -> the accept test (ledger, tuner, bench: one function)
    efficiency(flops, ms, mhz, sms, arch, dtype) -> achieved FLOP/s / (peak FLOP/clock/SM * SMs * clock)

Intervals. A round times the candidate and the baseline next to each other (order alternating), so a clock that
drifts over the run cancels in the round's ratio; rounds are then independent draws of that ratio, but neither
normal nor outlier-free (a preempted batch, a clock step). The intervals therefore use only order statistics:
- ``median_interval``: [x_(k), x_(n+1-k)] with the largest k such that P(Bin(n, 1/2) < k) <= 2.5% (the sign
  test): at least 95% coverage of the median for any continuous distribution. Below 6 rounds even [min, max]
  covers less than 95%: no interval, verdict "inconclusive".
- ``shift_interval`` (Mann-Whitney / Hodges-Lehmann): the k-th smallest and largest of the m*n differences
  x_i - y_j, k from the exact distribution of the rank-sum statistic: at least 95% coverage of a location
  shift. Ratios are compared on the log scale, so it is a ratio of the two typical ratios.
Verdicts: "faster" (the whole interval of base/cand above 1), "slower" (below 1), "within noise" (it holds
1), "inconclusive" (too few rounds for any interval). A difference is only ever claimed from an interval.
"""

from __future__ import annotations

import functools
import math
import statistics

from gemmlab.device import tensor_peak_tflops

LEVEL = 0.95
EXACT_PAIRS = 4000  # m * n up to which the rank-sum distribution is counted exactly (normal beyond)


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
    return {
        "median_ms": statistics.median(times_ms),
        "p20_ms": quantile(times_ms, 0.2),
        "p80_ms": quantile(times_ms, 0.8),
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
        "cv": statistics.pstdev(times_ms) / mean if mean else 0.0,
        "n": len(times_ms),
    }


# ------------------------------------------------------------------------------------------- intervals


def _depth(cdf: list[float], level: float) -> int:
    """The largest k >= 1 with P(statistic <= k - 1) <= (1 - level) / 2 (0: none), from the null cdf."""
    tail, k = (1.0 - level) / 2, 0
    while k < len(cdf) and cdf[k] <= tail:
        k += 1
    return k


def median_interval(xs: list[float], level: float = LEVEL) -> tuple[float, float] | None:
    """Distribution-free interval of the median of ``xs`` (independent draws): order statistics chosen by the
    sign test. None when ``len(xs)`` is too small for ``level`` (fewer than 6 at 95%)."""
    n = len(xs)
    k = _depth(_sign_cdf(n), level) if n else 0
    if k == 0:
        return None
    s = sorted(xs)
    return s[k - 1], s[n - k]


@functools.cache
def _sign_cdf(n: int) -> list[float]:
    """P(B <= j), j = 0..n, for B ~ Bin(n, 1/2)."""
    return [sum(math.comb(n, i) for i in range(j + 1)) / 2**n for j in range(n + 1)]


@functools.cache
def _rank_sum_cdf(m: int, n: int) -> list[float]:
    """P(U <= u), u = 0..m*n, of the Mann-Whitney statistic for samples of m and n with no ties: the
    coefficients of the Gaussian binomial [m + n choose m]_q, normalized."""
    m, n = min(m, n), max(m, n)  # [m + n choose m]_q = [m + n choose n]_q: loop over the shorter
    poly = [1]  # [n + i choose i]_q for i = 0..m: times (1 - q^(n + i)), divided by (1 - q^i)
    for i in range(1, m + 1):
        prod = poly + [0] * (n + i)
        for d, c in enumerate(poly):
            prod[d + n + i] -= c
        quot = [0] * len(prod)
        for d, c in enumerate(prod):
            quot[d] = c + (quot[d - i] if d >= i else 0)
        poly = quot[: i * n + 1]
    total = math.comb(m + n, m)
    cdf, acc = [], 0
    for c in poly[: m * n + 1]:
        acc += c
        cdf.append(acc / total)
    return cdf


def shift_interval(xs: list[float], ys: list[float], level: float = LEVEL) -> tuple[float, float] | None:
    """Distribution-free interval of the shift d in "x is distributed as y + d" (two independent samples):
    order statistics of the m*n differences x_i - y_j, chosen by the rank-sum test. None when the samples
    are too small for ``level`` (at 95%: 4 and 4, 3 and 5, 2 and 8, ...)."""
    m, n = len(xs), len(ys)
    if m == 0 or n == 0:
        return None
    if m * n <= EXACT_PAIRS:
        k = _depth(_rank_sum_cdf(m, n), level)
    else:  # normal approximation of U, continuity-corrected
        z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
        k = max(0, math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12) + 0.5))
    if k == 0:
        return None
    d = sorted(x - y for x in xs for y in ys)
    return d[k - 1], d[m * n - k]


# ---------------------------------------------------------------------------------------------- ratios


def verdict(ci: tuple[float, float] | list[float] | None, noise: float = 0.0) -> str:
    """ "faster" when the whole interval of base/cand is above 1 + noise, "slower" below 1 - noise, "within
    noise" when it holds 1, "inconclusive" when there is no interval."""
    if not ci:
        return "inconclusive"
    lo, hi = ci
    return "faster" if lo > 1.0 + noise else "slower" if hi < 1.0 - noise else "within noise"


def _summary(ratio: float, ci: tuple[float, float] | None, per_round: list[float], **extra) -> dict:
    half = None if ci is None else (ci[1] - ci[0]) / (2 * ratio)
    return {
        "ratio": ratio,
        "ci95": list(ci) if ci else None,
        "per_round": per_round,
        "verdict": verdict(ci),
        "half_width": half,
        "rounds": len(per_round),
        **extra,
    }


def ratio_of_rounds(per_round: list[float]) -> dict:
    """Summary of paired per-round ratios (base time / candidate time): their median and its interval."""
    if not per_round:
        raise ValueError("no rounds to summarize")
    return _summary(statistics.median(per_round), median_interval(per_round), list(per_round))


def ratio_summary(cand: list[list[float]], base: list[list[float]]) -> dict:
    """Speed ratio base time / candidate time (> 1: candidate faster). ``cand`` and ``base`` are times per
    round ([[ms x reps] x rounds], rounds run interleaved); each round gives the ratio of the round medians;
    the result is their median, its distribution-free 95% interval (None below 6 rounds) and a verdict."""
    if len(cand) != len(base) or not cand:
        raise ValueError(f"need the same number (> 0) of rounds, got {len(cand)} and {len(base)}")
    return ratio_of_rounds([statistics.median(b) / statistics.median(c) for c, b in zip(cand, base, strict=True)])


def ratio_between(child: list[float], parent: list[float], levels: tuple[float, ...] = ()) -> dict:
    """How much faster ``child`` is than ``parent``, each a list of per-round ratios to a common baseline
    measured in a run of its own (unpaired): exp of the Hodges-Lehmann shift of the log ratios, with the
    rank-sum 95% interval (None when either list is too short), and one more as "ci<level>" per ``levels``."""
    if not child or not parent:
        raise ValueError("no rounds to compare")
    lc, lp = [math.log(x) for x in child], [math.log(x) for x in parent]
    shift = statistics.median([x - y for x in lc for y in lp])

    def interval(level):
        ci = shift_interval(lc, lp, level)
        return None if ci is None else (math.exp(ci[0]), math.exp(ci[1]))

    extra = {f"ci{round(100 * lv)}": (list(ci) if (ci := interval(lv)) else None) for lv in levels}
    return _summary(math.exp(shift), interval(LEVEL), list(child), parent_rounds=len(parent), **extra)


def is_faster(summary: dict | None) -> bool:
    """The accept test: a speed-up is claimed only when its whole 95% interval lies above 1."""
    return bool(summary) and summary.get("verdict") == "faster"


# ------------------------------------------------------------------------------------------ the device


def efficiency(
    flops: float,
    median_ms: float,
    clock_mhz: float | None,
    sm_count: int | None,
    arch: tuple[int, int] | None,
    dtype: str,
) -> float | None:
    """Achieved FLOP/s over the dense tensor peak at the clock observed while it ran (0..1); None when the
    peak is unknown (no NVML clock, unknown architecture or dtype)."""
    peak = tensor_peak_tflops(arch, dtype, sm_count, clock_mhz)
    if peak is None or median_ms <= 0:
        return None
    return flops / (median_ms * 1e-3) / 1e12 / peak


def clock_flags(
    clock_means: list[float],
    clock_mins: list[float],
    clock_maxs: list[float],
    spread: float = 0.20,
    drift: float = 0.03,
) -> list[str]:
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
            flags.append(
                f"clock differs between runs: mean SM clock {min(clock_means):.0f}-"
                f"{max(clock_means):.0f} MHz (cv {cv:.1%})"
            )
    return flags
