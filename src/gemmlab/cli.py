"""The `gemmlab` command: a thin shell over the library.

    gemmlab grade [--cases NAME|PATH] [--kernel FILE.py:FN] [--signature ...] [--output-dir DIR] [--json]
    gemmlab check [--shapes M,N,K ...] [--dtype float16|bfloat16|both]
    gemmlab bench gemm [--shapes M,N,K ... | --suite NAME] [--backend NAME ...] [--graph] [--output-dir DIR]
    gemmlab bench stable --shape M,N,K [--processes N] [--backend NAME ...]
    gemmlab table [--model NAME] [--batch-size 4 --seq-len 8192 --top-k 4 ...] [--output-dir DIR]
    gemmlab inspect --shape M,N,K [--dtype] [--layout NN] [--packed] [--json]
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
                                                   "moe, llm, cpu) or a path; default competition with CUDA, "
                                                   "else cpu")] = None,
    kernel: Annotated[str | None, typer.Option(help="FILE.py:FN or package.module:FN; default gemmlab's")] = None,
    signature: Annotated[str | None, typer.Option(help="rowmajor: FN(a, b) -> c; colmajor: FN(A, B, C, M, N, K); "
                                                       "default the case file's layout")] = None,
    allow_vendor: Annotated[bool, typer.Option(help="allow cuBLAS/CUTLASS/aten::mm in the candidate")] = False,
    timeout: Annotated[float, typer.Option(help="seconds per request to the candidate's process")] = 60.0,
    seed: Annotated[int, typer.Option(help="base seed of all inputs")] = 0,
    rounds: Annotated[int | None, typer.Option(help="interleaved timing rounds")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write report.json and report.md here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON on stdout")] = False,
) -> None:
    """Grade a GEMM kernel: exact-shape verification, dispatch coverage, anti-cheat rules, isolation,
    interleaved timing against the vendor BLAS. Exit 0: all passed; 1: a case or rule failed; 2: usage."""
    import json

    from rich.progress import Progress

    from gemmlab.grade import cases as case_files
    from gemmlab.grade import default_cases
    from gemmlab.grade import grade as run_grade
    from gemmlab.grade import report as rep

    err = Console(stderr=True, width=140)
    try:
        n_steps = len(case_files.load(cases or default_cases()).correctness)
    except case_files.CaseError as e:
        err.print(f"[red]{e}")
        raise typer.Exit(2) from e
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("grading", total=n_steps + 1)
        report = run_grade(cases, kernel, signature, allow_vendor, timeout, seed, rounds,
                           progress=lambda msg: bar.update(task, advance=1, description=msg))
    rep.render(report, Console(stderr=json_out, width=140))
    if output_dir:
        rep.write(report, output_dir)
    if json_out:
        print(json.dumps(report, indent=1, default=str))
    raise typer.Exit(0 if report["verdict"] == "PASS" else 1)


@bench_app.command("gemm")
def bench_gemm(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable)")] = None,
    suite: Annotated[str | None, typer.Option(help="seeds, square, llm, small-m, all (cpu without CUDA)")] = None,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[list[str] | None, typer.Option(help="gemmlab, gemmlab-packed, cublas, FILE.py:FN or "
                                                           "package.module:FN (repeatable); cublas is always "
                                                           "the baseline")] = None,
    rounds: Annotated[int, typer.Option(help="interleaved rounds")] = 10,
    reps: Annotated[int, typer.Option(help="timed calls per candidate per round")] = 5,
    warmup_s: Annotated[float, typer.Option(help="seconds of warm-up (clocks settle)")] = 1.0,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays (device time, no host launch cost)")] = False,
    seed: Annotated[int, typer.Option(help="seed of the random inputs")] = 0,
    output_dir: Annotated[str | None, typer.Option(help="write gemm-bench.json, .csv and .png here")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON on stdout")] = False,
) -> None:
    """GEMM backends against cuBLAS: verified against float64 first, then interleaved with the L2 flushed,
    clocks sampled. Exit 1 when any backend is wrong."""
    import json

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from gemmlab.bench import gemm as bg

    todo = _shapes(shapes, suite, "all" if torch.cuda.is_available() else "cpu")
    dt = _dtype(dtype)
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
                                   graph=graph, seed=seed, progress=step)
        except (ValueError, FileNotFoundError, AttributeError, ImportError) as e:
            err.print(f"[red]{e}")
            raise typer.Exit(2) from e
    env = report["env"]
    title = (f"{env.get('gpu') or 'CPU (Triton interpreter, host clock: not a GPU measurement)'} {dtype} "
             f"{'graph replay' if graph else 'eager'}, interleaved vs cuBLAS, git {env['git_sha'][:12]}")
    table = Table(title=title)
    for col in ("shape", "backend", "path", "median ms", "p20-p80 ms", "TFLOPS", "ratio", "95% CI", "verdict",
                "MHz", "eff", "ok"):
        table.add_column(col)
    wrong = 0
    for r in bg.rows(report):
        wrong += not r["ok"]
        ci = "-" if r["ci95_lo"] is None else f"[{r['ci95_lo']:.3f}, {r['ci95_hi']:.3f}]"
        spread = "-" if r["p20_ms"] is None else f"{r['p20_ms']:.4f}-{r['p80_ms']:.4f}"
        table.add_row(r["shape"], r["backend"], r["path"] or "-", _num(r["median_ms"], ".4f"), spread,
                      _num(r["tflops"], ".4g"), _num(r["ratio_vs_cublas"], ".3f"), ci, r["verdict"] or "-",
                      _num(r["sm_clock_mhz"], ".0f"), _num(r["efficiency"], ".1%"),
                      "[green]ok" if r["ok"] else f"[red]WRONG {r['error'] or ''}")
    out = Console(stderr=json_out, width=150)
    out.print(table)
    out.print("ratio = cuBLAS time / backend time per round (> 1: faster), median of rounds, bootstrap 95% CI; "
              "TFLOPS = 2*M*N*K / median; eff = TFLOPS / dense tensor peak at the observed SM clock")
    if output_dir:
        for path in bg.write(report, output_dir):
            out.print(f"wrote {path}")
    if json_out:
        print(json.dumps(report, indent=1, default=str))
    if wrong:
        raise typer.Exit(1)


@bench_app.command("stable")
def bench_stable(
    shape: Annotated[str, typer.Option(help="M,N,K")] = "8192,8192,16384",
    processes: Annotated[int, typer.Option(help="separate processes, each compiling fresh")] = 5,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    backend: Annotated[list[str] | None, typer.Option(help="as for `bench gemm` (repeatable)")] = None,
    rounds: Annotated[int, typer.Option(help="interleaved rounds per process")] = 6,
    reps: Annotated[int, typer.Option(help="timed calls per candidate per round")] = 5,
    warmup_s: Annotated[float, typer.Option(help="seconds of warm-up per process")] = 1.0,
    output_dir: Annotated[str | None, typer.Option(help="write stable-bench.json here")] = None,
) -> None:
    """The same measurement in N fresh processes: the spread across processes, and clock warnings."""
    import json
    from pathlib import Path

    from gemmlab.bench.stable import stable_bench
    from gemmlab.problems import parse_shape

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
        path = Path(output_dir) / "stable-bench.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1, default=str))
        Console().print(f"wrote {path}")
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
    warmup: Annotated[int, typer.Option(help="warm-up calls per row (and at least --warmup-s seconds)")] = 10,
    repeat: Annotated[int, typer.Option(help="timed calls per row")] = 50,
    warmup_s: Annotated[float, typer.Option(help="seconds of warm-up")] = 1.0,
    inspect: Annotated[bool, typer.Option(help="read tensor-core instructions from the SASS")] = True,
    output_dir: Annotated[str | None, typer.Option(help="write table.csv, table.json, table.md here")] = None,
) -> None:
    """The seed's GEMM table: an MoE configuration's dense GEMM (M = batch*seq_len*top_k, N = intermediate,
    K = hidden) through cuBLAS, gemmlab and gemmlab with a prepacked B; the fused MoE row."""
    from gemmlab.bench import table as bt
    from gemmlab.problems import resolve_moe

    try:
        top_k, hidden_size, intermediate_size = resolve_moe(model, top_k, hidden_size, intermediate_size)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    try:
        res = bt.moe_table(batch_size, seq_len, top_k, hidden_size, intermediate_size, dtype=_dtype(dtype),
                           warmup=warmup, repeat=repeat, warmup_s=warmup_s, inspect=inspect, model=model)
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


@app.command()
def paths() -> None:
    """List the kernel paths the dispatcher can take."""
    import gemmlab

    for p in gemmlab.paths():
        print(p)


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
