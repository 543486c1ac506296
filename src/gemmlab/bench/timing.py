"""Honest GPU timing under clock throttling.

- Every timed call is preceded by an L2 flush (a write over a buffer twice the L2 size) and bracketed by
  CUDA events; the host also waits on the end event of each round, so host wall time cross-checks it.
- Candidates are interleaved: round r runs A, B, A, B, ... so slow clock drift hits both alike; ratios
  are taken per round and summarized by their median and a bootstrap 95% interval.
- A sampler thread reads NVML (SM clock, power, temperature, clock-event reasons) while timing runs.
"""

from __future__ import annotations

import datetime
import os
import platform
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

_FLUSH: dict[int, torch.Tensor] = {}


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer twice the device's L2; writing it evicts whatever the last call left in L2."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 64 << 20) or (64 << 20)
        _FLUSH[idx] = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)
    return _FLUSH[idx]


def time_calls(fn: Callable[[], object], reps: int, device: torch.device | None = None) -> list[float]:
    """Milliseconds of ``reps`` calls of ``fn``, each after an L2 flush, each bracketed by events."""
    device = device or torch.device("cuda")
    flush = l2_flush_buffer(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def warmup(fns: dict[str, Callable[[], object]], seconds: float) -> None:
    """Run every candidate, round robin, for about ``seconds`` so compilation is done and clocks settle."""
    t0 = time.perf_counter()
    while True:
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= seconds:
            return


def as_graph(fn: Callable[[], object]) -> Callable[[], object]:
    """Capture one call of ``fn`` in a CUDA graph and return its replay: device time without the host's
    launch overhead. ``fn`` runs once on the capture stream first (allocations, lazily made buffers)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def interleave(fns: dict[str, Callable[[], object]], rounds: int = 10, reps: int = 5,
               warmup_s: float = 1.0, graph: bool = False) -> dict[str, list[list[float]]]:
    """Times per candidate per round: {name: [[ms x reps] x rounds]}. Within a round the candidates run
    in turn, and their order alternates between rounds (A B / B A) so neither always runs first.
    ``graph``: time CUDA-graph replays of each candidate (device time, no host launch overhead)."""
    if graph:
        fns = {name: as_graph(fn) for name, fn in fns.items()}
    warmup(fns, warmup_s)
    out: dict[str, list[list[float]]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            out[name].append(time_calls(fns[name], reps))
    return out


def summarize(times_ms: list[float]) -> dict[str, float]:
    xs = sorted(times_ms)
    q = lambda p: xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]
    mean = statistics.fmean(xs)
    return {"median_ms": statistics.median(xs), "p20_ms": q(0.2), "p80_ms": q(0.8), "min_ms": xs[0],
            "max_ms": xs[-1], "cv": statistics.pstdev(xs) / mean if mean else 0.0, "n": len(xs)}


def ratio_summary(cand: list[list[float]], base: list[list[float]], seed: int = 0) -> dict[str, float]:
    """Speed ratio base_time / cand_time (> 1: candidate faster), per round from round medians; median over
    rounds with a bootstrap 95% interval; verdict 'faster' / 'slower' / 'within noise'."""
    per_round = [statistics.median(b) / statistics.median(c) for c, b in zip(cand, base, strict=True)]
    rng = random.Random(seed)
    boots = sorted(statistics.median(rng.choices(per_round, k=len(per_round))) for _ in range(2000))
    lo, hi = boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]
    verdict = "faster" if lo > 1.0 else "slower" if hi < 1.0 else "within noise"
    return {"ratio": statistics.median(per_round), "ci95": [lo, hi], "per_round": per_round,
            "verdict": verdict}


class ClockSampler:
    """Context manager: samples SM clock (MHz), power (W), temperature (C) and clock-event reasons every
    ``period_s`` through NVML. Without nvidia-ml-py or a driver it records nothing and says so."""

    def __init__(self, device_index: int = 0, period_s: float = 0.02):
        self.device_index, self.period_s = device_index, period_s
        self.samples: list[tuple[float, float, float, int]] = []
        self.error: str | None = None
        self._stop = threading.Event()

    def __enter__(self) -> ClockSampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as e:  # no NVML: degrade, never crash
            self.error = f"NVML unavailable: {e}"
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        nv, h = self._nvml, self._handle
        while not self._stop.is_set():
            try:
                reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
            except Exception:
                reasons = 0
            self.samples.append((nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                                 nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                                 nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), reasons))
            time.sleep(self.period_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.error is None:
            self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {"nvml": self.error or "no samples"}
        clocks, power, temp, reasons = zip(*self.samples, strict=True)
        seen = 0
        for r in reasons:
            seen |= r
        names = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake"}
        return {"sm_clock_mhz_mean": statistics.fmean(clocks), "sm_clock_mhz_min": min(clocks),
                "sm_clock_mhz_max": max(clocks), "power_w_mean": statistics.fmean(power),
                "temp_c_max": max(temp), "clock_event_reasons": [n for bit, n in names.items() if seen & bit],
                "samples": len(clocks)}


def git_sha() -> str:
    """HEAD of the checkout (+ "-dirty"); GEMMLAB_GIT_SHA overrides it where the tree travels without .git."""
    if os.environ.get("GEMMLAB_GIT_SHA"):
        return os.environ["GEMMLAB_GIT_SHA"]
    root = Path(__file__).resolve().parents[3]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"


def env_info() -> dict:
    import triton

    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "git_sha": git_sha()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sm_count=props.multi_processor_count, cuda=torch.version.cuda)
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            info.update(driver=pynvml.nvmlSystemGetDriverVersion(),
                        power_limit_w=pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                        max_sm_clock_mhz=pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
        except Exception as e:
            info["nvml"] = f"unavailable: {e}"
    return info
