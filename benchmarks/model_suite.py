"""The whole-model suite on one H200 in about 8 minutes: ``gemmlab bench model`` once per model, each in its own
process under its own time limit, then one short table of every result.

    GEMMLAB_GIT_SHA=$(git rev-parse HEAD) PYTHONPATH=src python3 -m benchmarks model-suite --out "$OUT"

What it covers (``STEPS``: 9 processes, 65 s for each model's inference, 35 s for its training, 75 s for
compile, 475 s of limits; ``--time-scale 2`` doubles them): torch, gemmlab and Liger (where liger-kernel has a
patch for the family) on OLMoE-1B-7B (all 16 layers), Qwen3-30B-A3B (8 of 48 layers), Mixtral-8x7B (4 of 32)
and the DeepSeek-V3-like model (4 layers: 1 dense, 3 MoE; its training model 2 layers); prefill T = 4096 and
16384, decode batch 1, 8 and 64 (512-token prompt, 8 steps a call), a training step (2 x 1024 tokens), each in
eager and CUDA-graph mode; torch.compile only for OLMoE's decode at batch 8 (2 layers; torch and gemmlab),
last. 3 interleaved rounds of 2 timed calls. No case starts in a step's last 25 s (the rest are listed as not
run): in the limits as given, expect the training steps to reach eager only, and a model whose kernels compile
from a cold .triton-cache to reach fewer cases.
What it does not: full-depth Qwen3 and Mixtral (``gemmlab bench model`` without ``--layers`` does), compile
elsewhere (a compile per variant and shape is minutes), Liger's tuned fused MoE (pinned to one config,
LIGER_FUSED_MOE_AUTOTUNE=0, unless ``--liger-autotune``: its autotuning takes minutes per model unless
.triton-cache already holds it).
Liger: a liger_kernel wheel in .whl/ is installed into /tmp/site (no index, no dependencies) and put on the
path; without one the Liger rows say it is not installed. Kernels compile into .triton-cache (kept between calls).
Writes under --out: suite.log (every step's output), summary.md (every table), results.tgz (each step's JSON,
CSV and Markdown, written under --results first); prints one line per step, then the summary table.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

QUICK = [
    "--rounds",
    "3",
    "--reps",
    "2",
    "--warmup-s",
    "0.1",
    "--context",
    "512",
    "--decode-steps",
    "8",
    "--train-batch",
    "2",
    "--train-tokens",
    "1024",
]
INFER, TRAIN = ["--phases", "prefill,decode"], ["--phases", "train"]
MODELS = {  # step name prefix: (model, its --layers arguments)
    "olmoe": ["--model", "olmoe-1b-7b"],
    "qwen3": ["--model", "qwen3-30b-a3b", "--layers", "8"],
    "mixtral": ["--model", "mixtral-8x7b", "--layers", "4"],
    "deepseek": ["--model", "deepseek-v3-like", "--layers", "4"],
}
# (name, seconds, bench model arguments): inference and training in their own processes, so that each phase
# gets its share of the time and a fault (out of memory, a kernel that faults) ends only its own step
STEPS = [
    step
    for name, model in MODELS.items()
    for step in (
        (f"{name}-infer", 65, [*model, *INFER, "--modes", "eager,graph"]),
        (f"{name}-train", 35, [*model, *TRAIN, "--modes", "eager,graph"]),
    )
] + [
    (
        "compile",
        75,
        [
            "--model",
            "olmoe-1b-7b",
            "--layers",
            "2",
            "--phases",
            "decode",
            "--decode-batch",
            "8",
            "--modes",
            "compile",
            "--variants",
            "torch,gemmlab",
        ],
    )
]
BUDGET_MARGIN_S = 25  # the bench's --budget-s is the step's limit less this (its imports, the case in flight)


def liger_path(root: Path) -> str | None:
    """Install a liger_kernel wheel from .whl/ into /tmp/site once; the path to add, or None."""
    site = Path("/tmp/site")
    if (site / "liger_kernel").is_dir():
        return str(site)
    wheels = sorted(glob.glob(str(root / ".whl" / "*.whl")))  # Liger's and whatever it was carried with
    if not any(Path(w).name.startswith("liger_kernel") for w in wheels):
        return None
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(site),
            *wheels,
        ],
        check=False,
    )
    return str(site) if (site / "liger_kernel").is_dir() else None


def run_steps(
    out: Path, res: Path, root: Path, liger_autotune: bool, only: list[str] | None, scale: float = 1.0
) -> list[str]:
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        TRITON_CACHE_DIR=os.environ.get("TRITON_CACHE_DIR", str(root / ".triton-cache")),
        TRITON_CACHE_AUTOTUNING="1",
        LIGER_FUSED_MOE_AUTOTUNE="1" if liger_autotune else "0",
    )
    paths = [str(root / "src")] + ([p] if (p := liger_path(root)) else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    lines = [f"liger wheel on the path: {paths[1] if len(paths) > 1 else 'none (the Liger rows say so)'}"]
    with (out / "suite.log").open("w") as log:
        for name, limit, args in STEPS:
            if only and name not in only:
                continue
            limit = int(limit * scale)
            cmd = [
                sys.executable,
                "-m",
                "gemmlab",
                "bench",
                "model",
                *QUICK,
                *args,
                "--budget-s",
                str(limit - BUDGET_MARGIN_S),
                "--output-dir",
                str(res / name),
            ]
            log.write(f"\n===== {name}: {' '.join(cmd)}\n")
            log.flush()
            t0 = time.perf_counter()
            try:
                rc = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, timeout=limit
                ).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            lines.append(f"{name}: rc={rc} {time.perf_counter() - t0:.0f}s")
            print(lines[-1], flush=True)
    return lines


def summarize(res: Path, out: Path, lines: list[str]) -> None:
    """Every step's JSON merged: the tables into summary.md, the short table on stdout."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from rich.console import Console

    from gemmlab import output
    from gemmlab.bench import model_view as view

    reports = []
    for path in sorted(res.rglob("whole-model-bench-*.json")):
        try:
            reports.append(json.loads(path.read_text()))
        except ValueError as e:
            lines.append(f"unreadable {path}: {e}")
    with tarfile.open(out / "results.tgz", "w:gz") as tar:
        tar.add(res, arcname="results")
    if not reports:
        (out / "summary.md").write_text("\n".join(lines) + "\nno results\n")
        print("no results (see suite.log)")
        return
    merged = view.merge(reports)
    (out / "summary.md").write_text(output.markdown(view.tables(merged), "\n\n".join(lines)))
    console = Console(width=170)
    output.print_tables([view.summary_table(merged)], console)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gemmlab-out"))
    ap.add_argument(
        "--results",
        default="/tmp/gemmlab-model-results",
        help="each step's files (outside --out: only a few files come back)",
    )
    ap.add_argument("--liger-autotune", action="store_true", help="let Liger's fused MoE autotune (minutes)")
    ap.add_argument("--only", help="comma-separated step names (e.g. olmoe-infer,qwen3-train,compile)")
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply every step's time limit")
    a = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    out, res = Path(a.out), Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    res.mkdir(parents=True, exist_ok=True)
    lines = run_steps(out, res, root, a.liger_autotune, a.only.split(",") if a.only else None, a.time_scale)
    summarize(res, out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
