"""Interleaved comparison of candidates against a baseline: verify first, then time, then verify again.

    compare(candidate, baseline, check=..., flops=...)            two functions
    compare_many({"gemmlab": f, "cublas": g}, baseline="cublas")  any number, one of them the baseline

Each function takes no arguments and returns its output. ``check(output) -> {"ok": bool, ...}`` runs on
every candidate's output before timing (a wrong candidate is reported and never timed). A function that
writes one output buffer in place gets it NaN-poisoned before a second checked call and before timing, and
what the last timed call left there is checked after timing; others are checked on one more call.
Then the candidates run interleaved in rounds (``timing.interleave``) with the L2
flushed before every call, while NVML samples the clock. Result per candidate: time statistics (median,
p20, p80, min, max, cv), TFLOPS (= flops / median time), the mean SM clock, power and clock-event reasons
seen while it ran, the clock-normalized efficiency (against the nominal tensor peak, and against the
attainable rate ``gemmlab probe`` measured, when the caller hands in the profile), and against the
baseline the per-round ratios (baseline time / candidate time), their median, its 95% interval and a verdict
(``stats.ratio_summary``: no interval and "inconclusive" below 6 rounds).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gemmlab.instruments import stats, timing

Check = Callable[[object], dict]


def _device_facts(device: torch.device) -> tuple[tuple[int, int] | None, int | None]:
    if device.type != "cuda":
        return None, None
    props = torch.cuda.get_device_properties(device)
    return (props.major, props.minor), props.multi_processor_count


def _poison(out: object) -> bool:
    """Fill a floating-point output with NaN (so an unwritten output cannot pass); False if it is none."""
    if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() > 0:
        out.fill_(float("nan"))
        return True
    return False


def compare_many(
    fns: dict[str, timing.Fn],
    baseline: str,
    *,
    check: Check | None = None,
    flops: float | None = None,
    dtype: str = "float16",
    inputs: dict[str, torch.Tensor] | None = None,
    rounds: int = 10,
    reps: int = 5,
    warmup_s: float = 1.0,
    warmup_calls: int = 1,
    graph: bool = False,
    mode: str = "interleaved",
    device: torch.device | str | None = None,
    profile: dict | None = None,
    clock: str = "events",
) -> dict:
    """Verify, then time ``fns`` interleaved (or ``mode="back-to-back"``, the naive way, for contrast).
    ``clock``: "events" (device time of each call) or "wall" (host clock from call to result, interleaved
    mode only: ``timing.time_calls_wall``).
    ``profile``: the device profile ``gemmlab probe`` recorded for this GPU (``probe.load()``), handed in
    by the caller; with it the result also carries ``efficiency_measured``.
    Returns {"candidates": {name: {...}}, "baseline": name, "clocks": {...}, "mode", "timer", ...}."""
    if baseline not in fns:
        raise ValueError(f"baseline {baseline!r} is not one of the candidates {list(fns)}")
    if mode not in ("interleaved", "back-to-back"):
        raise ValueError(f"mode {mode!r}: interleaved or back-to-back")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if graph and device.type != "cuda":
        raise ValueError("graph=True needs CUDA (CUDA-graph replay)")
    if clock not in timing.CLOCKS or (clock != "events" and mode != "interleaved"):
        raise ValueError(f"clock {clock!r}: events, or wall with mode interleaved")
    if inputs:
        timing.require_random(**inputs)
    res, poisoned = _verify(fns, check, device)  # 1. verify the exact call that will be timed
    timed = {name: fn for name, fn in fns.items() if res[name]["check"].get("ok")}
    if baseline not in timed:
        for name in fns:
            res[name]["skipped"] = "the baseline failed its check: nothing is timed"
        return {"candidates": res, "baseline": baseline, "mode": mode, "timed": False}
    for name in fns:
        if name not in timed:
            res[name]["skipped"] = "failed its check before timing: not timed"
    windows: timing.Windows = {}
    with timing.ClockSampler(device.index or 0) as sampler:  # 2. time
        if mode == "interleaved":
            times = timing.interleave(
                timed,
                rounds,
                reps,
                warmup_s,
                graph=graph,
                device=device,
                windows=windows,
                warmup_calls=warmup_calls,
                clock=clock,
            )
        else:
            timed_fns = {name: timing.as_graph(fn) for name, fn in timed.items()} if graph else timed
            times = timing.back_to_back(
                timed_fns, rounds, reps, warmup_s, device=device, windows=windows, warmup_calls=warmup_calls
            )
    arch, sms = _device_facts(device)
    # the probe's attainable FLOP/clock/SM, when the caller handed in this GPU's recorded profile
    measured_rate = ((profile or {}).get("mma_peak") or {}).get("flop_per_clock_per_sm")
    all_windows = [w for ws in windows.values() for w in ws]
    for name in timed:  # 3. verify again: what the last timed call left, or one more call
        res[name].update(_check_after(poisoned.get(name), fns[name], check, device))
        s = stats.summarize([t for r in times[name] for t in r])
        clocks = sampler.summary(windows.get(name), fallback=all_windows)
        s["per_round_ms"] = times[name]
        s["clocks"] = clocks
        if flops is not None:
            s.update(_rates(flops, s["median_ms"], clocks.get("sm_clock_mhz_mean"), sms, arch, dtype, measured_rate))
        if name != baseline:
            s["vs_baseline"] = stats.ratio_summary(times[name], times[baseline])
        res[name].update(s)
    return {
        "candidates": res,
        "baseline": baseline,
        "mode": mode,
        "graph": graph,
        "timed": True,
        "rounds": rounds,
        "reps": reps,
        "warmup_s": warmup_s,
        "warmup_calls": warmup_calls,
        "clocks": sampler.summary(all_windows, min_samples=1),  # the timed batches, not the warm-up
        "clock": clock,
        "timer": ("host clock, call to result, L2 flushed" if clock == "wall" else "CUDA events, L2 flushed")
        if device.type == "cuda"
        else "host clock (CPU): not a GPU measurement",
    }


def _verify(
    fns: dict[str, timing.Fn], check: Check | None, device: torch.device
) -> tuple[dict[str, dict], dict[str, torch.Tensor]]:
    """Step 1: each candidate called and checked once; an output written in place is poisoned, written again
    and checked again (then poisoned for the timed calls). -> ({name: {"check"}}, {name: poisoned output})."""
    res: dict[str, dict] = {name: {} for name in fns}
    poisoned: dict[str, torch.Tensor] = {}  # outputs written in place: poisoned, checked again after timing
    for name, fn in fns.items():
        try:
            out = fn()
            timing.sync(device)
            res[name]["check"] = check(out) if check else {"ok": True, "note": "no check given"}
            if res[name]["check"].get("ok") and _poison(out):
                again = fn()  # same buffer again? then the timed calls write it: check what they leave
                timing.sync(device)
                if again is out or (isinstance(again, torch.Tensor) and again.data_ptr() == out.data_ptr()):
                    second = check(again) if check else {"ok": True}
                    if not second.get("ok"):
                        res[name]["check"] = dict(second, error="wrong on a second call into the poisoned output")
                    elif _poison(out):
                        poisoned[name] = out
        except Exception as e:  # a candidate that raises is reported, not timed
            res[name]["check"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return res, poisoned


def _check_after(poisoned: torch.Tensor | None, fn: timing.Fn, check: Check | None, device: torch.device) -> dict:
    """Step 3: the output the last timed call left (``poisoned``), or one more call's, checked."""
    try:
        out = poisoned if poisoned is not None else fn()
        timing.sync(device)
        return {
            "check_after": check(out)["ok"] if check else True,
            "checked_after": "last timed output" if poisoned is not None else "one more call",
        }
    except Exception as e:
        return {"check_after": False, "check_after_error": f"{type(e).__name__}: {e}"}


def outcome(c: dict) -> tuple[bool, str | None]:
    """One candidate of a ``compare_many`` result: (right, before and after timing; why not, else why it was not
    timed, else None). Why not: its check's error, its error, or its check after the timed calls."""
    check = c.get("check") or {}
    if not check.get("ok"):
        err = check.get("max_abs_err")
        why = check.get("error") or (f"wrong (max abs err {err:.3g})" if err is not None else "wrong")
        return False, "; ".join(w for w in (why, c.get("skipped")) if w)
    if c.get("check_after", True) is not True:
        return False, c.get("check_after_error") or f"wrong after the timed calls ({c.get('checked_after', 'checked')})"
    return True, c.get("skipped")


def _rates(
    flops: float, median_ms: float, sm_mhz: float | None, sms: int | None, arch, dtype: str, measured_rate: float | None
) -> dict:
    """TFLOPS = flops / median time; the efficiency against the nominal tensor peak at the observed clock, and
    against the probe's measured rate when there is one."""
    out = {"tflops": flops / (median_ms * 1e-3) / 1e12}
    out["efficiency"] = stats.efficiency(flops, median_ms, sm_mhz, sms, arch, dtype)
    if measured_rate and sm_mhz:
        out["efficiency_measured"] = out["tflops"] * 1e12 / (measured_rate * sms * sm_mhz * 1e6)
    return out


def compare(candidate: timing.Fn, baseline: timing.Fn, **kw) -> dict:
    """``compare_many({"candidate": candidate, "baseline": baseline}, "baseline", **kw)``; the verdict is
    ``result["candidates"]["candidate"]["vs_baseline"]["verdict"]`` (faster / slower / within noise /
    inconclusive)."""
    return compare_many({"candidate": candidate, "baseline": baseline}, "baseline", **kw)
