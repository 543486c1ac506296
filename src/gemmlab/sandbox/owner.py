"""The owner's own scheduling, kept as it was: a sandbox of the grader's uid (with CUDA by default) reaches the
grader's thread without ptrace rights: ``setpriority``, ``sched_setscheduler`` and ``sched_setaffinity`` need only
the same uid (lowering a priority) or CAP_SYS_NICE (root), and root may write ``/proc/PID/timerslack_ns`` and
``/proc/PID/autogroup`` of any process where /proc is writable to it (with CUDA: ``mounts.PROC_READ_ONLY``). A
candidate that slows the grader's thread while the baseline is timed (nice 19, SCHED_IDLE, one CPU, a timer slack of
milliseconds on every sleep of the grader's) and gives it back before its own window would gain. So before every
window (``Sandbox.ready``, ``check_held``) the grader compares its thread with what it was when the sandbox was made
(``sched.Sched.of_owner``, ``timer_slack``), fails the sandbox on any change and restores what it can.

    timer_slack()              the calling thread's timer slack (ns)
    changed(sched, slack)      what differs from ``sched`` and ``slack`` now ([]: nothing), the values restored
    restore_slack(pids, slack) every thread of ``pids`` given the owner's timer slack back (a trusted sandbox's:
                               root may write another's ``/proc/PID/timerslack_ns``, which no scheduling check sees)
    dumpable(hold)             the owner undumpable while a sandbox of the undumpable layer lives (counted), its own
                               flag back after the last"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from gemmlab.sandbox.contain import threads
from gemmlab.sandbox.sched import Sched, autogroup, autogroup_nice

PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
_OWNER = {"held": 0, "was": None}  # sandboxes holding the owner undumpable; its dumpable flag before the first


def timer_slack() -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)


def changed(sched: Sched, slack: int) -> list[str]:
    """The calling thread's policy, nice value and timer slack, and its process's autogroup nice value, where they
    differ from ``sched`` and ``slack`` (each named with both values); every one of them is set back (best effort: a
    grader that is not root cannot lower its nice value again, and the sandbox fails all the same). Its CPU affinity
    is set back without a failure (OpenMP binds the thread that starts its pool where ``OMP_PROC_BIND`` or
    ``GOMP_CPU_AFFINITY`` says so: the grader's own doing; the candidate, frozen through the other's window, cannot
    pin it after this), unless it cannot be."""
    now = Sched.of_owner()
    now_slack = timer_slack()
    if sorted(now.affinity) != sorted(sched.affinity):
        try:
            os.sched_setaffinity(0, sched.affinity)
        except OSError as e:
            return [f"CPUs {sorted(now.affinity)} (was {sorted(sched.affinity)}; not set back: {e.strerror})"]
    out = [
        f"{what} {b} (was {a})"
        for what, a, b in (
            ("policy", sched.policy, now.policy),
            ("nice", sched.nice, now.nice),
            ("timer slack ns", slack, now_slack),
            ("autogroup nice", sched.group_nice, now.group_nice),
        )
        if a != b
    ]
    if not out:
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    for fix in (
        lambda: os.sched_setscheduler(0, sched.policy, os.sched_param(0)),
        lambda: os.setpriority(os.PRIO_PROCESS, 0, sched.nice),
        lambda: libc.prctl(PR_SET_TIMERSLACK, slack, 0, 0, 0),
        lambda: (
            sched.group_nice is not None
            and autogroup_nice(autogroup("self")) != sched.group_nice
            and Path("/proc/self/autogroup").write_text(str(sched.group_nice))
        ),
    ):
        try:
            fix()
        except OSError:
            pass
    return out


def restore_slack(pids, slack: int) -> list[int]:
    """Give every thread of ``pids`` the timer slack ``slack`` (the owner's, which they inherited) where another
    process changed it: a candidate that is root (with CUDA by default) may write the baseline's threads'
    ``/proc/TID/timerslack_ns`` (CAP_SYS_NICE, no ptrace right) to put milliseconds on each of their timed
    sleeps. Returns the threads set back (a grader that is not root can set none, nor can its candidate)."""
    done = []
    for p in pids:
        for t in threads(p):
            path = Path(f"/proc/{t}/timerslack_ns")  # a thread id names its thread there too (no task/ entry)
            try:
                if int(path.read_text()) != slack:
                    path.write_text(str(slack))
                    done.append(t)
            except (OSError, ValueError):
                pass  # gone meanwhile, or not ours to set
    return done


def dumpable(hold: bool) -> None:
    """The owner (the grader's process) undumpable while at least one sandbox of that layer lives (``hold``: one
    more; else one fewer), its own flag back after the last: no process without CAP_SYS_PTRACE (every such sandbox's)
    can ptrace it or read its memory (``/proc/PID/mem``, ``process_vm_readv``), its uid whatever it is."""
    libc = ctypes.CDLL(None, use_errno=True)
    if hold:
        if _OWNER["held"] == 0:
            _OWNER["was"] = libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
            libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _OWNER["held"] += 1
    elif _OWNER["held"] > 0:
        _OWNER["held"] -= 1
        if _OWNER["held"] == 0 and _OWNER["was"] is not None and _OWNER["was"] >= 0:
            libc.prctl(PR_SET_DUMPABLE, _OWNER["was"], 0, 0, 0)
