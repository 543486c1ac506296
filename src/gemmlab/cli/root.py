"""The `gemmlab` command: the typer app and the registration of its commands, one module per command beside it
(cli/grade.py, cli/check.py, ...); each parses its arguments, calls the library and draws its own tables.

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
from inspect import cleandoc
from typing import Annotated

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import typer  # noqa: E402

from gemmlab.cli import check, grade, inspect, paths, probe, report, table, tune  # noqa: E402
from gemmlab.cli.bench import bench_app  # noqa: E402
from gemmlab.cli.ledger import ledger_app  # noqa: E402
from gemmlab.cli.profile import profile_cmd  # noqa: E402

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="gemmlab: fast FP16/BF16 GEMM in Triton, checked against a float64 reference.",
)
app.add_typer(bench_app, name="bench")
app.add_typer(ledger_app, name="ledger")
app.command("profile")(profile_cmd)
app.command("check")(check.check)
app.command("grade")(grade.grade)
app.command("table")(table.table_cmd)
app.command("inspect")(inspect.inspect_cmd)
app.command("tune")(tune.tune_cmd)
app.command("probe")(probe.probe_cmd)
app.command("report")(report.report_cmd)
app.command("paths")(paths.paths)


def _summaries(typer_app: typer.Typer) -> None:
    """Each command's summary in its group's list is the first paragraph of its help, whole (click would cut
    it to fit beside the name, ending in "...")."""
    for info in typer_app.registered_commands:
        if info.short_help is None and info.callback is not None and info.callback.__doc__:
            info.short_help = " ".join(cleandoc(info.callback.__doc__).split("\n\n")[0].split())
    for group in typer_app.registered_groups:
        group.short_help = group.short_help or group.typer_instance.info.help
        _summaries(group.typer_instance)


_summaries(app)


def _version(value: bool) -> None:
    if value:
        from gemmlab import provenance

        sha = provenance.git_sha()
        print(f"gemmlab {provenance.version()}" + (f" (git {sha})" if sha else ""))
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print gemmlab's version and exit")
    ] = False,
) -> None:
    """gemmlab: fast FP16/BF16 GEMM in Triton, checked against a float64 reference."""


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
        if type(e).__name__ == "NoArgsIsHelpError":  # `gemmlab`, `gemmlab bench`: the help, as --help prints it
            print(e.format_message(), file=sys.stderr)
            sys.exit(2)
        ctx, message = getattr(e, "ctx", None), " ".join(e.format_message().split())
        if message:  # (no arguments to a group: its help was printed, with no message)
            print(f"{ctx.command_path if ctx is not None else 'gemmlab'}: {message}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
