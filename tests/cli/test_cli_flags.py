"""Bad flags are usage errors in every command: exit 2 with a message naming the flag, before any work.

Each row is (command, flag, bad value). The commands run in-process through typer's runner; a flag that slipped
past its check would start grading, benchmarking or tuning, which these tests would see as another exit code (and
as seconds of interpreter work)."""

import pytest
from typer.testing import CliRunner

from gemmlab.cli import app

COUNTS = [
    (["grade"], "--rounds"),
    (["bench", "gemm"], "--rounds"),
    (["bench", "gemm"], "--reps"),
    (["bench", "moe"], "--rounds"),
    (["bench", "moe"], "--reps"),
    (["bench", "stable"], "--processes"),
    (["bench", "stable"], "--rounds"),
    (["bench", "stable"], "--reps"),
    (["table"], "--repeat"),
    (["table"], "--num-experts"),
    # sizes: a zero or negative one would start full-size work (or end in a traceback)
    (["bench", "moe"], "--tokens"),
    (["bench", "moe"], "--liger-tune-tokens"),
    (["bench", "moe-ep"], "--tokens"),
    (["bench", "moe-ep"], "--chunks"),
    (["bench", "layer"], "--rounds"),
    (["bench", "layer"], "--reps"),
    (["bench", "model"], "--layers"),
    (["bench", "model"], "--context"),
    (["bench", "model"], "--decode-steps"),
    (["bench", "model"], "--train-batch"),
    (["bench", "model"], "--train-tokens"),
    (["bench", "model"], "--rounds"),
    (["table"], "--batch-size"),
    (["table"], "--seq-len"),
    (["table"], "--top-k"),
    (["table"], "--hidden-size"),
    (["table"], "--intermediate-size"),
    (["tune"], "--tokens"),
    (["ledger", "list"], "--limit"),
]
LISTS = [
    (["bench", "model"], "--prefill-tokens"),
    (["bench", "model"], "--decode-batch"),
    (["bench", "layer"], "--tokens"),
]  # comma-separated: one bad entry among good ones
LIMITS = [(["grade"], "--timeout"), (["bench", "gemm"], "--timeout"), (["tune"], "--budget-minutes")]
WARMUPS = [
    (["bench", "gemm"], "--warmup-s"),
    (["bench", "moe"], "--warmup-s"),
    (["bench", "stable"], "--warmup-s"),
    (["table"], "--warmup-s"),
    (["table"], "--warmup"),
    (["bench", "moe"], "--min-bwd-tokens"),
    (["bench", "layer"], "--warmup-s"),
]

ROWS = (
    [(cmd, flag, v) for cmd, flag in COUNTS for v in ("0", "-3")]
    + [(cmd, flag, v) for cmd, flag in LISTS for v in ("0", "8,-4", "8,x")]
    + [(cmd, flag, v) for cmd, flag in LIMITS for v in ("0", "-1", "nan", "inf")]
    + [(cmd, flag, v) for cmd, flag in WARMUPS for v in ("-1",)]
    + [(cmd, flag, "nan") for cmd, flag in WARMUPS if flag == "--warmup-s"]
)


def _run(*args):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("cmd,flag,value", ROWS, ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_bad_number_is_a_usage_error(cmd, flag, value):
    res = _run(*cmd, flag, value)
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert flag in res.output and value in res.output


@pytest.mark.parametrize(
    "args,words",
    [
        (["grade", "--signature", "fortran"], ["--signature", "fortran"]),
        (["grade", "--kernel", "my_kernel.py"], ["--kernel", ":FN"]),
        (["bench", "gemm", "--shapes", "8,8,8", "--backend", "my_kernel.py", "--warmup-s", "0"], ["my_kernel.py"]),
        (["bench", "gemm", "--shapes", "8,8", "--warmup-s", "0"], ["M,N,K"]),
        (["check", "--dtype", "float8"], ["--dtype"]),
        # a kernel that is not there: a usage error before any grading or timing (gemmlab.cli.kernelspec)
        (["grade", "--kernel", "/nonexist.py:f"], ["--kernel", "no file /nonexist.py"]),
        (["grade", "--kernel", "src/gemmlab/cli/paths.py:no_such_fn"], ["--kernel", "defines no 'no_such_fn'"]),
        (["grade", "--kernel", "no_such_pkg.mod:f"], ["--kernel", "no module no_such_pkg.mod"]),
        (["grade", "--kernel", "gemmlab.ops:no_such_fn"], ["--kernel", "defines no 'no_such_fn'"]),
        (["bench", "gemm", "--backend", "/nonexist.py:f"], ["--backend", "no file /nonexist.py"]),
        (["bench", "stable", "--backend", "gemmlab.ops:no_such_fn"], ["--backend", "defines no 'no_such_fn'"]),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) and x and x[0] in ("grade", "bench", "check") else None,
)
def test_bad_spec_is_a_usage_error(args, words):
    res = _run(*args)
    assert res.exit_code == 2, (res.exit_code, res.output)
    for w in words:
        assert w in res.output, (w, res.output)


def test_an_existing_kernel_passes_the_spec_check(tmp_path):
    """Defined at the top level (a def, an assignment, an import), in a file or a module: no complaint; a file
    whose names cannot be told without running it is left to the loader."""
    from gemmlab.cli.kernelspec import problem

    kern = tmp_path / "k.py"
    kern.write_text("import torch\nfrom torch import matmul as mm\ndef gemm(a, b):\n    return a @ b\nalias = gemm\n")
    for fn in ("gemm", "alias", "mm", "torch"):
        assert problem(f"{kern}:{fn}") is None, fn
    assert "defines no 'other'" in problem(f"{kern}:other")
    assert problem("gemmlab:gemm") is None and problem("builtin:cublas") is None
    (tmp_path / "star.py").write_text("from torch import *\n")
    assert problem(f"{tmp_path / 'star.py'}:anything") is None


def test_good_values_pass_the_checks():
    """The callbacks let valid values through (here a zero warm-up, which is allowed)."""
    from gemmlab.cli.common import count, nonneg_count, nonneg_seconds, seconds

    assert count(1) == 1 and count(None) is None
    assert nonneg_count(0) == 0 and nonneg_seconds(0.0) == 0.0 and seconds(0.5) == 0.5


@pytest.mark.parametrize(
    "args",
    [
        ("bench", "gemm", "--rounds", "0"),
        ("table", "--num-experts", "0"),
        ("tune", "--budget-minutes", "nan"),
        ("grade", "--no-such-flag"),
    ],
    ids=" ".join,
)
def test_the_command_prints_one_line(args):
    """What a user sees from `gemmlab`: one line on stderr naming the command and the flag, exit status 2."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "gemmlab", *args], capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    assert args[0] in lines[0] and args[-2 if len(args) > 2 else -1] in lines[0]
