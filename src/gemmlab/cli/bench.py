"""``gemmlab bench gemm|moe|model|layer|moe-ep|stable|fp8``: arguments; the work and tables are gemmlab.bench's."""

from __future__ import annotations

from typing import Annotated

import torch
import typer
from rich.console import Console

from gemmlab.cli import common as cmd
from gemmlab.cli.bench_fp8 import bench_fp8_cmd
from gemmlab.cli.bench_model import bench_layer_cmd, bench_model_cmd
from gemmlab.cli.bench_moe import CPU_MOE, bench_moe_cmd, moe_fits, moe_sizes
from gemmlab.cli.common import JsonOpt, LedgerOpt, ParentOpt, RecordOpt, Reps, Rounds, WarmupS
from gemmlab.cli.progress import Steps

__all__ = [
    "CPU_MOE",
    "bench_app",
    "bench_gemm",
    "bench_layer_cmd",
    "bench_model_cmd",
    "bench_moe_cmd",
    "bench_moe_ep_cmd",
    "bench_stable",
    "moe_fits",
    "moe_sizes",
]

bench_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Time kernels against cuBLAS: verified first, interleaved, clocks logged.",
)

bench_app.command("fp8")(bench_fp8_cmd)


@bench_app.command("gemm")
def bench_gemm(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable)")] = None,
    suite: Annotated[
        str | None,
        typer.Option(
            help="seeds (8192x8192x16384 and 131072x2048x7168), "
            "square, llm, small-m, all (cpu without CUDA); broad, "
            "broad-quick, broad-cpu, dense (broad + ten models' "
            "nn.Linear shapes): cases with their own dtype and layout; "
            "the summary judges each backend against the dense targets "
            "(docs/measuring.md)"
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[
        list[str] | None,
        typer.Option(
            callback=cmd.backends,
            help="gemmlab, gemmlab-packed, cublas, inductor, FILE.py:FN "
            "or package.module:FN (repeatable); cublas is always "
            "the baseline",
        ),
    ] = None,
    rounds: Rounds = 10,
    reps: Reps = 5,
    warmup_s: WarmupS = 1.0,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays (device time, no host launch cost)")] = False,
    modes: Annotated[
        str | None,
        typer.Option(
            help="timing modes, first primary: graph (device time), wall "
            "(eager, host+device per call), eager (device time of eager "
            "calls); default graph,wall for broad suites on CUDA"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(callback=cmd.seed, help="seed of the random inputs")] = 0,
    timeout: Annotated[
        float,
        typer.Option(
            callback=cmd.seconds, help="seconds per request to a FILE.py:FN backend's own process, loading included"
        ),
    ] = 120.0,
    budget_s: Annotated[
        float | None,
        typer.Option(callback=cmd.budget_seconds, help="start no case after this many seconds (the rest: not_run)"),
    ] = None,
    inductor_search_space: Annotated[
        str,
        typer.Option(
            callback=cmd.checked(
                lambda v: v.upper() in ("DEFAULT", "EXHAUSTIVE"), "is not a search space: DEFAULT or EXHAUSTIVE"
            ),
            help="inductor backend: DEFAULT or EXHAUSTIVE",
        ),
    ] = "DEFAULT",
    inductor_autotune_rep_ms: Annotated[
        int | None,
        typer.Option(callback=cmd.count, help="inductor backend: ms measured per autotune choice (its default 100)"),
    ] = None,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write gemm-bench.json, .csv, .md, -rows.csv and .png here")
    ] = None,
    json_out: JsonOpt = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """GEMM backends against cuBLAS, verified first, interleaved.

    Verified against float64 first, then interleaved with the L2 flushed, clocks sampled. Exit 1 when any backend is
    wrong."""
    from gemmlab.bench import gemm as bg
    from gemmlab.bench import gemm_view, probe
    from gemmlab.problems import CASE_SUITES, cases

    cuda = torch.cuda.is_available()
    if shapes and suite:
        raise cmd.usage_error(
            f"bench gemm: --shapes or --suite, not both (--suite {suite} with --shapes {' '.join(shapes)})"
        )
    todo = (
        cases(suite) if suite in CASE_SUITES and not shapes else cmd.shapes_of(shapes, suite, "all" if cuda else "cpu")
    )
    if modes is None and suite in CASE_SUITES and cuda and not graph:
        modes = "graph,wall"
    dt = cmd.dtype_of(dtype)
    cmd.fit_shapes(c.shape if hasattr(c, "shape") else c for c in todo)
    cmd.outputs_ready(output_dir, "gemm-bench", "gemm-bench-rows.csv", "gemm-bench.png")
    cmd.ledger_ready(ledger, record_note is not None or bool(ledger), parent, record_note is not None)
    with Steps("bench", len(todo), Console(stderr=True)) as steps:
        try:
            report = bg.bench_gemm(
                todo,
                dt,
                backend or ["gemmlab"],
                rounds=rounds,
                reps=reps,
                warmup_s=warmup_s,
                graph=graph,
                seed=seed,
                progress=steps.step,
                timeout=timeout,
                profile=probe.load(),
                modes=modes.split(",") if modes is not None else None,
                budget_s=budget_s,
                inductor_opts={
                    "search_space": inductor_search_space.upper(),
                    "autotune_rep_ms": inductor_autotune_rep_ms,
                },
            )
        except (ValueError, FileNotFoundError, AttributeError, ImportError) as e:
            raise cmd.usage_error(e) from e
    cmd.show(report, gemm_view, json_out, output_dir)
    if record_note is not None:
        from gemmlab.ledger.records import from_bench

        cmd.record(from_bench(report), record_note, ledger, parent)
    if not all(r["ok"] for r in bg.rows(report)):
        raise typer.Exit(1)


# registered in the order of the group's help (gemm, moe, model, layer, moe-ep, stable)
bench_app.command("moe")(bench_moe_cmd)
bench_app.command("model")(bench_model_cmd)
bench_app.command("layer")(bench_layer_cmd)


@bench_app.command("moe-ep")
def bench_moe_ep_cmd(
    model: Annotated[
        list[str] | None, typer.Option(help="deepseek-v3, qwen3-30b-a3b, mixtral-8x7b (repeatable)")
    ] = None,
    tokens: Annotated[
        list[int] | None, typer.Option(callback=cmd.counts, help="T per rank (repeatable) [default: 4096]")
    ] = None,
    chunks: Annotated[
        list[int] | None, typer.Option(callback=cmd.counts, help="overlap chunks (repeatable) [default: 1 2 4]")
    ] = None,
    rounds: Rounds = 10,
    reps: Reps = 5,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="rank 0 writes moe-ep-bench.json, .csv, .md here")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="rank 0 prints the report as JSON on stdout")] = False,
) -> None:
    """Expert-parallel MoE across the GPUs of a torchrun launch.

    Run as ``torchrun --nproc-per-node N -m gemmlab bench moe-ep``: per-rank time, all-to-all GB/s against NCCL's
    equal-split all_to_all, speedup against one GPU
    holding every expert; verified first. Exit 2 without CUDA or a process group, 1 if an output is wrong."""
    from gemmlab.bench import moe_ep

    cmd.outputs_ready(output_dir, "moe-ep-bench")
    try:
        rank, _ = moe_ep.init_from_env()
        rep = moe_ep.bench_moe_ep(
            model or ["qwen3-30b-a3b"], tokens or [4096], chunks or [1, 2, 4], rounds=rounds, reps=reps
        )
    except ValueError as e:
        raise cmd.usage_error(str(e).splitlines()[0]) from e
    if rank == 0:
        cmd.show(rep, moe_ep, json_out, output_dir, width=170)
    if not all(r["ok"] for r in rep["results"]):
        raise typer.Exit(1)


@bench_app.command("stable")
def bench_stable(
    shape: Annotated[str, typer.Option(help="M,N,K")] = "8192,8192,16384",
    processes: Annotated[int, typer.Option(callback=cmd.count, help="separate processes, each compiling fresh")] = 5,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[
        list[str] | None, typer.Option(callback=cmd.backends, help="as for `bench gemm` (repeatable)")
    ] = None,
    rounds: Annotated[int, typer.Option(callback=cmd.rounds_count, help="interleaved rounds per process")] = 6,
    reps: Reps = 5,
    warmup_s: Annotated[float, typer.Option(callback=cmd.warmup_seconds, help="seconds of warm-up per process")] = 1.0,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write stable-bench.json, .csv and .md here")
    ] = None,
    json_out: JsonOpt = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """The same measurement in N fresh processes: the spread across processes, and clock warnings."""
    from gemmlab.bench import stable
    from gemmlab.problems import parse_shape

    cmd.outputs_ready(output_dir, "stable-bench")
    cmd.ledger_ready(ledger, record_note is not None or bool(ledger), parent, record_note is not None)
    try:
        res = stable.stable_bench(
            parse_shape(shape),
            cmd.dtype_of(dtype),
            backend or ["gemmlab"],
            processes=processes,
            rounds=rounds,
            reps=reps,
            warmup_s=warmup_s,
            progress=Console(stderr=True).print,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cmd.show(res, stable, json_out, output_dir)
    if record_note is not None:
        from gemmlab.ledger.records import from_stable

        cmd.record(from_stable(res), record_note, ledger, parent)
    s = res["summary"]
    if any(e["wrong_in"] for e in s["backends"].values()) or s["processes_failed"]:
        raise typer.Exit(1)
