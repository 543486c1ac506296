"""Issue 34's second hostile round, the CLI's share: an inspect shape too large to address (a traceback from the
compiling child), and an inductor search space no one checked unless the inductor backend ran. Each is exit 2 and
one line from the real entry point, before any work."""

import pytest

from tests.cli.test_cli_bad_input import cli


@pytest.mark.parametrize("argv,says", [
    (["inspect", "--shape", "99999999999,99999999999,9999999999"], "cannot be addressed"),
    (["inspect", "--shape", "4294967296,4294967296,1"], "cannot be addressed"),
    (["bench", "gemm", "--shapes", "4,4,4", "--inductor-search-space", "NOPE"], "DEFAULT or EXHAUSTIVE"),
], ids=["inspect-huge", "inspect-2^32-squared", "inductor-search-space"])
def test_bad_values_are_one_line(argv, says, monkeypatch, capsys):
    code, out, err = cli(argv, monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and says in lines[0], err
