"""Honest timing under clock throttling.

- Every timed call is preceded by an L2 flush (a write over a buffer twice the L2 size) and bracketed by
  CUDA events (``time_calls``), or timed by the host clock from the call to its result on an idle device
  (``time_calls_wall``: host + device, what an eager caller waits for). Without CUDA (the CPU interpreter)
  calls are timed by the host clock and labelled so.
- Warm-up is by time (about 1 s by default), so compilation is done and the clock has settled under load.
- Candidates are interleaved: round r runs A, B, A, B, ... with the order alternating between rounds, so
  slow clock drift hits all alike. ``back_to_back`` is the naive way (all of A, then all of B), kept to
  show what it gets wrong.
- A sampler thread reads NVML (SM clock, power, temperature, clock-event reasons) while timing runs; each
  timed batch records its host window, so every candidate gets the clock seen while it ran.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import threading
import time
from collections.abc import Callable

import torch

from gemmlab import provenance
from gemmlab.instruments.stats import ratio_summary, summarize  # noqa: F401  (re-exported: timing's old home)

Fn = Callable[[], object]
Windows = dict[str, list[tuple[float, float]]]
_FLUSH: dict[int, torch.Tensor] = {}


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer twice the device's L2; writing it evicts whatever the last call left in L2."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 64 << 20) or (64 << 20)
        _FLUSH[idx] = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)
    return _FLUSH[idx]


def require_random(**tensors: torch.Tensor) -> None:
    """Refuse timing inputs that are constant (all zeros, all ones, ...): they flatter the hardware (less
    switching power, so higher clocks; compressible data) and hide wrong results. Raises ValueError naming
    the tensor."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.numel() < 2:
            continue
        lo, hi = t.min(), t.max()
        if bool(lo == hi):
            raise ValueError(
                f"timing input {name!r} {tuple(t.shape)} is constant (every element {lo.item()!r}): "
                "zeros and constants inflate speed (power, L2) and hide wrong results; "
                "time random inputs"
            )
        if bool(torch.isnan(lo)) or bool(torch.isnan(hi)):
            raise ValueError(f"timing input {name!r} contains NaN")


def sync(device: torch.device) -> None:
    """Wait for the device (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Fn, reps: int, device: torch.device | None = None, flush: bool = True) -> list[float]:
    """Milliseconds of ``reps`` calls of ``fn``: on CUDA each after an L2 flush and bracketed by events, between
    device-wide syncs; with ``flush=False`` back to back, one pair of events around them all, every call given
    the average (events per call cost the host microseconds a call, as much as a decode-sized GEMM); on the CPU
    by the host clock, one call at a time. The one timing loop: ``bench`` times with it in-process, and the
    grader's sandboxed child runs its batches with it (where the times are advisory: the grader's clock decides)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    if not flush:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / max(reps, 1)] * reps
    buf = l2_flush_buffer(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda.synchronize(device)
    for s, e in zip(starts, ends, strict=True):
        buf.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def time_calls_wall(fn: Fn, reps: int, device: torch.device | None = None, flush: bool = True) -> list[float]:
    """Milliseconds of ``reps`` calls of ``fn`` by the host clock, each from the call to its result being
    ready: host launch cost + device time (+ one synchronize's latency, the same for every candidate). On
    CUDA the L2 is flushed and the device idle before each call. What an eager caller waits for."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        return time_calls(fn, reps, device)
    buf = l2_flush_buffer(device) if flush else None
    out = []
    for _ in range(reps):
        if buf is not None:
            buf.zero_()
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


CLOCKS = {"events": time_calls, "wall": time_calls_wall}


def warmup(fns: dict[str, Fn], seconds: float, device: torch.device | None = None, min_calls: int = 1) -> int:
    """Run every candidate, round robin, for about ``seconds`` (and at least ``min_calls`` times each) so
    compilation is done and clocks settle. Returns the number of rounds run."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t0, n = time.perf_counter(), 0
    while True:
        for fn in fns.values():
            fn()
        sync(device)
        n += 1
        if n >= min_calls and time.perf_counter() - t0 >= seconds:
            return n


def capture(fn: Callable[[], object], calls: int = 1) -> tuple[torch.cuda.CUDAGraph, object]:
    """Capture ``calls`` calls of ``fn`` in one CUDA graph, torch's recipe: one warm-up call on the capture
    stream first (allocations, lazily made buffers). Returns the graph and what the last captured call
    returned (the graph's static output: each replay rewrites it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            out = fn()
    torch.cuda.synchronize()
    return graph, out


def as_graph(fn: Fn) -> Fn:
    """Capture one call of ``fn`` in a CUDA graph and return its replay: device time without the host's
    launch overhead."""
    return capture(fn)[0].replay


def interleave(
    fns: dict[str, Fn],
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 1.0,
    graph: bool = False,
    device: torch.device | None = None,
    windows: Windows | None = None,
    warmup_calls: int = 1,
    clock: str = "events",
) -> dict[str, list[list[float]]]:
    """Times per candidate per round: {name: [[ms x reps] x rounds]}. Within a round the candidates run
    in turn, and their order alternates between rounds (A B / B A) so neither always runs first.
    ``graph``: time CUDA-graph replays of each candidate (device time, no host launch overhead).
    ``clock``: "events" (CUDA events around each call, ``time_calls``) or "wall" (host clock from call to
    result, ``time_calls_wall``).
    ``windows``: filled with each candidate's host time windows (for the clock sampler). Warm-up: at least
    ``warmup_s`` seconds and ``warmup_calls`` calls of each."""
    if clock not in CLOCKS:
        raise ValueError(f"clock {clock!r}: one of {', '.join(CLOCKS)}")
    timer = CLOCKS[clock]
    if graph:
        fns = {name: as_graph(fn) for name, fn in fns.items()}
    warmup(fns, warmup_s, device, warmup_calls)
    out: dict[str, list[list[float]]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            own = getattr(fns[name], "time_calls", None)  # a backend in its own process times itself there
            out[name].append(own(reps) if own is not None else timer(fns[name], reps, device))
            if windows is not None:
                windows.setdefault(name, []).append((t0, time.perf_counter()))
    return out


def back_to_back(
    fns: dict[str, Fn],
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 0.0,
    device: torch.device | None = None,
    windows: Windows | None = None,
    warmup_calls: int = 1,
) -> dict[str, list[list[float]]]:
    """The naive measurement, for contrast: each candidate warmed up and timed on its own, one after the
    other (all of A's rounds, then all of B's). Same return shape as ``interleave``; round i of A and round
    i of B are minutes apart, so a clock that moves in between biases the ratio."""
    out: dict[str, list[list[float]]] = {}
    for name, fn in fns.items():
        warmup({name: fn}, warmup_s, device, warmup_calls)
        t0 = time.perf_counter()
        out[name] = [time_calls(fn, reps, device) for _ in range(rounds)]
        if windows is not None:
            windows.setdefault(name, []).append((t0, time.perf_counter()))
    return out


CLOCK_EVENT_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


class ClockSampler:
    """Context manager: samples SM clock (MHz), power (W), temperature (C) and clock-event reasons every
    ``period_s`` through NVML, with host timestamps. Without nvidia-ml-py, a driver or a GPU it records
    nothing and says why in ``error``: results then carry no clock fields (never a crash)."""

    def __init__(self, device_index: int = 0, period_s: float = 0.01):
        self.device_index, self.period_s = device_index, period_s
        self.samples: list[tuple[float, float, float, float, int]] = []  # (t, MHz, W, C, reasons)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ClockSampler:
        if not torch.cuda.is_available():
            self.error = "no CUDA device: no clocks"
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as e:  # no NVML: degrade, never crash
            self.error = f"NVML unavailable: {type(e).__name__}: {e}"
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
            try:
                self.samples.append(
                    (
                        time.perf_counter(),
                        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                        nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                        reasons,
                    )
                )
            except Exception as e:
                self.error = f"NVML read failed: {e}"
                return
            time.sleep(self.period_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(
        self,
        windows: list[tuple[float, float]] | None = None,
        min_samples: int = 20,
        fallback: list[tuple[float, float]] | None = None,
    ) -> dict:
        """Clock, power, temperature and reasons over all samples, or over those inside ``windows`` (host
        time intervals). With fewer than ``min_samples`` inside (microsecond kernels, short runs) the
        samples inside ``fallback`` (e.g. every candidate's timed batches) or else all are used: a handful
        of samples would attribute noise to one candidate. ``clock_scope`` says which."""

        def within(ws):
            return [s for s in self.samples if any(t0 <= s[0] <= t1 for t0, t1 in ws)]

        samples, scope = self.samples, "whole run"
        if windows:
            inside = within(windows)
            if len(inside) >= min_samples:
                samples, scope = inside, "own timing windows"
            elif fallback and within(fallback):
                samples, scope = within(fallback), f"all timed batches (only {len(inside)} samples in its own)"
            else:
                scope = f"whole run (only {len(inside)} samples inside its own windows)"
        if not samples:
            return {"nvml": self.error or "no samples"}
        _, clocks, power, temp, reasons = zip(*samples, strict=True)
        seen = 0
        for r in reasons:
            seen |= r
        return {
            "sm_clock_mhz_mean": statistics.fmean(clocks),
            "sm_clock_mhz_min": min(clocks),
            "sm_clock_mhz_max": max(clocks),
            "power_w_mean": statistics.fmean(power),
            "temp_c_max": max(temp),
            "clock_event_reasons": [n for bit, n in CLOCK_EVENT_REASONS.items() if seen & bit],
            "samples": len(clocks),
            "clock_scope": scope,
        }


def env_info() -> dict:
    """Provenance: date, versions (gemmlab's too), gemmlab's git SHA (None unless it runs from a checkout of
    gemmlab: ``provenance.git_sha``); with CUDA the GPU, its SM count and architecture, driver, power limit
    and maximum SM clock (NVML)."""
    import triton

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gemmlab": provenance.version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "git_sha": provenance.git_sha(),
    }
    if not torch.cuda.is_available():
        info.update(gpu=None, device="cpu", timer="host clock (Triton CPU interpreter): not a GPU measurement")
        return info
    props = torch.cuda.get_device_properties(0)
    info.update(
        gpu=props.name,
        device="cuda",
        sm_count=props.multi_processor_count,
        arch=[props.major, props.minor],
        cuda=torch.version.cuda,
        timer="CUDA events, L2 flushed before each call",
    )
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        info.update(
            driver=pynvml.nvmlSystemGetDriverVersion(),
            power_limit_w=pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
            max_sm_clock_mhz=pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        )
    except Exception as e:
        info["nvml"] = f"unavailable: {e}"
    return info
