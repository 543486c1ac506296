"""Issue 34's second hostile round, the report's share: a FIFO or a device named *.json, given to
``gemmlab report`` as a file, was read without bound (a FIFO with no writer hung; /dev/zero filled memory). Now
each is listed as unreadable, with what it is, and the page is written."""

import os
import threading

from typer.testing import CliRunner

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
    res = CliRunner().invoke(app, ["report", str(tmp_path / "fifo.json"), str(tmp_path / "zero.json"),
                                   "--output", str(out)])
    assert res.exit_code == 0 and "2 unreadable" in res.stderr, res.output
    assert "fifo.json" in out.read_text()
