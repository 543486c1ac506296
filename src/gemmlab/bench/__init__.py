"""Timing instruments: L2-flushed device-event timing, interleaved comparisons, NVML clock sampling."""

from gemmlab.bench.timing import ClockSampler, env_info, interleave, ratio_summary, summarize, time_calls

__all__ = ["ClockSampler", "env_info", "interleave", "ratio_summary", "summarize", "time_calls"]
