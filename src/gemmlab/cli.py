"""The `gemmlab` command: a thin shell over the library.

    gemmlab grade [--cases NAME|PATH] [--kernel FILE.py:FN] [--signature ...] [--output-dir DIR] [--json]
    gemmlab check [--shapes M,N,K ...] [--dtype float16|bfloat16|both]
    gemmlab bench gemm [--shapes M,N,K ... | --suite NAME|broad] [--backend NAME|inductor ...] [--modes graph,wall]
    gemmlab bench moe-ep --model NAME --tokens T   (under torchrun --nproc-per-node N)
    gemmlab bench stable --shape M,N,K [--processes N] [--backend NAME ...]
    gemmlab bench model [--model mixtral,qwen3-moe,deepseek-v3] [--tokens 4096,1,8,64] [--modes eager,graph,compile]
    gemmlab table [--model NAME] [--batch-size 4 --seq-len 8192 --top-k 4 ...] [--output-dir DIR]
    gemmlab inspect --shape M,N,K [--dtype] [--layout NN] [--packed] [--json]
    gemmlab profile --shape M,N,K [--config JSON | --ledger-entry ID] [--baseline cublas] | --diff A B
    gemmlab paths

Without CUDA it runs through Triton's CPU interpreter (TRITON_INTERPRET=1, set here before any kernel is
imported) on small shapes; with CUDA on the seed and small-M shapes at full size.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

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
        if shapes:
            return [parse_shape(s) for s in shapes]
        return suite(suite_name or default)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _count(value: int | None) -> int | None:
    """A typer callback: a count flag (--rounds, --reps, --processes, ...) must be a whole number >= 1."""
    if value is not None and value < 1:
        raise typer.BadParameter(f"{value} is not a count: give a whole number >= 1")
    return value


def _nonneg_count(value: int | None) -> int | None:
    """A typer callback: a count that may be zero (--warmup calls)."""
    if value is not None and value < 0:
        raise typer.BadParameter(f"{value} is negative: give a whole number >= 0")
    return value


def _seconds(value: float | None) -> float | None:
    """A typer callback: a time limit (--timeout, --budget-minutes) must be a finite number > 0."""
    import math

    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a time limit: give a finite number > 0")
    return value


def _nonneg_seconds(value: float | None) -> float | None:
    """A typer callback: a warm-up time (--warmup-s) must be a finite number >= 0."""
    import math

    if value is not None and not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"{value} is not a duration: give a finite number >= 0")
    return value


RecordOpt = Annotated[str | None, typer.Option("--record", help="record this run in the ledger: what changed")]
LedgerOpt = Annotated[str | None, typer.Option("--ledger", help="ledger file [default: $GEMMLAB_LEDGER or "
                                                                "~/.gemmlab/ledger.db]")]
ParentOpt = Annotated[int | None, typer.Option("--parent", help="ledger entry to decide against [default: the "
                                                                "last accepted entry of the same shape]")]


def _write_report(report: dict, output_dir: str, name: str) -> None:
    """``--output-dir``: the whole report as OUTPUT_DIR/NAME (JSON)."""
    import json
    from pathlib import Path

    path = Path(output_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
    Console().print(f"wrote {path}")


def _usage_error(message: object) -> typer.Exit:
    """One line on stderr, unwrapped and taken literally (no rich markup), for ``raise ... from e``: exit 2."""
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[red]{escape(str(message))}", highlight=False)
    return typer.Exit(2)


def _ledger_ready(ledger: str | None) -> None:
    """Before any work of a command that records: a ledger path that is a directory, a corrupt or read-only
    file, or a ledger of a newer gemmlab is one line and exit 2 (not a traceback after the work)."""
    from gemmlab.ledger import LedgerError, check

    try:
        check(ledger)
    except LedgerError as e:
        raise _usage_error(e) from e


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


def _record(entries, note: str, ledger: str | None, parent: int | None) -> None:
    """Write entries to the ledger and print each decision."""
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
    c = Console(stderr=True, width=150)
    for e in done:
        color = "green" if e.decision == "accepted" else "yellow"
        c.print(f"ledger #{e.id} {e.shape} {e.backend}: [{color}]{e.decision}[/] ({e.reason})")


@app.command()
def check(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable); default: a suite")] = None,
    dtype: Annotated[str, typer.Option(help="float16, bfloat16 or both")] = "float16",
    seed: Annotated[int, typer.Option(help="seed of the random inputs (uniform in [-0.5, 0.5))")] = 0,
) -> None:
    """Multiply random matrices with gemmlab.gemm, check against gemm_ref, report plan, error and time."""
    import gemmlab
    from gemmlab.problems import CPU_CHECK, SEEDS, SMALL_M, parse_shape
    from gemmlab.ref import gemm_check, gemm_ref

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        todo = [parse_shape(s) for s in shapes] if shapes else (SEEDS + SMALL_M if device == "cuda" else CPU_CHECK)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    dtypes = {"float16": [torch.float16], "bfloat16": [torch.bfloat16],
              "both": [torch.float16, torch.bfloat16]}.get(dtype)
    if dtypes is None:
        raise typer.BadParameter(f"--dtype {dtype!r}: float16, bfloat16 or both")
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)"
    table = Table(title=f"gemmlab check on {where}")
    for col in ("shape", "dtype", "path", "config", "max |err|", "err/allowed", "ms", "result"):
        table.add_column(col)
    g = torch.Generator(device=device).manual_seed(seed)
    failed = 0
    for m, n, k in todo:
        for dt in dtypes:
            a = (torch.rand((m, k), generator=g, device=device) - 0.5).to(dt)
            b = (torch.rand((k, n), generator=g, device=device) - 0.5).to(dt)
            out = torch.full((m, n), float("nan"), dtype=dt, device=device)
            p = gemmlab.plan(a, b, out=out)
            t0 = time.perf_counter()
            gemmlab.gemm(a, b, out=out)
            if device == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            chk = gemm_check(out, a, b, gemm_ref(a, b))
            failed += not chk["ok"]
            cfg = p.config
            cfg_s = "-" if cfg is None else f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps}"
            cfg_s += "" if cfg is None else f" s{cfg.num_stages}"
            if p.path == "tma_splitk":
                cfg_s += f" k{cfg.split_k}"
            table.add_row(f"{m}x{n}x{k}", str(dt).removeprefix("torch."), p.path, cfg_s, f"{chk['max_abs_err']:.2e}",
                          f"{chk['worst']:.2f}", f"{ms:.1f}", "[green]PASS" if chk["ok"] else "[red]FAIL")
    Console(width=130).print(table)
    Console().print("ms: one call incl. compilation on first use; timing lives in benchmarks/ "
                    "(interleaved with cuBLAS, L2 flushed).")
    if failed:
        Console().print(f"[red]{failed} check(s) failed")
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
    timeout: Annotated[float, typer.Option(callback=_seconds,
                                        help="seconds per request to the candidate's process, loading the kernel "
                                             "included")] = 120.0,
    seed: Annotated[int, typer.Option(help="base seed of the correctness inputs (timed inputs are secret)")] = 0,
    rounds: Annotated[int | None, typer.Option(callback=_count, help="interleaved timing rounds")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write report.json and report.md here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON on stdout")] = False,
    keep_logs: Annotated[bool, typer.Option(help="keep the workers' logs (the report names the directory)")] = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """Grade a GEMM kernel: exact-shape verification, dispatch coverage, anti-cheat rules, isolation,
    interleaved timing against the vendor BLAS. Exit 0: all passed; 1: a case or rule failed; 2: usage."""
    import json

    from rich.progress import Progress

    from gemmlab.grade import cases as case_files
    from gemmlab.grade import default_cases, load_any
    from gemmlab.grade import grade as run_grade
    from gemmlab.grade import report as rep

    err = Console(stderr=True, width=140)
    if record_note is not None or ledger:
        _ledger_ready(ledger)
    try:
        n_steps = len(load_any(cases or default_cases()).correctness)
        if output_dir:
            rep.clear(output_dir)  # no earlier report.json may stand for this grade
        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("grading", total=n_steps + 1)
            report = run_grade(cases, kernel, signature, allow_vendor, timeout, seed, rounds,
                               progress=lambda msg: bar.update(task, advance=1, description=msg), keep_logs=keep_logs)
    except (case_files.CaseError, OSError) as e:
        err.print(f"[red]{e}", soft_wrap=True)
        raise typer.Exit(2) from e
    rep.render(report, Console(stderr=json_out, width=140))
    if output_dir:
        rep.write(report, output_dir)
    if json_out:
        print(json.dumps(report, indent=1, default=str))
    if record_note is not None:
        from gemmlab.ledger.records import from_grade

        _record(from_grade(report), record_note, ledger, parent)
    raise typer.Exit(0 if report["verdict"] == "PASS" else 1)


@bench_app.command("gemm")
def bench_gemm(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable)")] = None,
    suite: Annotated[str | None, typer.Option(help="seeds, square, llm, small-m, all (cpu without CUDA); "
                                                   "broad, broad-quick, broad-cpu: cases with their own dtype "
                                                   "and layout")] = None,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[list[str] | None, typer.Option(help="gemmlab, gemmlab-packed, cublas, inductor, FILE.py:FN "
                                                           "or package.module:FN (repeatable); cublas is always "
                                                           "the baseline")] = None,
    rounds: Annotated[int, typer.Option(callback=_count, help="interleaved rounds")] = 10,
    reps: Annotated[int, typer.Option(callback=_count, help="timed calls per candidate per round")] = 5,
    warmup_s: Annotated[float, typer.Option(callback=_nonneg_seconds, help="seconds of warm-up (clocks settle)")] = 1.0,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays (device time, no host launch cost)")] = False,
    modes: Annotated[str | None, typer.Option(help="timing modes, first primary: graph (device time), wall "
                                                   "(eager, host+device per call), eager (device time of eager "
                                                   "calls); default graph,wall for broad suites on CUDA")] = None,
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    timeout: Annotated[float, typer.Option(callback=_seconds,
                                        help="seconds per request to a FILE.py:FN backend's own process, loading "
                                             "included")] = 120.0,
    budget_s: Annotated[float | None, typer.Option(callback=_seconds, help="start no case after this many seconds "
                                                                           "(the rest: not_run)")] = None,
    inductor_search_space: Annotated[str, typer.Option(help="inductor backend: DEFAULT or EXHAUSTIVE")] = "DEFAULT",
    inductor_autotune_rep_ms: Annotated[int | None, typer.Option(
        callback=_count, help="inductor backend: ms measured per autotune choice (its default 100)")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write gemm-bench.json, .csv and .png here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON on stdout")] = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """GEMM backends against cuBLAS: verified against float64 first, then interleaved with the L2 flushed,
    clocks sampled. Exit 1 when any backend is wrong."""
    import json

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from gemmlab import probe, provenance
    from gemmlab.bench import gemm as bg
    from gemmlab.ledger.records import from_bench as bg_records
    from gemmlab.problems import CASE_SUITES, cases

    cuda = torch.cuda.is_available()
    todo = cases(suite) if suite in CASE_SUITES and not shapes else _shapes(shapes, suite, "all" if cuda else "cpu")
    if modes is None and suite in CASE_SUITES and cuda and not graph:
        modes = "graph,wall"
    dt = _dtype(dtype)
    if record_note is not None or ledger:
        _ledger_ready(ledger)
    err = Console(stderr=True, width=150)
    cols = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*cols, console=err, transient=True) as bar:
        task = bar.add_task("bench", total=len(todo))
        state = {"first": True}

        def step(msg: str) -> None:
            bar.update(task, advance=0 if state.pop("first", False) else 1, description=msg)

        try:
            report = bg.bench_gemm(todo, dt, backend or ["gemmlab"], rounds=rounds, reps=reps, warmup_s=warmup_s,
                                   graph=graph, seed=seed, progress=step, timeout=timeout, profile=probe.load(),
                                   modes=modes.split(",") if modes else None, budget_s=budget_s,
                                   inductor_opts={"search_space": inductor_search_space.upper(),
                                                  "autotune_rep_ms": inductor_autotune_rep_ms})
        except (ValueError, FileNotFoundError, AttributeError, ImportError) as e:
            err.print(f"[red]{e}")
            raise typer.Exit(2) from e
    env = report["env"]
    used = report["args"]["modes"]
    title = (f"{env.get('gpu') or 'CPU (Triton interpreter, host clock: not a GPU measurement)'} "
             f"{'/'.join(report['args']['dtypes'])} {used[0]} (primary; also {','.join(used[1:]) or '-'}), "
             f"interleaved vs cuBLAS, {provenance.label(env)}")
    table = Table(title=title)
    for col in ("case", "backend", "path", "median ms", "p20-p80 ms", "TFLOPS", "ratio", "95% CI", "verdict",
                "eager ratio", "vs inductor", "MHz", "eff", "ok"):
        table.add_column(col)
    wrong = 0
    for r in bg.rows(report):
        wrong += not r["ok"]
        ci = "-" if r["ci95_lo"] is None else f"[{r['ci95_lo']:.3f}, {r['ci95_hi']:.3f}]"
        spread = "-" if r["p20_ms"] is None else f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}"
        table.add_row(r["case"], r["backend"], r["path"] or "-", _num(r["median_ms"], ".4f"), spread,
                      _num(r["tflops"], ".4g"), _num(r["ratio_vs_cublas"], ".3f"), ci, r["verdict"] or "-",
                      _num(r["eager_ratio"], ".3f"), _num(r["inductor_ratio"], ".3f"),
                      _num(r["sm_clock_mhz"], ".0f"), _num(r["efficiency"], ".1%"),
                      "[green]ok" if r["ok"] else f"[red]WRONG {r['error'] or ''}")
    out = Console(stderr=json_out, width=150)
    out.print(table)
    out.print("ratio = cuBLAS time / backend time per round (> 1: faster), median of rounds, bootstrap 95% CI; "
              "TFLOPS = 2*M*N*K / median; eff = TFLOPS / dense tensor peak at the observed SM clock; eager ratio: "
              "wall mode; vs inductor = inductor time / backend time (device time where graph ran)")
    for line in bg.summary_lines(report):
        out.print(line)
    if output_dir:
        for path in bg.write(report, output_dir):
            out.print(f"wrote {path}")
    if json_out:
        print(json.dumps(report, indent=1, default=str))
    if record_note is not None:
        _record(bg_records(report), record_note, ledger, parent)
    if wrong:
        raise typer.Exit(1)


@bench_app.command("moe")
def bench_moe_cmd(
    model: Annotated[list[str] | None, typer.Option(help="deepseek-v3, mixtral-8x7b, qwen3-30b-a3b, olmoe-1b-7b, "
                                                         "gpt-oss-120b-like (repeatable)")] = None,
    tokens: Annotated[list[int] | None, typer.Option(help="T (repeatable) [default: 16 128 1024 4096 16384]")] = None,
    routing: Annotated[list[str] | None, typer.Option(help="uniform or zipf (repeatable)")] = None,
    part: Annotated[list[str] | None, typer.Option(help="grouped (first GEMM) or forward (whole body)")] = None,
    dtype: Annotated[str, typer.Option(help="bfloat16 or float16")] = "bfloat16",
    rounds: Annotated[int, typer.Option(callback=_count, help="interleaved rounds")] = 10,
    reps: Annotated[int, typer.Option(callback=_count, help="timed calls per candidate per round")] = 5,
    warmup_s: Annotated[float, typer.Option(callback=_nonneg_seconds, help="seconds of warm-up")] = 1.0,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays")] = False,
    custom: Annotated[str | None, typer.Option(help="H,I,E,k of a model of your own (model name: custom)")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write moe-bench.json here")] = None,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
    baseline: Annotated[str, typer.Option(help="torch, or liger: the suite against Liger-Kernel's fused MoE "
                                               "(parts fwd, fwd+bwd; bench.moe_liger)")] = "torch",
    mode: Annotated[list[str] | None, typer.Option(help="--baseline liger: eager or graph (repeatable)")] = None,
    time_limit_s: Annotated[float | None, typer.Option(callback=_seconds, help="--baseline liger: start no case "
                                                       "after this many seconds")] = None,
    composite: Annotated[bool, typer.Option(help="--baseline liger: time the torch composite too (fwd)")] = True,
    min_bwd_tokens: Annotated[int, typer.Option(help="--baseline liger: fwd+bwd only at T >= this")] = 0,
    liger_tune_tokens: Annotated[int, typer.Option(callback=_count, help="--baseline liger: T of Liger's "
                                                   "autotuning call per model (outside timing)")] = 4096,
) -> None:
    """gemmlab's MoE kernels against torch._grouped_mm (and a per-expert loop, and the dense GEMM of the same
    size), verified first, interleaved; with --baseline liger, the suite against Liger-Kernel (five models x
    T 1..16384, uniform and zipf, eager and graph, fwd and fwd+bwd) with the dense and HBM bars. Exit 1 if
    anything is wrong."""

    from gemmlab.bench import moe as bm
    from gemmlab.problems import MoEModel

    if record_note is not None or ledger:
        _ledger_ready(ledger)
    err = Console(stderr=True)
    try:
        own = None
        if custom:
            h, i, e, k = (int(v) for v in custom.split(","))
            own = MoEModel(hidden=h, intermediate=i, experts=e, top_k=k)
        if baseline == "liger":
            if record_note is not None:
                raise ValueError("--record: not with --baseline liger (its rows are not ledger entries yet)")
            _bench_moe_liger(model, tokens, routing, part, mode or ["graph" if graph else "eager"], _dtype(dtype), own,
                             output_dir, composite=composite, min_bwd_tokens=min_bwd_tokens,
                             liger_tune_tokens=liger_tune_tokens,
                             time_limit_s=time_limit_s, rounds=rounds, reps=reps, warmup_s=warmup_s)
            return
        if baseline != "torch":
            raise ValueError(f"--baseline {baseline!r}: torch or liger")
        models = model or (["custom"] if own else ["deepseek-v3"])
        rep = bm.bench_moe(models, tokens or [16, 128, 1024, 4096, 16384], routing or ["uniform"],
                           part or ["grouped", "forward"], _dtype(dtype), custom=own, rounds=rounds, reps=reps,
                           warmup_s=warmup_s, graph=graph, progress=lambda msg: err.print(msg))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    table = Table(title=f"MoE {dtype} on {rep['env'].get('gpu') or 'CPU (interpreter; host clock)'}")
    for col in ("model", "T", "routing", "part", "backend", "median ms", "TFLOPS", "vs baseline", "95% CI", "ok"):
        table.add_column(col)
    wrong = 0
    for r in bm.rows(rep):
        wrong += not r["ok"]
        ci = "-" if not r["ci95"] else f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
        table.add_row(r["model"], str(r["T"]), r["routing"], r["part"], r["backend"], _num(r["median_ms"], ".4f"),
                      _num(r["tflops"], ".4g"), _num(r["ratio"], ".3f") if r["backend"] != r["baseline"]
                      else "baseline", ci, "[green]ok" if r["ok"] else f"[red]WRONG {r['error'] or ''}")
    Console(width=170).print(table)
    if output_dir:
        _write_report(rep, output_dir, "moe-bench.json")
    if record_note is not None:
        from gemmlab.ledger.records import from_moe_bench

        _record(from_moe_bench(rep), record_note, ledger, parent)
    if wrong:
        raise typer.Exit(1)


def _bench_moe_liger(model, tokens, routing, part, mode, dtype, own, output_dir, **kw) -> None:
    """``bench moe --baseline liger``: bench.moe_liger's suite; the report is rewritten after every case."""
    from gemmlab.bench import moe_liger as ml

    err = Console(stderr=True)
    models = model or (["custom"] if own else ml.SUITE_MODELS)
    write = (lambda r: ml.write(r, output_dir)) if output_dir else None
    rep = ml.bench_suite(models, tokens or ml.SUITE_TOKENS, routing or ml.ROUTINGS, mode, part or ["fwd"], dtype,
                         custom=own, progress=lambda msg: err.print(msg), on_result=write, **kw)
    wrong = ml.render(rep, Console(width=200))
    if output_dir:
        Console().print(f"wrote {ml.write(rep, output_dir)}")
    if wrong:
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
    output_dir: Annotated[str | None, typer.Option(help="write model-bench-MODELS-MODES.json here")] = None,
) -> None:
    """One Hugging Face decoder layer (real dims, random bf16 weights): unpatched torch against
    gemmlab.patch, eager / CUDA graph / torch.compile, verified first, interleaved. Exit 1 if gemmlab is wrong."""
    import importlib.util

    err = Console(stderr=True)
    if not torch.cuda.is_available():
        err.print("bench model needs a CUDA GPU (the layers are real-size)")
        raise typer.Exit(2)
    if importlib.util.find_spec("transformers") is None:
        err.print("bench model needs transformers: pip install transformers")
        raise typer.Exit(2)
    from gemmlab.bench import model as bmod

    try:
        rep = bmod.bench_model([m.strip() for m in model.split(",")], [int(t) for t in tokens.split(",")],
                               [m.strip() for m in modes.split(",")], rounds=rounds, reps=reps, warmup_s=warmup_s,
                               progress=lambda msg: err.print(msg))
    except ValueError as e:
        err.print(str(e).splitlines()[0])
        raise typer.Exit(2) from e
    used = rep["args"]["modes"]
    table = Table(title=f"one decoder layer, bf16, on {rep['env'].get('gpu')}: median ms, torch / gemmlab "
                        f"(> 1: gemmlab faster), transformers {rep['env']['transformers']}")
    table.add_column("model")
    table.add_column("T")
    for m in used:
        for col in ("torch", "gemmlab", "ratio"):
            table.add_column(f"{m} {col}")
    wrong = []
    for r in bmod.rows(rep):
        cells = [r["model"], str(r["T"])]
        for m in used:
            ok = r.get(f"{m}_gemmlab_ok", False)
            cells += [_num(r.get(f"{m}_torch_ms"), ".3f"), _num(r.get(f"{m}_gemmlab_ms"), ".3f"),
                      _num(r.get(f"{m}_ratio"), ".2f") if ok else "[red]WRONG/failed"]
            wrong += [f"{r['model']} T={r['T']} {e}" for e in r["errors"] if e.startswith(f"{m} gemmlab")]
        table.add_row(*cells)
    Console(width=200).print(table)
    for w in wrong:
        err.print(f"[red]{w}")
    if output_dir:
        _write_report(rep, output_dir, f"model-bench-{'+'.join(rep['args']['models'])}-{'+'.join(used)}.json")
    if wrong:
        raise typer.Exit(1)


@bench_app.command("moe-ep")
def bench_moe_ep_cmd(
    model: Annotated[list[str] | None, typer.Option(help="deepseek-v3, qwen3-30b-a3b, mixtral-8x7b (repeatable)")]
    = None,
    tokens: Annotated[list[int] | None, typer.Option(help="T per rank (repeatable) [default: 4096]")] = None,
    chunks: Annotated[list[int] | None, typer.Option(help="overlap chunks (repeatable) [default: 1 2 4]")] = None,
    rounds: Annotated[int, typer.Option(callback=_count, help="interleaved rounds")] = 10,
    reps: Annotated[int, typer.Option(callback=_count, help="timed calls per candidate per round")] = 5,
    output_dir: Annotated[str | None, typer.Option(help="rank 0 writes moe-ep-bench.json here")] = None,
) -> None:
    """Expert-parallel MoE across the GPUs of a torchrun launch (``torchrun --nproc-per-node N -m gemmlab bench
    moe-ep``): per-rank time, all-to-all GB/s against NCCL's equal-split all_to_all, speedup against one GPU
    holding every expert; verified first. Exit 2 without CUDA or a process group, 1 if an output is wrong."""
    from gemmlab.bench import moe_ep

    try:
        rank, world = moe_ep.init_from_env()
        rep = moe_ep.bench_moe_ep(model or ["qwen3-30b-a3b"], tokens or [4096], chunks or [1, 2, 4], rounds=rounds,
                                  reps=reps)
    except ValueError as e:
        raise _usage_error(str(e).splitlines()[0]) from e
    if rank == 0:
        table = Table(title=f"expert parallel over {world} x {rep['env'].get('gpu')}: slowest rank's median ms")
        for col in ("model", "T/rank", "candidate", "ms", "vs one GPU", "GB/s (rank 0)", "comm hidden (rank 0)",
                    "ok"):
            table.add_column(col)
        for r in rep["results"]:
            t0, tl = r["per_rank"][0]["times"], r["per_rank"][0]["timeline"]
            for name, ms in {**r["step_ms"], "one GPU, all experts": r["one_gpu_ms"]}.items():
                hidden = f"{tl[name]['comm_hidden']:.0%} of {tl[name]['comm_ms']:.3f} ms" if name in tl else "-"
                table.add_row(r["model"], str(r["tokens_per_rank"]), name, _num(ms, ".3f"),
                              _num(r["speedup_vs_one_gpu"].get(name), ".2f"), "-", hidden,
                              "ok" if r["ok"] else "WRONG")
            for name in ("dispatch a2a (routed)", "nccl a2a (equal)"):
                table.add_row(r["model"], str(r["tokens_per_rank"]), name, _num(t0[name]["median_ms"], ".3f"), "-",
                              _num(t0[name]["gb_per_s"], ".1f"), "-", "")
        Console(width=170).print(table)
        if output_dir:
            _write_report(rep, output_dir, "moe-ep-bench.json")
    if not all(r["ok"] for r in rep["results"]):
        raise typer.Exit(1)


@bench_app.command("stable")
def bench_stable(
    shape: Annotated[str, typer.Option(help="M,N,K")] = "8192,8192,16384",
    processes: Annotated[int, typer.Option(callback=_count, help="separate processes, each compiling fresh")] = 5,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[list[str] | None, typer.Option(help="as for `bench gemm` (repeatable)")] = None,
    rounds: Annotated[int, typer.Option(callback=_count, help="interleaved rounds per process")] = 6,
    reps: Annotated[int, typer.Option(callback=_count, help="timed calls per candidate per round")] = 5,
    warmup_s: Annotated[float, typer.Option(callback=_nonneg_seconds, help="seconds of warm-up per process")] = 1.0,
    output_dir: Annotated[str | None, typer.Option(help="write stable-bench.json here")] = None,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """The same measurement in N fresh processes: the spread across processes, and clock warnings."""

    from gemmlab.bench.stable import stable_bench
    from gemmlab.problems import parse_shape

    if record_note is not None or ledger:
        _ledger_ready(ledger)
    try:
        m, n, k = parse_shape(shape)
        dt = _dtype(dtype)
        err = Console(stderr=True)
        res = stable_bench((m, n, k), dt, backend or ["gemmlab"], processes=processes, rounds=rounds, reps=reps,
                           warmup_s=warmup_s, progress=lambda msg: err.print(msg))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    s = res["summary"]
    table = Table(title=f"stable bench {m}x{n}x{k} {dtype}: {s['processes_ok']} processes "
                        f"({s['processes_failed']} failed)")
    for col in ("backend", "median ms (of process medians)", "min-max ms", "cv", "ratio vs cuBLAS", "ratio min-max",
                "wrong in"):
        table.add_column(col)
    for name, e in s["backends"].items():
        t, r = e.get("median_ms"), e.get("ratio")
        table.add_row(name, _num(t and t["median_ms"], ".4f"), "-" if not t else f"{t['min_ms']:.4f}-{t['max_ms']:.4f}",
                      _num(t and t["cv"], ".2%"), _num(r and r["median"], ".3f"),
                      "-" if not r else f"{r['min']:.3f}-{r['max']:.3f}", str(e["wrong_in"]))
    Console().print(table)
    clk = s.get("sm_clock_mhz")
    if clk:
        Console().print("mean SM clock per process: " + ", ".join(f"{c:.0f}" for c in clk["mean_per_process"])
                        + f" MHz (range {clk['min']:.0f}-{clk['max']:.0f})")
    for f in s["flags"]:
        Console().print(f"[yellow]warning: {f}")
    if output_dir:
        _write_report(res, output_dir, "stable-bench.json")
    if record_note is not None:
        from gemmlab.ledger.records import from_stable

        _record(from_stable(res), record_note, ledger, parent)
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
    output_dir: Annotated[str | None, typer.Option(help="write table.csv, table.json, table.md here")] = None,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """The seed's GEMM table: an MoE configuration's dense GEMM (M = batch*seq_len*top_k, N = intermediate,
    K = hidden) through cuBLAS, gemmlab, gemmlab with a prepacked B, and gemmlab's grouped MoE kernel."""
    from gemmlab.bench import table as bt
    from gemmlab.problems import resolve_moe

    if record_note is not None or ledger:
        _ledger_ready(ledger)
    try:
        top_k, hidden_size, intermediate_size = resolve_moe(model, top_k, hidden_size, intermediate_size)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    try:
        from gemmlab.problems import MOE_MODELS

        experts = num_experts or (MOE_MODELS[model].experts if model else 8)
        res = bt.moe_table(batch_size, seq_len, top_k, hidden_size, intermediate_size, dtype=_dtype(dtype),
                           warmup=warmup, repeat=repeat, warmup_s=warmup_s, inspect=inspect, model=model,
                           num_experts=experts)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    shp = res["shape"]
    table = Table(title=f"M={shp['M']} N={shp['N']} K={shp['K']} {dtype} on "
                        f"{res['env'].get('gpu') or 'CPU (interpreter; host clock)'}")
    for col in bt.COLUMNS:
        table.add_column(col)
    for row in res["rows"]:
        table.add_row(*bt.cells(row))
    Console(width=200).print(table)
    if output_dir:
        for path in bt.write(res, output_dir):
            Console().print(f"wrote {path}")
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
    import json

    from gemmlab.inspect.sass import inspect_shape
    from gemmlab.problems import parse_shape

    try:
        m, n, k = parse_shape(shape)
        r = inspect_shape(m, n, k, _dtype(dtype), layout.upper(), packed)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if json_out:
        print(json.dumps(r, indent=1))
    else:
        c = Console(width=150)
        c.print(f"[bold]{m}x{n}x{k} {dtype} {layout}{' packed B' if packed else ''} on {r.get('target')}: "
                f"path {r.get('path')} ({r.get('reason')})")
        if r.get("kernel"):
            c.print(f"kernel {r['kernel']} {r['arch']}: block {r['block']}, {r['num_warps']} warps, "
                    f"{r['num_stages']} stages, group_m {r['group_m']}, split_k {r['split_k']}, "
                    f"epilogue subtile {r['epilogue_subtile']}, C via {'TMA' if r['c_tma'] else 'pointers'}")
            c.print(f"registers/thread {r['registers']}, stack {r['stack_bytes']} B, spill stores {r['spill_stores']}, "
                    f"local memory ops {r['local_memory_ops']}, shared {r['triton_shared_bytes']} B (dynamic) + "
                    f"{r['shared_bytes']} B (static), warp specialized {r['warp_specialized']}")
            c.print("SASS: " + ", ".join(f"{op} {cnt}" for op, cnt in r["sass"].items() if cnt)
                    + f" (of {r['sass_total']} instructions)")
        for f in r.get("flags", []):
            c.print(f"[red]FLAG: {f}")
    if r.get("kernel") and not r.get("tensor_core"):
        raise typer.Exit(1)


def _saved_profile(ref: str, ledger: str | None) -> dict:
    """``--diff`` argument: a profile JSON file, or entry:ID (the latest profile attached to that entry)."""
    import json
    from pathlib import Path

    from gemmlab.inspect.profile_view import check_format

    if ref.startswith("entry:"):
        if not ref.removeprefix("entry:").isdigit():
            raise ValueError(f"{ref}: entry:ID takes a ledger entry id, e.g. entry:12")
        found = _ledger(ledger).attachments(int(ref.removeprefix("entry:")), "profile")
        if not found:
            raise ValueError(f"{ref}: no profile attached to that ledger entry")
        return check_format(found[-1]["data"], ref)
    try:
        return check_format(json.loads(Path(ref).read_text()), ref)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{ref}: {e}") from None


def _print_rows(title: str, header: list[str], rows: list[list[str]], console: Console) -> None:
    table = Table(title=title)
    for col in header:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)


@app.command("profile")
def profile_cmd(
    shape: Annotated[str | None, typer.Option(help="M,N,K (default: the --ledger-entry's)")] = None,
    dtype: Annotated[str | None, typer.Option(help="float16 or bfloat16 (default: the entry's, else float16)")] = None,
    layout: Annotated[str, typer.Option(help="row: B (K, N) row-major; linear: nn.Linear's B = W^T, W (N, K)")] = "row",
    config: Annotated[str | None, typer.Option(help="pin gemmlab's config: a JSON object of GemmConfig fields "
                                                    "(default: the entry's, else the plan's)")] = None,
    ledger_entry: Annotated[int | None, typer.Option(help="profile this ledger entry's shape, dtype and config, "
                                                          "and attach the profile to it")] = None,
    baseline: Annotated[str, typer.Option(help="cublas (torch.mm) or none")] = "cublas",
    clock_control: Annotated[str, typer.Option(help="ncu --clock-control: none (the GPU's own clocks, as bench "
                                                    "runs) or base (locked at base clock)")] = "none",
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    diff: Annotated[tuple[str, str] | None, typer.Option(help="A B: two saved profiles (JSON files from "
                                                               "--output-dir, or entry:ID) side by side")] = None,
    output_dir: Annotated[str | None, typer.Option(help="keep the profile JSON, the ncu reports and their CSVs "
                                                        "here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the profile (or the diff) as JSON")] = False,
    ledger: LedgerOpt = None,
) -> None:
    """Hardware counters (Nsight Compute) of one verified call of gemmlab and of cuBLAS, L2 flushed, clocks
    recorded: tensor-pipe use, SM and DRAM throughput, L2 hit rate, occupancy, top warp stalls, bank
    conflicts. Exit 2 without a GPU or ncu; 1 when a profile could not be taken."""
    import json

    from gemmlab.inspect import profile as pf
    from gemmlab.inspect import profile_view as view

    out = Console(stderr=json_out, width=160)
    if diff:
        try:
            a, b = (_saved_profile(x, ledger) for x in diff)
        except ValueError as e:
            raise _usage_error(e) from e
        header, rows = view.diff_rows(a, b)
        if json_out:
            print(json.dumps({"a": diff[0], "b": diff[1], "header": header, "rows": rows}, indent=1))
        else:
            _print_rows(f"profile diff: A {diff[0]}  B {diff[1]}", header, rows, out)
        return
    entry = None
    if ledger_entry is not None:
        _ledger_ready(ledger)
        entry = _ledger(ledger).get(ledger_entry)
        if entry is None:
            raise _usage_error(f"--ledger-entry {ledger_entry}: no such entry in the ledger")
        if entry.op != "gemm" or not (entry.backend or "").startswith("gemmlab"):
            raise _usage_error(f"--ledger-entry {ledger_entry}: a {entry.op} entry of backend {entry.backend}; "
                               "profile takes gemmlab's GEMM entries")
        if entry.config is not None and not isinstance(entry.config, dict):
            raise _usage_error(f"--ledger-entry {ledger_entry}: its config {entry.config!r} is not GemmConfig fields")
    try:
        req = pf.request(shape or (entry.shape if entry else None), dtype or (entry.dtype if entry else "float16"),
                         layout, config if config is not None else (entry.config if entry else None), baseline,
                         clock_control)
        if entry and shape and (req["m"], req["n"], req["k"]) != tuple(map(int, entry.shape.split("x"))):
            raise ValueError(f"--shape {shape} differs from ledger entry {ledger_entry}'s {entry.shape}")
    except ValueError as e:
        raise _usage_error(e) from e
    why = pf.unavailable()
    if why:
        raise _usage_error(why)
    try:
        prof = pf.profile(req["m"], req["n"], req["k"], req["dtype"], req["layout"], req["config"], req["baseline"],
                          req["clock_control"], output_dir, seed, ledger_entry)
    except pf.ProfileError as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]gemmlab profile: {e}", highlight=False, markup=False)
        raise typer.Exit(e.code) from e
    if entry is not None:
        aid = _ledger(ledger).attach(ledger_entry, "profile", prof, prof.get("file"))
        Console(stderr=True).print(f"attached the profile to ledger entry #{ledger_entry} (attachment {aid})")
    g = prof["backends"]["gemmlab"]
    if entry is not None and entry.path and entry.path != g["path"]:
        out.print(f"[yellow]note: ledger entry #{ledger_entry} ran path {entry.path}; this profile's plan ran "
                  f"{g['path']}")
    title = (f"{req['m']}x{req['n']}x{req['k']} {req['dtype']} {req['layout']}: gemmlab {g['path']} under ncu "
             f"{prof['ncu']['version'] or ''}, clock control {req['clock_control']}, caches flushed")
    _print_rows(title, *view.summary_rows(prof), out)
    _print_rows("launches", *view.launch_rows(prof), out)
    if prof["unavailable"]:
        out.print("not available on this GPU / ncu: " + view.lacking_text(prof))
    if prof.get("file"):
        out.print(f"wrote {prof['file']}")
    if json_out:
        print(json.dumps(prof, indent=1, default=str))


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
    output_dir: Annotated[str | None, typer.Option(help="write tune-report.json here")] = None,
    record_note: Annotated[str, typer.Option("--record", help="what this tuning run is about")] = "tune",
    ledger: LedgerOpt = None,
    seed: Annotated[int, typer.Option(help="seed of inputs and search order")] = 0,
) -> None:
    """Search each shape's config space (--op gemm), or the MoE layer's grouped GEMMs (--op moe): verify every
    candidate at the shape, time it against the incumbent and the baseline (cuBLAS; torch's grouped GEMM),
    accept only what is faster beyond noise on tensor cores; every attempt goes to the ledger; confirmed
    winners become rules in the user's <gpu>.json, which `plan` and the MoE ops read before the bundled ones."""
    import time

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from gemmlab.ops import configs
    from gemmlab.ops.plan import target_for
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
        if shapes:
            todo += _shapes(shapes, None, "cpu")
        for name in suite or ([] if shapes else (["seeds", "small-m"] if torch.cuda.is_available() else ["cpu"])):
            todo += _shapes(None, name, "cpu")
        todo = list(dict.fromkeys(todo))
    else:
        raise typer.BadParameter(f"--op {op!r}: gemm or moe")
    _ledger_ready(ledger)  # every attempt is recorded
    err = Console(stderr=True, width=150)
    cols = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn())
    total = 60.0 * budget_minutes
    with Progress(*cols, console=err, transient=True) as bar:
        task = bar.add_task("tuning", total=total)
        t0 = time.perf_counter()
        counts: dict[str, int] = {}

        def step(ev: dict) -> None:
            counts[ev["shape"]] = ev.get("tried", counts.get(ev["shape"], 0))
            bar.update(task, completed=min(total, time.perf_counter() - t0),
                       description=f"{ev['shape']}: {counts[ev['shape']]} tried")

        res = tune(todo, _dtype(dtype or ("bfloat16" if op == "moe" else "float16")), budget_minutes=budget_minutes,
                   ledger=ledger, session=resume or session, seed=seed, note=record_note, progress=step)
    table = Table(title=f"tune session {res['session']} ({res['workers']} worker(s))")
    for col in ("shape", "path", "tried", "accepted", "pruned", "default vs baseline", "tuned vs baseline",
                "tuned / default [95% CI]", "confirmed"):
        table.add_column(col)
    for r in res["results"]:
        conf = r["confirm"]
        sp = conf.get("speedup")
        dv, tv = conf.get("default_vs_baseline") or {}, conf.get("tuned_vs_baseline") or {}
        table.add_row("x".join(map(str, r["shape"])), r["path"], str(len(r["tried"])),
                      str(sum(t["decision"] == "accepted" for t in r["tried"][1:])), str(len(r["pruned"])),
                      _num(dv.get("ratio"), ".3f"), _num(tv.get("ratio"), ".3f"),
                      "-" if not sp else f"{sp['ratio']:.3f} [{sp['ci95'][0]:.3f}, {sp['ci95'][1]:.3f}]",
                      "[green]yes" if r["confirmed"] else "no")
    Console(width=150).print(table)
    if write and any(r["confirmed"] for r in res["results"]):
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        path = write_configs(res["results"], target_for(device).name, configs_dir)
        Console().print(f"wrote the confirmed winners to {path}")
        if path.parent.resolve() != configs.user_dir().resolve():
            Console().print(f"note: plan reads {configs.user_dir()}; set GEMMLAB_CONFIGS={path.parent} to use {path}")
    if output_dir:
        from gemmlab.bench.timing import env_info

        _write_report({"env": env_info(), **res}, output_dir, "tune-report.json")
    if res.get("failed_workers"):
        raise typer.Exit(1)


def _ledger(path: str | None):
    """The ledger to read (list, show, compare, history, export); an unusable one is one line and exit 2."""
    from gemmlab.ledger import Ledger, LedgerError

    try:
        return Ledger.open(path)
    except LedgerError as e:
        raise _usage_error(e) from e


def _entry_row(e) -> list[str]:
    ci = "-" if not e.ratio_ci else f"[{e.ratio_ci[0]:.3f}, {e.ratio_ci[1]:.3f}]"
    return [str(e.id), (e.created or "")[:19], e.kind, e.shape, e.dtype, e.backend or "-", e.path or "-",
            "yes" if e.correct else "NO", _num(e.median_ms, ".4f"), _num(e.ratio, ".3f"), ci,
            _num(e.tensor_core_ops, "d"), str(e.parent_id or "-"),
            f"[green]{e.decision}" if e.decision == "accepted" else f"[yellow]{e.decision}", (e.note or "")[:30]]


ENTRY_COLS = ("id", "created", "kind", "shape", "dtype", "backend", "path", "correct", "median ms", "vs cuBLAS",
              "95% CI", "TC ops", "parent", "decision", "note")


@ledger_app.command("list")
def ledger_list(
    shape: Annotated[str | None, typer.Option(help="MxNxK")] = None,
    kind: Annotated[str | None, typer.Option(help="grade, bench, table or tune")] = None,
    session: Annotated[str | None, typer.Option(help="a tune session")] = None,
    limit: Annotated[int, typer.Option(help="the last N entries")] = 50,
    ledger: LedgerOpt = None,
) -> None:
    """The last entries, with their decisions."""
    db = _ledger(ledger)
    shape = shape.replace(",", "x") if shape else None
    table = Table(title=f"ledger {db.path}")
    for col in ENTRY_COLS:
        table.add_column(col)
    for e in db.list(shape=shape, kind=kind, session=session, limit=limit):
        table.add_row(*_entry_row(e))
    Console(width=200).print(table)


@ledger_app.command("show")
def ledger_show(entry_id: int, ledger: LedgerOpt = None) -> None:
    """One entry, whole (JSON), with the list of its attachments (``gemmlab profile --ledger-entry``) if any."""
    import dataclasses
    import json

    db = _ledger(ledger)
    e = db.get(entry_id)
    if e is None:
        raise typer.BadParameter(f"no ledger entry {entry_id}")
    shown = dataclasses.asdict(e)
    if att := db.attachments(entry_id):
        shown["attachments"] = [{key: a[key] for key in ("id", "kind", "created", "path")} for a in att]
    print(json.dumps(shown, indent=1, default=str))


@ledger_app.command("compare")
def ledger_compare(first: int, second: int, ledger: LedgerOpt = None) -> None:
    """The accept/reject rule applied to SECOND against FIRST, and what differs between them."""
    from gemmlab.ledger import decide, paired_speedup

    db = _ledger(ledger)
    a, b = db.get(first), db.get(second)
    if a is None or b is None:
        raise typer.BadParameter(f"no ledger entry {first if a is None else second}")
    table = Table(title=f"#{first} -> #{second}")
    for col in ("field", f"#{first}", f"#{second}"):
        table.add_column(col)
    for name in ("created", "git_sha", "gpu", "kind", "shape", "dtype", "backend", "path", "config", "correct",
                 "median_ms", "p20_ms", "p80_ms", "tflops", "ratio", "ratio_ci", "sm_clock_mhz", "tensor_core_ops",
                 "decision", "note"):
        va, vb = getattr(a, name), getattr(b, name)
        mark = "" if va == vb else "[bold]"
        table.add_row(mark + name, str(va), str(vb))
    Console(width=200).print(table)
    if a.shape != b.shape or a.dtype != b.dtype:
        Console().print("[yellow]different shapes or dtypes: not comparable")
        raise typer.Exit(1)
    if b.vs_parent and b.parent_id != a.id:
        b.vs_parent = None  # its same-run comparison was with another entry
    paired = paired_speedup(b, a)
    decision, reason = decide(b, a)
    if paired:
        Console().print(f"speedup #{second} over #{first}: {paired[0]:.3f} [{paired[1][0]:.3f}, "
                        f"{paired[1][1]:.3f}] ({paired[2]})")
    Console().print(f"#{second} against #{first}: {decision}: {reason}")


@ledger_app.command("history")
def ledger_history(
    shape: Annotated[str, typer.Option(help="M,N,K")],
    dtype: Annotated[str | None, typer.Option(help="float16 or bfloat16")] = None,
    plot: Annotated[str | None, typer.Option(help="write the latency curve as a PNG")] = None,
    ledger: LedgerOpt = None,
) -> None:
    """The latency curve of a shape: accepted versions in order, rejected attempts as their own marks."""
    from gemmlab.problems import parse_shape

    try:
        key = "x".join(map(str, parse_shape(shape)))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    entries = _ledger(ledger).history(key, dtype)
    table = Table(title=f"history of {key}")
    for col in ENTRY_COLS:
        table.add_column(col)
    for e in entries:
        table.add_row(*_entry_row(e))
    Console(width=200).print(table)
    accepted = [e for e in entries if e.decision == "accepted"]
    Console().print("accepted latency: " + (" -> ".join(f"{e.median_ms:.4f}" for e in accepted) or "none") + " ms")
    if plot:
        from gemmlab.ledger.plot import history_png

        history_png(entries, key, plot)
        Console().print(f"wrote {plot}")


@ledger_app.command("export")
def ledger_export(
    fmt: Annotated[str, typer.Option("--format", help="json or csv")] = "json",
    output: Annotated[str | None, typer.Option(help="file [default: stdout]")] = None,
    ledger: LedgerOpt = None,
) -> None:
    """Every entry as JSON or CSV."""
    try:
        text = _ledger(ledger).export(fmt)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if output:
        from pathlib import Path

        Path(output).write_text(text)
    else:
        print(text)


@app.command("probe")
def probe_cmd(
    check: Annotated[bool, typer.Option("--check", help="health check: a short re-measurement against the "
                                                        "recorded profile; exit 1 if degraded")] = False,
    output: Annotated[str | None, typer.Option(help="profile file [default: ~/.gemmlab/device-<gpu>.json]")] = None,
    profile: Annotated[str | None, typer.Option(help="a recorded profile to use (--check, --roofline)")] = None,
    roofline: Annotated[str | None, typer.Option(help="a `bench gemm` JSON to place on the roofline")] = None,
    plot: Annotated[str, typer.Option(help="roofline PNG")] = "roofline.png",
    min_fraction: Annotated[float, typer.Option(help="--check: figures below this fraction are problems")] = 0.8,
) -> None:
    """Measure the GPU's constants (SMs, L2, clocks, power limit, HBM bandwidth, cuBLAS 8192^3, the attainable
    tensor-core rate, launch overhead) and record them; or check health against them; or draw a roofline."""
    import json
    from pathlib import Path

    from gemmlab import probe as pr

    def recorded() -> dict:
        prof = json.loads(Path(profile).read_text()) if profile else pr.load()
        if prof is None:
            raise typer.BadParameter("no recorded profile for this GPU: run `gemmlab probe` first (or --profile)")
        return prof

    if roofline:
        report = json.loads(Path(roofline).read_text())
        Console().print(f"wrote {pr.roofline_png(recorded(), report, plot)}")
        return
    if not torch.cuda.is_available():
        Console(stderr=True).print("[red]gemmlab probe needs a CUDA GPU")
        raise typer.Exit(2)
    if check:
        prof = recorded()
        res = pr.health(prof)
        res["problems"] = pr.health_problems(prof, res["now"], min_fraction)
        now = res["now"]
        figs = [("HBM copy GB/s", now["hbm_copy"]["gbps"], prof["hbm_copy"]["gbps"]),
                ("cuBLAS 8192^3 TFLOPS", now["cublas_8192"]["tflops"], prof["cublas_8192"]["tflops"]),
                ("tensor-core loop TFLOPS", now["mma_peak"]["tflops"], prof["mma_peak"]["tflops"]),
                ("Triton launch us", now["launch"]["triton_empty_us"], prof["launch"]["triton_empty_us"])]
        Console().print("now (recorded): " + ", ".join(f"{n} {a:.1f} ({b:.1f})" for n, a, b in figs))
        for problem in res["problems"]:
            Console().print(f"[red]DEGRADED: {problem}")
        if not res["problems"]:
            Console().print(f"[green]healthy: every figure within {min_fraction:.0%} of the profile of {prof['date']}")
        raise typer.Exit(1 if res["problems"] else 0)
    prof = pr.probe()
    path = pr.save(prof, output)
    t = Table(title=f"{prof['gpu']} (sm_{prof['capability'][0]}{prof['capability'][1]}), {prof['date']}")
    t.add_column("constant")
    t.add_column("value")
    mp, cb = prof["mma_peak"], prof["cublas_8192"]
    for name, v in (("SMs", prof["sm_count"]), ("L2", f"{(prof['l2_bytes'] or 0) / 2**20:.0f} MiB"),
                    ("shared memory per block (opt-in)", f"{prof['smem_per_block_optin']} B"),
                    ("max SM clock / power limit", f"{prof['max_sm_clock_mhz']} MHz / {prof['power_limit_w']} W"),
                    ("HBM copy", f"{prof['hbm_copy']['gbps']:.0f} GB/s"),
                    ("cuBLAS fp16 8192^3", f"{cb['tflops']:.0f} TFLOPS at "
                                           f"{cb['clocks'].get('sm_clock_mhz_mean', 0):.0f} MHz"),
                    ("tensor-core loop (operands on chip)", f"{mp['tflops']:.0f} TFLOPS at "
                                                            f"{mp['clocks'].get('sm_clock_mhz_mean', 0):.0f} MHz = "
                                                            f"{mp['flop_per_clock_per_sm'] or 0:.0f} FLOP/clock/SM"),
                    ("nominal fp16 peak at max clock", f"{prof['nominal_tensor_tflops_at_max_clock'] or 0:.0f} TFLOPS"),
                    ("launch: Triton empty / torch add (host)", f"{prof['launch']['triton_empty_us']:.1f} / "
                                                                f"{prof['launch']['torch_add_us']:.1f} us"),
                    ("empty kernel back to back (device)", f"{prof['launch']['device_per_kernel_us']:.2f} us")):
        t.add_row(name, str(v))
    Console().print(t)
    Console().print(f"wrote {path}")


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
