"""The undumpable grader (``GEMMLAB_SANDBOX_UNDUMPABLE``: ``keeper.no_ptrace``, ``isolate.owner_dumpable``): no
sandbox holds CAP_SYS_PTRACE, and the grader (while a sandbox lives) and the baseline are not dumpable, so the
candidate cannot ptrace them or open their memory, root and of their uid alike: the one layer of these that asks
nothing of CUDA's IPC across uids or PID namespaces."""

import ctypes
import os

import pytest

from tests.grade.test_grade import passed
from tests.sandbox.test_isolation import _attacks, out_dir  # noqa: F401 (a fixture)

PR_GET_DUMPABLE = 3


def dumpable() -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)


def test_alone_it_keeps_the_graders_memory_out_of_reach(out_dir, monkeypatch):  # noqa: F811
    """Every other layer off (as with CUDA by default, and the grader's uid): ptrace, process_vm_readv and the
    grader's /proc/PID/mem are refused, the candidate still passes, the report says so for both sides, and the test's
    own process (the grader's) is dumpable again afterwards."""
    if os.geteuid() != 0:
        pytest.skip("shown as root, where the sandbox would otherwise hold CAP_SYS_PTRACE")
    before = dumpable()
    r, found, got = _attacks(
        out_dir,
        monkeypatch,
        GEMMLAB_SANDBOX_LANDLOCK="0",
        GEMMLAB_SANDBOX_SECCOMP="0",
        GEMMLAB_SANDBOX_UID="0",
        GEMMLAB_SANDBOX_PIDNS="0",
        GEMMLAB_SANDBOX_UNDUMPABLE="1",
        GEMMLAB_SANDBOX_TOOL="none",
    )
    assert all(found[k] in ("EPERM", "EACCES") for k in ("ptrace", "process_vm_readv", "proc_mem")), found
    assert r["isolation"]["candidate"]["ptrace"] == "no CAP_SYS_PTRACE", r["isolation"]
    assert r["isolation"]["baseline"]["ptrace"] == "no CAP_SYS_PTRACE; this sandbox undumpable", r["isolation"]
    assert passed(r), r["failures"]
    assert dumpable() == before


def test_held_while_a_sandbox_lives_and_given_back_after_the_last():
    from gemmlab.sandbox.isolate import owner_dumpable

    before = dumpable()
    if before == 0:
        pytest.skip("this process is not dumpable to begin with (started with other credentials)")
    owner_dumpable(hold=True)
    owner_dumpable(hold=True)
    assert dumpable() == 0
    owner_dumpable(hold=False)
    assert dumpable() == 0  # one sandbox still lives
    owner_dumpable(hold=False)
    assert dumpable() == before
    owner_dumpable(hold=False)  # one release too many changes nothing
    assert dumpable() == before
