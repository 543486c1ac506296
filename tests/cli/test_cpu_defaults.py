"""Without CUDA, `gemmlab table` and `gemmlab bench moe` with no options run a small suite the interpreter
finishes in seconds (and say so); options given are still honoured as given."""

import resource
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from gemmlab.cli import app
from tests.cli.test_cli import ENV

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU defaults: a machine without CUDA")


@pytest.mark.parametrize(
    "argv,says", [(["table"], "M=32 N=48 K=64"), (["bench", "moe"], "custom T=32 uniform")], ids=" ".join
)
def test_the_default_run_is_small(argv, says):
    """Small is counted in the child's CPU seconds, not wall time, which a busy machine stretches at will."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run(
        [sys.executable, "-m", "gemmlab", *argv], capture_output=True, text=True, env=ENV, timeout=1200
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert res.returncode == 0, res.stderr[-2000:]
    assert "no CUDA: the small CPU" in res.stderr and says in res.stdout + res.stderr
    assert cpu < 60, f"{argv}: {cpu:.0f} CPU s"  # measured 10-17 CPU s, the import included; full sizes: hours


def captured(monkeypatch, module: str, fn: str, argv: list[str]) -> dict:
    """The arguments the command hands the suite (the suite itself is not run)."""
    import importlib

    seen = {}

    def fake(*args, **kw):
        seen.update(args=args, kw=kw)
        raise ValueError("captured")

    monkeypatch.setattr(importlib.import_module(module), fn, fake)
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2 and "captured" in res.output, res.output
    return seen


def test_bench_moe_honours_what_is_given(monkeypatch):
    seen = captured(monkeypatch, "gemmlab.bench.moe", "bench_moe", ["bench", "moe", "--model", "deepseek-v3"])
    assert seen["args"][0] == ["deepseek-v3"] and seen["args"][1] == [16, 128, 1024, 4096, 16384]
    seen = captured(
        monkeypatch,
        "gemmlab.bench.moe",
        "bench_moe",
        ["bench", "moe", "--tokens", "5", "--rounds", "7", "--reps", "4", "--warmup-s", "0.5"],
    )
    assert seen["args"][0] == ["deepseek-v3"] and seen["args"][1] == [5]
    assert (seen["kw"]["rounds"], seen["kw"]["reps"], seen["kw"]["warmup_s"]) == (7, 4, 0.5)
    seen = captured(monkeypatch, "gemmlab.bench.moe", "bench_moe", ["bench", "moe"])
    assert seen["args"][0] == ["custom"] and seen["args"][1] == [8, 32] and seen["kw"]["custom"].hidden == 64


def test_table_honours_what_is_given(monkeypatch):
    seen = captured(monkeypatch, "gemmlab.bench.table", "moe_table", ["table", "--model", "deepseek-v3"])
    assert seen["args"][2:] == (8, 7168, 2048) and seen["kw"]["num_experts"] == 256  # the model's dims
    assert seen["args"][:2] == (1, 16)  # batch and sequence: still the CPU's
    seen = captured(monkeypatch, "gemmlab.bench.table", "moe_table", ["table", "--seq-len", "8192", "--repeat", "9"])
    assert seen["args"][:3] == (1, 8192, 2) and seen["kw"]["repeat"] == 9
