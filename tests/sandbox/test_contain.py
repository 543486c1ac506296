"""Which processes are a sandbox's (gemmlab.sandbox.contain.members), on a made-up process table: the owner is a
subreaper, so both a sandbox's own escapees and the orphans of another sandbox's killed keeper become its children."""

import os
import signal
import time
from pathlib import Path

import pytest

from gemmlab.sandbox import contain
from gemmlab.sandbox.box import Sandbox
from tests.paths import BAD_KERNELS

CANDIDATE, BASELINE = 900001, 900002  # keepers: each leads a session of its own


def _table(monkeypatch, rows):
    monkeypatch.setattr(contain, "procs", lambda: dict(rows))


def test_orphans_of_another_keepers_session_are_not_this_sandboxs(monkeypatch):
    """The candidate killed the baseline's keeper: the keeper's children, still in its session, are the baseline's
    (the grader then blames the baseline's death), while a process that left the candidate's session is the
    candidate's."""
    me = os.getpid()
    _table(
        monkeypatch,
        {
            CANDIDATE: (me, CANDIDATE),
            CANDIDATE + 10: (CANDIDATE, CANDIDATE),  # the candidate's worker
            BASELINE + 10: (me, BASELINE),  # the baseline keeper's orphan
            BASELINE + 11: (BASELINE + 10, BASELINE),  # and its child
            900050: (me, 900050),  # an escapee: setsid, then its parent exited
            900051: (900050, 900050),
        },
    )
    found = contain.members(CANDIDATE, set(), {CANDIDATE, BASELINE})
    assert found == {CANDIDATE, CANDIDATE + 10, 900050, 900051}


def test_a_trusted_sandbox_claims_no_orphans(monkeypatch):
    me = os.getpid()
    _table(monkeypatch, {BASELINE: (me, BASELINE), 900050: (me, 900050)})
    assert contain.members(BASELINE, set(), None) == {BASELINE}


def test_the_owners_own_session_is_never_an_orphan(monkeypatch):
    me = os.getpid()
    _table(monkeypatch, {CANDIDATE: (me, CANDIDATE), 900060: (me, os.getsid(0))})
    assert contain.members(CANDIDATE, set(), {CANDIDATE}) == {CANDIDATE}


def _keeper_and_worker(box) -> tuple[int, int]:
    """(the keeper, its worker): the sandbox's processes running keeper.py, parent first (bubblewrap aside)."""
    table = contain.procs()
    keepers = []
    for p in box.members():
        try:
            if b"sandbox/keeper.py" in Path(f"/proc/{p}/cmdline").read_bytes():
                keepers.append(p)
        except OSError:
            pass
    keeper = next(p for p in keepers if table[p][0] not in keepers)
    return keeper, next(p for p in keepers if table[p][0] == keeper)


@pytest.mark.parametrize("mode", ["cgroup", "signals"])
def test_a_killed_keepers_orphans_stay_its_sandboxs(tmp_path, monkeypatch, mode, device):
    """The candidate kills the baseline's keeper, whose worker lingers (held stopped here): the grader, their
    subreaper, adopts it, in the keeper's session. It is not the candidate's (which would then 'leave its cgroup' or be
    frozen with it, and the baseline's death be blamed on the wrong sandbox)."""
    if mode == "signals":  # no cgroup: the orphan is found by its session alone
        monkeypatch.setattr(contain.Freezer, "make", classmethod(lambda cls, tag: None))
    spec = f"{BAD_KERNELS / 'containment.py'}:honest"
    cand = Sandbox(spec, "colmajor", "colmajor", 60.0, device == "cpu", str(tmp_path))
    base = Sandbox("builtin:cublas", "colmajor", "colmajor", 60.0, device == "cpu", str(tmp_path), name="baseline")
    try:
        cand.start()
        base.start()
        keeper, worker = _keeper_and_worker(base)
        os.kill(worker, signal.SIGSTOP)  # it would notice its keeper's death and exit: held, it lingers
        os.kill(keeper, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while contain.procs().get(worker, (0, 0))[0] != os.getpid():
            assert time.monotonic() < deadline, "the worker was not adopted"
            time.sleep(0.01)
        assert worker not in cand.members()
        assert worker in base.members()  # its sandbox's still: frozen with it, killed with it
        cand.freeze()  # no member outside its cgroup
        cand.thaw()
        assert cand.failed is None, cand.failed
    finally:
        cand.close()
        base.close(graceful=False)
    assert not contain.state(worker)  # gone with its sandbox
