"""The ledger touches only its own files: another application's SQLite file is refused by every recording command
and left byte for byte as it was; read commands leave no -wal/-shm behind (also on a WAL file where nothing may
be created beside it); `ledger export --output` never overwrites the ledger, a SQLite file, a directory or a
symlink's target; ids, limits and nesting beyond what a ledger holds are one line, not "damaged" or a traceback."""

import json
import os
import sqlite3
import sys

import pytest

from gemmlab.ledger import Entry, Ledger, LedgerError, check
from gemmlab.ledger.sqlfile import APPLICATION_ID

READS = [
    ["list"],
    ["show", "1"],
    ["compare", "1", "1"],
    ["history", "--shape", "8,8,8"],
    ["export"],
    ["export", "--format", "csv"],
]


def cli(argv, monkeypatch, capsys):
    """``gemmlab ARGV`` in-process, through the real entry point (its one-line usage errors): (status, out, err)."""
    from gemmlab.cli.root import main

    monkeypatch.setattr(sys, "argv", ["gemmlab", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    got = capsys.readouterr()
    return e.value.code, got.out, got.err


def one_line(status, err, *words):
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def entry(**kw) -> Entry:
    return Entry(
        **{
            "kind": "bench",
            "shape": "8x8x8",
            "dtype": "float16",
            "correct": True,
            "median_ms": 1.0,
            "gpu": "test-gpu",
            **kw,
        }
    )


def ledger(tmp_path, n: int = 1):
    path = tmp_path / "l.db"
    db = Ledger.open(path)
    for _ in range(n):
        db.record(entry(), provenance=False)
    db.close()
    return path


def listing(d):
    return sorted(p.name for p in d.iterdir())


def foreign(path, kind: str):
    """Another application's SQLite file, of several kinds."""
    conn = sqlite3.connect(path)
    if kind == "wal":
        conn.execute("PRAGMA journal_mode=WAL")
    if kind in ("entries", "wal"):  # a table of the same name as the ledger's, with the app's own rows
        conn.execute("CREATE TABLE entries (who TEXT, amount REAL)")
        conn.execute("INSERT INTO entries VALUES ('alice', 3.5)")
    elif kind == "tables":
        conn.execute("CREATE TABLE users (name TEXT)")
    elif kind == "user_version":
        conn.execute("PRAGMA user_version = 7")
    elif kind == "application_id":
        conn.execute("PRAGMA application_id = 1234")
        conn.execute("CREATE TABLE entries (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    return path


FOREIGN = ["entries", "wal", "tables", "user_version", "application_id"]
RECORDING = [
    ["grade", "--ledger"],
    ["grade", "--record", "x", "--ledger"],
    ["bench", "gemm", "--shapes", "8,8,8", "--record", "x", "--ledger"],
    ["tune", "--ledger"],
]


@pytest.mark.parametrize("kind", FOREIGN)
def test_the_api_refuses_another_applications_file(tmp_path, kind):
    path = foreign(tmp_path / "app.db", kind)
    before = path.read_bytes()
    for attempt in (lambda: check(path), lambda: Ledger(path), lambda: Ledger(path, read_only=True)):
        with pytest.raises(LedgerError, match="not a gemmlab ledger"):
            attempt()
    assert path.read_bytes() == before and listing(tmp_path) == ["app.db"]  # no table, version, WAL or -shm


@pytest.mark.parametrize("argv", RECORDING, ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("kind", ["entries", "wal"])
def test_recording_commands_refuse_another_applications_file(tmp_path, monkeypatch, capsys, argv, kind):
    path = foreign(tmp_path / "app.db", kind)
    before = path.read_bytes()
    status, out, err = cli([*argv, str(path)], monkeypatch, capsys)
    one_line(status, err, str(path), "not a gemmlab ledger")
    assert path.read_bytes() == before and listing(tmp_path) == ["app.db"]


def test_a_new_ledger_carries_gemmlabs_application_id(tmp_path):
    path = ledger(tmp_path)
    assert sqlite3.connect(path).execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


def test_a_ledger_from_before_the_application_id_is_known_by_its_tables(tmp_path):
    path = ledger(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 0")  # as every ledger was before gemmlab set it
    conn.commit()
    conn.close()
    assert len(Ledger(path, read_only=True).list()) == 1
    db = Ledger(path)
    db.record(entry(), provenance=False)
    db.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID  # marked ours on its next write
    assert conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 2


def test_an_empty_file_becomes_a_ledger(tmp_path):
    path = tmp_path / "l.db"
    path.write_bytes(b"")  # nothing in it to lose (SQLite itself creates a file this way)
    assert check(path) == path
    with pytest.raises(LedgerError, match="not a regular file"):
        check("/dev/null")


@pytest.mark.parametrize("argv", READS, ids=" ".join)
def test_read_commands_leave_nothing_behind(tmp_path, monkeypatch, capsys, argv):
    path = ledger(tmp_path)
    assert listing(tmp_path) == ["l.db"]  # a writer that closes leaves the file alone, in the rollback journal mode
    status, out, err = cli(["ledger", *argv, "--ledger", str(path)], monkeypatch, capsys)
    assert status == 0, err
    assert listing(tmp_path) == ["l.db"]


def wal_at_rest(tmp_path):
    """A ledger left in WAL mode by its last writer (as gemmlab left every ledger before, or a writer killed
    after its last commit), its -wal checkpointed away."""
    path = ledger(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    assert listing(tmp_path) == ["l.db"] and path.read_bytes()[18:20] == b"\x02\x02"
    return path


@pytest.mark.parametrize("argv", READS, ids=" ".join)
@pytest.mark.parametrize("at_rest", ["rollback", "wal"])
def test_a_ledger_is_read_where_nothing_can_be_created_beside_it(tmp_path, monkeypatch, capsys, argv, at_rest):
    """A read-only mount or directory: SQLite's ``mode=ro`` open of a WAL file must create -wal and -shm and
    there fails ("attempt to write a readonly database", measured as an unprivileged user); ``immutable=1``
    reads it. The directory is made read-only (which binds only an unprivileged run: root ignores it), and every
    open is seen: a file in the rollback mode is opened ``mode=ro`` (needs no file beside it), a WAL one with
    nothing pending ``immutable=1``."""
    from gemmlab.ledger import sqlfile

    path = wal_at_rest(tmp_path) if at_rest == "wal" else ledger(tmp_path)
    uris, real = [], sqlfile._sqlite_connect
    monkeypatch.setattr(sqlfile, "_sqlite_connect", lambda target, **kw: uris.append(target) or real(target, **kw))
    os.chmod(tmp_path, 0o555)
    try:
        status, out, err = cli(["ledger", *argv, "--ledger", str(path)], monkeypatch, capsys)
    finally:
        os.chmod(tmp_path, 0o755)
    assert status == 0, err
    assert listing(tmp_path) == ["l.db"]
    assert uris and all(u.endswith("?immutable=1" if at_rest == "wal" else "?mode=ro") for u in uris), uris


def test_a_wal_ledger_is_read_and_left_as_it_was(tmp_path):
    path = wal_at_rest(tmp_path)
    before = path.read_bytes()
    db = Ledger(path, read_only=True)
    assert [e.shape for e in db.list()] == ["8x8x8"]
    db.close()
    assert path.read_bytes() == before and listing(tmp_path) == ["l.db"]


def test_limits_and_ids_beyond_64_bits(tmp_path, monkeypatch, capsys):
    path = ledger(tmp_path, 2)
    db = Ledger(path, read_only=True)
    assert len(db.list(limit=2**70)) == 2 and db.get(10**23) is None and db.get(-(10**23)) is None
    with pytest.raises(ValueError, match="limit"):
        db.list(limit=-1)
    db.close()
    db = Ledger(path)
    with pytest.raises(KeyError, match="no ledger entry"):
        db.attach(10**23, "profile", {})
    db.close()
    status, out, err = cli(
        ["ledger", "list", "--limit", "99999999999999999999", "--ledger", str(path)], monkeypatch, capsys
    )
    one_line(status, err, "--limit", "99999999999999999999")
    assert "damaged" not in err
    status, out, err = cli(["ledger", "show", "99999999999999999999999", "--ledger", str(path)], monkeypatch, capsys)
    one_line(status, err, "no ledger entry 99999999999999999999999")


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--shape", "1x2"], ["--shape", "1x2"]),
        (["--shape", "8,8,x"], ["--shape"]),
        (["--shape", "8,8,8 zipf"], ["--shape"]),
        (["--kind", "nope"], ["--kind", "nope"]),
    ],
)
def test_list_filters_that_would_match_nothing_are_refused(tmp_path, monkeypatch, capsys, argv, words):
    path = ledger(tmp_path)
    status, out, err = cli(["ledger", "list", *argv, "--ledger", str(path)], monkeypatch, capsys)
    one_line(status, err, *words)


@pytest.mark.parametrize("shape", ["8,8,8", "8x8x8", "16,32,64,4,2", "16x32x64x4x2 zipf"])
def test_list_filters_take_every_shape_a_ledger_keys(tmp_path, monkeypatch, capsys, shape):
    path = tmp_path / "l.db"
    db = Ledger.open(path)
    db.record(entry(), provenance=False)
    db.record(entry(op="moe_grouped", shape="16x32x64x4x2"), provenance=False)
    db.record(entry(op="moe_grouped", shape="16x32x64x4x2 zipf"), provenance=False)
    db.close()
    status, out, err = cli(["ledger", "list", "--json", "--shape", shape, "--ledger", str(path)], monkeypatch, capsys)
    assert status == 0, err
    assert [e["shape"] for e in json.loads(out)["entries"]] == [shape.replace(",", "x")]


def test_export_output_never_destroys_data(tmp_path, monkeypatch, capsys):
    path = ledger(tmp_path)
    before = path.read_bytes()
    status, out, err = cli(["ledger", "export", "--ledger", str(path), "--output", str(path)], monkeypatch, capsys)
    one_line(status, err, "refusing")
    (tmp_path / "other").mkdir()
    other = ledger(tmp_path / "other")  # another ledger: a SQLite file
    other_bytes = other.read_bytes()
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    for out_path in (other, tmp_path / "dir", tmp_path / "link"):
        status, out, err = cli(
            ["ledger", "export", "--ledger", str(path), "--output", str(out_path)], monkeypatch, capsys
        )
        one_line(status, err, str(out_path), "refusing")
    assert path.read_bytes() == before and other.read_bytes() == other_bytes and not (tmp_path / "target").exists()
    status, out, err = cli(
        ["ledger", "export", "--ledger", str(path), "--output", str(tmp_path / "e.csv"), "--format", "csv"],
        monkeypatch,
        capsys,
    )
    assert status == 0, err
    assert (tmp_path / "e.csv").read_text().startswith("kind,shape")
    assert listing(tmp_path) == [".gemmlab-written.json", "dir", "e.csv", "l.db", "link", "other"]  # no temp file


def set_cell(path, column: str, text: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"UPDATE entries SET {column} = ? WHERE id = 1", (text,))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("depth", [100, 5000, 100_000])
@pytest.mark.parametrize("argv", [["list"], ["list", "--json"], ["show", "1"], ["export"]], ids=" ".join)
def test_a_cell_nested_too_deep_is_one_line(tmp_path, monkeypatch, capsys, depth, argv):
    path = ledger(tmp_path)
    set_cell(path, "report", "[" * depth + "]" * depth)
    status, out, err = cli(["ledger", *argv, "--ledger", str(path)], monkeypatch, capsys)
    one_line(status, err, "ledger entry 1", "column report", "nested deeper")
    assert out == ""


def test_a_foreign_entries_table_is_one_line_for_every_read(tmp_path, monkeypatch, capsys):
    path = foreign(tmp_path / "app.db", "entries")
    for argv in READS:
        status, out, err = cli(["ledger", *argv, "--ledger", str(path)], monkeypatch, capsys)
        one_line(status, err, "not a gemmlab ledger")
        assert "KeyError" not in err and "correct" not in err
