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


@pytest.mark.parametrize("argv,says", [(["table"], "M=32 N=48 K=64"), (["bench", "moe"], "custom T=32 uniform")],
                         ids=" ".join)
def test_the_default_run_is_small(argv, says):
    """Small is counted in the child's CPU seconds, not wall time, which a busy machine stretches at will."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-m", "gemmlab", *argv], capture_output=True, text=True, env=ENV,
                         timeout=1200)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert res.returncode == 0, res.stderr[-2000:]
    assert "no CUDA: the small CPU" in res.stderr and says in res.stdout + res.stderr
    assert cpu < 60, f"{argv}: {cpu:.0f} CPU s"  # measured 10-17 CPU s, the import included; full sizes: hours


def test_a_cpu_grade_says_why_its_score_is_the_correctness_points():
    """The CPU grade's verdict line: no timed case, and why, so 30/100 with PASS is no surprise."""
    from gemmlab.grade import view

    report = {"score": {"total": 30.0, "max": 100.0, "correctness": 30.0, "performance": 0.0}, "performance": None,
              "performance_shape": None, "device": "cpu", "verdict": "PASS"}
    line = view.summary_line(report)
    assert line.startswith("official score 30.0/100") and line.endswith("verdict PASS")
    assert "not graded (no timed case: in Triton's CPU interpreter a kernel's time means nothing), so the score is " \
        "the correctness points alone" in line
    gpu = view.summary_line({**report, "device": "cuda"})
    assert "(the case file has no performance case), so the score is the correctness points alone" in gpu


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
    seen = captured(monkeypatch, "gemmlab.bench.moe", "bench_moe", ["bench", "moe", "--tokens", "5", "--rounds",
                                                                    "7", "--reps", "4", "--warmup-s", "0.5"])
    assert seen["args"][0] == ["deepseek-v3"] and seen["args"][1] == [5]
    assert (seen["kw"]["rounds"], seen["kw"]["reps"], seen["kw"]["warmup_s"]) == (7, 4, 0.5)
    seen = captured(monkeypatch, "gemmlab.bench.moe", "bench_moe", ["bench", "moe"])
    assert seen["args"][0] == ["custom"] and seen["args"][1] == [8, 32] and seen["kw"]["custom"].hidden == 64


def test_table_honours_what_is_given(monkeypatch):
    seen = captured(monkeypatch, "gemmlab.bench.table", "moe_table", ["table", "--model", "deepseek-v3"])
    assert seen["args"][2:] == (8, 7168, 2048) and seen["kw"]["num_experts"] == 256  # the model's dims
    assert seen["args"][:2] == (1, 16)  # batch and sequence: still the CPU's
    seen = captured(monkeypatch, "gemmlab.bench.table", "moe_table", ["table", "--seq-len", "8192", "--repeat",
                                                                      "9"])
    assert seen["args"][:3] == (1, 8192, 2) and seen["kw"]["repeat"] == 9


def test_the_shipped_cpu_case_files_time_nothing():
    """The CPU case files are correctness only (a ratio there would time the interpreter): the MoE one used to carry
    a performance case, so a plain `gemmlab grade --cases moe-layer-cpu` ended INCONCLUSIVE, exit 3."""
    from gemmlab.grade import load_any

    for name in ("cpu", "moe-layer-cpu", "fp8-cpu", "fp8-moe-cpu"):
        cf = load_any(name)
        assert cf.performance is None and cf.correctness, name


def test_an_inconclusive_grade_does_not_say_a_rule_failed():
    """Exit 3 means every rule passed and the timing could not score: the note under the tables says so, and the
    "a rule beyond them failed" note stays for a FAIL."""
    from gemmlab.grade import view

    base = {"cases_name": "c", "layout": "rowmajor", "dtype": "bfloat16", "kernel": "k", "env": {}, "device": "cpu",
            "correctness": [{"name": "t1", "shape": [1, 2, 3], "status": "PASS", "max_abs_err": 0.0,
                             "tolerance": 1.0, "paths": [], "kernels": [], "rule": None, "reason": ""}],
            "performance": None, "performance_shape": None, "listed_correctness_passed": True,
            "score": {"total": 30.0, "max": 100.0, "correctness": 30.0, "performance": 0.0}}

    def notes(verdict):
        return " ".join(str(n) for t in view.tables({**base, "verdict": verdict}) for n in t.notes)

    assert "timing could not be scored" in notes("INCONCLUSIVE") and "rule beyond them failed" not in \
        notes("INCONCLUSIVE")
    assert "rule beyond them failed" in notes("FAIL") and "timing could not be scored" not in notes("FAIL")
    assert "rule beyond them failed" not in notes("PASS")
