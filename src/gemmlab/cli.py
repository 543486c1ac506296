"""The `gemmlab` command: argument handling over the library; each module draws its own tables.

    gemmlab grade [--cases NAME|PATH] [--kernel FILE.py:FN] [--signature ...]
    gemmlab check [--shapes M,N,K ...] [--dtype float16|bfloat16|both]
    gemmlab bench gemm [--shapes M,N,K ... | --suite NAME] [--backend NAME ...] [--graph]
    gemmlab bench moe | model | stable | moe-ep (under torchrun --nproc-per-node N)
    gemmlab table [--model NAME] [--batch-size 4 --seq-len 8192 --top-k 4 ...]
    gemmlab tune [--op gemm|moe] ...;  gemmlab probe [--check | --roofline BENCH.json]
    gemmlab report DIR... --output report.html;  gemmlab ledger list|show|compare|history|export
    gemmlab inspect --shape M,N,K [--dtype] [--layout NN] [--packed] [--json];  gemmlab paths

Every measuring command takes --json (one JSON document on stdout; its tables go to stderr) and --output-dir
(NAME.json, a long-format NAME.csv, NAME.md: ``gemmlab.output``). Without CUDA it runs through Triton's CPU
interpreter (TRITON_INTERPRET=1, set here before any kernel is imported) on small shapes.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Annotated

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import typer  # noqa: E402
from rich.console import Console  # noqa: E402

from gemmlab import output  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="gemmlab: fast FP16/BF16 GEMM in Triton, checked against a float64 reference.")
bench_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Time kernels against cuBLAS: verified first, interleaved, clocks logged.")
app.add_typer(bench_app, name="bench")
ledger_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="The experiment ledger: every attempt, accepted or rejected with its reason.")
app.add_typer(ledger_app, name="ledger")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise typer.BadParameter(f"--dtype {name!r}: float16 or bfloat16")
    return DTYPES[name]


def _shapes(shapes: list[str] | None, suite_name: str | None, default: str) -> list[tuple[int, int, int]]:
    from gemmlab.problems import parse_shape, suite

    try:
        return [parse_shape(s) for s in shapes] if shapes else suite(suite_name or default)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e


def _ints(text: str, n: int) -> list[int]:
    values = [int(v) for v in text.split(",")]
    if len(values) != n:
        raise ValueError(f"{text!r}: {n} comma-separated whole numbers")
    return values


def _check(ok, message: str):
    """A typer callback factory: ``ok(value)`` or a usage error naming the value."""
    def callback(value):
        if value is not None and not ok(value):
            raise typer.BadParameter(f"{value} {message}")
        return value
    return callback


_count = _check(lambda v: v >= 1, "is not a count: give a whole number >= 1")  # --rounds, --reps, --processes
_nonneg_count = _check(lambda v: v >= 0, "is negative: give a whole number >= 0")  # --warmup calls
_seconds = _check(lambda v: math.isfinite(v) and v > 0, "is not a time limit: give a finite number > 0")
_nonneg_seconds = _check(lambda v: math.isfinite(v) and v >= 0, "is not a duration: give a finite number >= 0")

RecordOpt = Annotated[str | None, typer.Option("--record", help="record this run in the ledger: what changed")]
LedgerOpt = Annotated[str | None, typer.Option("--ledger", help="ledger file [default: $GEMMLAB_LEDGER or "
                                                                "~/.gemmlab/ledger.db]")]
ParentOpt = Annotated[int | None, typer.Option("--parent", help="ledger entry to decide against [default: the "
                                                                "last accepted entry of the same shape]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the report as one JSON document on stdout (the "
                                                      "tables go to stderr)")]
OutOpt = Annotated[str | None, typer.Option(help="write NAME.json, NAME.csv (long format) and NAME.md here")]
Rounds = Annotated[int, typer.Option(callback=_count, help="interleaved rounds")]
Reps = Annotated[int, typer.Option(callback=_count, help="timed calls per candidate per round")]
WarmupS = Annotated[float, typer.Option(callback=_nonneg_seconds, help="seconds of warm-up (clocks settle)")]


def _usage_error(message: object) -> typer.Exit:
    """One line on stderr, unwrapped and taken literally (no rich markup), for ``raise ... from e``: exit 2."""
    print(" ".join(str(message).split()), file=sys.stderr)
    return typer.Exit(2)


def _ledger_ready(ledger: str | None, when: bool = True) -> None:
    """Before any work of a command that records: an unusable ledger is one line and exit 2."""
    from gemmlab.ledger import LedgerError, check

    try:
        if when:
            check(ledger)
    except LedgerError as e:
        raise _usage_error(e) from e


def _record(entries, note: str, ledger: str | None, parent: int | None) -> None:
    """Write entries to the ledger and print each decision (stderr)."""
    from gemmlab.ledger import LedgerError
    from gemmlab.ledger.records import record

    for e in entries:
        e.note = note
    try:
        done = record(entries, ledger, parent)
    except KeyError as e:
        raise typer.BadParameter(str(e)) from e
    except LedgerError as e:
        raise _usage_error(e) from e
    for e in done:
        color = "green" if e.decision == "accepted" else "yellow"
        Console(stderr=True, width=150).print(f"ledger #{e.id} {e.shape} {e.backend}: [{color}]{e.decision}[/] "
                                              f"({e.reason})")


def _show(report: dict, mod, json_out: bool, output_dir: str | None, width: int = 150, **write_kw) -> Console:
    """The module's tables (stderr under --json), its --output-dir files, the --json document."""
    con = Console(stderr=json_out, width=width)
    output.print_tables(mod.tables(report), con)
    for path in (mod.write(report, output_dir, **write_kw) if output_dir else []):
        con.print(f"wrote {path}")
    if json_out:
        output.emit_json(report)
    return con


def _progress(err: Console, total: float, count: bool = True):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    cols = (TextColumn("{task.description}"), BarColumn()) + ((TextColumn("{task.completed}/{task.total}"),)
                                                              if count else ()) + (TimeElapsedColumn(),
                                                                                   TimeRemainingColumn())
    return Progress(*cols, console=err, transient=True)


def _version(value: bool) -> None:
    if value:
        from gemmlab import provenance

        sha = provenance.git_sha()
        print(f"gemmlab {provenance.version()}" + (f" (git {sha})" if sha else ""))
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print gemmlab's version and exit")] = False) -> None:
    """gemmlab: fast FP16/BF16 GEMM in Triton, checked against a float64 reference."""


@app.command()
def check(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable); default: a suite")] = None,
    dtype: Annotated[str, typer.Option(help="float16, bfloat16 or both")] = "float16",
    seed: Annotated[int, typer.Option(help="seed of the random inputs (uniform in [-0.5, 0.5))")] = 0,
    output_dir: OutOpt = None, json_out: JsonOpt = False,
) -> None:
    """Multiply random matrices with gemmlab.gemm, check against gemm_ref, report plan, error and time."""
    from gemmlab.bench import check as bc
    from gemmlab.problems import parse_shape

    try:
        todo = [parse_shape(s) for s in shapes] if shapes else bc.default_shapes()
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if dtype not in bc.DTYPE_SETS:
        raise typer.BadParameter(f"--dtype {dtype!r}: float16, bfloat16 or both")
    report = bc.run_check(todo, bc.DTYPE_SETS[dtype], seed)
    _show(report, bc, json_out, output_dir, width=130)
    if bc.failed(report):
        raise typer.Exit(1)


@app.command()
def grade(
    cases: Annotated[str | None, typer.Option(help="case file: a shipped name (competition, competition-legacy, "
                                                   "moe, llm, cpu, moe-layer, moe-layer-cpu) or a path; default "
                                                   "competition with CUDA, else cpu")] = None,
    kernel: Annotated[str | None, typer.Option(help="FILE.py:FN or package.module:FN; default gemmlab's")] = None,
    signature: Annotated[str | None, typer.Option(help="rowmajor: FN(a, b) -> c; colmajor: FN(A, B, C, M, N, K); "
                                                       "default the case file's layout (moe case files: "
                                                       "FN(x, w1, w2, topk_weights, topk_ids) -> y)")] = None,
    allow_vendor: Annotated[bool, typer.Option(help="allow cuBLAS/CUTLASS/aten::mm in the candidate")] = False,
    timeout: Annotated[float, typer.Option(callback=_seconds, help="seconds per request to the candidate's "
                                                                   "process, loading the kernel included")] = 120.0,
    seed: Annotated[int, typer.Option(help="base seed of the correctness inputs (timed inputs are secret)")] = 0,
    rounds: Annotated[int | None, typer.Option(callback=_count, help="interleaved timing rounds")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write report.json, report.csv and report.md here")] = None,
    json_out: JsonOpt = False,
    keep_logs: Annotated[bool, typer.Option(help="keep the workers' logs (the report names the directory)")] = False,
    record_note: RecordOpt = None, ledger: LedgerOpt = None, parent: ParentOpt = None,
) -> None:
    """Grade a GEMM kernel: exact-shape verification, dispatch coverage, anti-cheat rules, isolation,
    interleaved timing against the vendor BLAS. Exit 0: all passed; 1: a case or rule failed; 2: usage."""
    from gemmlab.grade import cases as case_files
    from gemmlab.grade import default_cases, load_any
    from gemmlab.grade import grade as run_grade
    from gemmlab.grade import report as rep

    _ledger_ready(ledger, record_note is not None or bool(ledger))
    try:
        n_steps = len(load_any(cases or default_cases()).correctness)
        if output_dir:
            rep.clear(output_dir)  # no earlier report.json may stand for this grade
        with _progress(Console(stderr=True, width=140), n_steps + 1) as bar:
            task = bar.add_task("grading", total=n_steps + 1)
            report = run_grade(cases, kernel, signature, allow_vendor, timeout, seed, rounds,
                               progress=lambda msg: bar.update(task, advance=1, description=msg), keep_logs=keep_logs)
    except (case_files.CaseError, OSError) as e:
        raise _usage_error(e) from e
    rep.render(report, Console(stderr=json_out, width=140))
    if output_dir:
        rep.write(report, output_dir)
    if json_out:
        output.emit_json(report)
    if record_note is not None:
        from gemmlab.ledger.records import from_grade

        _record(from_grade(report), record_note, ledger, parent)
    raise typer.Exit(0 if report["verdict"] == "PASS" else 1)


@bench_app.command("gemm")
def bench_gemm(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable)")] = None,
    suite: Annotated[str | None, typer.Option(help="seeds, square, llm, small-m, all (cpu without CUDA)")] = None,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[list[str] | None, typer.Option(help="gemmlab, gemmlab-packed, cublas, FILE.py:FN or "
                                                           "package.module:FN (repeatable); cublas is always "
                                                           "the baseline")] = None,
    rounds: Rounds = 10, reps: Reps = 5, warmup_s: WarmupS = 1.0,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays (device time, no host launch cost)")] = False,
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    timeout: Annotated[float, typer.Option(callback=_seconds, help="seconds per request to a FILE.py:FN backend's "
                                                                   "own process, loading included")] = 120.0,
    output_dir: Annotated[str | None, typer.Option(help="write gemm-bench.json, .csv, .md and .png here")] = None,
    json_out: JsonOpt = False, record_note: RecordOpt = None, ledger: LedgerOpt = None, parent: ParentOpt = None,
) -> None:
    """GEMM backends against cuBLAS: verified against float64 first, then interleaved with the L2 flushed,
    clocks sampled. Exit 1 when any backend is wrong."""
    from gemmlab import probe
    from gemmlab.bench import gemm as bg

    todo = _shapes(shapes, suite, "all" if torch.cuda.is_available() else "cpu")
    dt = _dtype(dtype)
    _ledger_ready(ledger, record_note is not None or bool(ledger))
    with _progress(Console(stderr=True, width=150), len(todo)) as bar:
        task, state = bar.add_task("bench", total=len(todo)), {"first": True}

        def step(msg: str) -> None:
            bar.update(task, advance=0 if state.pop("first", False) else 1, description=msg)

        try:
            report = bg.bench_gemm(todo, dt, backend or ["gemmlab"], rounds=rounds, reps=reps, warmup_s=warmup_s,
                                   graph=graph, seed=seed, progress=step, timeout=timeout, profile=probe.load())
        except (ValueError, FileNotFoundError, AttributeError, ImportError) as e:
            raise _usage_error(e) from e
    _show(report, bg, json_out, output_dir)
    if record_note is not None:
        from gemmlab.ledger.records import from_bench

        _record(from_bench(report), record_note, ledger, parent)
    if not all(r["ok"] for r in bg.rows(report)):
        raise typer.Exit(1)


@bench_app.command("moe")
def bench_moe_cmd(
    model: Annotated[list[str] | None, typer.Option(help="deepseek-v3, mixtral-8x7b, qwen3-30b-a3b (repeatable)")]
    = None,
    tokens: Annotated[list[int] | None, typer.Option(help="T (repeatable) [default: 16 128 1024 4096 16384]")] = None,
    routing: Annotated[list[str] | None, typer.Option(help="uniform or zipf (repeatable)")] = None,
    part: Annotated[list[str] | None, typer.Option(help="grouped (first GEMM) or forward (whole body)")] = None,
    dtype: Annotated[str, typer.Option(help="bfloat16 or float16")] = "bfloat16",
    rounds: Rounds = 10, reps: Reps = 5, warmup_s: WarmupS = 1.0,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays")] = False,
    custom: Annotated[str | None, typer.Option(help="H,I,E,k of a model of your own (model name: custom)")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write moe-bench.json, .csv and .md here")] = None,
    json_out: JsonOpt = False, record_note: RecordOpt = None, ledger: LedgerOpt = None, parent: ParentOpt = None,
) -> None:
    """gemmlab's MoE kernels against torch._grouped_mm (and a per-expert loop, and the dense GEMM of the same
    size), verified first, interleaved. Exit 1 if anything is wrong."""
    from gemmlab.bench import moe as bm
    from gemmlab.problems import MoEModel

    _ledger_ready(ledger, record_note is not None or bool(ledger))
    err = Console(stderr=True)
    try:
        own = MoEModel(*_ints(custom, 4)) if custom else None  # H, I, E, k
        rep = bm.bench_moe(model or (["custom"] if own else ["deepseek-v3"]), tokens or [16, 128, 1024, 4096, 16384],
                           routing or ["uniform"], part or ["grouped", "forward"], _dtype(dtype), custom=own,
                           rounds=rounds, reps=reps, warmup_s=warmup_s, graph=graph, progress=err.print)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    _show(rep, bm, json_out, output_dir, width=170)
    if record_note is not None:
        from gemmlab.ledger.records import from_moe_bench

        _record(from_moe_bench(rep), record_note, ledger, parent)
    if not all(r["ok"] for r in bm.rows(rep)):
        raise typer.Exit(1)


@bench_app.command("model")
def bench_model_cmd(
    model: Annotated[str, typer.Option(help="mixtral, qwen3-moe, deepseek-v3 (comma-separated)")] =
    "mixtral,qwen3-moe,deepseek-v3",
    tokens: Annotated[str, typer.Option(help="T, comma-separated: prefill 4096, decode 1, 8, 64")] = "4096,1,8,64",
    modes: Annotated[str, typer.Option(help="eager, graph, compile (comma-separated)")] = "eager,graph,compile",
    rounds: Annotated[int, typer.Option(help="interleaved rounds")] = 10,
    reps: Annotated[int, typer.Option(help="timed calls per candidate per round")] = 5,
    warmup_s: Annotated[float, typer.Option(help="seconds of warm-up per case")] = 0.5,
    output_dir: Annotated[str | None, typer.Option(help="write model-bench-MODELS-MODES.json, .csv, .md here")]
    = None,
    json_out: JsonOpt = False,
) -> None:
    """One Hugging Face decoder layer (real dims, random bf16 weights): unpatched torch against
    gemmlab.patch, eager / CUDA graph / torch.compile, verified first, interleaved. Exit 1 if gemmlab is wrong."""
    import importlib.util

    if not torch.cuda.is_available():
        raise _usage_error("bench model needs a CUDA GPU (the layers are real-size)")
    if importlib.util.find_spec("transformers") is None:
        raise _usage_error("bench model needs transformers: pip install transformers")
    from gemmlab.bench import model as bmod

    try:
        rep = bmod.bench_model([m.strip() for m in model.split(",")], [int(t) for t in tokens.split(",")],
                               [m.strip() for m in modes.split(",")], rounds=rounds, reps=reps, warmup_s=warmup_s,
                               progress=Console(stderr=True).print)
    except ValueError as e:
        raise _usage_error(str(e).splitlines()[0]) from e
    _show(rep, bmod, json_out, output_dir, width=200)
    if bmod.failures(rep):
        raise typer.Exit(1)


@bench_app.command("moe-ep")
def bench_moe_ep_cmd(
    model: Annotated[list[str] | None, typer.Option(help="deepseek-v3, qwen3-30b-a3b, mixtral-8x7b (repeatable)")]
    = None,
    tokens: Annotated[list[int] | None, typer.Option(help="T per rank (repeatable) [default: 4096]")] = None,
    chunks: Annotated[list[int] | None, typer.Option(help="overlap chunks (repeatable) [default: 1 2 4]")] = None,
    rounds: Rounds = 10, reps: Reps = 5,
    output_dir: Annotated[str | None, typer.Option(help="rank 0 writes moe-ep-bench.json, .csv, .md here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="rank 0 prints the report as JSON on stdout")] = False,
) -> None:
    """Expert-parallel MoE across the GPUs of a torchrun launch (``torchrun --nproc-per-node N -m gemmlab bench
    moe-ep``): per-rank time, all-to-all GB/s against NCCL's equal-split all_to_all, speedup against one GPU
    holding every expert; verified first. Exit 2 without CUDA or a process group, 1 if an output is wrong."""
    from gemmlab.bench import moe_ep

    try:
        rank, _ = moe_ep.init_from_env()
        rep = moe_ep.bench_moe_ep(model or ["qwen3-30b-a3b"], tokens or [4096], chunks or [1, 2, 4], rounds=rounds,
                                  reps=reps)
    except ValueError as e:
        raise _usage_error(str(e).splitlines()[0]) from e
    if rank == 0:
        _show(rep, moe_ep, json_out, output_dir, width=170)
    if not all(r["ok"] for r in rep["results"]):
        raise typer.Exit(1)


@bench_app.command("stable")
def bench_stable(
    shape: Annotated[str, typer.Option(help="M,N,K")] = "8192,8192,16384",
    processes: Annotated[int, typer.Option(callback=_count, help="separate processes, each compiling fresh")] = 5,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[list[str] | None, typer.Option(help="as for `bench gemm` (repeatable)")] = None,
    rounds: Annotated[int, typer.Option(callback=_count, help="interleaved rounds per process")] = 6,
    reps: Reps = 5,
    warmup_s: Annotated[float, typer.Option(callback=_nonneg_seconds, help="seconds of warm-up per process")] = 1.0,
    output_dir: Annotated[str | None, typer.Option(help="write stable-bench.json, .csv and .md here")] = None,
    json_out: JsonOpt = False, record_note: RecordOpt = None, ledger: LedgerOpt = None, parent: ParentOpt = None,
) -> None:
    """The same measurement in N fresh processes: the spread across processes, and clock warnings."""
    from gemmlab.bench import stable
    from gemmlab.problems import parse_shape

    _ledger_ready(ledger, record_note is not None or bool(ledger))
    try:
        res = stable.stable_bench(parse_shape(shape), _dtype(dtype), backend or ["gemmlab"], processes=processes,
                                  rounds=rounds, reps=reps, warmup_s=warmup_s, progress=Console(stderr=True).print)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    _show(res, stable, json_out, output_dir)
    if record_note is not None:
        from gemmlab.ledger.records import from_stable

        _record(from_stable(res), record_note, ledger, parent)
    s = res["summary"]
    if any(e["wrong_in"] for e in s["backends"].values()) or s["processes_failed"]:
        raise typer.Exit(1)


@app.command("table")
def table_cmd(
    model: Annotated[str | None, typer.Option(help="deepseek-v3, mixtral-8x7b or qwen3-30b-a3b: fills hidden, "
                                                   "intermediate and top-k")] = None,
    batch_size: Annotated[int, typer.Option(help="batch")] = 4,
    seq_len: Annotated[int, typer.Option(help="sequence length")] = 8192,
    top_k: Annotated[int | None, typer.Option(help="experts per token [default: 4]")] = None,
    hidden_size: Annotated[int | None, typer.Option(help="K [default: 7168]")] = None,
    intermediate_size: Annotated[int | None, typer.Option(help="N [default: 2048]")] = None,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    warmup: Annotated[int, typer.Option(callback=_nonneg_count,
                                        help="warm-up calls per row (and at least --warmup-s seconds)")] = 10,
    repeat: Annotated[int, typer.Option(callback=_count, help="timed calls per row")] = 50,
    warmup_s: Annotated[float, typer.Option(callback=_nonneg_seconds, help="seconds of warm-up")] = 1.0,
    inspect: Annotated[bool, typer.Option(help="read tensor-core instructions from the SASS")] = True,
    num_experts: Annotated[int | None, typer.Option(
        callback=_count, help="experts of the fused MoE row [default: the model's, else 8]")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write table.json, table.csv, table.md here")] = None,
    json_out: JsonOpt = False, record_note: RecordOpt = None, ledger: LedgerOpt = None, parent: ParentOpt = None,
) -> None:
    """The seed's GEMM table: an MoE configuration's dense GEMM (M = batch*seq_len*top_k, N = intermediate,
    K = hidden) through cuBLAS, gemmlab, gemmlab with a prepacked B, and gemmlab's grouped MoE kernel."""
    from gemmlab.bench import table as bt
    from gemmlab.problems import MOE_MODELS, resolve_moe

    _ledger_ready(ledger, record_note is not None or bool(ledger))
    try:
        top_k, hidden_size, intermediate_size = resolve_moe(model, top_k, hidden_size, intermediate_size)
        res = bt.moe_table(batch_size, seq_len, top_k, hidden_size, intermediate_size, dtype=_dtype(dtype),
                           warmup=warmup, repeat=repeat, warmup_s=warmup_s, inspect=inspect, model=model,
                           num_experts=num_experts or (MOE_MODELS[model].experts if model else 8))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    _show(res, bt, json_out, output_dir, width=200)
    if record_note is not None:
        from gemmlab.ledger.records import from_table

        _record(from_table(res), record_note, ledger, parent)
    if any(r.get("ok") is False for r in res["rows"]):
        raise typer.Exit(1)


@app.command("inspect")
def inspect_cmd(
    shape: Annotated[str, typer.Option(help="M,N,K")] = "8192,8192,16384",
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    layout: Annotated[str, typer.Option(help="NN, NT, TN or TT: T = that operand stored transposed")] = "NN",
    packed: Annotated[bool, typer.Option(help="B prepacked by pack_b (K-major)")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """What the compiler made of the kernel `plan` picks at this shape (on this GPU, or the H200 without
    one): registers, spills, shared memory, warps, stages, blocks, SASS histogram, warp specialization.
    Exit 1 when the SASS has no tensor-core instruction."""
    from gemmlab.inspect.sass import inspect_shape, summary
    from gemmlab.problems import parse_shape

    try:
        m, n, k = parse_shape(shape)
        r = inspect_shape(m, n, k, _dtype(dtype), layout.upper(), packed)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if json_out:
        output.emit_json(r)
    else:
        Console(width=150).print("\n".join(summary(r, f"{m}x{n}x{k} {dtype} {layout}{' packed B' if packed else ''}")))
    if r.get("kernel") and not r.get("tensor_core"):
        raise typer.Exit(1)


@app.command("tune")
def tune_cmd(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable)")] = None,
    suite: Annotated[list[str] | None, typer.Option(help="shape suites (repeatable) [default: seeds and small-m "
                                                         "with CUDA, cpu without]")] = None,
    dtype: Annotated[str | None, typer.Option(help="float16 or bfloat16 [default: float16; bfloat16 with --op moe]")]
    = None,
    budget_minutes: Annotated[float, typer.Option(callback=_seconds, help="time budget for all shapes")] = 5.0,
    session: Annotated[str | None, typer.Option(help="session name [default: tune-<date>-<time>]")] = None,
    resume: Annotated[str | None, typer.Option(help="resume a session: skip what the ledger holds for it")] = None,
    op: Annotated[str, typer.Option(help="gemm, or moe (the MoE layer's grouped GEMMs)")] = "gemm",
    model: Annotated[str | None, typer.Option(help="--op moe: deepseek-v3, mixtral-8x7b, qwen3-30b-a3b")] = None,
    moe: Annotated[str | None, typer.Option(help="--op moe: H,I,E,k of a model of your own")] = None,
    tokens: Annotated[list[int] | None, typer.Option(help="--op moe: T (repeatable) [default: 4096]")] = None,
    moe_mode: Annotated[list[str] | None, typer.Option(help="--op moe: gate_up, down, grouped (repeatable) "
                                                            "[default: all three]")] = None,
    write: Annotated[bool, typer.Option(help="write confirmed winners to the user's <gpu>.json")] = True,
    configs_dir: Annotated[str | None, typer.Option(help="where to write <gpu>.json [default: $GEMMLAB_CONFIGS, "
                                                         "else $GEMMLAB_HOME/configs, else ~/.gemmlab/configs: "
                                                         "the directory plan reads]")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write tune-report.json, .csv and .md here")] = None,
    json_out: JsonOpt = False,
    record_note: Annotated[str, typer.Option("--record", help="what this tuning run is about")] = "tune",
    ledger: LedgerOpt = None,
    seed: Annotated[int, typer.Option(help="seed of inputs and search order")] = 0,
) -> None:
    """Search each shape's config space (--op gemm), or the MoE layer's grouped GEMMs (--op moe): verify every
    candidate at the shape, time it against the incumbent and the baseline (cuBLAS; torch's grouped GEMM),
    accept only what is faster beyond noise on tensor cores; every attempt goes to the ledger; confirmed
    winners become rules in the user's <gpu>.json, which `plan` and the MoE ops read before the bundled ones."""
    import time

    from gemmlab.ops import configs
    from gemmlab.ops.plan import target_for
    from gemmlab.tune import report as tr
    from gemmlab.tune.tuner import moe_items, moe_model, tune, write_configs

    todo: list = []
    if op == "moe":
        if shapes or suite:
            raise typer.BadParameter("--shapes and --suite are for --op gemm; --op moe takes --model/--moe, --tokens")
        try:
            todo = moe_items(moe_model(model, moe), tokens or [4096], moe_mode or ("gate_up", "down", "grouped"))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    elif op == "gemm":
        todo = _shapes(shapes, None, "cpu") if shapes else []
        for name in suite or ([] if shapes else (["seeds", "small-m"] if torch.cuda.is_available() else ["cpu"])):
            todo += _shapes(None, name, "cpu")
        todo = list(dict.fromkeys(todo))
    else:
        raise typer.BadParameter(f"--op {op!r}: gemm or moe")
    _ledger_ready(ledger)  # every attempt is recorded
    err, total = Console(stderr=True, width=150), 60.0 * budget_minutes
    with _progress(err, total, count=False) as bar:
        task, t0, counts = bar.add_task("tuning", total=total), time.perf_counter(), {}

        def step(ev: dict) -> None:
            counts[ev["shape"]] = ev.get("tried", counts.get(ev["shape"], 0))
            bar.update(task, completed=min(total, time.perf_counter() - t0),
                       description=f"{ev['shape']}: {counts[ev['shape']]} tried")

        res = tr.report(tune(todo, _dtype(dtype or ("bfloat16" if op == "moe" else "float16")),
                             budget_minutes=budget_minutes, ledger=ledger, session=resume or session, seed=seed,
                             note=record_note, progress=step))
    con = _show(res, tr, json_out, output_dir)
    if write and any(r["confirmed"] for r in res["results"]):
        path = write_configs(res["results"], target_for(torch.device("cuda" if torch.cuda.is_available() else
                                                                     "cpu")).name, configs_dir)
        con.print(f"wrote the confirmed winners to {path}")
        if path.parent.resolve() != configs.user_dir().resolve():
            con.print(f"note: plan reads {configs.user_dir()}; set GEMMLAB_CONFIGS={path.parent} to use {path}")
    if res.get("failed_workers"):
        raise typer.Exit(1)


def _ledger(path: str | None):
    """The ledger to read (list, show, compare, history, export); an unusable one is one line and exit 2."""
    from gemmlab.ledger import Ledger, LedgerError

    try:
        return Ledger.open(path)
    except LedgerError as e:
        raise _usage_error(e) from e


@ledger_app.command("list")
def ledger_list(
    shape: Annotated[str | None, typer.Option(help="MxNxK")] = None,
    kind: Annotated[str | None, typer.Option(help="grade, bench, table or tune")] = None,
    session: Annotated[str | None, typer.Option(help="a tune session")] = None,
    limit: Annotated[int, typer.Option(help="the last N entries")] = 50,
    ledger: LedgerOpt = None,
) -> None:
    """The last entries, with their decisions."""
    from gemmlab.ledger import view

    db = _ledger(ledger)
    entries = db.list(shape=shape.replace(",", "x") if shape else None, kind=kind, session=session, limit=limit)
    output.print_tables([view.entries_table(entries, f"ledger {db.path}")], Console(width=200))


@ledger_app.command("show")
def ledger_show(entry_id: int, ledger: LedgerOpt = None) -> None:
    """One entry, whole (JSON)."""
    import dataclasses

    e = _ledger(ledger).get(entry_id)
    if e is None:
        raise typer.BadParameter(f"no ledger entry {entry_id}")
    output.emit_json(dataclasses.asdict(e))


@ledger_app.command("compare")
def ledger_compare(first: int, second: int, ledger: LedgerOpt = None) -> None:
    """The accept/reject rule applied to SECOND against FIRST, and what differs between them."""
    from gemmlab.ledger import decide, paired_speedup, view

    db = _ledger(ledger)
    a, b = db.get(first), db.get(second)
    if a is None or b is None:
        raise typer.BadParameter(f"no ledger entry {first if a is None else second}")
    con = Console(width=200)
    output.print_tables([view.compare_table(a, b)], con)
    if a.shape != b.shape or a.dtype != b.dtype:
        con.print("[yellow]different shapes or dtypes: not comparable")
        raise typer.Exit(1)
    if b.vs_parent and b.parent_id != a.id:
        b.vs_parent = None  # its same-run comparison was with another entry
    paired = paired_speedup(b, a)
    decision, reason = decide(b, a)
    if paired:
        con.print(f"speedup #{second} over #{first}: {paired[0]:.3f} [{paired[1][0]:.3f}, {paired[1][1]:.3f}] "
                  f"({paired[2]})")
    con.print(f"#{second} against #{first}: {decision}: {reason}")


@ledger_app.command("history")
def ledger_history(
    shape: Annotated[str, typer.Option(help="M,N,K")],
    dtype: Annotated[str | None, typer.Option(help="float16 or bfloat16")] = None,
    plot: Annotated[str | None, typer.Option(help="write the latency curve as a PNG")] = None,
    ledger: LedgerOpt = None,
) -> None:
    """The latency curve of a shape: accepted versions in order, rejected attempts as their own marks."""
    from gemmlab.ledger import view
    from gemmlab.problems import parse_shape

    try:
        key = "x".join(map(str, parse_shape(shape)))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    entries = _ledger(ledger).history(key, dtype)
    con = Console(width=200)
    output.print_tables([view.entries_table(entries, f"history of {key}")], con)
    con.print(view.accepted_line(entries))
    if plot:
        from gemmlab.ledger.plot import history_png

        if history_png(entries, key, plot) is not None:
            con.print(f"wrote {plot}")


@ledger_app.command("export")
def ledger_export(
    fmt: Annotated[str, typer.Option("--format", help="json or csv")] = "json",
    output_file: Annotated[str | None, typer.Option("--output", help="file [default: stdout]")] = None,
    ledger: LedgerOpt = None,
) -> None:
    """Every entry as JSON or CSV."""
    from pathlib import Path

    try:
        text = _ledger(ledger).export(fmt)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if output_file:
        Path(output_file).write_text(text)
    else:
        print(text)


@app.command("probe")
def probe_cmd(
    check: Annotated[bool, typer.Option("--check", help="health check: a short re-measurement against the "
                                                        "recorded profile; exit 1 if degraded")] = False,
    output_file: Annotated[str | None, typer.Option("--output", help="profile file [default: "
                                                                     "~/.gemmlab/device-<gpu>.json]")] = None,
    profile: Annotated[str | None, typer.Option(help="a recorded profile to use (--check, --roofline)")] = None,
    roofline: Annotated[str | None, typer.Option(help="a `bench gemm` JSON to place on the roofline")] = None,
    plot: Annotated[str, typer.Option(help="roofline PNG")] = "roofline.png",
    min_fraction: Annotated[float, typer.Option(help="--check: figures below this fraction are problems")] = 0.8,
    output_dir: Annotated[str | None, typer.Option(help="write device-profile (device-health, roofline) .json, "
                                                        ".csv and .md here")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure the GPU's constants (SMs, L2, clocks, power limit, HBM bandwidth, cuBLAS 8192^3, the attainable
    tensor-core rate, launch overhead) and record them; or check health against them; or draw a roofline."""
    import json
    from pathlib import Path
    from types import SimpleNamespace as View

    from gemmlab import probe as pr

    def recorded() -> dict:
        try:
            prof = json.loads(Path(profile).read_text()) if profile else pr.load()
        except (OSError, ValueError) as e:
            raise _usage_error(f"--profile {profile}: {e}") from e
        if prof is None:
            raise typer.BadParameter("no recorded profile for this GPU: run `gemmlab probe` first (or --profile)")
        return prof

    def view(tables, rows, stem):
        return View(tables=tables, write=lambda rep, d: output.write(rep, d, stem, tables(rep), rows(rep)))

    if roofline:
        try:
            data = pr.roofline(recorded(), json.loads(Path(roofline).read_text()))
        except (OSError, ValueError, KeyError) as e:
            raise _usage_error(f"--roofline {roofline}: {e}") from e
        con = _show(data, view(pr.roofline_tables, pr.roofline_rows, "roofline"), json_out, output_dir)
        if pr.roofline_png(recorded(), json.loads(Path(roofline).read_text()), plot) is not None:
            con.print(f"wrote {plot}")
        return
    if not torch.cuda.is_available():
        raise _usage_error("gemmlab probe needs a CUDA GPU")
    if check:
        prof = recorded()
        res = pr.health(prof)
        res["problems"] = pr.health_problems(prof, res["now"], min_fraction)
        _show(res, view(lambda r: pr.health_tables(r, prof), pr.long_rows, "device-health"), json_out, output_dir)
        raise typer.Exit(1 if res["problems"] else 0)
    prof = pr.probe()
    path = pr.save(prof, output_file)
    _show(prof, view(pr.tables, pr.long_rows, "device-profile"), json_out, output_dir).print(f"wrote {path}")


@app.command("report")
def report_cmd(
    dirs: Annotated[list[str], typer.Argument(help="directories (or files) holding gemmlab's JSON reports")],
    output_file: Annotated[str, typer.Option("--output", help="the HTML page to write")] = "report.html",
    ledger: Annotated[str | None, typer.Option(help="also draw this ledger's history curves")] = None,
) -> None:
    """One self-contained HTML page (inline CSS and SVG, no network) from every JSON report under DIRS: bench
    tables with ratio plots, eager against graph, MoE, the roofline, the ledger's history, grades and their
    coverage, the device profile; files of an unknown kind are listed."""
    from pathlib import Path

    from gemmlab.report import html

    missing = [d for d in dirs if not Path(d).exists()]
    if missing:
        raise _usage_error(f"gemmlab report: no such file or directory: {missing[0]}")
    extra = []
    if ledger:
        import json

        extra.append((f"ledger {ledger}", json.loads(_ledger(ledger).export("json"))))
    page, found = html.build(dirs, extra)
    Path(output_file).write_text(page)
    print(f"wrote {output_file}: {len(found)} JSON file(s), " + ", ".join(
        f"{n} {k}" for k, n in sorted(html.count_kinds(found).items())), file=sys.stderr)


@app.command()
def paths() -> None:
    """List the kernel paths the dispatcher can take."""
    import gemmlab

    for p in gemmlab.paths():
        print(p)


def main() -> None:
    """The `gemmlab` command. A usage error (a bad flag or value, in any command) is one line on stderr and
    exit status 2, the same everywhere; everything else exits as the command says."""
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # click's UsageError (typer vendors click in newer releases): exit_code 2
        if getattr(e, "exit_code", None) != 2 or not hasattr(e, "format_message"):
            raise
        ctx, message = getattr(e, "ctx", None), " ".join(e.format_message().split())
        if message:  # (no arguments to a group: its help was printed, with no message)
            print(f"{ctx.command_path if ctx is not None else 'gemmlab'}: {message}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
