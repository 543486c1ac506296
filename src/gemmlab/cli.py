"""The `gemmlab` command: a thin shell over the library.

    gemmlab grade [--cases NAME|PATH] [--kernel FILE.py:FN] [--signature ...] [--output-dir DIR] [--json]
    gemmlab check [--shapes M,N,K ...] [--dtype float16|bfloat16|both]
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
