"""Which mounts CUDA needs writable: the sandbox's read-only host (``mounts.read_only_host``) against ``cuInit``.

Each trial is a child process (root, its own mount namespace, mounts private) that changes some mounts, then calls
the driver's ``cuInit(0)`` and ``cuDeviceGetCount`` through ctypes (no torch) and reports the CUresult (304 is
CUDA_ERROR_OPERATING_SYSTEM, what torch reports as "Error 304: OS call failed"). Trials:
  none       no change (the driver works here at all);
  all        read_only_host([scratch]) as the sandbox does it;
  only:M     mount point M alone made read-only (a failure names a mount CUDA writes to);
  all_but:M  read_only_host([scratch, M]): everything read-only but M (a success names a mount that suffices);
  fix        read_only_host([scratch, *every M whose only:M failed]);
  netns      no mount changed, a network namespace of its own (``sockets.own_network``, GEMMLAB_SANDBOX_NETNS);
and the 'all' trial under strace, where installed (its failed calls but ENOENT and ENOTTY).
Prints one line per trial and writes a JSON (env, trials). About 1-2 minutes on an H200 (cuInit per trial).

    python -m benchmarks cuda-mounts --out DIR
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CLONE_NEWNS = 0x00020000


def mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return sorted({line.split()[4].replace("\\040", " ") for line in f})


def cuda_result() -> str:
    """cuInit(0) and the device count, as text."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no libcuda ({e})"
    rc = cuda.cuInit(0)
    if rc != 0:
        return f"cuInit={rc}"
    n = ctypes.c_int(0)
    rc = cuda.cuDeviceGetCount(ctypes.byref(n))
    return f"ok ({n.value} devices)" if rc == 0 else f"cuDeviceGetCount={rc}"


def trial(kind: str, points: list[str]) -> str:
    """In this (child) process: a private mount namespace, the trial's mounts changed, then CUDA."""
    from gemmlab.sandbox import mounts

    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "netns":
        from gemmlab.sandbox import sockets

        return cuda_result() + f" [network {sockets.own_network()}]"
    if kind != "none":
        if libc.unshare(CLONE_NEWNS) != 0:
            return f"unshare: {os.strerror(ctypes.get_errno())}"
        if libc.mount(None, b"/", None, mounts.MS_REC | mounts.MS_PRIVATE, None) != 0:
            return f"private: {os.strerror(ctypes.get_errno())}"
    scratch = tempfile.mkdtemp(prefix="cuda-mounts-")
    done = ""
    if kind == "only":
        (point,) = points
        flags = mounts.MS_REMOUNT | mounts.MS_BIND | mounts.MS_RDONLY | mounts.mount_flags(point)
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            return f"remount: {os.strerror(ctypes.get_errno())}"
    elif kind in ("all", "all_but", "fix"):
        done = mounts.read_only_host([scratch, *points], [])
    return cuda_result() + (f" [{done}]" if done else "")


def run_trial(kind: str, points: list[str]) -> str:
    cmd = [sys.executable, __file__, "--trial", kind, *points]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "timed out (120 s)"
    lines = p.stdout.strip().splitlines()
    return lines[-1] if lines else f"rc={p.returncode}: {p.stderr.strip()[-300:]}"


def strace_all() -> list[str]:
    """The 'all' trial under strace (where installed): its failed file system calls."""
    cmd = ["strace", "-f", "-Z", "-e", "trace=%file,%desc", sys.executable, __file__, "--trial", "all"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"no strace run ({e})"]
    return [ln for ln in p.stderr.splitlines() if "= -1 " in ln and not ("ENOENT" in ln or "ENOTTY" in ln)][-200:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--trial", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    if args.trial:
        print(trial(args.trial[0], args.trial[1:]))
        return 0
    points = mount_points()
    jobs = [("none", []), ("all", []), ("netns", [])]
    jobs += [("only", [p]) for p in points] + [("all_but", [p]) for p in points]
    with ThreadPoolExecutor(args.workers) as pool:
        results = list(pool.map(lambda j: run_trial(*j), jobs))
    rows = [{"kind": k, "points": p, "result": r} for (k, p), r in zip(jobs, results, strict=True)]
    culprits = [r["points"][0] for r in rows if r["kind"] == "only" and not r["result"].startswith("ok")]
    rows.append({"kind": "fix", "points": culprits, "result": run_trial("fix", culprits)})
    traced = strace_all()
    for r in rows:
        print(f"{r['kind']:8} {','.join(r['points'])[:60]:60} {r['result'][:120]}")
    print("strace of the 'all' trial, failed file calls:", *traced[-40:], sep="\n  ")
    if args.out:
        from gemmlab.instruments.timing import env_info

        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "cuda-mounts.json"
        path.write_text(json.dumps({"env": env_info(), "trials": rows, "strace_all": traced}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
