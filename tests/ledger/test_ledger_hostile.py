"""A ledger that another program wrote into (issue 34's second hostile round): text cells with rich markup or a
terminal's escape sequences, an attachment nested deeper than a printer recurses, an accepted parent with a bad
cell under a recording command, and filters that can match nothing (--session not UTF-8, --dtype misspelt).
Each is shown literally or is one line and exit 2; none is a traceback, and the file is left as it was."""

import sqlite3

import pytest
import typer
from typer.testing import CliRunner

from gemmlab.cli import app
from gemmlab.cli import common as cmd
from gemmlab.ledger import Entry, Ledger


def ledger(tmp_path, n: int = 2) -> str:
    path = tmp_path / "l.db"
    db = Ledger.open(path)
    for i in range(n):
        db.record(
            Entry(
                kind="bench",
                shape="64x64x64",
                dtype="float16",
                correct=True,
                median_ms=1.0 + i,
                gpu="cpu",
                note=f"n{i}",
            ),
            provenance=False,
        )
    db.close()
    return str(path)


def update(path: str, sql: str, *args) -> bytes:
    with sqlite3.connect(path) as conn:
        conn.execute(sql, args)
    conn.close()
    return open(path, "rb").read()


def run(*args):
    return CliRunner().invoke(app, ["ledger", *args])


HOSTILE = "[/bold] \x1b]0;pwned\x07 \x1b[2J [red]x"


@pytest.mark.parametrize(
    "argv", [["list"], ["history", "--shape", "64,64,64"], ["compare", "1", "2"]], ids=lambda a: a[0]
)
def test_markup_and_escapes_in_cells_print_literally(tmp_path, argv):
    """rich read a note "[/bold]" as a closing tag (MarkupError, a 145-line traceback) and printed ESC sequences
    raw (a retitled window, a cleared screen): now both show as the text they are."""
    path = ledger(tmp_path)
    before = update(path, "UPDATE entries SET note = ?, backend = ? WHERE id = 1", HOSTILE, "[/]")
    res = run(*argv, "--ledger", path)
    assert res.exit_code == 0 and res.exception is None, res.output
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "\\x1b]0;pwned\\x07" in res.stdout and "[/bold]" in res.stdout and "[/]" in res.stdout
    assert open(path, "rb").read() == before


def test_a_ledger_path_with_brackets_is_its_title(tmp_path):
    path = tmp_path / "[/]x.db"
    Ledger.open(path).close()
    res = run("list", "--ledger", str(path))
    assert res.exit_code == 0 and res.exception is None and "[/]x.db" in res.stdout, res.output


def test_an_attachment_nested_deep_is_one_line(tmp_path):
    """ledger show parsed an attachment of 5000 nested lists: RecursionError."""
    path = ledger(tmp_path)
    for data in ("[" * 5000 + "]" * 5000, "[" * 100 + "]" * 100):
        update(path, "DELETE FROM attachments")
        before = update(path, "INSERT INTO attachments (entry_id, kind, data) VALUES (1, 'profile', ?)", data)
        res = run("show", "1", "--ledger", path)
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1 and res.stdout == "", res.output
        assert "column data is JSON nested deeper than the 64 levels" in lines[0] and path in lines[0]
        assert open(path, "rb").read() == before


def test_an_accepted_parent_with_a_bad_cell_is_one_line_when_recording(tmp_path, capsys):
    """A recording command read the parent outside the ledger's checks: CellError (a traceback); now one line,
    exit 2, and no entry is added."""
    path = ledger(tmp_path)
    update(path, "UPDATE entries SET decision = 'accepted', median_ms = 'fast' WHERE id = 2")
    with pytest.raises(typer.Exit) as e:
        cmd.record(
            [Entry(kind="bench", shape="64x64x64", dtype="float16", correct=True, median_ms=0.5, gpu="cpu")],
            "n",
            path,
            None,
        )
    assert e.value.exit_code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ledger entry 2: column median_ms holds str 'fast'" in err[0], err
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 2
    conn.close()


def test_a_recorded_line_prints_a_backend_literally(tmp_path, capsys):
    path = ledger(tmp_path, 0)
    cmd.record(
        [Entry(kind="bench", shape="64x64x64", dtype="float16", backend="k[/].py:fn\x1b[2J", gpu="cpu")],
        "n",
        path,
        None,
    )
    err = capsys.readouterr().err
    assert "k[/].py:fn\\x1b[2J" in err and "\x1b[2J" not in err, err


@pytest.mark.parametrize(
    "argv,says",
    [
        (["list", "--session", "\udcff"], "--session"),  # what Python makes of a shell's byte 0xff
        (["history", "--shape", "64,64,64", "--dtype", "nope"], "--dtype"),
    ],
    ids=["session-not-utf8", "dtype-misspelt"],
)
def test_filters_that_match_nothing_are_usage_errors(tmp_path, argv, says):
    """--session with bytes that are not UTF-8 was a UnicodeEncodeError traceback; --dtype nope an empty table."""
    path = ledger(tmp_path)
    res = run(*argv, "--ledger", path)
    assert res.exit_code == 2 and res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert says in res.output and "Traceback" not in res.output


def test_history_takes_a_real_dtype(tmp_path):
    res = run("history", "--shape", "64,64,64", "--dtype", "float16", "--ledger", ledger(tmp_path))
    assert res.exit_code == 0 and "2.0000" in res.stdout, res.output


def test_a_ledger_whose_name_is_not_utf8_is_read(tmp_path):
    """Reading opens the file by a file: URI; a name with a byte that is not UTF-8 (b"g\\xff.db") made quoting it a
    UnicodeEncodeError traceback. Now its bytes are percent-encoded and the ledger is read."""
    import os

    good = ledger(tmp_path)
    path = tmp_path / os.fsdecode(b"g\xff.db")
    os.rename(good, path)
    for argv in (["list"], ["show", "1"], ["export", "--format", "csv"]):
        res = run(*argv, "--ledger", str(path))
        assert res.exit_code == 0 and res.exception is None and "1.0" in res.stdout, (argv, res.output)
    assert sorted(os.listdir(tmp_path)) == [b"g\xff.db".decode("utf-8", "surrogateescape")]


def test_a_ledger_locked_by_a_writer_is_busy_not_foreign_or_damaged(tmp_path):
    """A sound ledger held under an exclusive lock past the read's timeout was "not a SQLite ledger (database is
    locked)"; it is busy, and the message says so (and to try again)."""
    from gemmlab.ledger import LedgerError

    path = ledger(tmp_path)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("UPDATE entries SET note = 'x'")
        with pytest.raises(LedgerError) as e:
            Ledger(path, timeout=0.2, read_only=True)
        assert "is busy: another process holds it locked" in str(e.value) and "not a SQLite" not in str(e.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    db = Ledger(path, timeout=0.2, read_only=True)  # the lock gone: read as before
    try:
        assert [e.note for e in db.list()] == ["n0", "n1"]
    finally:
        db.close()
