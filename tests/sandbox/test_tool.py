"""bubblewrap around the keeper (gemmlab.sandbox.tool): chosen where installed and self-tested (without CUDA by
default, opt-in with it), the hand-written path otherwise, and the report says which. The bubblewrap-only tests skip
where it is not usable (a CI machine without it); the fallback is tested by forcing GEMMLAB_SANDBOX_TOOL=none and by
a PATH with no bwrap, or with one that fails its self-test."""

import json
import os
import subprocess
import sys

import pytest
import torch

from gemmlab.sandbox.box import Sandbox
from gemmlab.sandbox.isolate import Isolation
from gemmlab.sandbox.tool import Tool
from tests.child import no_interpreter_env
from tests.grade.test_grade import TINY, passed
from tests.paths import BAD_KERNELS

BOX = str(BAD_KERNELS / "containment.py")
RED = str(BAD_KERNELS / "redteam.py")
WAIT_S = 120.0


def _bwrap() -> Tool:
    found = Tool.choose(True)
    if found.path is None:
        pytest.skip(f"bubblewrap is not usable here ({found.why})")
    return found


def _loads(tmp_path, env: dict[str, str]):
    """Start a sandbox of the honest kernel with ``env`` set; one call; its isolation words."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        box = Sandbox(f"{BOX}:honest", "colmajor", "colmajor", WAIT_S, True, str(tmp_path))
        a = torch.rand(4, 4, dtype=torch.float16).t()
        c = torch.full((16,), float("nan"), dtype=torch.float16)
        box.bind([((a, a), c)])
        box.request("call", slot=0)
        box.close()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert torch.isfinite(c).all()
    return box.isolation


def test_an_unknown_tool_is_one_clear_error(monkeypatch):
    """GEMMLAB_SANDBOX_TOOL other than auto, bwrap or none: a ValueError naming it from the API; from the CLI one
    line and exit status 2, before any sandbox starts."""
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "firejail")
    with pytest.raises(ValueError, match="GEMMLAB_SANDBOX_TOOL must be one of auto, bwrap, none, not 'firejail'"):
        Isolation.from_env(True)
    out = subprocess.run(
        [sys.executable, "-m", "gemmlab", "grade", "--cases", TINY],
        capture_output=True,
        text=True,
        env={**no_interpreter_env(), "GEMMLAB_SANDBOX_TOOL": "firejail"},
        timeout=600,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1 and "GEMMLAB_SANDBOX_TOOL" in out.stderr, out.stderr


def test_with_cuda_bubblewrap_is_opt_in(monkeypatch):
    """With CUDA, unset or auto: the hand-written path (bubblewrap has not run on a GPU yet), and the report's words
    say how to ask for it; ``bwrap``: bubblewrap with the GPU's device nodes bound and no IPC namespace of its own
    (CUDA IPC); a PID or network namespace only when asked for (GEMMLAB_SANDBOX_PIDNS, GEMMLAB_SANDBOX_NETNS), with
    CUDA or without."""
    monkeypatch.delenv("GEMMLAB_SANDBOX_TOOL", raising=False)
    off = Tool.choose(interpret=False)
    assert off.path is None and "GEMMLAB_SANDBOX_TOOL=bwrap" in off.why
    _bwrap()
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "bwrap")
    on = Tool.choose(interpret=False)
    argv = on.argv("/tmp", [], [])
    assert on.path is not None and on.cuda and "--unshare-ipc" not in argv and "--unshare-pid" not in argv
    assert "--unshare-pid" in Tool.choose(interpret=False, pidns=True).argv("/tmp", [], [])
    assert "--unshare-net" not in argv
    assert "--unshare-net" in Tool.choose(interpret=False, netns=True).argv("/tmp", [], [])
    assert "--unshare-ipc" in Tool.choose(interpret=True).argv("/tmp", [], [])
    nodes = [f for f in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm") if os.path.exists(f)]
    assert all(argv[argv.index(f) - 1] == "--dev-bind" for f in nodes), argv


def test_without_bubblewrap_the_hand_written_path_holds_and_says_why(tmp_path, monkeypatch):
    """No bwrap on PATH: the keeper's own containment, and the report says the tool was not there."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("GEMMLAB_SANDBOX_TOOL", raising=False)
    assert Tool.choose(True).why == "bubblewrap not installed"
    iso = _loads(tmp_path, {"GEMMLAB_SANDBOX_TOOL": "auto"})
    assert iso["tool"] == "hand-written (bubblewrap not installed)", iso
    assert iso["seccomp"] == "on", iso


def test_a_bubblewrap_that_fails_its_self_test_is_not_used(tmp_path, monkeypatch):
    """A bwrap that answers ``--version`` but runs nothing (a broken install, no namespaces allowed here) fails its
    self-test: the hand-written path holds, and the report says why."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "bubblewrap 9.9.9"; exit 0; }\n'
        'echo "bwrap: No permissions to create new namespace" >&2\nexit 1\n'
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("GEMMLAB_SANDBOX_TOOL", raising=False)
    why = Tool.choose(True).why
    assert why.startswith("bubblewrap 9.9.9 failed its self-test (exit status 1") and "namespace" in why, why
    iso = _loads(tmp_path, {"GEMMLAB_SANDBOX_TOOL": "bwrap"})
    assert iso["tool"].startswith("hand-written (bubblewrap 9.9.9 failed its self-test"), iso


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_the_report_says_which_isolation_held(tmp_path, monkeypatch, choice):
    """Without CUDA, auto: bubblewrap (where usable), its name and version in the report, its /dev and (asked for)
    PID namespace standing for the keeper's; none: the hand-written path, and the report says it was switched off."""
    if choice == "auto":
        found = _bwrap()
        iso = _loads(tmp_path, {"GEMMLAB_SANDBOX_TOOL": choice, "GEMMLAB_SANDBOX_PIDNS": "1"})
        assert iso["tool"] == found.name and found.name.startswith("bubblewrap "), iso
        assert iso["pid_namespace"] == "on" and iso["terminals"].startswith("hidden (bubblewrap"), iso
    else:
        iso = _loads(tmp_path, {"GEMMLAB_SANDBOX_TOOL": choice})
        assert iso["tool"] == "hand-written (off (GEMMLAB_SANDBOX_TOOL=none))", iso
    assert iso["seccomp"] == "on" and iso["landlock"].startswith(("on", "partial", "off: no Landlock")), iso


def test_inside_bubblewrap_nothing_outside_its_scratch_is_writable(tmp_path, monkeypatch):
    """With every hand-written layer off (no Landlock, no uid, no filter, no hidden terminals: as with CUDA by
    default), bubblewrap alone (with GEMMLAB_SANDBOX_PIDNS=1): the candidate writes neither into the grader's log
    directory nor into a directory on the Python path (a read-only host), and sees no process of the grader's (a PID
    namespace of its own)."""
    _bwrap()
    out, path_dir = tmp_path / "out", tmp_path / "path"
    out.mkdir()
    path_dir.mkdir()
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(out))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(out))
    monkeypatch.setenv("BAD_PATH_DIR", str(path_dir))
    for var in ("LANDLOCK", "UID", "SECCOMP", "TERMINALS"):
        monkeypatch.setenv(f"GEMMLAB_SANDBOX_{var}", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "bwrap")
    monkeypatch.setenv("GEMMLAB_SANDBOX_PIDNS", "1")
    from gemmlab.grade import grade

    r = grade(TINY, kernel=f"{RED}:reaches_outside_by_files")
    found = json.loads((out / "files.json").read_text())
    assert {"log_dir", "python_path"} <= set(found) and all(v is not True for v in found.values()), found
    assert "Read-only file system" in found["log_dir"] and "Read-only" in found["python_path"], found
    assert not any(k.startswith("autogroup") for k in found), found  # no baseline process in its view
    assert not list(path_dir.iterdir())
    iso = r["isolation"]["candidate"]
    assert iso["tool"].startswith("bubblewrap ") and iso["landlock"] == "off" and iso["seccomp"] == "off", iso
    assert passed(r), r["failures"]


@pytest.mark.gpu
def test_bubblewrap_with_cuda(tmp_path, monkeypatch):
    """With CUDA and GEMMLAB_SANDBOX_TOOL=bwrap (opt-in until this passes on a GPU): a sandbox inside bubblewrap (the
    GPU's device nodes bound, the host's /dev/shm) opens the slots' CUDA IPC handles and computes the product; a grade,
    whose kernel observer cannot cross bubblewrap yet, falls back to the hand-written path, passes, and says why."""
    from gemmlab.grade import grade
    from gemmlab.sandbox.share import slot_memory

    _bwrap()
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "bwrap")
    box = Sandbox("builtin:cublas", "colmajor", "colmajor", WAIT_S, False, str(tmp_path))
    try:
        with slot_memory("cuda"):
            a = torch.rand(64, 64, dtype=torch.float16, device="cuda").t()
            c = torch.full((64 * 64,), float("nan"), dtype=torch.float16, device="cuda")
        box.bind([((a, a), c)])
        box.request("call", slot=0)
        torch.cuda.synchronize()
        assert box.isolation["tool"].startswith("bubblewrap "), box.isolation
    finally:
        box.close()
    want = (a.float() @ a.float()).t().reshape(-1)
    assert torch.allclose(c.float(), want, atol=0.1, rtol=0.01), (c.float() - want).abs().max()
    r = grade(TINY)
    assert passed(r), r["failures"]
    iso = r["isolation"]["candidate"]
    assert iso["tool"].startswith("hand-written (bubblewrap not used: the kernel observer"), iso


def test_a_sandbox_with_the_kernel_observer_is_not_wrapped(monkeypatch):
    """The kernel observer's channel is the keeper's, inherited by fork: a sandbox that loads it is not put inside
    bubblewrap (whose exec would cut it), even when asked for, and the report says why."""
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "bwrap")
    iso = Isolation.from_env(False, observed=True)
    assert iso.tool.path is None and "kernel observer" in iso.tool.why
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "none")
    assert Isolation.from_env(False, observed=True).tool.why == "off (GEMMLAB_SANDBOX_TOOL=none)"
