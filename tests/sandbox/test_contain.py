"""Which processes are a sandbox's (gemmlab.sandbox.contain.members), on a made-up process table: the owner is a
subreaper, so both a sandbox's own escapees and the orphans of another sandbox's killed keeper become its children."""

import os

from gemmlab.sandbox import contain

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
