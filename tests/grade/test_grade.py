"""The grader's rules and its defences, each shown on a known-bad kernel (tests/bad_kernels/kernels.py),
and gemmlab's own kernel passing. Without CUDA this runs small case files through the CPU interpreter;
most exploits are graded on tests/cases/tiny.json with fast torch-op kernels."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gemmlab.grade import cases, grade, make_op, rules
from gemmlab.grade.grader import Grader
from gemmlab.sandbox.box import Sandbox
from tests.child import no_interpreter_env
from tests.paths import BAD_KERNELS, CASES

BAD = str(BAD_KERNELS / "kernels.py")
TINY = str(CASES / "tiny.json")
TINY_LEGACY = str(CASES / "tiny-legacy.json")
CPU = str(CASES / "cpu-timed.json")  # the shipped cpu.json with a timed case (its shapes small on a GPU too)


def run(fn, cases_file=TINY, **kw):
    return grade(cases_file, kernel=f"{BAD}:{fn}", **kw)


def failed_rules(report):
    return {f["rule"] for f in report["failures"]}


def passed(report) -> bool:
    """Every rule passed: PASS, or INCONCLUSIVE where the timing could not score (the CPU, mostly: a busy
    scheduler, and a protocol cost above 5% of a tiny call)."""
    return report["verdict"] in ("PASS", "INCONCLUSIVE") and not report["failures"]


def test_gemmlab_kernel_passes():
    r = grade(CPU, rounds=6)
    assert passed(r), r["failures"]
    assert r["score"]["correctness"] == 30 and r["worker_starts"] == 1
    paths = {p for c in r["correctness"] for p in c["paths"]}
    assert paths == {"tma_persistent", "tma_splitk", "portable"}  # every dispatch path verified
    perf = r["performance"]
    assert perf["status"] in ("PASS", "INCONCLUSIVE") and perf["timed_path"] == "tma_splitk"
    assert perf["rounds"] == 6 and perf["rounds_full_mantissa"] == 2  # one pair in three: full-mantissa inputs
    assert perf["samples_checked"] == perf["calls_per_batch"] * perf["rounds"]  # every timed call verified
    assert 0 < perf["ratio"] and "honest" in perf and perf["protocol_overhead_ms"] > 0
    assert perf["batch_plan"]["calls"] == perf["calls_per_batch"]
    counts = perf["rounding"]["candidate"]  # honest arithmetic: correctly rounded almost everywhere
    assert counts["elements"] == 96 * 128 * perf["samples_checked"] and counts["not_rounded"] < 0.01 * counts["judged"]
    if r["verdict"] == "INCONCLUSIVE":  # the timing says why it does not score
        assert r["score"]["performance"] == 0 and r["inconclusive"] == perf["reason"]


def test_gemmlab_kernel_has_no_false_failure_on_new_seeds():
    cf = cases.load(str(CASES / "cpu-legacy.json"))
    g = Grader(make_op(cf), cf)
    try:
        for seed in (1, 2):
            g.seed = seed
            for shape in cf.correctness:
                res = g.check(shape)
                assert res.status == "PASS", (seed, res)
        assert g.cand.starts == 1
    finally:
        g.cand.close()


def test_rowmajor_signature_on_a_colmajor_case():
    r = run("good_rowmajor", signature="rowmajor")
    assert passed(r), (r["verdict"], r["failures"], r["performance"].get("reason"))


def test_exact_shape_rule_closes_the_competition_blind_spot():
    """Wrong only at the perf size: the listed cases all pass (the original grader's 100/100), but the
    perf shape is verified through the same call before it is timed."""
    r = run("wrong_at_perf_shape", TINY_LEGACY)
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL"
    assert failed_rules(r) == {"exact-shape"} and "median_ms" not in r["performance"]
    good = run("honest", TINY_LEGACY)
    assert passed(good) and good["performance"]["exact_shape_check"]["status"] == "PASS"


@pytest.mark.parametrize(
    "fn,rule,words",
    [
        ("quarter_tiles", "poison-freshness", "NaN"),
        ("caches_first", "poison-freshness", "stale"),
        ("mutates_input", "poison-freshness", "modified an input"),
        ("nan_some", "poison-freshness", "NaN"),
        ("wrong_dtype", "output", "dtype"),
        ("returns_input_view", "correctness", "max |out - ref|"),
        ("raises", "isolation", "always fails"),
        ("crashes", "isolation", "died"),
    ],
)
def test_bad_kernel_fails_by_its_rule(fn, rule, words):
    sig = "rowmajor" if fn in ("wrong_dtype", "returns_input_view") else None
    r = run(fn, signature=sig)
    assert r["verdict"] == "FAIL"
    first = r["failures"][0]
    assert first["rule"] == rule and words in first["reason"], r["failures"]
    assert r["performance"] is None  # a failed correctness case stops grading before performance


@pytest.mark.parametrize(
    "fn,words",
    [
        ("lazy_after_warmup", "were not written"),  # honest while verified, idle while timed
        ("skip_every_4th", "were not written"),  # every timed call's sample is read: none can be skipped
        ("fills_all_outputs", "the same values"),  # one answer written into the other calls' outputs
        ("replays_seeded_inputs", "is wrong"),  # timed inputs are secret: the seed predicts nothing
        ("finishes_in_background", "batch"),  # answers first, works later: incomplete when timed, or never done
    ],
)
def test_cheating_while_timed_fails(fn, words):
    r = run(fn)
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL"
    assert failed_rules(r) == {"timed-outputs"} and words in r["failures"][0]["reason"], r["failures"]


def test_caching_by_address_fails():
    """Same addresses, new values: in the trials (where the allocator reuses addresses) or while timed."""
    r = run("caches_by_pointer")
    assert r["verdict"] == "FAIL" and failed_rules(r) <= {"timed-outputs", "poison-freshness", "correctness"}


def test_lying_clocks_gain_nothing():
    """The child's clock is advisory: a 10000x slow clock (time.perf_counter, CUDA events) or a faked
    timing loop contradicts the grader's and fails; a 0.7x clock changes nothing the grader reports."""
    for fn in ("lying_clock", "fake_timed_loop"):
        r = run(fn)
        assert r["verdict"] == "FAIL" and failed_rules(r) == {"honest-timing"}, (fn, r["failures"])
        assert "candidate's clock" in r["failures"][0]["reason"]
    r = run("lying_clock_mild")
    if r["verdict"] == "FAIL":  # on a loaded CPU the gap can pass the contradiction bound: caught, no gain
        assert failed_rules(r) == {"honest-timing"}, r["failures"]
        return
    perf = r["performance"]
    assert perf["median_ms"] > 1.2 * perf["advisory_median_ms"]  # the lie is visible, and not used:
    assert perf["ratio"] == pytest.approx(perf["tflops"] / perf["baseline_tflops"])
    assert perf["tflops"] == pytest.approx(2 * 16 * 24 * 32 / (perf["median_ms"] * 1e-3) / 1e12)


def test_cheats_on_unchecked_or_repeated_inputs_gain_nothing(tmp_path, monkeypatch):
    """Every output is poisoned before every call and every call has inputs no call saw before: a
    kernel that works only on poisoned outputs always works, and a fingerprint cache never hits."""
    r = run("compute_if_nan", rounds=6)
    assert passed(r), r["failures"]
    assert r["performance"]["samples_checked"] == 6 * r["performance"]["calls_per_batch"]
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    r = run("memo_fingerprint")
    assert passed(r), r["failures"]
    assert not (tmp_path / "hits").exists()  # not one cache hit


def test_killing_the_baseline_fails(monkeypatch):
    """Where the sandbox has no Landlock domain and no uid of its own (either refuses the signal:
    tests/sandbox/test_sandbox.py, tests/sandbox/test_isolation.py), the kill lands, and the grader notices."""
    monkeypatch.setenv("GEMMLAB_SANDBOX_LANDLOCK", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", "0")
    r = run("kills_baseline")
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"isolation"}
    assert "baseline worker" in r["failures"][0]["reason"]


def test_vendor_blas_is_refused_unless_allowed():
    r = run("uses_torch_mm", signature="rowmajor")
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"vendor"}
    assert "aten::mm" in r["failures"][0]["reason"] or "cublas" in r["failures"][0]["reason"].lower()
    assert passed(run("uses_torch_mm", signature="rowmajor", allow_vendor=True))


@pytest.mark.cpu_only("on a GPU the interposer decides: next test")
def test_silencing_the_profiler_hides_the_vendor_blas_from_it():
    """The profiler runs in the candidate's process, so its names are advisory: silenced, it sees nothing
    (on the CPU no observer outside sees the CPU BLAS; on a GPU the interposer does, next test)."""
    r = grade(TINY, kernel=f"{BAD_KERNELS / 'hides_vendor.py'}:hides_torch_mm", signature="rowmajor")
    assert passed(r)  # the known hole without an outside observer (stated in the README)


@pytest.mark.gpu
def test_vendor_blas_behind_a_silenced_profiler_is_seen_from_outside():
    """The candidate patches its own process's profiler; the preloaded interposer still sees cuBLAS."""
    preload = pytest.importorskip("gemmlab.grade.preload")
    try:
        preload.build()
    except preload.Unavailable as e:
        pytest.skip(f"the interposer cannot be built here: {e}")
    r = grade(TINY, kernel=f"{BAD_KERNELS / 'hides_vendor.py'}:hides_torch_mm", signature="rowmajor")
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"vendor"}, r["failures"]


def test_time_limit_kills_and_loading_happens_once():
    t0 = time.monotonic()
    r = run("sleeps", TINY_LEGACY, timeout=3)
    assert r["verdict"] == "FAIL" and time.monotonic() - t0 < 25
    first, second = r["correctness"]
    assert first["status"] == "FAIL" and "time limit" in first["reason"]
    assert second["status"] == "FAIL" and second["reason"].startswith("not run")
    assert r["worker_starts"] == 1


def test_slow_loading_honours_the_time_limit():
    t0 = time.monotonic()
    r = grade(TINY_LEGACY, kernel=f"{BAD_KERNELS / 'slow_import.py'}:kernel", timeout=5)
    assert time.monotonic() - t0 < 30 and r["verdict"] == "FAIL" and r["worker_starts"] == 1
    assert all("loading the kernel" in c["reason"] for c in r["correctness"]), r["correctness"]


def test_sandbox_kills_every_process_it_started(tmp_path, monkeypatch, device):
    """A double-forked grandchild in a new session is found (the owner is a child subreaper) and killed; the
    owner's own child (in the owner's session, as a compile worker pool is) is neither claimed nor killed."""
    own = subprocess.Popen(["sleep", "60"])
    try:
        monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))  # as where no Landlock domain stops its writes
        box = Sandbox(
            f"{BAD}:forks_report_writer",
            "colmajor",
            "colmajor",
            30.0,
            device == "cpu",
            str(tmp_path),
            extra_env={"BAD_KERNEL_OUT_DIR": str(tmp_path)},
        )
        a, b = torch.rand(4, 4, dtype=torch.float16).t(), torch.rand(4, 4, dtype=torch.float16).t()
        box.bind([((a, b), torch.full((16,), float("nan"), dtype=torch.float16))])
        box.request("call", slot=0)
        deadline = time.monotonic() + 5
        while not (tmp_path / "grandchild.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int((tmp_path / "grandchild.pid").read_text())
        assert pid in box.members() and own.pid not in box.members()
        box.close()
        assert not Path(f"/proc/{pid}").exists()
        assert own.poll() is None, "the sandbox killed a process the owner started"
        time.sleep(2.5)
    finally:
        own.kill()
        own.wait()
    assert not (tmp_path / "report.json").exists()


def test_rules():
    run_ev = dict(
        wall_ms=3.0,
        advisory_ms=2.9,
        overhead_ms=0.01,
        tflops=700.0,
        peak=989.4,
        device="cuda",
        baseline_ms=3.0,
        baseline_solo_ms=3.0,
        kernels={"_gemm_tma_splitk_kernel"},
        ops=set(),
        preload_calls=[],
        allow_vendor=False,
        timed_path="tma_splitk",
        seen_paths={"tma_splitk"},
        seen_kernels={"_gemm_tma_splitk_kernel"},
    )
    assert rules.first_failure(rules.RUN_RULES, rules.Run(**run_ev)) is None
    for change, rule, words in (
        ({"tflops": 1500.0}, "honest-timing", "impossible"),
        ({"advisory_ms": 0.01}, "honest-timing", "faked clock"),
        ({"advisory_ms": 9.0}, "honest-timing", "more than"),
        ({"baseline_ms": 3.4}, "honest-timing", "slowed the baseline"),
        ({"preload_calls": ["cublasGemmEx"]}, "vendor", "cublasGemmEx"),
        ({"timed_path": "portable"}, "dispatch-coverage", "never verified"),
        ({"kernels": {"_gemm_tma_splitk_kernel", "sneaky"}}, "dispatch-coverage", "sneaky"),
    ):
        got = rules.first_failure(rules.RUN_RULES, rules.Run(**{**run_ev, **change}))
        assert got is not None and got[0] == rule and words in got[1], (change, got)
    assert rules.first_failure(rules.RUN_RULES, rules.Run(**{**run_ev, "baseline_ms": 3.2})) is None  # within 10%
    assert rules.first_failure(rules.RUN_RULES, rules.Run(**{**run_ev, "baseline_ms": 3.5, "device": "cpu"})) is None
    assert rules.first_failure(rules.RUN_RULES, rules.Run(**{**run_ev, "baseline_ms": 3.5, "overhead_ms": 0.2})) is None


def test_fixed_baseline_and_module_kernel(tmp_path):
    d = json.loads(Path(TINY).read_text())
    d["performance"]["baseline_gflops"] = 1e-9  # a fixed baseline far below anything: full marks
    f = tmp_path / "fixed.json"
    f.write_text(json.dumps(d))
    r = grade(str(f), kernel="tests.bad_kernels.kernels:honest")  # package.module:FN form
    assert r["verdict"] == "PASS" and r["performance"]["baseline"].startswith("fixed")  # every round beats it
    assert r["score"]["performance"] == 70 and "baseline_ms" not in r["performance"]  # no baseline worker timed


GOOD = {
    "dtype": "float16",
    "layout": "colmajor",
    "inputs": "competition",
    "correctness": [{"M": 4, "N": 4, "K": 4}],
    "performance": {"M": 4, "N": 4, "K": 4, "baseline_gflops": None, "full_score_ratio": 0.3},
}


@pytest.mark.parametrize(
    "change,words",
    [
        ({"perfomance": {"M": 4, "N": 4, "K": 4}}, "perfomance: unknown key"),
        ({"tolerence": {"base": 0.1}}, "tolerence: unknown key"),
        ({"tolerance": 5}, "tolerance: expected an object"),
        ({"tolerance": {"base": "x"}}, "tolerance.base: expected a number"),
        ({"score": [1, 2]}, "score: expected an object"),
        ({"layout": "diagonal"}, "layout: expected one of"),
        ({"correctness": [{"M": 4, "N": 4, "K": 1.5}]}, "correctness[0].K: expected a positive integer"),
        ({"correctness": [{"M": 0, "N": 4, "K": 4}]}, "correctness[0].M: expected a positive integer"),
        ({"correctness": [{"M": True, "N": 4, "K": 4}]}, "correctness[0].M: expected a positive integer"),
        ({"correctness": [{"M": 4, "N": 4}]}, "correctness[0].K: missing"),
        ({"correctness": []}, "correctness: expected a non-empty list"),
        ({"performance": {"M": 4, "N": 4, "K": 4, "baseline_gflops": "fast"}}, "baseline_gflops: expected a number"),
        ({"performance": {"M": 4, "N": 4, "K": 4, "baseline_gflops": 0}}, "baseline_gflops: must be > 0"),
        ({"performance": {"M": 4, "N": 4, "K": 4, "full_score_ratio": 0}}, "full_score_ratio: must be > 0"),
        ({"mode": "moe"}, "layout: unknown key"),
    ],
)
def test_case_file_schema(tmp_path, change, words):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(cases.CaseError) as e:
        cases.load(str(f))
    msg = str(e.value)
    assert msg.startswith(str(f)) and words in msg and "\n" not in msg, msg


def test_case_files_that_are_not_case_files(tmp_path):
    (tmp_path / "bin.json").write_bytes(b"\x00\xff\xfe\x80binary")
    for src, words in (
        (str(tmp_path), "is a directory"),
        (str(tmp_path / "bin.json"), "not a text file"),
        ("no-such-cases", "no case file"),
    ):
        with pytest.raises(cases.CaseError, match=words):
            cases.load(src)
    f = tmp_path / "good.json"
    f.write_text(json.dumps(GOOD))
    assert cases.load(str(f)).performance.mnk == (4, 4, 4)
    for name in ("competition", "competition-legacy", "moe", "llm"):
        cf = cases.load(name)
        assert cf.performance is not None and cf.correctness
    cpu = cases.load("cpu")  # correctness only: the interpreter against a native BLAS would time neither
    assert cpu.performance is None and cpu.correctness
    full, legacy = cases.load("competition"), cases.load("competition-legacy")
    assert full.performance.mnk in {c.mnk for c in full.correctness}
    assert legacy.performance.mnk not in {c.mnk for c in legacy.correctness}


def _cli(*args, env=None):
    env = {**no_interpreter_env(), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gemmlab", "grade", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_cli_json_stays_clean_and_logs_are_removed(tmp_path):
    logs = tmp_path / "tmp"
    logs.mkdir()
    ok = _cli(
        "--cases", TINY, "--kernel", f"{BAD}:prints", "--output-dir", str(tmp_path), "--json", env={"TMPDIR": str(logs)}
    )
    report = json.loads(ok.stdout)  # the candidate's prints went to its log, not here
    assert report["verdict"] in ("PASS", "INCONCLUSIVE"), (report["failures"], ok.stderr[-2000:])
    assert ok.returncode == {"PASS": 0, "INCONCLUSIVE": 3}[report["verdict"]], ok.stderr[-2000:]
    assert passed(report) and report["logs"] is None
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == report["verdict"]
    assert "official score" in (tmp_path / "report.md").read_text() and report["kind"] == "grade"
    long = (tmp_path / "report.csv").read_text().splitlines()  # each case's error and tolerance; time, TFLOPS,
    assert long[0].startswith("kind,kernel,provider,mode,metric")  # baseline TFLOPS and ratio of the timed case
    assert len(long) == 1 + 2 * len(report["correctness"]) + 4 * ("median_ms" in report["performance"])
    assert not list(logs.glob("gemmlab-grade-*"))  # per-worker logs removed
    kept = _cli("--cases", TINY, "--kernel", f"{BAD}:prints", "--keep-logs", "--json", env={"TMPDIR": str(logs)})
    log = Path(json.loads(kept.stdout)["logs"]) / "candidate.log"
    assert "hello on stdout" in log.read_text() and "on stderr" in log.read_text()


def test_cli_forked_grandchild_cannot_rewrite_the_report(tmp_path):
    bad = _cli(
        "--cases",
        TINY,
        "--kernel",
        f"{BAD}:forks_report_writer",
        "--output-dir",
        str(tmp_path),
        env={"BAD_KERNEL_OUT_DIR": str(tmp_path), "GEMMLAB_SANDBOX_WRITABLE": str(tmp_path)},
    )
    assert bad.returncode == 1 and "FAIL" in bad.stdout
    pid = int((tmp_path / "grandchild.pid").read_text())
    time.sleep(2.5)
    assert not Path(f"/proc/{pid}").exists()
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == "FAIL"


def test_cli_killing_its_parent_kills_the_keeper_not_the_grader(tmp_path):
    r = _cli("--cases", TINY, "--kernel", f"{BAD}:kills_parent", "--output-dir", str(tmp_path))
    assert r.returncode == 1, r.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"] == "FAIL" and "keeper" in report["failures"][0]["reason"]


def test_cli_usage_errors(tmp_path):
    for args in (
        ("--cases", "no-such-file"),
        ("--cases", str(tmp_path)),
        ("--cases", TINY, "--timeout", "0"),
        ("--cases", TINY, "--kernel", "no_function.py"),
    ):
        r = _cli(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_competition_reference_is_the_float32_sum_not_its_rounding():
    """K = 16384: the bound is 0.0566, below one fp16 ulp (0.0625) at |C| >= 64. The exact C here is 64.0315 (just
    above the rounding midpoint 64.03125), so a kernel whose float32 sum lands a hair lower rounds to 64.0: one ulp
    from the rounded reference, though half an ulp from the true sum. It must pass; two ulps off must fail."""
    from gemmlab.grade.inputs import reference

    k = 16384
    a = torch.zeros(1, k, dtype=torch.float16)
    a[0, :3] = torch.tensor([64.0, 2.0**-5, 2.0**-12])
    b = torch.ones(k, 1, dtype=torch.float16)
    ref = reference(a, b, "competition", torch.float16, 0.01, 512)
    assert abs(ref["tol"] - 0.01 * (k / 512) ** 0.5) < 1e-12
    assert ref["c_ref"].dtype == torch.float32 and ref["c_ref"].item() > 64.03125
    assert torch.tensor(64.0315, dtype=torch.float16).item() == 64.0625  # what rounding the reference would give
    for c, ok in ((64.0, True), (64.0625, True), (63.9375, False), (64.125, False)):
        err = abs(torch.tensor(c, dtype=torch.float16).double().item() - ref["c_ref"].double().item())
        assert (err <= ref["tol"]) == ok, (c, err)


def test_heater_keeps_the_device_busy_for_the_time_asked():
    """The pre-batch load (protocol step 2) runs at least as long as asked."""
    from gemmlab.grade.protocol import heater

    heat = heater(torch.device("cpu"), size=64)
    t0 = time.perf_counter()
    heat(0.05)
    assert time.perf_counter() - t0 >= 0.05


def test_a_pickle_sent_by_the_candidate_is_never_loaded(tmp_path, monkeypatch):
    """Replies from the child are JSON: a candidate that sends a pickle down any multiprocessing connection of its
    process (which, loaded, would run code in the grader) finds none (the channel is a plain socket, and a pickle
    framed on it fails: tests/sandbox/test_sandbox.py), and the code never runs."""
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    res = run("sends_pickle")
    assert not (tmp_path / "pwned").exists()
    assert passed(res), res["failures"]  # it computes honestly, and its pickle reached nothing
