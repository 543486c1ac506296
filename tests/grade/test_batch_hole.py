"""The batch hole (issue 29, item 8): one candidate call doing the whole timed batch. The slots of a batch are the
same tensors batch after batch and, before the late inputs (grade/slots.py), all their inputs were written before
the window, so the first call of a batch could compute every call (one batched GEMM) while the others returned at
once. Now the first call of every segment but the first has inputs written only after the call before it returned
(on the CPU every call but the first), and the outputs of the calls not yet made are read there: both cheats of
tests/bad_kernels/batch_kernels.py FAIL, their honest twin does not.

On the CPU (tests/cases/tiny.json, 2 calls a batch) the protocol before (``LATE_CALLS`` 0) lets both cheats through
(``test_without_late_inputs_the_cheats_get_through``), INCONCLUSIVE like their honest twin: there the protocol's own
cost is more than a call, so no gain can be read off the CPU. With the late inputs both FAIL. On a GPU,
``test_the_fused_batch_on_the_gpu`` prints the gain before and after (``benchmarks/session.sh batch_hole``).
"""

import shutil
from pathlib import Path

import pytest
import torch

from gemmlab.grade import grade, rules, slots
from tests.paths import BAD_KERNELS, CASES

BK = str(BAD_KERNELS / "batch_kernels.py")
TINY = str(CASES / "tiny.json")


def _grade(fn: str, cases: str = TINY, **kw) -> tuple[dict, str]:
    """The report of grading ``fn`` and the text of its logs (removed after)."""
    r = grade(cases, kernel=f"{BK}:{fn}", allow_vendor=True, keep_logs=True, **kw)
    try:
        logs = "".join(p.read_text(errors="replace") for p in Path(r["logs"]).rglob("*") if p.is_file())
    finally:
        shutil.rmtree(r["logs"], ignore_errors=True)
    return r, logs


def _fused_grade(fn: str, tries: int = 3, **kw) -> dict:
    """A grade in which the cheat did fuse (it learns the slots in one batch and fuses from the next; on a loaded
    machine a grade can end before that): graded again up to ``tries`` times, else the test shows nothing."""
    seen = []
    for _ in range(tries):
        r, logs = _grade(fn, **kw)
        if "fused" in logs:
            assert r["listed_correctness_passed"], r["failures"]  # not failed for another reason
            return r
        seen.append((r["verdict"], [f["rule"] for f in r["failures"]]))
    raise RuntimeError(f"{fn} never computed more than its own call in {tries} grades: {seen}")


def test_one_call_computing_the_batch_into_its_outputs_fails():
    r = _fused_grade("fuses_the_batch")
    assert r["verdict"] == "FAIL", r["performance"]
    f = r["failures"][0]
    assert f["rule"] == "timed-outputs" and "before those calls were made" in f["reason"], r["failures"]


def test_one_call_computing_the_batch_into_its_own_memory_fails():
    """The outputs of the calls to come stay poisoned until they are called, but the late call's inputs changed
    after the call before it returned: its product, computed ahead, is wrong."""
    r = _fused_grade("fuses_ahead_privately")
    assert r["verdict"] == "FAIL", r["performance"]
    f = r["failures"][0]
    assert f["rule"] == "timed-outputs" and "written only after call" in f["reason"], r["failures"]


def test_the_honest_twin_is_not_failed():
    """One product a call, the same arithmetic: never FAIL (INCONCLUSIVE on a CPU, where the protocol's cost is
    more than a call); both sides ran the late writes."""
    r, _ = _grade("honest")
    assert r["verdict"] in ("PASS", "INCONCLUSIVE"), r["failures"]
    perf = r["performance"]
    assert perf["late_calls_per_batch"] == perf["calls_per_batch"] - 1 == 1, perf
    assert set(perf["late_ms_by_side"]) == {"candidate", "baseline"}, perf


def test_without_late_inputs_the_cheats_get_through(monkeypatch):
    """What the late inputs add: the protocol without them (``LATE_CALLS`` 0: every input written before the
    window, one request a batch) FAILs neither cheat."""
    monkeypatch.setattr(slots, "LATE_CALLS", {"cuda": 0, "cpu": 0})
    for fn in ("fuses_the_batch", "fuses_ahead_privately"):
        r = _fused_grade(fn)
        assert r["verdict"] != "FAIL", (fn, r["failures"])
        assert r["performance"]["late_calls_per_batch"] == 0


def test_a_cheat_fusing_only_its_request_has_nothing_to_fuse_on_the_cpu(monkeypatch):
    """A cheat that fuses only the calls of the request it serves (read from the worker's frame) is not caught by
    the late calls; on the CPU every request is one call, so it never fuses and is graded as the honest kernel it
    then is. Without the cut (``LATE_CALLS`` 0: one request a batch) it does fuse: the test is not vacuous."""
    with monkeypatch.context() as m:
        m.setattr(slots, "LATE_CALLS", {"cuda": 0, "cpu": 0})
        _fused_grade("fuses_each_request")
    r, logs = _grade("fuses_each_request")
    assert r["verdict"] in ("PASS", "INCONCLUSIVE"), r["failures"]
    assert "fused" not in logs and r["performance"]["rounds"] >= 4, r["performance"]


def test_the_batch_rules_fire_on_early_and_stale_outputs():
    ok = {"index": 3, "reply": {}, "changed": [], "incomplete": [], "wrong": [], "verified": 2}
    assert rules.first_failure(rules.BATCH_RULES, rules.Batch(**ok)) is None
    assert rules.first_failure(rules.BATCH_RULES, rules.Batch(**ok, late=[1])) is None
    rule, why = rules.first_failure(rules.BATCH_RULES, rules.Batch(**ok, ahead=[1, 2]))
    assert rule == "timed-outputs" and "2 timed call(s) (batch 3, first call 1) were written before" in why
    wrong = {**ok, "wrong": [(1, "max err 3"), (2, "max err 4")]}
    rule, why = rules.first_failure(rules.BATCH_RULES, rules.Batch(**wrong, late=[2]))
    assert rule == "timed-outputs" and "(batch 3, call 2) is wrong: max err 4" in why, why  # the late one first
    assert "written only after call 1 returned" in why, why
    rule, why = rules.first_failure(rules.BATCH_RULES, rules.Batch(**wrong, late=[3]))
    assert rule == "timed-outputs" and "(batch 3, call 1) is wrong: max err 3" in why, why
    assert "written only after" not in why, why


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_a_late_splice_writes_exactly_the_drawn_elements(dtype):
    """Through ``slots.bits`` (integer views: float8 indexing is not on every device), on a column-major view."""
    x, y = (torch.randn(5, 7).to(dtype).t() for _ in range(2))
    before = x.clone()
    pos = (torch.tensor([0, 6, 3]), torch.tensor([4, 0, 2]))
    slots.bits(x)[pos] = slots.bits(y)[pos].clone()
    assert torch.equal(x.float()[pos], y.float()[pos])
    keep = torch.ones(x.shape, dtype=torch.bool)
    keep[pos] = False
    assert torch.equal(x.float()[keep], before.float()[keep])


def test_segments_cut_before_every_late_call_and_replies_merge():
    assert slots.segments(5, [2, 4]) == [[0, 1], [2, 3], [4]]
    assert slots.segments(2, [1]) == [[0], [1]]
    assert slots.segments(3, []) == [[0, 1, 2]]
    m = slots.merged(
        [
            {"ms": [1.0], "problem": None, "held_ms": 0.5, "loop_ms": 1.0},
            {"ms": [2.0, 3.0], "problem": "bad", "held_ms": 0.25, "loop_ms": 5.0},
        ]
    )
    assert m == {"ms": [1.0, 2.0, 3.0], "problem": "bad", "held_ms": 0.75, "loop_ms": 6.0}
    assert slots.merged([{"ms": [1.0], "held_ms": None, "loop_ms": 1.0}])["held_ms"] is None


@pytest.mark.gpu
def test_the_fused_batch_on_the_gpu(tmp_path, monkeypatch):
    """A decode-sized GEMM (64 x 64 x 64 fp16, thousands of calls a batch) on the GPU: each cheat's ratio against
    cuBLAS without the late inputs (the gain before; printed with -s), then with them: both FAIL, the honest twin
    does not. Last, the ratio of the cheat that fuses one request's calls (the hole left), printed."""
    path = tmp_path / "small.json"
    path.write_text(
        '{"name": "small", "dtype": "float16", "layout": "colmajor", "inputs": "competition", '
        '"correctness": [{"name": "t", "M": 64, "N": 64, "K": 64}], '
        '"performance": {"name": "t", "M": 64, "N": 64, "K": 64, "full_score_ratio": 1.0}}'
    )
    cases = str(path)
    honest, _ = _grade("honest", cases, budget_s=30)
    print(
        "honest",
        honest["verdict"],
        (honest["performance"] or {}).get("ratio"),
        "calls per batch",
        (honest["performance"] or {}).get("calls_per_batch"),
    )
    assert honest["verdict"] != "FAIL", honest["failures"]
    with monkeypatch.context() as m:
        m.setattr(slots, "LATE_CALLS", {"cuda": 0, "cpu": 0})
        for fn in ("fuses_the_batch", "fuses_ahead_privately"):
            r = _fused_grade(fn, cases=cases, budget_s=30)
            print("before", fn, r["verdict"], (r["performance"] or {}).get("ratio"), r["failures"])
    for fn, words in (
        ("fuses_the_batch", "before those calls were made"),
        ("fuses_ahead_privately", "written only after call"),
    ):
        r = _fused_grade(fn, cases=cases, budget_s=30)
        print("after", fn, r["verdict"], r["failures"])
        assert r["verdict"] == "FAIL" and words in r["failures"][0]["reason"], r["failures"]
    # the hole left on a GPU (docs/grading.md, "What is not enforced"): a segment's calls fused; measured, not judged
    r, logs = _grade("fuses_each_request", cases, budget_s=30)
    print(
        "residual fuses_each_request",
        r["verdict"],
        (r["performance"] or {}).get("ratio"),
        "fused" in logs,
        r["failures"],
    )
