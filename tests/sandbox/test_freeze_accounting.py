"""Freeze accounting (gemmlab.sandbox.hold): a frozen sandbox that uses CPU fails, though the threads that used it
have exited (tests/bad_kernels/frozen_cpu.py), by its cgroup's cpu.stat where it has one and by /proc times where it
has none; the report says which count held. The escape itself is played by the test (an accomplice outside that
wakes the helper for a few bursts and stops it again), since the sandbox's other layers leave the candidate none."""

import json
import os
import platform
import signal
import time

import pytest
import torch

from gemmlab.sandbox import contain, hold
from gemmlab.sandbox.box import Sandbox, WorkerFailure
from tests.paths import BAD_KERNELS

BOX = str(BAD_KERNELS / "frozen_cpu.py")
WAIT_S = 120.0  # generous: a loaded 2-core machine


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    """Where the bad kernel notes its helper's pid and bursts: writable for it (GEMMLAB_SANDBOX_WRITABLE)."""
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    return tmp_path


def _read_int(path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _wait(what, test, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        got = test()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.005)


def _live_ns(pid: int) -> int:
    """The live threads' schedstat alone (what freeze accounting read before it counted exited threads)."""
    total = 0
    for t in contain.threads(pid):
        try:
            total += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def _outer(cand, inner: int) -> int | None:
    """The pid here of the sandbox's process whose own pid (in its PID namespace, if it has one) is ``inner``."""
    for p in cand.members():
        try:
            status = open(f"/proc/{p}/status").read()
        except OSError:
            continue
        ns = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [str(p)])
        if int(ns[-1]) == inner:
            return p
    return None


def _start(out_dir, fn, mode, monkeypatch):
    if mode == "per-process":
        monkeypatch.setattr(contain.Freezer, "make", classmethod(lambda cls, tag: None))
    else:
        probe = contain.Freezer.make("probe")
        if probe is None or not probe.v2 or probe.usage_ns() is None:
            pytest.skip("no writable cgroup v2 with cpu.stat here")
        probe.remove()
    cand = Sandbox(f"{BOX}:{fn}", "colmajor", "colmajor", WAIT_S, True, str(out_dir))
    a = torch.rand(4, 4, dtype=torch.float16).t()
    cand.bind([((a, a), torch.full((16,), float("nan"), dtype=torch.float16))])
    cand.request("call", slot=0)  # leaves the helper
    inner = _wait("the helper's pid", lambda: _read_int(out_dir / "helper.pid"))
    _wait("a first burst", lambda: _read_int(out_dir / "bursts"))
    return cand, _wait("the helper among the sandbox's processes", lambda: _outer(cand, inner))


def _stopped(pid: int) -> bool:
    return contain.state(pid) in ("T", "t")


@pytest.mark.parametrize("mode", ["cgroup", "per-process"])
@pytest.mark.parametrize("fn", ["short_lived_threads", "zombie_short_lived_threads"])
def test_cpu_used_while_frozen_fails_though_its_threads_exited(out_dir, monkeypatch, mode, fn):
    """Frozen, the helper does nothing, and ``ready`` passes (the control, twice). Then an accomplice wakes it for
    three bursts (each in a thread that exits before the check) and stops it again right after one: ``ready`` fails
    the sandbox, by the cgroup's count or, without a cgroup, by the process's /proc times, which keep what its exited
    threads used (their live threads' schedstat alone shows almost none of it)."""
    if fn.startswith("zombie") and platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the bad kernel exits its main thread by the x86_64 or aarch64 system call number")
    cand, helper = _start(out_dir, fn, mode, monkeypatch)
    try:
        assert cand.isolation["freeze_accounting"].startswith(mode), cand.isolation
        for _ in range(2):  # the control: frozen is frozen, no false failure
            cand.freeze()
            bursts = _read_int(out_dir / "bursts")
            time.sleep(0.2)
            assert _read_int(out_dir / "bursts") == bursts
            cand.ready()
            cand.wake()
            cand.running()
        cand.freeze()
        before = {"process": hold.process_ns(helper), "live": _live_ns(helper)}
        seen = _read_int(out_dir / "bursts")
        if mode == "cgroup":
            cand.freezer.thaw()  # the accomplice: everything of the sandbox runs again
        os.kill(helper, signal.SIGCONT)  # (a freeze may also have stopped it by signal, seen before the cgroup froze)
        _wait("three bursts", lambda: _read_int(out_dir / "bursts") >= seen + 3)
        if mode == "cgroup":
            cand.freezer.freeze()
            _wait("the cgroup frozen again", cand.freezer.frozen)
        else:
            os.kill(helper, signal.SIGSTOP)
            _wait("the helper stopped again", lambda: _stopped(helper))
        if mode == "per-process":  # the burners' CPU is in the process's times, not in any live thread's: of two
            # whole bursts at least (30 ms each), all but the clock ticks' truncation (10 ms a reading)
            used, live = hold.process_ns(helper) - before["process"], _live_ns(helper) - before["live"]
            assert used - live >= 2 * 30e6 - 2 * hold.TICK_NS, (used, live)
        with pytest.raises(WorkerFailure, match="of CPU while frozen, between its freeze and its wake"):
            cand.ready()
    finally:
        cand.close()
    assert not cand.members()


def test_cpu_used_during_the_other_sides_window_fails_it(out_dir, monkeypatch):
    """The same escape while the other sandbox's window runs (the check at that sandbox's freeze) fails the frozen
    one: the accounting holds across windows, not only across its own freeze."""
    cand, helper = _start(out_dir, "short_lived_threads", "per-process", monkeypatch)
    base = Sandbox("builtin:cublas", "colmajor", "colmajor", WAIT_S, True, str(out_dir), name="baseline")
    try:
        a = torch.rand(4, 4, dtype=torch.float16).t()
        base.bind([((a, a), torch.full((16,), float("nan"), dtype=torch.float16))])
        base.freeze()
        cand.freeze()
        base.ready()  # notes the frozen candidate's CPU: the baseline's window opens
        base.wake()
        seen = _read_int(out_dir / "bursts")
        os.kill(helper, signal.SIGCONT)
        _wait("three bursts", lambda: _read_int(out_dir / "bursts") >= seen + 3)
        os.kill(helper, signal.SIGSTOP)
        _wait("the helper stopped again", lambda: _stopped(helper))
        base.request("call", slot=0)
        with pytest.raises(
            WorkerFailure, match="candidate's processes used .* of CPU while frozen, during the baseline's window"
        ):
            base.freeze()
    finally:
        cand.close()
        base.close()
    assert not cand.members() and not base.members()


@pytest.mark.parametrize("mode", ["cgroup", "per-process"])
def test_the_report_says_how_frozen_cpu_was_counted(out_dir, monkeypatch, mode):
    """The keeper's account of its isolation, as the report carries it, says which freeze accounting held."""
    cand, _ = _start(out_dir, "short_lived_threads", mode, monkeypatch)
    try:
        words = cand.isolation["freeze_accounting"]
        assert words.startswith(mode) and "exited threads included" in words, words
        json.dumps(cand.isolation)  # it goes into report.json as it is
    finally:
        cand.close()
