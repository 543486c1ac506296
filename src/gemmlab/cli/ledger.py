"""``gemmlab ledger list|show|compare|history|export``: argument handling; the tables live in gemmlab.ledger.view.

Every one of them only reads (the file is opened read-only: nothing is created, migrated or overwritten), takes
--json (one JSON document on stdout and nothing else there), and turns a ledger it cannot read (missing, foreign,
damaged pages, cells of the wrong type) into one line and exit 2."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console

from gemmlab import output
from gemmlab.cli import common as cmd
from gemmlab.cli.common import LedgerOpt

ledger_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The experiment ledger: every attempt, accepted or rejected with its reason.",
)
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout (and nothing else there)")]


@contextmanager
def reading(path: str | None, write: bool = False) -> Iterator:
    """The ledger to read (opened read-only, so a read never creates, migrates or overwrites a file) or, with
    ``write``, to attach to; an unusable one, found on opening or on reading, is one line and exit 2."""
    from gemmlab.ledger import Ledger, LedgerError

    try:
        db = Ledger.open(path, read_only=not write)
    except LedgerError as e:
        raise cmd.usage_error(e) from e
    try:
        yield db
    except LedgerError as e:
        raise cmd.usage_error(e) from e
    finally:
        db.close()


def open_ledger(path: str | None, write: bool = False):
    """The ledger, opened as ``reading`` opens it, for a caller that closes it itself."""
    from gemmlab.ledger import Ledger, LedgerError

    try:
        return Ledger.open(path, read_only=not write)
    except LedgerError as e:
        raise cmd.usage_error(e) from e


KINDS = ("grade", "bench", "table", "tune")  # what recorded an entry (Entry.kind)


def shape_key(text: str) -> str:
    """--shape as the ledger keys it: M,N,K (or MxNxK) -> "MxNxK"; an MoE shape T,H,I,E,k -> "TxHxIxExk", with
    its routing after a space ("... zipf"). A usage error for anything else (it would match nothing)."""
    sizes, _, routing = text.strip().partition(" ")
    parts = sizes.replace(",", "x").split("x")
    if len(parts) not in (3, 5) or not all(p.isdigit() for p in parts) or (routing and len(parts) != 5):
        raise typer.BadParameter(
            f"{text!r}: M,N,K (a GEMM) or T,H,I,E,k (an MoE layer, optionally followed by "
            "its routing, e.g. '4096,7168,2048,256,8 zipf')",
            param_hint="'--shape'",
        )
    return "x".join(str(int(p)) for p in parts) + (f" {routing}" if routing else "")


def utf8(value: str | None, option: str) -> str | None:
    """An option's text as the ledger can match it: UTF-8 (a shell can pass other bytes); a usage error if not."""
    try:
        value is None or value.encode("utf-8")
    except UnicodeEncodeError:
        raise typer.BadParameter(
            f"{output.literal(ascii(value))}: not UTF-8 text, so no ledger entry can have it", param_hint=f"'{option}'"
        ) from None
    return value


def dtype_name(value: str | None) -> str | None:
    """--dtype of a ledger read: the name of a torch dtype (float16, bfloat16, float8_e4m3fn, ...), else a usage
    error (a misspelt one would match nothing, in silence)."""
    import torch

    if value is not None and not isinstance(getattr(torch, value, None), torch.dtype):
        raise typer.BadParameter(f"{value!r}: a dtype's name, such as float16 or bfloat16", param_hint="'--dtype'")
    return value


def _entry(db, entry_id: int):
    e = db.get(entry_id)
    if e is None:
        raise typer.BadParameter(f"no ledger entry {entry_id}")
    return e


@ledger_app.command("list")
def ledger_list(
    shape: Annotated[str | None, typer.Option(help="MxNxK")] = None,
    kind: Annotated[str | None, typer.Option(help="grade, bench, table or tune")] = None,
    session: Annotated[str | None, typer.Option(help="a tune session")] = None,
    limit: Annotated[int, typer.Option(callback=cmd.entry_count, help="the last N entries")] = 50,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The last entries, with their decisions (none yet, exit 0, before anything was recorded)."""
    from pathlib import Path

    from gemmlab.ledger import default_path, view

    if kind is not None and kind not in KINDS:
        raise typer.BadParameter(f"{kind!r}: {', '.join(KINDS)}", param_hint="'--kind'")
    key = shape_key(shape) if shape is not None else None
    utf8(session, "--session")
    path = Path(ledger) if ledger else default_path()
    if not path.exists() and not path.is_symlink():  # a fresh machine: nothing recorded yet is no error
        if json_out:
            output.emit_json({"ledger": str(path), "entries": []})
        else:
            print(f"no ledger yet at {path} (grade --record, bench gemm --record, table --record and tune write one)")
        return
    with reading(ledger) as db:
        entries = db.list(shape=key, kind=kind, session=session, limit=limit)
    if json_out:
        output.emit_json({"ledger": str(db.path), "entries": [dataclasses.asdict(e) for e in entries]})
        return
    output.print_tables([view.entries_table(entries, f"ledger {output.literal(db.path)}")], Console(width=200))


@ledger_app.command("show")
def ledger_show(
    entry_id: int,
    ledger: LedgerOpt = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="accepted for symmetry: show always prints one JSON document")
    ] = False,
) -> None:
    """One entry, whole (JSON), with its attachments if any.

    The attachments are what `gemmlab profile --ledger-entry` added."""
    with reading(ledger) as db:
        shown = dataclasses.asdict(_entry(db, entry_id))
        if att := db.attachments(entry_id):
            shown["attachments"] = [{key: a[key] for key in ("id", "kind", "created", "path")} for a in att]
    output.emit_json(shown)


def speedup_line(a, b, paired) -> str:
    """Which of the two is faster and by how much, said in the direction it is reported: "#B is 1.234x faster
    than #A" (A's time over B's), or "slower" (B's time over A's) when B took longer."""
    if paired:
        s, (lo, hi), how = paired
        how = f"95% interval [{lo:.3f}, {hi:.3f}], {how}"
    elif a.median_ms and b.median_ms:
        s, how = a.median_ms / b.median_ms, f"median times {a.median_ms:.4f} ms / {b.median_ms:.4f} ms, no interval"
    else:
        return f"#{b.id} against #{a.id}: no speedup (an entry was not timed)"
    if s >= 1:
        return f"#{b.id} is {s:.3f}x faster than #{a.id} (time #{a.id} / time #{b.id}; {how})"
    if paired:  # the interval of the inverse ratio is the inverse interval, ends swapped
        how = f"95% interval [{1 / hi:.3f}, {1 / lo:.3f}], {paired[2]}"
    return f"#{b.id} is {1 / s:.3f}x slower than #{a.id} (time #{b.id} / time #{a.id}; {how})"


@ledger_app.command("compare")
def ledger_compare(first: int, second: int, ledger: LedgerOpt = None, json_out: JsonOpt = False) -> None:
    """The accept/reject rule applied to SECOND against FIRST, and what differs.

    The speedup is said in its direction: "#SECOND is 1.2x faster than #FIRST" (FIRST's time over SECOND's).
    Exit 1 when the two are not comparable (different shapes or dtypes)."""
    from gemmlab.ledger import decide, paired_speedup, view

    with reading(ledger) as db:
        a, b = _entry(db, first), _entry(db, second)
    comparable = a.shape == b.shape and a.dtype == b.dtype
    doc = {"first": dataclasses.asdict(a), "second": dataclasses.asdict(b), "comparable": comparable}
    lines = ["[yellow]different shapes or dtypes: not comparable"]
    if comparable:
        if b.vs_parent and b.parent_id != a.id:
            b.vs_parent = None  # its same-run comparison was with another entry
        try:
            paired = paired_speedup(b, a)
            decision, reason = decide(b, a)
        except (TypeError, ValueError, KeyError, ZeroDivisionError) as e:  # a hand-edited report the rule can't read
            raise cmd.usage_error(f"ledger entries #{first} and #{second} cannot be compared: {e!r}") from e
        lines = [speedup_line(a, b, paired), f"#{second} against #{first}: {decision}: {reason}"]
        doc.update(
            speedup=paired
            and {
                "of": second,
                "over": first,
                "ratio": paired[0],
                "ci95": paired[1],
                "means": f"time #{first} / time #{second}",
                "paired": paired[2],
            },
            decision=decision,
            reason=reason,
            summary=lines[0],
        )
    if json_out:
        output.emit_json(doc)
    else:
        con = Console(width=200)
        output.print_tables([view.compare_table(a, b)], con)
        for line in lines:
            con.print(line, markup=line.startswith("[yellow]"), highlight=False)
    if not comparable:
        raise typer.Exit(1)


@ledger_app.command("history")
def ledger_history(
    shape: Annotated[str, typer.Option(help="M,N,K")],
    dtype: Annotated[str | None, typer.Option(callback=dtype_name, help="float16 or bfloat16")] = None,
    plot: Annotated[str | None, typer.Option(callback=cmd.out_file, help="write the latency curve as a PNG")] = None,
    ledger: LedgerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The latency curve of a shape.

    Accepted versions in order, rejected attempts as their own marks."""
    from gemmlab.ledger import view
    from gemmlab.problems import parse_shape

    try:
        key = "x".join(map(str, parse_shape(shape)))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    with reading(ledger) as db:
        entries = db.history(key, dtype)
    con = Console(width=200, stderr=json_out)
    if json_out:
        output.emit_json(
            {
                "shape": key,
                "dtype": dtype,
                "entries": [dataclasses.asdict(e) for e in entries],
                "accepted_ms": [e.median_ms for e in entries if e.decision == "accepted"],
            }
        )
    else:
        output.print_tables([view.entries_table(entries, f"history of {key}")], con)
        con.print(view.accepted_line(entries))
    if plot:
        from gemmlab.ledger.plot import history_png

        try:
            if history_png(entries, key, plot) is not None:
                con.print(f"wrote {plot}")
        except OSError as e:  # a file gemmlab did not write there since the up-front check, a full disk
            raise cmd.usage_error(e if isinstance(e, output.ReportPathError) else f"--plot {plot}: {e}") from e


@ledger_app.command("export")
def ledger_export(
    fmt: Annotated[str, typer.Option("--format", help="json or csv")] = "json",
    output_file: Annotated[
        str | None, typer.Option("--output", callback=cmd.out_file, help="file [default: stdout]")
    ] = None,
    ledger: LedgerOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="the same as --format json, on stdout")] = False,
) -> None:
    """Every entry as JSON or CSV."""
    if json_out and (fmt != "json" or output_file):
        raise cmd.usage_error("ledger export: --json prints JSON on stdout; not with --format csv or --output")
    if fmt not in ("json", "csv"):
        raise typer.BadParameter(f"{fmt!r}: json or csv", param_hint="'--format'")
    with reading(ledger) as db:
        text = db.export(fmt)
    if output_file:
        try:  # whole (a new file renamed over it), never through a symlink, never over the ledger itself
            output.write_text(output_file, text, keep=[db.path, f"{db.path}-wal", f"{db.path}-shm"])
        except OSError as e:
            raise cmd.usage_error(e if isinstance(e, output.ReportPathError) else f"{output_file}: {e}") from e
    else:
        print(text)
