"""``gemmlab bench fp8``: argument handling; the work is gemmlab.bench.fp8's, the tables gemmlab.bench.fp8_view's."""

from __future__ import annotations

import sys
from typing import Annotated

import torch
import typer
from rich.console import Console

from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt
from gemmlab.cli.progress import Steps

SUITES = ("dense", "moe", "all")


def _dense_shapes(shapes: list[str] | None, quick: bool, cuda: bool) -> dict[str, tuple[int, int, int]]:
    from gemmlab.bench import fp8
    from gemmlab.problems import parse_shape

    if shapes:
        parsed = [parse_shape(s) for s in shapes]
        return {f"{m}x{n}x{k}": (m, n, k) for m, n, k in parsed}
    if not cuda:
        return dict(fp8.CPU_DENSE)
    return {n: s for n, s in fp8.DENSE_SHAPES.items() if not quick or n in fp8.DENSE_QUICK}


def bench_fp8_cmd(
    suite: Annotated[
        str,
        typer.Option(
            help="dense (gemm_fp8 vs torch._scaled_mm and gemmlab bf16), moe (FP8 experts vs bf16 experts) or all"
        ),
    ] = "all",
    shapes: Annotated[
        list[str] | None,
        typer.Option(
            help="dense M,N,K (repeatable; K a multiple of 16) "
            "[default: 4096^3, 8192^3, 8192x8192x16384 and "
            "DeepSeek-V3's nn.Linear shapes at T 4096; "
            "32x48x64 and 24x40x160 without CUDA]"
        ),
    ] = None,
    tokens: Annotated[
        list[int] | None,
        typer.Option(
            callback=cmd.counts,
            help="MoE T (repeatable) [default: "
            "4096 128 at DeepSeek-V3's experts; 5 at H 128 I 128 E 2 "
            "k 2 without CUDA]",
        ),
    ] = None,
    quick: Annotated[bool, typer.Option(help="dense 8192^3 and dsv3-o only, MoE T 4096 only")] = False,
    rounds: Annotated[
        int, typer.Option(callback=cmd.rounds_count, help="interleaved rounds (>= 6: the ratios' 95% intervals)")
    ] = 10,
    reps: Annotated[
        int | None,
        typer.Option(callback=cmd.reps_count, help="timed calls per candidate per round [default: 5; 1 without CUDA]"),
    ] = None,
    warmup_s: Annotated[
        float | None,
        typer.Option(callback=cmd.warmup_seconds, help="seconds of warm-up [default: 0.3; 0 without CUDA]"),
    ] = None,
    graph: Annotated[bool, typer.Option(help="also time CUDA-graph replays (eager always; needs CUDA)")] = True,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            "--output-dir",
            callback=cmd.out_dir,
            help="write fp8-bench.json (env: GPU, clocks, versions, git SHA), .csv and .md here",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """FP8 GEMMs against torch._scaled_mm and gemmlab's bf16, verified first, interleaved.

    Dense: gemm_fp8 per tensor and block-scaled against torch._scaled_mm per tensor and gemmlab.gemm bf16 on the
    dequantized operands; MoE: moe_forward on FP8 experts against the bf16 experts on the same weights
    dequantized. Each output checked against its own operands' float64 reference; eager and CUDA-graph replay.
    Without CUDA: tiny shapes under the Triton interpreter, eager only. Exit 1 if any output is wrong, 2 on bad
    input."""
    from gemmlab.bench import fp8, fp8_view

    err = Console(stderr=True)
    cuda = torch.cuda.is_available()
    if suite not in SUITES:
        raise cmd.usage_error(f"--suite {suite!r}: one of {', '.join(SUITES)}")
    cmd.outputs_ready(out, "fp8-bench")
    try:
        dense = _dense_shapes(shapes, quick, cuda) if suite in ("dense", "all") else {}
        for m, n, k in dense.values():
            fp8.check_dense_shape(m, n, k)
    except ValueError as e:
        raise cmd.usage_error(e) from e
    moe_tokens = (
        []
        if suite == "dense"
        else tokens or list(fp8.CPU_MOE_TOKENS if not cuda else fp8.MOE_QUICK if quick else fp8.MOE_TOKENS)
    )
    modes = ["eager", "graph"] if graph and cuda else ["eager"]
    try:
        fp8.check_args(modes, rounds)
    except ValueError as e:
        raise cmd.usage_error(e) from e
    if not cuda:
        err.print(
            "no CUDA: tiny shapes under the Triton interpreter, host clock, eager only (not a GPU "
            "measurement)" + ("; torch._scaled_mm: " + p if (p := fp8.scaled_mm_problem(torch.device("cpu"))) else ""),
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    kw = {
        "rounds": rounds,
        "reps": reps or (5 if cuda else 1),
        "warmup_s": (0.3 if cuda else 0.0) if warmup_s is None else warmup_s,
    }
    try:
        with Steps("bench fp8", (len(dense) + len(moe_tokens)) * len(modes), err) as steps:
            report = fp8.bench_fp8(dense, moe_tokens, modes=modes, progress=steps.step, **kw)
    except ValueError as e:
        raise cmd.usage_error(e) from e
    cmd.show(report, fp8_view, json_out, out, width=200)
    bad = fp8.failures(report)
    if bad:
        print(f"bench fp8: {len(bad)} wrong output(s): {', '.join(bad)}", file=sys.stderr)
        raise typer.Exit(1)
