"""``gemmlab report``'s files: a file whose name is not UTF-8 is named with escapes and the page is still written;
``--output`` never overwrites one of the report's inputs (or its ledger), never writes through a symlink or into a
directory, and leaves no temporary file; a ledger given with --ledger is read, leaving no -wal/-shm."""

import os

import pytest

from gemmlab.ledger import Entry, Ledger
from gemmlab.output import MANIFEST, write_text
from gemmlab.report import collect
from tests.cli.test_cli_bad_input import cli  # gemmlab ARGV in-process: (status, out, err)

NOT_UTF8 = b"r\xffport.json"  # 0xff never occurs in UTF-8


@pytest.fixture
def results(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.json").write_text('{"kind": "check", "results": []}')
    with open(os.path.join(os.fsencode(d), NOT_UTF8), "w") as f:
        f.write("{}")
    return d


def test_a_name_that_is_not_utf8_is_named_with_escapes(results, tmp_path, monkeypatch, capsys):
    names = [f.path for f in collect.collect([results])]
    assert any(n.endswith("r\\xffport.json") for n in names), names
    for n in names:
        n.encode("utf-8")  # every name can be written into the page
    status, out, err = cli(["report", results, "--output", tmp_path / "page.html"], monkeypatch, capsys)
    assert status == 0, err
    assert "r\\xffport.json" in (tmp_path / "page.html").read_text(encoding="utf-8")


def test_output_never_overwrites_an_input(results, tmp_path, monkeypatch, capsys):
    before = (results / "a.json").read_bytes()
    for target in (results / "a.json", results):
        status, out, err = cli(["report", results, "--output", target], monkeypatch, capsys)
        assert status == 2 and len(err.strip().splitlines()) == 1 and "refusing" in err, err
    assert (results / "a.json").read_bytes() == before
    status, out, err = cli(["report", results / "a.json", "--output", results / "a.json"], monkeypatch, capsys)
    assert status == 2 and "refusing" in err, err
    assert (results / "a.json").read_bytes() == before


def test_output_never_goes_through_a_symlink(results, tmp_path, monkeypatch, capsys):
    (tmp_path / "link.html").symlink_to(tmp_path / "elsewhere.html")
    status, out, err = cli(["report", results, "--output", tmp_path / "link.html"], monkeypatch, capsys)
    assert status == 2 and "symlink" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "elsewhere.html").exists()


def test_the_ledger_given_is_neither_overwritten_nor_left_with_wal_files(results, tmp_path, monkeypatch, capsys):
    path = tmp_path / "l.db"
    db = Ledger.open(path)
    db.record(Entry(kind="bench", shape="8x8x8", dtype="float16", correct=True, median_ms=1.0), provenance=False)
    db.close()
    before = path.read_bytes()
    status, out, err = cli(["report", results, "--ledger", path, "--output", path], monkeypatch, capsys)
    assert status == 2 and "refusing" in err, err
    status, out, err = cli(["report", results, "--ledger", path, "--output", tmp_path / "p.html"], monkeypatch, capsys)
    assert status == 0, err
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "in", "l.db", "p.html"]  # no -wal, -shm, temp


def test_write_text_refuses_a_sqlite_file_and_replaces_its_own(tmp_path):
    db = tmp_path / "l.db"
    Ledger.open(db).close()
    with pytest.raises(OSError, match="SQLite"):
        write_text(db, "x")
    write_text(tmp_path / "t.txt", "old")
    write_text(tmp_path / "t.txt", "new")  # gemmlab wrote it: replaced (a user's file is not: test_output_owner.py)
    assert (tmp_path / "t.txt").read_text() == "new"
