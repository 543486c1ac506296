"""Every command's --help at 80 columns: no line wider than 80 characters (counted as characters, not bytes),
and every command has a one-line summary (the first paragraph of its help, shown in its group's list)."""

import inspect

import click
import pytest
import typer
from typer.testing import CliRunner

from gemmlab.cli import app


def commands(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, cmd)]
    for name, sub in getattr(cmd, "commands", {}).items():
        found += commands(sub, (*path, name))
    return found


ROOT = typer.main.get_command(app)
ALL = commands(ROOT)


def test_every_command_is_found():
    names = {" ".join(p) for p, _ in ALL}
    assert {"", "grade", "table", "bench moe", "bench gemm", "ledger compare", "profile"} <= names, names


@pytest.mark.parametrize("path,cmd", ALL, ids=[" ".join(p) or "gemmlab" for p, _ in ALL])
def test_help_fits_80_columns(path, cmd):
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert res.exit_code == 0, res.output
    wide = [line for line in res.stdout.splitlines() if len(line) > 80]
    assert not wide, "\n".join(wide)
    summary = inspect.cleandoc(cmd.help or "").split("\n\n")[0]
    assert summary and "\n" not in summary, f"{' '.join(path)}: summary is not one line: {summary!r}"
    assert len(summary) <= 100, f"{' '.join(path)}: summary {len(summary)} characters: {summary!r}"


def flat(text: str) -> str:
    return "".join(text.split())


def test_no_help_text_is_cut_or_lost():
    """At 80 columns every command's summary shows whole in its group's list (no "..."), and every option's
    help text shows whole in its command's help (nothing eaten as markup, nothing cut): compared with the
    whitespace taken out, since the lines are wrapped."""
    for path, cmd in ALL:
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).stdout
        cut = [line for line in out.splitlines()[1:] if line.rstrip().endswith("...")]  # click's cut summaries
        assert not cut, (path, cut)
        for name, sub in getattr(cmd, "commands", {}).items():
            summary = inspect.cleandoc(sub.help or "").split("\n\n")[0]
            assert flat(summary) in flat(out), (path, name, summary)
        for param in cmd.params:
            if getattr(param, "help", None):
                assert flat(param.help) in flat(out), (path, param.name, param.help)
