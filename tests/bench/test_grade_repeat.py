"""benchmarks/grade_repeat.py (issue 29's self-grade and seed-shape repeats on the H200): its arguments, its JSON
(the environment, one row per grade) and its summary, on the CPU with a tiny case file, through the entry point."""

import json
import subprocess
import sys

from tests.paths import BAD_KERNELS, CASES, REPO

HONEST = f"{BAD_KERNELS / 'kernels.py'}:honest"


def _repeat(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "grade-repeat", "--cases", str(CASES / "tiny.json"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bad_arguments_are_one_line():
    for args in (("--kernel", f"{HONEST}=0"), ("--kernel", f"{HONEST}=two"), ("--runs", "0"), ("--time-limit-s", "-1")):
        r = _repeat(*args, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_one_grade_writes_its_environment_and_a_summary(tmp_path):
    r = _repeat("--kernel", f"{HONEST}=1", "--quick-correctness", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads((tmp_path / "grade-repeat-tiny-0.json").read_text())
    assert d["env"]["torch"] and "git_sha" in d["env"] and d["quick_correctness"] and d["not_run"] == []
    assert len(d["rows"]) == 1 and d["rows"][0]["verdict"] in ("PASS", "INCONCLUSIVE")  # an honest kernel
    assert len(json.loads((tmp_path / "cases-tiny-quick.json").read_text())["correctness"]) == 1
    assert r.stdout.strip().splitlines()[-1].startswith(f"{HONEST}: ") and "of 1" in r.stdout
