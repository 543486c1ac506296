"""What a newcomer meets first on a machine without CUDA: the CPU grade's words (why the score is 30, what exit 3
means), the shipped CPU case files, and `ledger list` before anything was recorded."""

import json
import os

from typer.testing import CliRunner

from gemmlab.cli import app


def test_a_cpu_grade_says_why_its_score_is_the_correctness_points():
    """The CPU grade's verdict line: no timed case, and why, so 30/100 with PASS is no surprise."""
    from gemmlab.grade import view

    report = {
        "score": {"total": 30.0, "max": 100.0, "correctness": 30.0, "performance": 0.0},
        "performance": None,
        "performance_shape": None,
        "device": "cpu",
        "verdict": "PASS",
    }
    line = view.summary_line(report)
    assert line.startswith("official score 30.0/100") and line.endswith("verdict PASS")
    assert (
        "not graded (no timed case: in Triton's CPU interpreter a kernel's time means nothing), so the score is "
        "the correctness points alone" in line
    )
    gpu = view.summary_line({**report, "device": "cuda"})
    assert "(the case file has no performance case), so the score is the correctness points alone" in gpu


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

    base = {
        "cases_name": "c",
        "layout": "rowmajor",
        "dtype": "bfloat16",
        "kernel": "k",
        "env": {},
        "device": "cpu",
        "correctness": [
            {
                "name": "t1",
                "shape": [1, 2, 3],
                "status": "PASS",
                "max_abs_err": 0.0,
                "tolerance": 1.0,
                "paths": [],
                "kernels": [],
                "rule": None,
                "reason": "",
            }
        ],
        "performance": None,
        "performance_shape": None,
        "listed_correctness_passed": True,
        "score": {"total": 30.0, "max": 100.0, "correctness": 30.0, "performance": 0.0},
    }

    def notes(verdict):
        return " ".join(str(n) for t in view.tables({**base, "verdict": verdict}) for n in t.notes)

    assert "timing could not be scored" in notes("INCONCLUSIVE") and "rule beyond them failed" not in notes(
        "INCONCLUSIVE"
    )
    assert "rule beyond them failed" in notes("FAIL") and "timing could not be scored" not in notes("FAIL")
    assert "rule beyond them failed" not in notes("PASS")


def test_ledger_list_on_a_fresh_machine_is_no_error(tmp_path, monkeypatch):
    """No ledger yet (a new user's first `ledger list`): exit 0 and one line naming where it will be; --json an
    empty list; nothing created. A path that is there but no ledger is still one line and exit 2."""
    monkeypatch.setenv("GEMMLAB_LEDGER", str(tmp_path / "none" / "ledger.db"))
    res = CliRunner().invoke(app, ["ledger", "list"])
    assert res.exit_code == 0 and res.stdout.strip() == (
        f"no ledger yet at {tmp_path / 'none' / 'ledger.db'} (grade --record, bench gemm --record, table --record "
        "and tune write one)"
    ), res.output
    res = CliRunner().invoke(app, ["ledger", "list", "--json", "--ledger", str(tmp_path / "l.db")])
    assert res.exit_code == 0 and json.loads(res.stdout) == {"ledger": str(tmp_path / "l.db"), "entries": []}
    assert os.listdir(tmp_path) == []
    (tmp_path / "notes.txt").write_text("not a ledger")
    res = CliRunner().invoke(app, ["ledger", "list", "--ledger", str(tmp_path / "notes.txt")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
