"""The `gemmlab` command: argument handling over the library; each module draws its own tables.

    gemmlab grade [--cases NAME|PATH] [--kernel FILE.py:FN] [--signature ...]
    gemmlab check [--shapes M,N,K ...] [--dtype float16|bfloat16|both]
    gemmlab bench gemm [--shapes M,N,K ... | --suite NAME|broad] [--backend NAME|inductor ...] [--modes graph,wall]
    gemmlab bench moe | model | stable | moe-ep (under torchrun --nproc-per-node N)
    gemmlab table [--model NAME] [--batch-size 4 --seq-len 8192 --top-k 4 ...]
    gemmlab tune [--op gemm|moe] ...;  gemmlab probe [--check | --roofline BENCH.json]
    gemmlab report DIR... --output report.html;  gemmlab ledger list|show|compare|history|export
    gemmlab inspect --shape M,N,K [--dtype] [--layout NN] [--packed] [--json];  gemmlab paths
    gemmlab profile --shape M,N,K [--config JSON | --ledger-entry ID] [--baseline cublas] | --diff A B

Every measuring command takes --json (one JSON document on stdout; its tables go to stderr) and --output-dir
(NAME.json, a long-format NAME.csv, NAME.md: ``gemmlab.output``). Without CUDA it runs through Triton's CPU
interpreter (TRITON_INTERPRET=1, set here before any kernel is imported) on small shapes.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import typer  # noqa: E402
from rich.console import Console  # noqa: E402

from gemmlab import output  # noqa: E402
from gemmlab.cli import common as cmd  # noqa: E402
from gemmlab.cli.bench import bench_app  # noqa: E402
from gemmlab.cli.common import JsonOpt, LedgerOpt, OutOpt, ParentOpt, RecordOpt  # noqa: E402
from gemmlab.cli.ledger import ledger_app, open_ledger  # noqa: E402
from gemmlab.cli.profile import profile_cmd  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="gemmlab: fast FP16/BF16 GEMM in Triton, checked against a float64 reference.")
app.add_typer(bench_app, name="bench")
app.add_typer(ledger_app, name="ledger")
app.command("profile")(profile_cmd)


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
    cmd.show(report, bc, json_out, output_dir, width=130)
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
    timeout: Annotated[float, typer.Option(callback=cmd.seconds, help="seconds per request to the candidate's "
                                                                   "process, loading the kernel included")] = 120.0,
    seed: Annotated[int, typer.Option(help="base seed of the correctness inputs (timed inputs are secret)")] = 0,
    rounds: Annotated[int | None, typer.Option(callback=cmd.count, help="interleaved timing rounds")] = None,
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
    from gemmlab.grade import view as rep

    cmd.ledger_ready(ledger, record_note is not None or bool(ledger))
    try:
        n_steps = len(load_any(cases or default_cases()).correctness)
        if output_dir:
            rep.clear(output_dir)  # no earlier report.json may stand for this grade
        with cmd.progress(Console(stderr=True, width=140), n_steps + 1) as bar:
            task = bar.add_task("grading", total=n_steps + 1)
            report = run_grade(cases, kernel, signature, allow_vendor, timeout, seed, rounds,
                               progress=lambda msg: bar.update(task, advance=1, description=msg), keep_logs=keep_logs)
    except (case_files.CaseError, OSError) as e:
        raise cmd.usage_error(e) from e
    rep.render(report, Console(stderr=json_out, width=140))
    if output_dir:
        try:
            rep.write(report, output_dir)
        except OSError as e:  # a symlink or a FIFO where the report goes (output.ReportPathError), a full disk
            raise cmd.usage_error(e) from e
    if json_out:
        output.emit_json(report)
    if record_note is not None:
        from gemmlab.ledger.records import from_grade

        cmd.record(from_grade(report), record_note, ledger, parent)
    raise typer.Exit(0 if report["verdict"] == "PASS" else 1)

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
    warmup: Annotated[int, typer.Option(callback=cmd.nonneg_count,
                                        help="warm-up calls per row (and at least --warmup-s seconds)")] = 10,
    repeat: Annotated[int, typer.Option(callback=cmd.count, help="timed calls per row")] = 50,
    warmup_s: Annotated[float, typer.Option(callback=cmd.nonneg_seconds, help="seconds of warm-up")] = 1.0,
    inspect: Annotated[bool, typer.Option(help="read tensor-core instructions from the SASS")] = True,
    num_experts: Annotated[int | None, typer.Option(
        callback=cmd.count, help="experts of the fused MoE row [default: the model's, else 8]")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write table.json, table.csv, table.md here")] = None,
    json_out: JsonOpt = False, record_note: RecordOpt = None, ledger: LedgerOpt = None, parent: ParentOpt = None,
) -> None:
    """The seed's GEMM table: an MoE configuration's dense GEMM (M = batch*seq_len*top_k, N = intermediate,
    K = hidden) through cuBLAS, gemmlab, gemmlab with a prepacked B, and gemmlab's grouped MoE kernel."""
    from gemmlab.bench import table as bt
    from gemmlab.problems import MOE_MODELS, resolve_moe

    cmd.ledger_ready(ledger, record_note is not None or bool(ledger))
    try:
        top_k, hidden_size, intermediate_size = resolve_moe(model, top_k, hidden_size, intermediate_size)
        res = bt.moe_table(batch_size, seq_len, top_k, hidden_size, intermediate_size, dtype=cmd.dtype_of(dtype),
                           warmup=warmup, repeat=repeat, warmup_s=warmup_s, inspect=inspect, model=model,
                           num_experts=num_experts or (MOE_MODELS[model].experts if model else 8))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cmd.show(res, bt, json_out, output_dir, width=200)
    if record_note is not None:
        from gemmlab.ledger.records import from_table

        cmd.record(from_table(res), record_note, ledger, parent)
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
    from gemmlab.instruments.sass import inspect_shape, summary
    from gemmlab.problems import parse_shape

    try:
        m, n, k = parse_shape(shape)
        r = inspect_shape(m, n, k, cmd.dtype_of(dtype), layout.upper(), packed)
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
    budget_minutes: Annotated[float, typer.Option(callback=cmd.seconds, help="time budget for all shapes")] = 5.0,
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
    from gemmlab.tune import view as tr
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
        todo = cmd.shapes_of(shapes, None, "cpu") if shapes else []
        for name in suite or ([] if shapes else (["seeds", "small-m"] if torch.cuda.is_available() else ["cpu"])):
            todo += cmd.shapes_of(None, name, "cpu")
        todo = list(dict.fromkeys(todo))
    else:
        raise typer.BadParameter(f"--op {op!r}: gemm or moe")
    cmd.ledger_ready(ledger)  # every attempt is recorded
    err, total = Console(stderr=True, width=150), 60.0 * budget_minutes
    with cmd.progress(err, total, count=False) as bar:
        task, t0, counts = bar.add_task("tuning", total=total), time.perf_counter(), {}

        def step(ev: dict) -> None:
            counts[ev["shape"]] = ev.get("tried", counts.get(ev["shape"], 0))
            bar.update(task, completed=min(total, time.perf_counter() - t0),
                       description=f"{ev['shape']}: {counts[ev['shape']]} tried")

        res = tr.report(tune(todo, cmd.dtype_of(dtype or ("bfloat16" if op == "moe" else "float16")),
                             budget_minutes=budget_minutes, ledger=ledger, session=resume or session, seed=seed,
                             note=record_note, progress=step))
    con = cmd.show(res, tr, json_out, output_dir)
    if write and any(r["confirmed"] for r in res["results"]):
        path = write_configs(res["results"], target_for(torch.device("cuda" if torch.cuda.is_available() else
                                                                     "cpu")).name, configs_dir)
        con.print(f"wrote the confirmed winners to {path}")
        if path.parent.resolve() != configs.user_dir().resolve():
            con.print(f"note: plan reads {configs.user_dir()}; set GEMMLAB_CONFIGS={path.parent} to use {path}")
    if res.get("failed_workers"):
        raise typer.Exit(1)

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

    from gemmlab.bench import probe as pr

    def recorded() -> dict:
        try:
            prof = json.loads(Path(profile).read_text()) if profile else pr.load()
        except (OSError, ValueError) as e:
            raise cmd.usage_error(f"--profile {profile}: {e}") from e
        if prof is None:
            raise typer.BadParameter("no recorded profile for this GPU: run `gemmlab probe` first (or --profile)")
        return prof

    def view(tables, rows, stem):
        return View(tables=tables, write=lambda rep, d: output.write(rep, d, stem, tables(rep), rows(rep)))

    if roofline:
        try:
            data = pr.roofline(recorded(), json.loads(Path(roofline).read_text()))
        except (OSError, ValueError, KeyError) as e:
            raise cmd.usage_error(f"--roofline {roofline}: {e}") from e
        con = cmd.show(data, view(pr.roofline_tables, pr.roofline_rows, "roofline"), json_out, output_dir)
        if pr.roofline_png(recorded(), json.loads(Path(roofline).read_text()), plot) is not None:
            con.print(f"wrote {plot}")
        return
    if not torch.cuda.is_available():
        raise cmd.usage_error("gemmlab probe needs a CUDA GPU")
    if check:
        prof = recorded()
        res = pr.health(prof)
        res["problems"] = pr.health_problems(prof, res["now"], min_fraction)
        cmd.show(res, view(lambda r: pr.health_tables(r, prof), pr.long_rows, "device-health"), json_out, output_dir)
        raise typer.Exit(1 if res["problems"] else 0)
    prof = pr.probe()
    path = pr.save(prof, output_file)
    cmd.show(prof, view(pr.tables, pr.long_rows, "device-profile"), json_out, output_dir).print(f"wrote {path}")


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
        raise cmd.usage_error(f"gemmlab report: no such file or directory: {missing[0]}")
    extra = []
    if ledger:
        import json

        extra.append((f"ledger {ledger}", json.loads(open_ledger(ledger).export("json"))))
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
