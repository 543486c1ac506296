"""``gemmlab ledger list|show|compare|history|export``: argument handling; the tables live in gemmlab.ledger.view."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from gemmlab import output
from gemmlab.cli import common as cmd
from gemmlab.cli.common import LedgerOpt

ledger_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="The experiment ledger: every attempt, accepted or rejected with its reason.")


def open_ledger(path: str | None, write: bool = False):
    """The ledger to read (list, show, compare, history, export: opened read-only, so a read never creates,
    migrates or overwrites a file) or, with ``write``, to attach to; an unusable one is one line and exit 2."""
    from gemmlab.ledger import Ledger, LedgerError

    try:
        return Ledger.open(path, read_only=not write)
    except LedgerError as e:
        raise cmd.usage_error(e) from e


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

    db = open_ledger(ledger)
    entries = db.list(shape=shape.replace(",", "x") if shape else None, kind=kind, session=session, limit=limit)
    output.print_tables([view.entries_table(entries, f"ledger {db.path}")], Console(width=200))


@ledger_app.command("show")
def ledger_show(entry_id: int, ledger: LedgerOpt = None) -> None:
    """One entry, whole (JSON), with the list of its attachments (``gemmlab profile --ledger-entry``) if any."""
    import dataclasses

    db = open_ledger(ledger)
    e = db.get(entry_id)
    if e is None:
        raise typer.BadParameter(f"no ledger entry {entry_id}")
    shown = dataclasses.asdict(e)
    if att := db.attachments(entry_id):
        shown["attachments"] = [{key: a[key] for key in ("id", "kind", "created", "path")} for a in att]
    output.emit_json(shown)


@ledger_app.command("compare")
def ledger_compare(first: int, second: int, ledger: LedgerOpt = None) -> None:
    """The accept/reject rule applied to SECOND against FIRST, and what differs between them."""
    from gemmlab.ledger import decide, paired_speedup, view

    db = open_ledger(ledger)
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
    entries = open_ledger(ledger).history(key, dtype)
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
        text = open_ledger(ledger).export(fmt)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if output_file:
        Path(output_file).write_text(text)
    else:
        print(text)
