"""The undumpable grader (``GEMMLAB_SANDBOX_UNDUMPABLE``: ``keeper.no_ptrace``, ``owner.dumpable``): no
sandbox holds CAP_SYS_PTRACE, and the grader (while a sandbox lives) and the baseline are not dumpable, so the
candidate cannot ptrace them or open their memory, root and of their uid alike: the one layer of these that asks
nothing of CUDA's IPC across uids or PID namespaces."""

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.grade.test_grade import passed
from tests.paths import REPO
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
    said = r["isolation"]["candidate"]["ptrace"]  # the grader's uid: every capability dropped (test_root_powers.py)
    assert said.startswith("no CAP_SYS_PTRACE (nor any other capability"), r["isolation"]
    assert r["isolation"]["baseline"]["ptrace"] == "no CAP_SYS_PTRACE; this sandbox undumpable", r["isolation"]
    assert passed(r), r["failures"]
    assert dumpable() == before


def test_held_while_a_sandbox_lives_and_given_back_after_the_last():
    from gemmlab.sandbox import owner

    before = dumpable()
    if before == 0:
        pytest.skip("this process is not dumpable to begin with (started with other credentials)")
    owner.dumpable(hold=True)
    owner.dumpable(hold=True)
    assert dumpable() == 0
    owner.dumpable(hold=False)
    assert dumpable() == 0  # one sandbox still lives
    owner.dumpable(hold=False)
    assert dumpable() == before
    owner.dumpable(hold=False)  # one release too many changes nothing
    assert dumpable() == before


HELPER = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from gemmlab.sandbox import keeper

    r, w = os.pipe()
    base = os.fork()
    if base == 0:  # the baseline's side: undumpable, then runs a helper by exec (a compiler, Triton's ldconfig)
        said = keeper.no_ptrace(True)
        helper = subprocess.Popen(["sleep", "60"])
        os.write(w, json.dumps([said, helper.pid]).encode())
        helper.wait()
        os._exit(0)
    said, helper = json.loads(os.read(r, 1000))
    found = {"baseline": said}
    cand = os.fork()
    if cand == 0:  # the candidate's side, root as the baseline is
        found["candidate"] = keeper.no_ptrace(False)
        for name, flags in (("mem", os.O_RDWR), ("fd/1", os.O_WRONLY)):
            try:
                os.close(os.open(f"/proc/{helper}/{name}", flags))
                found[name] = "opened"
            except OSError as e:
                found[name] = e.strerror
        print(json.dumps(found), flush=True)
        os._exit(0)
    os.waitpid(cand, 0)
    os.kill(helper, 9)
    os.waitpid(base, 0)
    """
)


def test_a_helper_the_baseline_execs_is_out_of_reach():
    """Exec makes a process dumpable again, so a helper the undumpable baseline runs (root, with the baseline's
    capabilities) was open to the candidate (root, the same capabilities but CAP_SYS_PTRACE, which an undumpable target
    alone asks for): its memory writable, its descriptors (the baseline's files, past the read-only host) openable.
    The candidate now also lacks capabilities the helper holds (``keeper.UNTRUSTED_DROPS``), and the kernel lets no
    process reach one whose capabilities are not all its own too."""
    if os.geteuid() != 0:
        pytest.skip("shown as root: a grader that is not root leaves its helpers' memory to its uid (docs/grading.md)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    p = subprocess.run([sys.executable, "-c", HELPER], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    found = json.loads(p.stdout.strip().splitlines()[-1])
    assert found["baseline"] == "no CAP_SYS_PTRACE; this sandbox undumpable", found
    assert found["candidate"].startswith("no CAP_SYS_PTRACE (nor CAP_SYS_MODULE, "), found
    assert found["mem"] == "Permission denied" and found["fd/1"] == "Permission denied", found
