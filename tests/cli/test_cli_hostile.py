"""Issue 34's second hostile round, the CLI's share: an inspect shape too large to address (a traceback from the
compiling child), and an inductor search space no one checked unless the inductor backend ran. Each is exit 2 and
one line from the real entry point, before any work."""

import pytest

from tests.cli.test_cli_bad_input import cli


@pytest.mark.parametrize(
    "argv,says",
    [
        (["inspect", "--shape", "99999999999,99999999999,9999999999"], "cannot be addressed"),
        (["inspect", "--shape", "4294967296,4294967296,1"], "cannot be addressed"),
        (["bench", "gemm", "--shapes", "4,4,4", "--inductor-search-space", "NOPE"], "DEFAULT or EXHAUSTIVE"),
    ],
    ids=["inspect-huge", "inspect-2^32-squared", "inductor-search-space"],
)
def test_bad_values_are_one_line(argv, says, monkeypatch, capsys):
    code, out, err = cli(argv, monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and says in lines[0], err


def test_tune_refuses_what_it_would_ignore_or_fail_on_at_the_end(tmp_path, monkeypatch, capsys):
    """tune took --moe with --op gemm and --session beside another --resume in silence, and found a --configs-dir
    that is a file, or a table there it cannot read, only when writing its winners after the whole search."""
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "interpreter.json").write_text("{not json")  # the CPU's table (device.target_for)
    before = (tmp_path / "cfg" / "interpreter.json").read_text()
    ledger = tmp_path / "l.db"
    base = ["tune", "--shapes", "16,16,16", "--budget-minutes", "0.01", "--ledger", ledger]
    for extra, says in (
        (["--op", "gemm", "--moe", "64,32,4,2"], "--moe: for --op moe only"),
        (["--session", "a", "--resume", "b"], "--resume names the session"),
        (["--configs-dir", tmp_path / "file"], "exists and is not a directory"),
        (["--configs-dir", tmp_path / "cfg"], "cannot be read as JSON"),
    ):
        code, out, err = cli([*base, *extra], monkeypatch, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1 and says in lines[0], (extra, err)
    assert not ledger.exists() and (tmp_path / "cfg" / "interpreter.json").read_text() == before


@pytest.mark.parametrize("argv", [[], ["bench"], ["ledger"]], ids=["gemmlab", "bench", "ledger"])
def test_a_group_without_a_command_prints_its_help_readably(argv, monkeypatch, capsys):
    """`gemmlab` alone printed its help squeezed into one line of about 900 characters (click's "no arguments:
    help" error went through the one-line usage-error path); now the help as --help lays it out (exit 2, click's
    status for it)."""
    code, out, err = cli(argv, monkeypatch, capsys)
    lines = err.splitlines()
    assert code == 2 and out == "" and lines[0].startswith("Usage:") and "Commands:" in lines, err
    assert max(map(len, lines)) <= 200, err


def test_probe_reads_its_profile_and_roofline_files_bounded(tmp_path, monkeypatch, capsys):
    """probe --profile/--roofline parsed a 100000-deep file (RecursionError), read a FIFO (a hang) and fed a JSON
    list to the roofline (TypeError): each a traceback or worse; now one line, exit 2."""
    import json
    import os

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "list.json").write_text("[]")
    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps({"sm_count": 1, "hbm_copy": {}, "mma_peak": {}}))
    for argv, says in (
        (["--profile", deep, "--roofline", deep], "nested deeper than the 64 levels"),
        (["--profile", tmp_path / "fifo", "--roofline", deep], "a FIFO, not a regular file"),
        (["--profile", tmp_path / "list.json", "--roofline", deep], "a JSON list, not a device"),
        (["--profile", prof, "--roofline", deep], "nested deeper than the 64 levels"),
        (["--profile", prof, "--roofline", tmp_path / "list.json"], "TypeError"),
    ):
        code, out, err = cli(["probe", *argv, "--plot", tmp_path / "r.png"], monkeypatch, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1 and says in lines[0], (argv, err)
    assert not (tmp_path / "r.png").exists()
