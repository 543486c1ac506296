"""The grader's rules, each shown firing on a known-bad kernel (tests/bad_kernels/kernels.py), and
gemmlab's own kernel passing. Without CUDA this runs cpu.json-sized cases through the interpreter."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gemmlab.grade import cases, grade
from gemmlab.grade.grader import CaseResult, Grader, Worker, coverage_problem, timing_problem

HERE = Path(__file__).resolve().parent
BAD = str(HERE / "bad_kernels" / "kernels.py")
LEGACY = str(HERE / "cases" / "cpu-legacy.json")
CPU = "cpu"  # the shipped small case file; on a GPU machine it is small there too


def run(fn, cases_file=CPU, **kw):
    return grade(cases_file, kernel=f"{BAD}:{fn}", **kw)


def failed_rules(report):
    return {f["rule"] for f in report["failures"]}


def test_gemmlab_kernel_passes():
    r = grade(CPU)
    assert r["verdict"] == "PASS", r["failures"]
    assert r["score"]["correctness"] == 30
    paths = {p for c in r["correctness"] for p in c["paths"]}
    assert paths == {"tma_persistent", "tma_splitk", "portable"}  # every dispatch path verified
    perf = r["performance"]
    assert perf["status"] == "PASS" and perf["samples_checked"] >= 1 and perf["timed_path"] == "tma_splitk"
    assert 0 < perf["ratio"] and "honest" in perf


def test_gemmlab_kernel_has_no_false_failure_on_20_seeds():
    cf = cases.load(CPU)
    worker = Worker(None, "colmajor", cf.layout, 60.0, not torch.cuda.is_available())
    try:
        for seed in range(20):
            g = Grader(cf, seed=seed, worker=worker)
            for shape in cf.correctness:
                res = g.check(shape)
                assert res.status == "PASS", (seed, res)
        assert worker.starts == 1
    finally:
        worker.close()


def test_rowmajor_signature_on_a_colmajor_case():
    assert run("good_rowmajor", signature="rowmajor")["verdict"] == "PASS"


def test_exact_shape_rule_closes_the_competition_blind_spot():
    """Wrong only at the perf size: the legacy cases all pass (the original grader's 100/100), but the
    perf shape is verified before it is timed; the full case file fails it as a correctness case."""
    legacy = run("wrong_at_perf_shape", LEGACY)
    assert legacy["listed_correctness_passed"] and legacy["verdict"] == "FAIL"
    assert failed_rules(legacy) == {"exact-shape"}
    assert legacy["performance"]["status"] == "FAIL" and "median_ms" not in legacy["performance"]
    full = run("wrong_at_perf_shape")
    assert full["verdict"] == "FAIL" and not full["listed_correctness_passed"]
    assert [c["name"] for c in full["correctness"] if c["status"] == "FAIL"] == ["perf_shape"]
    good = grade(LEGACY)
    assert good["verdict"] == "PASS" and good["performance"]["exact_shape_check"]["status"] == "PASS"


@pytest.mark.parametrize("fn,rule,words", [
    ("quarter_tiles", "poison-freshness", "NaN"),
    ("caches_first", "poison-freshness", "stale"),
    ("mutates_input", "poison-freshness", "modified an input"),
    ("nan_some", "poison-freshness", "NaN"),
    ("wrong_dtype", "output", "dtype"),
    ("raises", "isolation", "always fails"),
    ("crashes", "isolation", "died"),
])
def test_bad_kernel_fails_by_its_rule(fn, rule, words):
    sig = "rowmajor" if fn == "wrong_dtype" else None
    r = run(fn, signature=sig)
    assert r["verdict"] == "FAIL"
    first = r["failures"][0]
    assert first["rule"] == rule and words in first["reason"], r["failures"]
    assert r["performance"] is None  # a failed correctness case stops grading before performance


def test_results_replayed_during_timing_are_caught():
    """Honest during verification, then lazy while being timed: the outputs sampled from the timed calls
    (after their inputs changed in place and C was poisoned) are wrong. A kernel caching by address is
    caught in verification when addresses repeat, else the same way."""
    r = run("lazy_after_warmup")
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL"
    assert failed_rules(r) == {"exact-shape"} and "while timing" in r["failures"][0]["reason"]
    r = run("caches_by_pointer")
    assert r["verdict"] == "FAIL" and failed_rules(r) <= {"exact-shape", "poison-freshness", "correctness"}


def test_vendor_blas_is_refused_unless_allowed():
    r = run("uses_torch_mm", signature="rowmajor")
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"no-vendor-blas"}
    assert "aten::mm" in r["failures"][0]["reason"] or "cublas" in r["failures"][0]["reason"].lower()
    assert run("uses_torch_mm", signature="rowmajor", allow_vendor=True)["verdict"] == "PASS"


def test_time_limit_kills_and_grading_goes_on():
    r = run("sleeps", timeout=3)
    assert r["verdict"] == "FAIL"
    assert all(c["status"] == "FAIL" and "time limit" in c["reason"] for c in r["correctness"])
    assert len(r["correctness"]) == 4 and r["worker_starts"] >= 4  # every case tried, each in a new process


def test_timing_rule():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert timing_problem(3.0, 3.1, 700.0, gpu, peak=989.4) is None
    assert "impossible" in timing_problem(1.0, 1.1, 1500.0, gpu, peak=989.4)
    assert "outside the timed stream" in timing_problem(0.01, 3.4, 10.0, gpu, peak=989.4)
    assert "exceeds the host time" in timing_problem(3.0, 1.0, 10.0, gpu, peak=989.4)
    assert timing_problem(5.0, 5.0, 0.001, cpu) is None


def test_coverage_rule():
    ok = CaseResult("a", (1, 1, 1), paths=["tma_splitk"], kernels=["_gemm_tma_splitk_kernel"])
    failed = CaseResult("b", (2, 2, 2), status="FAIL", paths=["portable"], kernels=["_gemm_portable_kernel"])
    assert coverage_problem("tma_splitk", {"_gemm_tma_splitk_kernel"}, [ok, failed]) is None
    assert "never verified" in coverage_problem("portable", set(), [ok, failed])  # only a failed case ran it
    assert "sneaky" in coverage_problem(None, {"_gemm_tma_splitk_kernel", "sneaky_fast_kernel"}, [ok])


def test_fixed_baseline_and_module_kernel(tmp_path):
    d = json.loads(cases.resolve("cpu").read_text())
    d["performance"]["baseline_gflops"] = 1e-6  # a fixed baseline far below anything: full marks
    f = tmp_path / "fixed.json"
    f.write_text(json.dumps(d))
    r = grade(str(f), kernel="bad_kernels.kernels:good")  # package.module:FN form
    assert r["verdict"] == "PASS" and r["performance"]["baseline"].startswith("fixed")
    assert r["score"]["performance"] == 70 and "honest" not in r["performance"]


def test_case_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"dtype": "float16", "layout": "diagonal", "inputs": "competition",
                               "correctness": [{"M": 1, "N": 1, "K": 1}]}))
    for src, match in ((str(bad), "layout"), ("no-such-cases", "no case file")):
        with pytest.raises(cases.CaseError, match=match):
            cases.load(src)
    for name in ("competition", "competition-legacy", "moe", "llm", "cpu"):
        cf = cases.load(name)
        assert cf.performance is not None and cf.correctness
    full, legacy = cases.load("competition"), cases.load("competition-legacy")
    assert full.performance.mnk in {c.mnk for c in full.correctness}
    assert legacy.performance.mnk not in {c.mnk for c in legacy.correctness}


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "gemmlab", "grade", *args], capture_output=True, text=True,
                          env=env, timeout=900)


def test_cli_exit_codes_and_outputs(tmp_path):
    ok = _cli("--cases", "cpu", "--output-dir", str(tmp_path), "--json")
    assert ok.returncode == 0, ok.stderr[-2000:]
    report = json.loads(ok.stdout)
    assert report["verdict"] == "PASS"
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "PASS"
    assert "official score" in (tmp_path / "report.md").read_text()
    bad = _cli("--cases", "cpu", "--kernel", f"{BAD}:nan_some")
    assert bad.returncode == 1 and "FAIL" in bad.stdout
    usage = _cli("--cases", "no-such-file")
    assert usage.returncode == 2
