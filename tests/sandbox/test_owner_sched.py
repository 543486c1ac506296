"""The grader's own thread, kept as it was (``sandbox.owner``): a candidate of the grader's uid (with CUDA) with root's
capabilities reniced, rescheduled, pinned and slackened it without any ptrace right; the grade now fails and the
grader's thread has its values back. Without a capability (the undumpable layer's candidate side) it cannot."""

import ctypes
import json
import os

import pytest

from gemmlab.grade import grade
from gemmlab.sandbox import owner
from tests.grade.test_grade import TINY, failed_rules, passed
from tests.paths import BAD_KERNELS


def _mine() -> tuple:
    return (
        os.sched_getscheduler(0),
        os.getpriority(os.PRIO_PROCESS, 0),
        frozenset(os.sched_getaffinity(0)),
        owner.timer_slack(),
    )


def _restore(was: tuple) -> None:
    os.sched_setscheduler(0, was[0], os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, 0, was[1])
    os.sched_setaffinity(0, was[2])
    ctypes.CDLL(None).prctl(owner.PR_SET_TIMERSLACK, was[3], 0, 0, 0)


def _as_with_cuda(tmp_path, monkeypatch, undumpable: str) -> None:
    """The grader's uid and a writable /proc, as with CUDA; ``undumpable`` "1": every capability dropped (the layer's
    candidate side), "0": root's capabilities kept (where the probe left the layer off)."""
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_READONLY", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_LANDLOCK", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_UNDUMPABLE", undumpable)


@pytest.mark.parametrize("undumpable", ["1", "0"], ids=["no-capability", "root-capabilities"])
def test_a_candidate_that_slows_the_graders_thread_fails(tmp_path, monkeypatch, undumpable):
    """Without a capability, every change is refused (the kernel asks CAP_SYS_NICE of a process whose capabilities
    are not a subset of the caller's) and the grade passes; with root's, each lands and the grade fails."""
    if os.geteuid() != 0:
        pytest.skip("shown as root (a grader that is not root could not lower its own nice value again)")
    _as_with_cuda(tmp_path, monkeypatch, undumpable)
    was = _mine()
    try:
        r = grade(TINY, kernel=f"{BAD_KERNELS / 'redteam.py'}:slows_the_grader")
        assert _mine() == was  # given back by the grader itself, before the test's own restore below
    finally:
        _restore(was)
    did = json.loads((tmp_path / "slowed").read_text().splitlines()[0])
    if undumpable == "1":
        assert set(did.values()) == {"Operation not permitted"}, did
        assert passed(r), (r["verdict"], r["failures"])
        return
    assert did.get("nice") == "ok" and did.get("policy") == "ok", did  # it did reach the grader's thread
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"isolation"}, r["failures"]
    reason = r["failures"][0]["reason"]
    assert "grader's own scheduling was changed" in reason and "nice 19 (was" in reason, reason


def test_changed_names_and_restores_each_value():
    if os.geteuid() != 0:
        pytest.skip("lowering the nice value again needs root")
    from gemmlab.sandbox.sched import Sched

    was, sched, slack = _mine(), Sched.of_owner(), owner.timer_slack()
    assert owner.changed(sched, slack) == []  # nothing changed: nothing said
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, was[1] + 3))
        ctypes.CDLL(None).prctl(owner.PR_SET_TIMERSLACK, slack + 12345, 0, 0, 0)
        said = owner.changed(sched, slack)
        assert len(said) == 2 and said[0].startswith("nice ") and said[1].startswith("timer slack ns "), said
        assert _mine() == was and owner.changed(sched, slack) == []
        if len(was[2]) > 1:  # pinned to one CPU (as OpenMP binds a pool's first thread): set back, not a failure
            os.sched_setaffinity(0, {min(was[2])})
            assert owner.changed(sched, slack) == [] and _mine() == was
    finally:
        _restore(was)


@pytest.mark.parametrize("undumpable", ["1", "0"], ids=["no-capability", "root-capabilities"])
def test_a_baseline_slackened_by_the_candidate_gets_the_owners_slack_back(tmp_path, monkeypatch, undumpable):
    """``containment.py:slackens_baseline`` sets the baseline's threads' timer slack to 50 ms in each timed call:
    without a capability it cannot (CAP_SYS_NICE); with root's, the grader gives them its own back before every
    baseline window, so a later batch's calls find the owner's value again."""
    if os.geteuid() != 0:
        pytest.skip("another process's timer slack is root's to write (CAP_SYS_NICE)")
    _as_with_cuda(tmp_path, monkeypatch, undumpable)
    r = grade(TINY, kernel=f"{BAD_KERNELS / 'containment.py'}:slackens_baseline")
    assert (tmp_path / "slack").exists(), ("no timed call ran", r["verdict"], r["failures"])
    calls = [json.loads(line) for line in (tmp_path / "slack").read_text().splitlines()]
    if undumpable == "1":
        assert all(c["set"] == 0 for c in calls) and passed(r), (calls, r["verdict"], r["failures"])
        return
    assert calls[0]["set"] > 0, calls  # it reached the baseline's threads
    # within one batch a call finds its own 50 ms; the first call after a baseline window, the owner's value again
    seen = [v for c in calls[1:] for v in c["seen"]]
    assert set(seen) <= {owner.timer_slack(), 50_000_000} and owner.timer_slack() in seen, calls
