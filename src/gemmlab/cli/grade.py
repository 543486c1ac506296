"""``gemmlab grade``: argument handling and the progress bar; the grading lives in gemmlab.grade, its tables in
gemmlab.grade.view."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from gemmlab import output
from gemmlab.cli import common as cmd
from gemmlab.cli import kernelspec
from gemmlab.cli.common import JsonOpt, LedgerOpt, ParentOpt, RecordOpt
from gemmlab.cli.progress import Steps


def grade_step(steps: Steps, msg: str) -> None:
    """The grader's progress messages: one step per correctness case and one for the performance case (their
    messages begin so); planning, exact-shape checks and timing rounds are notes within a step."""
    (steps.step if msg.startswith(("correctness ", "performance ")) else steps.note)(msg)


def fits(cf, recording: bool) -> None:
    """Before grading: every case fits in memory (operands, and their float64 copies for the reference), and a
    run to record has a timed case; else one line and exit 2."""
    for c in (*cf.correctness, *([cf.performance] if cf.performance else [])):
        if hasattr(c, "mnk"):
            m, n, k = c.mnk
            need = cmd.GEMM_BYTES_PER_ELEMENT * (m * k + k * n + m * n)
        else:  # MoE: x, w1 (E x 2I x H), w2 (E x H x I), the routed rows' intermediates and the output
            t, h, i, e, k = c.dims
            need = cmd.MOE_BYTES_PER_ELEMENT * (t * h + 3 * e * i * h + t * k * (2 * i + h) + t * h)
        cmd.fit(need, f"case {c.name} of {cf.name} ({'x'.join(map(str, c.dims))})")
    if recording and cf.performance is None:
        raise cmd.usage_error(
            f"--record: case file {cf.name} has no timed (performance) case, so a grade of it has nothing to record"
        )


def grade(
    cases: Annotated[
        str | None,
        typer.Option(
            help="case file: a shipped name (competition, competition-legacy, "
            "moe, llm, cpu, moe-layer, moe-layer-cpu, fp8, fp8-cpu, fp8-moe, "
            "fp8-moe-cpu) or a path; "
            "default competition with CUDA, else cpu"
        ),
    ] = None,
    kernel: Annotated[
        str | None,
        typer.Option(callback=kernelspec.kernel_option, help="FILE.py:FN or package.module:FN; default gemmlab's"),
    ] = None,
    signature: Annotated[
        str | None,
        typer.Option(
            help="rowmajor: FN(a, b) -> c; colmajor: FN(A, B, C, M, N, K); "
            "default the case file's layout (moe case files: "
            "FN(x, w1, w2, topk_weights, topk_ids) -> y; fp8: "
            "FN(a, b, a_scale, b_scale, c, M, N, K); moe_fp8: FN(x, w1, "
            "w1_scale, w2, w2_scale, topk_weights, topk_ids, out))"
        ),
    ] = None,
    allow_vendor: Annotated[bool, typer.Option(help="allow cuBLAS/CUTLASS/aten::mm in the candidate")] = False,
    timeout: Annotated[
        float,
        typer.Option(
            callback=cmd.seconds, help="seconds per request to the candidate's process, loading the kernel included"
        ),
    ] = 120.0,
    seed: Annotated[
        int,
        typer.Option(
            callback=cmd.seed,
            help="base seed of the public correctness trials, to reproduce them (each case also "
            "runs secret trials; timed inputs are secret)",
        ),
    ] = 0,
    rounds: Annotated[
        int | None,
        typer.Option(
            callback=cmd.rounds_count, help="interleaved timing rounds, at most (the grader stops once precise)"
        ),
    ] = None,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write report.json, report.csv and report.md here")
    ] = None,
    json_out: JsonOpt = False,
    keep_logs: Annotated[bool, typer.Option(help="keep the workers' logs (the report names the directory)")] = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """Grade a GEMM (or MoE) kernel: correct, honest, and how fast against the vendor BLAS.

    Exact-shape verification, dispatch coverage, anti-cheat rules, isolation, interleaved timing against the
    vendor BLAS. Exit 0: all passed; 1: a case or rule failed; 2: usage; 3: every
    rule passed but the timing could not score (inconclusive)."""
    from gemmlab.grade import cases as case_files
    from gemmlab.grade import default_cases, load_any
    from gemmlab.grade import grade as run_grade
    from gemmlab.grade import view as rep
    from gemmlab.sandbox import tool

    try:
        tool.mode()  # the sandbox's settings from the environment: a bad one is a usage error, before anything starts
    except ValueError as e:
        raise cmd.usage_error(e) from None
    cmd.outputs_ready(output_dir, "report")  # before ``clear`` removes gemmlab's own earlier report there
    cmd.ledger_ready(ledger, record_note is not None or bool(ledger), parent, record_note is not None)
    try:
        cf = load_any(cases or default_cases())
        fits(cf, record_note is not None)
        if output_dir:
            rep.clear(output_dir)  # no earlier report.json may stand for this grade
        with Steps("grading", len(cf.correctness) + (cf.performance is not None), Console(stderr=True)) as steps:
            report = run_grade(
                cases,
                kernel,
                signature,
                allow_vendor,
                timeout,
                seed,
                rounds,
                progress=lambda msg: grade_step(steps, msg),
                keep_logs=keep_logs,
            )
    except (case_files.CaseError, OSError) as e:
        raise cmd.usage_error(e) from e
    except RecursionError:  # the JSON parser gave up on the case file
        raise cmd.usage_error(f"case file {cases}: nested too deep to be a case file") from None
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
    raise typer.Exit({"PASS": 0, "INCONCLUSIVE": 3}.get(report["verdict"], 1))
