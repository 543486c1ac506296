"""The one entry point of the measurement scripts: ``python -m benchmarks`` lists them, ``python -m benchmarks NAME
ARGS...`` runs one (a Python script as ``__main__`` with ARGS as its argv, a shell suite under bash). Run from the
repository root with gemmlab importable (installed, or ``PYTHONPATH=src``); each script's docstring or header says
what it measures, what it writes and how long it takes. docs/measuring.md describes them."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SCRIPTS = {  # name: (file, one line)
    "clock-order": ("clock_order.py", "why interleave: back-to-back against interleaved timing, cuBLAS vs itself"),
    "grade-gap": ("grade_gap.py", "the grader's competition-shape ratio re-measured by the benchmark's protocol"),
    "grade-rounding": (
        "grade_rounding.py",
        "the honest-arithmetic rule calibrated on cuBLAS and every gemmlab path, "
        "the cheap-arithmetic kernels, every case file's batch plan (3 minutes)",
    ),
    "cuda-mounts": ("cuda_mounts.py", "which mounts CUDA needs writable under the sandbox's read-only host (GPU)"),
    "grade-repeat": ("grade_repeat.py", "repeated grades: no false failure over N runs, cuBLAS graded against itself"),
    "host-cost": ("host_cost.py", "host microseconds per call of the public ops against PyTorch's, beside device time"),
    "moe-backward": ("moe_backward.py", "MoE forward + backward against torch's composite and Liger; peak memory"),
    "liger-warm": (
        "liger_warm.py",
        "compile and autotune Liger-Kernel's MoE kernels before `bench moe --baseline liger`",
    ),
    "bench-suite": ("bench_suite.sh", "the GEMM tables of docs/results/gemm.md (about 6 minutes on an H200)"),
    "loop-suite": ("loop_suite.sh", "probe, tune, health check and roofline (about 7 minutes on an H200)"),
    "moe-suite": ("moe_suite.sh", "the MoE tables of docs/results/moe.md, in two parts: bench, rest"),
    "session": ("session.sh", "one device call: named steps in order, each under its own time limit"),
    "model-suite": ("model_suite.py", "whole models' tokens/s, torch vs gemmlab vs Liger (about 8 minutes on an H200)"),
    "sweep-dense": (
        "sweep_dense.py",
        "issue 23's grid of paths and configs against cuBLAS (about 4 minutes on an H200)",
    ),
    "dense-rules": ("dense_rules.py", "the dense sweep's rows into dispatch rules and ledger entries (CPU)"),
    "dense-ab": (
        "dense_ab.py",
        "two bench gemm runs of one suite (dispatch table before and after), case by case (CPU)",
    ),
    "dense-estimate": (
        "dense_estimate.py",
        "a candidate dispatch table's effect on a suite, estimated from dense-ab runs already timed (CPU)",
    ),
    "fp8-dense": (
        "fp8_dense.py",
        "FP8 gemm_fp8 (per-tensor, block) vs torch._scaled_mm and gemmlab bf16, eager and "
        "graph (about 4 minutes on an H200)",
    ),
    "fp8-variants": (
        "fp8_variants.py",
        "issue 31: FP8 kernel variants vs cuBLASLt (block, per tensor) and the FP8 "
        "tensor cores' accumulation error (under 7 minutes on an H200)",
    ),
    "fp8-decode": (
        "fp8_decode.py",
        "issue 31 small M: gemm_fp8's decode path vs torch._scaled_mm at M 1..64, eager and graph, with the "
        "fraction of HBM copy bandwidth (about 5 minutes on an H200)",
    ),
    "fp8-moe": (
        "fp8_moe.py",
        "FP8 experts' moe_forward vs gemmlab bf16 at DeepSeek-V3 (T 4096, 128), eager and graph "
        "(sized for 6 minutes on an H200)",
    ),
}


def usage() -> str:
    width = max(map(len, SCRIPTS))
    return "usage: python -m benchmarks NAME [ARGS...]\n\n" + "\n".join(
        f"  {name:<{width}}  {line}" for name, (_, line) in SCRIPTS.items()
    )


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, args = argv[0], argv[1:]
    if name not in SCRIPTS:
        print(f"benchmarks: no script {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    path = HERE / SCRIPTS[name][0]
    if path.suffix == ".sh":
        return subprocess.call(["bash", str(path), *args])
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:  # the script's own exit status
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
