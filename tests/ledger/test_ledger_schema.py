"""The ledger file's schema version: an older file is migrated on open, a newer one is refused; and a ledger
path that cannot record (a directory, a corrupt or read-only file) is one line and exit 2 before any work."""

import os
import sqlite3

import pytest
from typer.testing import CliRunner

from gemmlab.cli import app
from gemmlab.ledger import SCHEMA_VERSION, Entry, Ledger, LedgerError, check

# The schema of every ledger file before versions were recorded (version 0: no user_version), as
# gemmlab/ledger/store.py at git 68bbce2 created it.
V0_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind, shape, dtype, op, note, command, backend, path, config, correct, error, median_ms, p20_ms, p80_ms, tflops, ratio, ratio_ci, per_round, vs_parent, sm_clock_mhz, tensor_core_ops, session, parent_id, report, created, git_sha, dirty, gpu, driver, torch, triton, decision, reason
);
CREATE INDEX IF NOT EXISTS entries_shape ON entries (op, shape, dtype, gpu, decision);
CREATE INDEX IF NOT EXISTS entries_session ON entries (session);
"""  # noqa: E501


def v0_file(path):
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(V0_SCHEMA)
    conn.execute(
        "INSERT INTO entries (kind, shape, dtype, op, correct, median_ms, gpu, decision, config, report) "
        "VALUES ('bench', '64x64x64', 'float16', 'gemm', 1, 2.5, 'g', 'accepted', '{\"block_m\": 64}', '{}')"
    )
    conn.commit()
    conn.close()
    return path


def columns(db: Ledger) -> list[str]:
    return sorted(r[1] for r in db.conn.execute("PRAGMA table_info(entries)"))


def tables(db: Ledger) -> list[tuple[str, str]]:
    return sorted(
        (r[0], r[1]) for r in db.conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
    )


def test_a_version_1_file_gains_the_attachments_table(tmp_path):
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.executescript(V0_SCHEMA)
    conn.execute("ALTER TABLE entries ADD COLUMN gemmlab_version")
    conn.execute("INSERT INTO entries (kind, shape, dtype) VALUES ('bench', '8x8x8', 'float16')")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    db = Ledger(path)
    assert db.schema_version() == SCHEMA_VERSION and tables(db) == tables(Ledger(tmp_path / "new.db"))
    assert db.attachments(1) == []


def test_an_old_file_is_migrated_and_keeps_its_entries(tmp_path):
    db = Ledger(v0_file(tmp_path / "old.db"))
    assert db.schema_version() == SCHEMA_VERSION == 2
    old = db.get(1)
    assert old.median_ms == 2.5 and old.config == {"block_m": 64} and old.gemmlab_version is None
    assert columns(db) == columns(Ledger(tmp_path / "new.db"))  # a migration for every column a new file has
    assert tables(db) == tables(Ledger(tmp_path / "new.db"))  # and for every table and index
    db.attach(1, "profile", {"x": 1})
    assert db.attachments(1)[0]["data"] == {"x": 1}
    e = Entry(
        kind="bench",
        shape="64x64x64",
        dtype="float16",
        correct=True,
        median_ms=2.0,
        gpu="g",
        gemmlab_version="0.1.0",
        git_sha="x",
        dirty=False,
        per_round=[1.2] * 6,
        tensor_core_ops=1,
    )
    db.record(e, provenance=False)
    assert db.get(e.id).gemmlab_version == "0.1.0" and db.get(e.id).parent_id == 1
    db.close()
    assert Ledger(tmp_path / "old.db").schema_version() == SCHEMA_VERSION  # opening again: nothing to do


def test_a_new_file_carries_the_version(tmp_path):
    db = Ledger(tmp_path / "l.db")
    assert db.schema_version() == SCHEMA_VERSION
    assert columns(db) == sorted(f for f in Entry.__dataclass_fields__)


def test_a_newer_file_is_refused(tmp_path):
    path = tmp_path / "future.db"
    Ledger(path).conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(LedgerError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this gemmlab's"):
        Ledger(path)
    res = CliRunner().invoke(app, ["ledger", "list", "--ledger", str(path)])
    assert res.exit_code == 2 and "upgrade gemmlab" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def unusable(tmp_path, kind):
    if kind == "directory":
        (tmp_path / "d.db").mkdir()
        return tmp_path / "d.db", "is a directory"
    if kind == "corrupt":
        (tmp_path / "c.db").write_bytes(b"not a ledger, " * 100)
        return tmp_path / "c.db", "not a SQLite ledger"
    if kind == "read-only file":  # no write bit: read-only for root too (tests may run as root)
        Ledger(tmp_path / "r.db").close()
        os.chmod(tmp_path / "r.db", 0o444)
        return tmp_path / "r.db", "is read-only"
    (tmp_path / "ro").mkdir()  # a new file in a read-only directory
    os.chmod(tmp_path / "ro", 0o555)
    return tmp_path / "ro" / "l.db", "its directory"


KINDS = ["directory", "corrupt", "read-only file", "read-only directory"]


@pytest.mark.parametrize("kind", KINDS)
def test_check_refuses_a_ledger_that_cannot_record(tmp_path, kind):
    path, says = unusable(tmp_path, kind)
    with pytest.raises(LedgerError, match=says):
        check(path)


def test_check_catches_what_sqlite_refuses(tmp_path, monkeypatch):
    """A read-only file system passes the permission checks; SQLite's own refusal is the same one line."""
    path = tmp_path / "l.db"
    Ledger(path).close()
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda p, **kw: real(f"file:{p}?mode=ro", uri=True, **kw))
    with pytest.raises(LedgerError, match="read-only|cannot be written"):
        check(path)


MARKER_KERNEL = """
import pathlib
pathlib.Path({marker!r}).write_text("graded")
import torch
def gemm(a, b):
    return a @ b
"""


@pytest.mark.parametrize("kind", KINDS)
def test_grade_record_stops_before_grading(tmp_path, kind):
    path, says = unusable(tmp_path, kind)
    marker = tmp_path / "marker"
    kernel = tmp_path / "k.py"
    kernel.write_text(MARKER_KERNEL.format(marker=str(marker)))
    res = CliRunner().invoke(
        app, ["grade", "--kernel", f"{kernel}:gemm", "--signature", "rowmajor", "--record", "x", "--ledger", str(path)]
    )
    assert res.exit_code == 2, res.output
    assert says in res.stderr and str(path) in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == "" and not marker.exists()  # the candidate was never loaded: no grading ran


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "gemm", "--shapes", "16,16,16"],
        ["bench", "moe"],
        ["bench", "stable", "--shape", "16,16,16"],
        ["table"],
        ["tune"],
    ],
)
def test_every_recording_command_checks_first(tmp_path, argv):
    path, says = unusable(tmp_path, "directory")
    res = CliRunner().invoke(app, [*argv, "--record", "x", "--ledger", str(path)])
    assert res.exit_code == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output


@pytest.mark.parametrize(
    "argv", [["list"], ["show", "1"], ["compare", "1", "2"], ["history", "--shape", "1,1,1"], ["export"]]
)
def test_reading_commands_refuse_a_corrupt_ledger(tmp_path, argv):
    path, says = unusable(tmp_path, "corrupt")
    res = CliRunner().invoke(app, ["ledger", *argv, "--ledger", str(path)])
    assert res.exit_code == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output


def test_reading_commands_read_an_old_file_as_it_is(tmp_path):
    path = v0_file(tmp_path / "old.db")
    before = path.read_bytes()
    res = CliRunner().invoke(app, ["ledger", "list", "--ledger", str(path)])
    assert res.exit_code == 0 and "64x64x64" in res.stdout
    assert path.read_bytes() == before  # a read command migrates nothing: the next recording command does


@pytest.mark.parametrize(
    "argv", [["list"], ["show", "1"], ["compare", "1", "2"], ["history", "--shape", "1,1,1"], ["export"]]
)
@pytest.mark.parametrize("content", [None, b"x", b"a short text file\n", b""])
def test_reading_commands_change_no_file(tmp_path, argv, content):
    """A missing path is not created, and a file that is not a ledger (one byte, text, empty) is neither
    overwritten nor turned into one: one line, exit 2, the bytes as they were."""
    path = tmp_path / "sub" / "l.db"
    if content is not None:
        path.parent.mkdir()
        path.write_bytes(content)
    res = CliRunner().invoke(app, ["ledger", *argv, "--ledger", str(path)])
    if content is None and argv == ["list"]:  # nothing recorded yet is no error (tests/cli/test_first_contact.py)
        assert res.exit_code == 0 and "no ledger yet at" in res.stdout and not path.parent.exists(), res.output
        return
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    if content is None:
        assert not path.parent.exists() and "no ledger at" in res.stderr
    else:
        assert path.read_bytes() == content and sorted(p.name for p in path.parent.iterdir()) == ["l.db"]
