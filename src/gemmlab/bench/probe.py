"""``gemmlab probe``: measure the device's constants before modelling anything, and check its health.

    probe() -> profile      SM count, L2, shared memory, clocks and power limit (NVML), HBM copy bandwidth,
                            cuBLAS fp16 at 8192^3, the attainable tensor-core rate of a Triton loop whose
                            operands stay in shared memory, kernel launch overhead
    save(profile) -> ~/.gemmlab/device-<gpu>.json (GEMMLAB_HOME overrides ~/.gemmlab); load(gpu)
    health(profile) -> a short re-measurement and the problems found against the recorded profile
    roofline_png(profile, bench_report, path): benchmark points against the measured ceilings

Bandwidth counts read + write bytes of a device-to-device copy; TFLOPS = FLOPs / median time; the
attainable rate is also given per clock per SM (``flop_per_clock_per_sm``), so efficiency at any observed
clock can use it (``instruments.compare`` reports ``efficiency_measured`` when the caller hands it a profile).
The roofline (``roofline``, ``roofline_tables``, ``roofline_rows``, ``roofline_png``): ``bench.roofline``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from gemmlab.bench.roofline import roofline, roofline_png, roofline_rows, roofline_tables
from gemmlab.device import gpu_slug, tensor_peak_tflops
from gemmlab.instruments import timing
from gemmlab.output import Table, load_json, long_row
from gemmlab.problems import matrix

__all__ = [
    "HEALTH_FIGURES",
    "HEALTH_MIN",
    "cublas_tflops",
    "hbm_copy_gbps",
    "health",
    "health_problems",
    "health_tables",
    "home",
    "launch_overhead",
    "load",
    "long_rows",
    "mma_peak",
    "probe",
    "profile_path",
    "roofline",
    "roofline_png",
    "roofline_rows",
    "roofline_tables",
    "save",
    "tables",
]

HEALTH_MIN = 0.8  # a re-measured figure below this fraction of the profile's is a problem


@triton.jit
def _mma_peak_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    iters,  # a (BM, BK), b (BK, BN) fp16; c (grid, BM, BN) fp16
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """Grid (programs,): each loads one A and one B tile once and runs ``iters`` dots on them, so the
    operands stay on chip and only the tensor cores are measured."""
    rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * BN + rn[None, :])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(iters):
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + tl.program_id(0) * BM * BN + rm[:, None] * BN + rn[None, :], acc.to(tl.float16))


@triton.jit
def _empty_kernel(x_ptr):
    pass


def home() -> Path:
    return Path(os.environ.get("GEMMLAB_HOME", Path.home() / ".gemmlab"))


def profile_path(gpu_name: str) -> Path:
    return home() / f"device-{gpu_slug(gpu_name)}.json"


def load(gpu_name: str | None = None) -> dict | None:
    """The recorded profile of this GPU (or ``gpu_name``), None when there is none."""
    if gpu_name is None:
        if not torch.cuda.is_available():
            return None
        gpu_name = torch.cuda.get_device_name()
    path = profile_path(gpu_name)
    if not path.exists() and not path.is_symlink():
        return None
    try:  # bounded (output.load_json): a damaged, deep or swapped file is one ValueError naming it
        data = load_json(path)
    except OSError as e:
        raise ValueError(f"the recorded device profile {path}: {e.strerror or e}") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"the recorded device profile {path}: a JSON {type(data).__name__}, not a profile "
            "(run `gemmlab probe` again, or remove it)"
        )
    return data


def save(profile: dict, path: str | Path | None = None) -> Path:
    path = Path(path) if path else profile_path(profile["gpu"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=1))
    return path


def _timed(fn, reps: int, warmup_s: float) -> tuple[float, dict]:
    """Median ms of ``reps`` L2-flushed calls after ``warmup_s`` of warm-up, and the clocks while timed."""
    timing.warmup({"f": fn}, warmup_s)
    windows: timing.Windows = {}
    with timing.ClockSampler() as s:
        t = timing.interleave({"f": fn}, rounds=max(1, reps // 5), reps=min(5, reps), warmup_s=0.0, windows=windows)
    return statistics.median(x for r in t["f"] for x in r), s.summary(windows["f"], min_samples=1)


def hbm_copy_gbps(nbytes: int = 1 << 30, reps: int = 20) -> dict:
    src = torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    ms, clk = _timed(lambda: dst.copy_(src), reps, 0.3)
    return {
        "gbps": 2 * nbytes / (ms * 1e-3) / 1e9,
        "bytes_per_copy": nbytes,
        "median_ms": ms,
        "clocks": clk,
        "note": "device-to-device copy; read + write bytes counted",
    }


def cublas_tflops(n: int = 8192, reps: int = 20, dtype: torch.dtype = torch.float16) -> dict:
    a, b = (matrix(n, n, "centered", None, dtype, device="cuda") for _ in range(2))
    timing.require_random(a=a, b=b)
    c = torch.empty((n, n), dtype=dtype, device="cuda")
    ms, clk = _timed(lambda: torch.mm(a, b, out=c), reps, 1.0)
    return {
        "shape": [n, n, n],
        "dtype": str(dtype).removeprefix("torch."),
        "median_ms": ms,
        "tflops": 2.0 * n**3 / (ms * 1e-3) / 1e12,
        "clocks": clk,
    }


def mma_peak(iters: int = 4096, reps: int = 10, block: tuple[int, int, int] = (128, 256, 64)) -> dict:
    """The attainable dense fp16 tensor-core rate: ``_mma_peak_kernel`` on every SM (one program each)."""
    bm, bn, bk = block
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a = matrix(bm, bk, "centered", None, torch.float16, device="cuda")
    b = matrix(bk, bn, "centered", None, torch.float16, device="cuda") / iters
    c = torch.empty((sms, bm, bn), dtype=torch.float16, device="cuda")
    call = lambda: _mma_peak_kernel[(sms,)](a, b, c, iters, BM=bm, BN=bn, BK=bk, num_warps=8)  # noqa: E731
    call()
    torch.cuda.synchronize()
    want = (a.float() @ b.float()) * iters
    err = (c[0].float() - want).abs().max().item()
    if not err <= 1e-2 * max(1.0, want.abs().max().item()):  # the loop really ran
        raise RuntimeError(f"mma peak kernel is wrong: max |err| {err}")
    ms, clk = _timed(call, reps, 1.0)
    tflops = 2.0 * bm * bn * bk * iters * sms / (ms * 1e-3) / 1e12
    mhz = clk.get("sm_clock_mhz_mean")
    return {
        "tflops": tflops,
        "median_ms": ms,
        "block": list(block),
        "iters": iters,
        "programs": sms,
        "clocks": clk,
        "flop_per_clock_per_sm": tflops * 1e12 / (sms * mhz * 1e6) if mhz else None,
    }


def launch_overhead(n: int = 2000) -> dict:
    """Host microseconds per launch of an empty Triton kernel, and per torch.add of 1 element (both
    enqueue-only, the device keeping up), and device microseconds per empty kernel back to back."""
    x = torch.zeros(1, device="cuda")
    _empty_kernel[(1,)](x)
    torch.cuda.synchronize()
    out = {}
    for name, fn in (("triton_empty_us", lambda: _empty_kernel[(1,)](x)), ("torch_add_us", lambda: x.add_(1))):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(100):
            _empty_kernel[(1,)](x)
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    out["device_per_kernel_us"] = s.elapsed_time(e) * 1e3 / 1000
    return out


def probe(quick: bool = False) -> dict:
    """Measure this GPU (device 0). ``quick``: fewer repetitions (the health check)."""
    if not torch.cuda.is_available():
        raise RuntimeError("gemmlab probe needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    env = timing.env_info()
    prof = {
        "kind": "device-profile",
        "gpu": props.name,
        "date": env["date"],
        "gemmlab": env["gemmlab"],
        "git_sha": env["git_sha"],
        "torch": env["torch"],
        "triton": env["triton"],
        "driver": env.get("driver"),
        "sm_count": props.multi_processor_count,
        "capability": [props.major, props.minor],
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "smem_per_block_optin": getattr(props, "shared_memory_per_block_optin", None),
        "memory_bytes": props.total_memory,
        "power_limit_w": env.get("power_limit_w"),
        "max_sm_clock_mhz": env.get("max_sm_clock_mhz"),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        prof["max_mem_clock_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
        prof["idle_sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    except Exception as e:
        prof["nvml"] = f"unavailable: {e}"
    reps = 6 if quick else 20
    prof["hbm_copy"] = hbm_copy_gbps(reps=reps)
    prof["cublas_8192"] = cublas_tflops(reps=reps)
    prof["mma_peak"] = mma_peak(reps=max(5, reps // 2))
    prof["launch"] = launch_overhead(500 if quick else 2000)
    nominal = tensor_peak_tflops(
        (props.major, props.minor), "float16", props.multi_processor_count, prof.get("max_sm_clock_mhz")
    )
    prof["nominal_tensor_tflops_at_max_clock"] = nominal
    return prof


def health_problems(profile: dict, now: dict, min_fraction: float = HEALTH_MIN) -> list[str]:
    """Figures of ``now`` below ``min_fraction`` of the recorded ``profile`` (the competition story's "below
    40 TFLOPS means the GPU is degraded"), and a launch overhead above twice the recorded one."""
    problems = []
    for name, get in (
        ("HBM copy GB/s", lambda p: p["hbm_copy"]["gbps"]),
        ("cuBLAS 8192^3 TFLOPS", lambda p: p["cublas_8192"]["tflops"]),
        ("tensor-core loop TFLOPS", lambda p: p["mma_peak"]["tflops"]),
    ):
        ref, cur = get(profile), get(now)
        if cur < min_fraction * ref:
            problems.append(f"{name}: {cur:.0f} is {cur / ref:.0%} of the recorded {ref:.0f}")
    # host-side launch cost varies with CPU load far more than device figures: flag only a doubling
    ref, cur = profile["launch"]["triton_empty_us"], now["launch"]["triton_empty_us"]
    if cur > 2 * ref:
        problems.append(f"Triton launch overhead: {cur:.1f} us against the recorded {ref:.1f} us")
    return problems


def health(profile: dict) -> dict:
    now = probe(quick=True)
    return {
        "kind": "device-health",
        "profile_date": profile["date"],
        "now": now,
        "problems": health_problems(profile, now),
    }


def tables(profile: dict) -> list[Table]:
    """The recorded constants of a device profile, one row each."""
    p, mp, cb = profile, profile["mma_peak"], profile["cublas_8192"]
    t = Table(f"{p['gpu']} (sm_{p['capability'][0]}{p['capability'][1]}), {p['date']}", ("constant", "value"))
    for name, v in (
        ("SMs", p["sm_count"]),
        ("L2", f"{(p['l2_bytes'] or 0) / 2**20:.0f} MiB"),
        ("shared memory per block (opt-in)", f"{p['smem_per_block_optin']} B"),
        ("max SM clock / power limit", f"{p['max_sm_clock_mhz']} MHz / {p['power_limit_w']} W"),
        ("HBM copy", f"{p['hbm_copy']['gbps']:.0f} GB/s"),
        ("cuBLAS fp16 8192^3", f"{cb['tflops']:.0f} TFLOPS at {cb['clocks'].get('sm_clock_mhz_mean', 0):.0f} MHz"),
        (
            "tensor-core loop (operands on chip)",
            f"{mp['tflops']:.0f} TFLOPS at "
            f"{mp['clocks'].get('sm_clock_mhz_mean', 0):.0f} MHz = "
            f"{mp['flop_per_clock_per_sm'] or 0:.0f} FLOP/clock/SM",
        ),
        ("nominal fp16 peak at max clock", f"{p['nominal_tensor_tflops_at_max_clock'] or 0:.0f} TFLOPS"),
        (
            "launch: Triton empty / torch add (host)",
            f"{p['launch']['triton_empty_us']:.1f} / {p['launch']['torch_add_us']:.1f} us",
        ),
        ("empty kernel back to back (device)", f"{p['launch']['device_per_kernel_us']:.2f} us"),
    ):
        t.rows.append([name, str(v)])
    return [t]


HEALTH_FIGURES = (
    ("HBM copy GB/s", lambda p: p["hbm_copy"]["gbps"]),
    ("cuBLAS 8192^3 TFLOPS", lambda p: p["cublas_8192"]["tflops"]),
    ("tensor-core loop TFLOPS", lambda p: p["mma_peak"]["tflops"]),
    ("Triton launch us", lambda p: p["launch"]["triton_empty_us"]),
)


def health_tables(res: dict, profile: dict) -> list[Table]:
    t = Table(f"health against the profile of {profile['date']}", ("figure", "now", "recorded"))
    t.rows = [[name, f"{get(res['now']):.1f}", f"{get(profile):.1f}"] for name, get in HEALTH_FIGURES]
    t.notes = [f"[red]DEGRADED: {p}" for p in res["problems"]] or [
        "[green]healthy: every figure within the allowed fraction of the profile"
    ]
    return [t]


def long_rows(profile: dict) -> list[dict]:
    """The profile's measured figures (a device profile, or the "now" of a health check)."""
    p = profile.get("now", profile)
    return [
        long_row("device", p["gpu"], metric, unit, "constant", metric, get(p))
        for metric, unit, get in (
            ("hbm_copy", "GB/s", HEALTH_FIGURES[0][1]),
            ("cublas_8192", "TFLOPS", HEALTH_FIGURES[1][1]),
            ("mma_peak", "TFLOPS", HEALTH_FIGURES[2][1]),
            ("triton_launch", "us", HEALTH_FIGURES[3][1]),
        )
    ]
