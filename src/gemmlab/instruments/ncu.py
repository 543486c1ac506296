"""``gemmlab profile``: why a GEMM runs as fast as it does, read from the hardware counters (Nsight Compute).

    profile(m, n, k, dtype="float16", layout="row", config=None, baseline="cublas") -> a profile (dict)
    request(...) -> the CLI's arguments checked; profile_view.py turns a profile into the CLI's tables

One ``ncu`` process per backend (gemmlab, then the baseline), so every kernel in a report is that backend's:

    ncu --profile-from-start off --cache-control all --clock-control none|base --metrics <METRICS> \\
        --export R python -m gemmlab.instruments.ncu_target --backend gemmlab --shape M,N,K ...

The target (``profile_target``) builds fresh random inputs, warms up, poisons the output, brackets one call
with cudaProfilerStart/Stop (so ncu profiles exactly that call's launches) and verifies that call's output
against ``gemmlab.ref``. ncu replays each launch once per pass of counters and flushes every cache before
each pass (``--cache-control all``: L2 cold, as the benchmarks time). ``--clock-control none`` (the default
here) leaves the GPU its own clocks, as ``bench`` sees them; ``base`` locks them to base clock (steadier for
before/after, slower than what users get). The SM clock during each launch is a counter
(``sm__cycles_elapsed.avg.per_second``), and nvidia-smi is read before and after each ncu run.

The report is read back with ``ncu --import R --csv --page raw`` (``ncu_metrics.parse_raw_csv``: a header row of
metric names, a units row, one row per launch). A call of several launches (a copy before the GEMM, a reduction
after it) is reported per launch and in total: durations and counts summed, rates and percentages averaged
weighted by duration (``Metric.combine``). Metrics this ncu does not know (``ncu --query-metrics``) are left
out and listed in ``unavailable``; durations under ncu (serialized, replayed, caches flushed) are for
explaining, not timing: ``bench`` times.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from gemmlab import output
from gemmlab.instruments.ncu_metrics import (
    METRICS,
    launch_summary,
    metric_names,
    number,
    parse_raw_csv,
    requested,
    total,
)

FORMAT = "gemmlab-profile/1"
BASELINES = ("cublas", "none")
LAYOUTS = ("row", "linear")  # row: B (K, N) row-major; linear: nn.Linear's B = W^T with W (N, K) row-major
CLOCK_CONTROLS = ("none", "base")


class ProfileError(RuntimeError):
    """A profile that could not be taken; one line. ``code`` 2: this machine cannot profile (no GPU, no ncu,
    no counter permission); 1: the run failed."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def find_ncu() -> str | None:
    """``$GEMMLAB_NCU``, else ``ncu`` on PATH, else the CUDA toolkit's and Nsight Compute's usual homes."""
    if os.environ.get("GEMMLAB_NCU"):
        return os.environ["GEMMLAB_NCU"] if os.access(os.environ["GEMMLAB_NCU"], os.X_OK) else None
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in (
        "/usr/local/cuda/bin/ncu",
        "/usr/local/cuda-*/bin/ncu",
        "/usr/local/cuda*/nsight-compute*/ncu",
        "/opt/nvidia/nsight-compute/*/ncu",
        "/usr/local/NVIDIA-Nsight-Compute*/ncu",
    ):
        for path in sorted(glob.glob(pattern), reverse=True):
            if os.access(path, os.X_OK):
                return path
    return None


def unavailable(cuda: bool | None = None, ncu: str | None = "find") -> str | None:
    """Why this machine cannot profile (one line), or None. ``cuda``/``ncu`` override the probes (tests)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if not cuda:
        return "gemmlab profile: no CUDA GPU here (Nsight Compute reads a GPU's counters)"
    if (find_ncu() if ncu == "find" else ncu) is None:
        return (
            "gemmlab profile: Nsight Compute (ncu) not found: not on PATH, nor in /usr/local/cuda/bin; "
            "set GEMMLAB_NCU=/path/to/ncu"
        )
    return None


# ------------------------------------------------------------------------------------------- reading ncu


def backend_profile(csv_text: str, m: int, n: int, k: int) -> dict:
    """Per-launch summaries and the call's total from one backend's raw CSV; TFLOPS = 2*M*N*K / duration."""
    launches = [launch_summary(launch) for launch in parse_raw_csv(csv_text)]
    if not launches:
        raise ProfileError("ncu profiled no kernel in the call (no rows in its report)")
    tot = total(launches)
    us = tot["values"].get("duration")
    tot["tflops"] = 2.0 * m * n * k / (us * 1e-6) / 1e12 if us else None
    return {"launches": launches, "total": tot}


# ------------------------------------------------------------------------------------------- running ncu


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise ProfileError(f"{Path(cmd[0]).name} ran past {timeout:.0f} s: {' '.join(cmd[:6])} ...") from None


def ncu_version(ncu: str) -> str | None:
    r = _run([ncu, "--version"], 60)
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    return lines[-1].strip() if r.returncode == 0 and lines else None


def query_metrics(ncu: str) -> tuple[set[str] | None, str]:
    """The metric names this ncu knows on GPU 0 (``metric_names``), and its raw output. None when the query
    fails or its output does not read as a metric list (no gpu__time_duration): then every metric is asked
    for and ncu's own refusals decide (``run_backend``)."""
    r = _run([ncu, "--query-metrics", "--query-metrics-mode", "all", "--devices", "0"], 120)
    names = metric_names(r.stdout) if r.returncode == 0 else set()
    return (names if "gpu__time_duration" in names else None), r.stdout + r.stderr


def smi_clocks() -> dict | None:
    """GPU 0's SM clock (now and max), power and temperature from nvidia-smi; None without it."""
    fields = ("clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu")
    try:
        r = subprocess.run(
            ["nvidia-smi", "-i", "0", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = [p.strip() for p in r.stdout.strip().split(",")]
    if r.returncode != 0 or len(parts) != len(fields):
        return None
    keys = ("sm_clock_mhz", "max_sm_clock_mhz", "power_w", "temp_c")
    return {key: number(p) for key, p in zip(keys, parts, strict=True)}


def _ncu_error(output: str) -> str:
    """The line of ncu's output that says what went wrong: its first error, else its first warning (such as
    "No kernels were profiled"), else the last line."""
    for mark in ("==ERROR==", "==WARNING=="):
        lines = [line.strip() for line in output.splitlines() if mark in line]
        if lines:
            return lines[0][:300]
    return (output.strip().splitlines() or ["(no output)"])[-1][:300]


def _missing_metrics(output: str, names: list[str]) -> list[str]:
    """Requested metrics that ncu's error lines name (an unknown metric on this GPU or ncu version)."""
    errors = "\n".join(line for line in output.splitlines() if "==ERROR==" in line)
    return [n for n in names if n in errors or re.search(rf"\b{re.escape(n.split('.')[0])}\b(?!\.)", errors)]


def run_backend(
    ncu: str,
    backend: str,
    target_args: list[str],
    metrics: list[str],
    work: Path,
    stem: str,
    clock_control: str,
    timeout: float,
) -> tuple[dict, str, list[str]]:
    """One ncu run of the target for ``backend``: (the target's result, the raw CSV, metrics dropped because
    ncu refused them). Keeps R.ncu-rep, the CSV, the ncu log and the target's JSON in ``work``."""
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    rep, result = work / f"{stem}-{backend}", work / f"{stem}-{backend}.target.json"
    dropped: list[str] = []
    for _attempt in range(3):  # again only without the metrics ncu named as unknown
        result.unlink(missing_ok=True)
        cmd = [
            ncu,
            "--target-processes",
            "all",
            "--profile-from-start",
            "off",
            "--cache-control",
            "all",
            "--clock-control",
            clock_control,
            "--metrics",
            ",".join(metrics),
            "--export",
            str(rep),
            "--force-overwrite",
            sys.executable,
            "-m",
            "gemmlab.instruments.ncu_target",
            "--backend",
            backend,
            "--result",
            str(result),
            *target_args,
        ]
        r = _run(cmd, timeout, env)
        (work / f"{stem}-{backend}.ncu.log").write_text(" ".join(cmd) + "\n" + r.stdout + r.stderr)
        missing = _missing_metrics(r.stdout + r.stderr, metrics)
        if not missing:
            break
        dropped += missing
        metrics = [x for x in metrics if x not in missing]
    out = r.stdout + r.stderr
    if "ERR_NVGPUCTRPERM" in out:
        raise ProfileError(
            "ncu: no permission to read the GPU's counters (ERR_NVGPUCTRPERM): run as root or "
            "allow profiling for all users (NVreg_RestrictProfilingToAdminUsers=0)",
            code=2,
        )
    if not result.exists():
        raise ProfileError(f"the {backend} target did not finish under ncu (rc {r.returncode}): {_ncu_error(out)}")
    target = json.loads(result.read_text())
    if not target["check"]["ok"]:
        raise ProfileError(
            f"{backend}'s output is wrong at this shape (worst error / allowed "
            f"{target['check']['worst']:.3g}): a wrong kernel is not worth profiling"
        )
    if not Path(f"{rep}.ncu-rep").exists():
        raise ProfileError(f"ncu wrote no report for {backend} (rc {r.returncode}): {_ncu_error(out)}")
    imp = _run([ncu, "--import", f"{rep}.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"], timeout)
    if imp.returncode != 0:  # an ncu without --print-units: the parser converts scaled units too
        imp = _run([ncu, "--import", f"{rep}.ncu-rep", "--csv", "--page", "raw"], timeout)
    if imp.returncode != 0:
        raise ProfileError(f"ncu --import {rep}.ncu-rep failed: {_ncu_error(imp.stdout + imp.stderr)}")
    (work / f"{stem}-{backend}.raw.csv").write_text(imp.stdout)
    return target, imp.stdout, dropped


def stem(m: int, n: int, k: int, dtype: str, layout: str, entry: int | None = None) -> str:
    """The name profiles of this problem share: profile-MxNxK-dtype-layout[-eID]."""
    return f"profile-{m}x{n}x{k}-{dtype}-{layout}" + (f"-e{entry}" if entry is not None else "")


def profile(
    m: int,
    n: int,
    k: int,
    dtype: str = "float16",
    layout: str = "row",
    config: dict | None = None,
    baseline: str = "cublas",
    clock_control: str = "none",
    output_dir: str | None = None,
    seed: int = 0,
    entry: int | None = None,
    timeout: float = 600.0,
) -> dict:
    """Profile one verified call of gemmlab (``config`` pinned, else its plan's) and of ``baseline`` at
    C (M, N) = A (M, K) @ B; returns the profile (``FORMAT``) and, with ``output_dir``, writes it as
    ``stem(...).json`` beside the ncu reports, their CSVs and logs. Raises ProfileError."""
    from gemmlab.instruments.timing import env_info

    why = unavailable()
    if why:
        raise ProfileError(why, code=2)
    ncu = find_ncu()
    name = stem(m, n, k, dtype, layout, entry)
    keep = Path(output_dir) if output_dir else None
    work = keep or Path(tempfile.mkdtemp(prefix="gemmlab-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        available, listing = query_metrics(ncu)
        if keep:  # the query's lines about these metrics (the whole list is megabytes), to check names by
            bases = {x.ncu.split(".")[0] for x in METRICS} | {"stalled", "tensor"}
            lines = listing.splitlines()
            text = "\n".join(lines[:6] + [x for x in lines[6:] if any(b in x for b in bases)]) + "\n"
            output.write_files(keep, {"ncu-query-metrics.txt": text})  # never over a file gemmlab did not write
        metrics, lacking = requested(available)
        target_args = ["--shape", f"{m},{n},{k}", "--dtype", dtype, "--layout", layout, "--seed", str(seed)]
        if config:
            target_args += ["--config", json.dumps(config)]
        prof = {
            "kind": "ncu-profile",
            "format": FORMAT,
            "shape": [m, n, k],
            "dtype": dtype,
            "layout": layout,
            "config": config,
            "ledger_entry": entry,
            "seed": seed,
            "env": env_info(),
            "ncu": {
                "path": ncu,
                "version": ncu_version(ncu),
                "clock_control": clock_control,
                "cache_control": "all",
                "replay": "kernel",
                "metrics": metrics,
            },
            "metrics": [asdict(x) for x in METRICS],
            "unavailable": lacking,
            "backends": {},
        }
        for backend in ["gemmlab"] + ([baseline] if baseline != "none" else []):
            before = smi_clocks()
            target, text, dropped = run_backend(ncu, backend, target_args, metrics, work, name, clock_control, timeout)
            prof["unavailable"] += [d for d in dropped if d not in prof["unavailable"]]
            metrics = [x for x in metrics if x not in dropped]
            prof["backends"][backend] = {
                **target,
                **backend_profile(text, m, n, k),
                "clocks": {"before": before, "after": smi_clocks()},
                "report": f"{name}-{backend}.ncu-rep" if keep else None,
            }
        g, c = prof["backends"]["gemmlab"]["total"], prof["backends"].get(baseline, {}).get("total")
        gd, cd = g["values"].get("duration"), (c or {}).get("values", {}).get("duration")
        prof["ratio_vs_baseline"] = cd / gd if gd and cd else None  # baseline time / gemmlab time, under ncu
        if keep:
            output.write_files(keep, {f"{name}.json": json.dumps(prof, indent=1, default=str)})
            prof["file"] = str(keep / f"{name}.json")
        return prof
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def request(
    shape: str | None, dtype: str, layout: str, config: str | dict | None, baseline: str, clock_control: str
) -> dict:
    """The CLI's arguments checked: {"m", "n", "k", "dtype", "layout", "config", "baseline", "clock_control"};
    ValueError (one line, naming the flag) for a bad one. ``config``: JSON text or a dict of GemmConfig
    fields, None for gemmlab's own plan."""
    from gemmlab.ops.gemm import GemmConfig
    from gemmlab.problems import parse_shape

    if not shape:
        raise ValueError("--shape M,N,K is required (or --ledger-entry ID, whose shape is used)")
    try:
        m, n, k = parse_shape(shape)
    except ValueError as e:
        raise ValueError(f"--shape {shape!r}: {e}") from None
    if min(m, n, k) < 1:
        raise ValueError(f"--shape {shape!r}: every size must be >= 1 (an empty GEMM launches no kernel)")
    for flag, value, allowed in (
        ("--dtype", dtype, ("float16", "bfloat16")),
        ("--layout", layout, LAYOUTS),
        ("--baseline", baseline, BASELINES),
        ("--clock-control", clock_control, CLOCK_CONTROLS),
    ):
        if value not in allowed:
            raise ValueError(f"{flag} {value!r}: one of {', '.join(allowed)}")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as e:
            raise ValueError(f"--config is not JSON ({e})") from None
    if config is not None:
        if not isinstance(config, dict):
            raise ValueError('--config: a JSON object of GemmConfig fields, e.g. {"block_m": 128, "block_n": 256}')
        try:
            config = asdict(GemmConfig.from_dict(config))
        except (TypeError, ValueError) as e:
            raise ValueError(f"--config: {e}") from None
    return {
        "m": m,
        "n": n,
        "k": k,
        "dtype": dtype,
        "layout": layout,
        "config": config,
        "baseline": baseline,
        "clock_control": clock_control,
    }
