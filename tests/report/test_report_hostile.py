"""Issue 34's second hostile round, the report's share: a FIFO or a device named *.json, given to
``gemmlab report`` as a file, was read without bound (a FIFO with no writer hung; /dev/zero filled memory). Now
each is listed as unreadable, with what it is, and the page is written."""

import os
import threading

import pytest
from typer.testing import CliRunner

from gemmlab import output
from gemmlab.cli import app
from gemmlab.report import collect


def collected(path):
    """``collect([path])`` in a thread: one that blocks on a FIFO is released by opening and closing the FIFO's
    writing end after 120 s (generous on a loaded machine), so the test fails instead of hanging."""
    found = []
    t = threading.Thread(target=lambda: found.extend(collect.collect([path])), daemon=True)
    t.start()
    t.join(120)
    blocked = t.is_alive()
    if blocked and path.name == "fifo.json":
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
    assert not blocked, f"collect blocked on {path}"
    return found


def test_a_fifo_or_a_device_named_json_is_listed_not_read(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    for name, what in (("fifo.json", "a FIFO"), ("zero.json", "a character device")):
        found = collected(tmp_path / name)
        assert [(f.kind, what in (f.error or "")) for f in found] == [("unreadable", True)], found
    out = tmp_path / "page.html"
    res = CliRunner().invoke(
        app, ["report", str(tmp_path / "fifo.json"), str(tmp_path / "zero.json"), "--output", str(out)]
    )
    assert res.exit_code == 0 and "2 unreadable" in res.stderr, res.output
    assert "fifo.json" in out.read_text()


def deep_file(path):
    path.write_text("[" * 100_000 + "]" * 100_000)
    return path


def test_profile_diff_and_docs_read_their_json_bounded(tmp_path, monkeypatch, capsys):
    """profile --diff and report --docs parsed a 100000-deep file (RecursionError traceback), and --docs took an
    index entry of the wrong type (AttributeError traceback): each is one line, exit 2."""
    from tests.cli.test_cli_bad_input import cli

    deep = deep_file(tmp_path / "deep.json")
    (tmp_path / "tree").mkdir()
    deep_file(tmp_path / "tree" / "index.json")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "index.json").write_text('{"about": "x", "results": [{"path": 5}], "pages": "nope"}')
    for argv, says in (
        (["profile", "--diff", deep, deep], "nested deeper than the 64 levels"),
        (["report", tmp_path / "tree", "--docs", tmp_path / "out"], "nested deeper than the 64"),
        (["report", tmp_path / "odd", "--docs", tmp_path / "out"], "an entry this gemmlab cannot read"),
    ):
        code, out, err = cli(argv, monkeypatch, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1 and says in lines[0], (argv, err)
    assert not (tmp_path / "out").exists()


def test_profile_diff_and_docs_readme_refuse_a_fifo(tmp_path):
    """A FIFO given to profile --diff, or as report --docs --readme, was opened and read: a hang with no writer.
    Through the entry point in a child, with a generous limit, so a regression fails instead of hanging."""
    import subprocess
    import sys
    from pathlib import Path

    os.mkfifo(tmp_path / "fifo")
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    for argv in (
        ["profile", "--diff", "fifo", "fifo"],
        ["report", str(results), "--docs", "out", "--check", "--readme", "fifo"],
    ):
        res = subprocess.run(
            [sys.executable, "-m", "gemmlab", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and "a FIFO, not a regular file" in lines[0], res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_a_write_that_cannot_be_made_names_the_file_asked_for():
    """ledger export --output /proc/x.json said "No such file or directory: '.x.json.8f3b...tmp'": the temporary
    name, not the path given."""
    with pytest.raises(OSError) as e:
        output.write_text("/proc/gemmlab-hostile-34.json", "{}")
    assert e.value.filename == "/proc/gemmlab-hostile-34.json" and ".tmp" not in str(e.value)
