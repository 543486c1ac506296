"""Measuring instruments: L2-flushed device-event timing, interleaved comparisons with bootstrap intervals,
NVML clock sampling and clock-normalized efficiency, the GEMM bench, the MoE GEMM table, the stable bench.

    from gemmlab.bench import compare, compare_many, summarize, ratio_summary, ClockSampler
"""

from gemmlab.bench.compare import compare, compare_many
from gemmlab.bench.stats import efficiency, ratio_summary, summarize
from gemmlab.bench.timing import ClockSampler, env_info, interleave, require_random, time_calls

__all__ = ["ClockSampler", "compare", "compare_many", "efficiency", "env_info", "interleave", "ratio_summary",
           "require_random", "summarize", "time_calls"]
