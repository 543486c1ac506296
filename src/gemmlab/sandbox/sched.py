"""The scheduling of a sandbox's threads, read from /proc (Linux): what the owner has, what each thread has, and what
changed between two reads.

    Sched.of_owner()             the owner's scheduling (policy, nice, affinity, autogroup nice), what every sandbox
                                 thread must have; ``restore`` gives it back to threads, ``regrouped`` finds autogroups
                                 reniced
    sched_seen(pids)             {tid: (policy, nice, cgroups, autogroup)} of every thread of ``pids``
    sched_changes(before, after) what changed, one line each
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gemmlab.sandbox.contain import state, threads

POLICIES = {
    getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR") if hasattr(os, n)
}
RESET_ON_FORK = getattr(os, "SCHED_RESET_ON_FORK", 0x40000000)


def autogroup(pid: int | str) -> str | None:
    """The autogroup line of a process ("/autogroup-N nice X"); None without autogroups (or when it is gone)."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().strip()
    except OSError:
        return None


def autogroup_nice(line: str | None) -> int | None:
    try:
        return int(line.rsplit(" ", 1)[1]) if line else None
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Sched:
    """The owner's scheduling: what every thread of a sandbox gets back before each of its windows. With autogroups
    (each session a scheduling group of its own, ``kernel.sched_autogroup_enabled``) the group's nice value weighs
    the whole session: written by another process into ``/proc/PID/autogroup``, it slows a sandbox that no thread's
    nice value shows."""

    policy: int
    nice: int
    affinity: frozenset
    group_nice: int | None = None  # the owner's autogroup nice value (None: no autogroups)

    @classmethod
    def of_owner(cls) -> Sched:
        return cls(
            os.sched_getscheduler(0),
            os.getpriority(os.PRIO_PROCESS, 0),
            frozenset(os.sched_getaffinity(0)),
            autogroup_nice(autogroup("self")),
        )

    def raised(self, seen: dict[int, tuple]) -> list[str]:
        """Threads in ``seen`` that run at a higher priority than the owner (a real-time policy, a lower nice, a lower
        autogroup nice)."""
        rt = {getattr(os, n) for n in ("SCHED_FIFO", "SCHED_RR") if hasattr(os, n)}
        low = lambda g: self.group_nice is not None and g is not None and g < self.group_nice
        return [
            f"thread {t}: {_policy(pol)}, nice {nice}, autogroup nice {autogroup_nice(ag)}"
            for t, (pol, nice, _, ag) in seen.items()
            if (pol & ~RESET_ON_FORK) in rt or nice < self.nice or low(autogroup_nice(ag))
        ]

    def regrouped(self, seen: dict[int, tuple]) -> list[str]:
        """Threads in ``seen`` whose process's autogroup nice value is not the owner's: for a trusted sandbox, which
        never writes its own, only another process can have set it (and the record it is compared with may already
        hold the write)."""
        if self.group_nice is None:
            return []
        return [
            f"thread {t}: autogroup nice {autogroup_nice(ag)} (the owner's: {self.group_nice})"
            for t, (_, _, _, ag) in seen.items()
            if autogroup_nice(ag) is not None and autogroup_nice(ag) != self.group_nice
        ]

    def restore(self, pids) -> list[str]:
        """Give every thread of ``pids`` this policy, nice value and affinity, and every process the owner's autogroup
        nice value; returns the threads it could not."""
        failed = []
        for p in pids:
            group = autogroup_nice(autogroup(p))
            if self.group_nice is not None and group is not None and group != self.group_nice:
                try:
                    Path(f"/proc/{p}/autogroup").write_text(str(self.group_nice))
                except OSError as e:
                    failed.append(f"process {p}: autogroup nice {group}: {e.strerror}")
            for t in threads(p):
                try:
                    if (os.sched_getscheduler(t), os.getpriority(os.PRIO_PROCESS, t)) != (self.policy, self.nice):
                        os.sched_setscheduler(t, self.policy & ~RESET_ON_FORK, os.sched_param(0))
                        os.setpriority(os.PRIO_PROCESS, t, self.nice)
                    if frozenset(os.sched_getaffinity(t)) != self.affinity:
                        os.sched_setaffinity(t, self.affinity)
                except (ProcessLookupError, FileNotFoundError):
                    pass  # gone meanwhile
                except PermissionError as e:
                    failed.append(f"thread {t}: {e.strerror}")
        return failed


def _policy(pol: int) -> str:
    return POLICIES.get(pol & ~RESET_ON_FORK, str(pol))


def sched_seen(pids) -> dict[int, tuple[int, int, str | None, str | None]]:
    """{thread: (policy, nice value, its /proc cgroup text, its process's autogroup line; None for a zombie or
    unknown)} of every thread of ``pids``."""
    out = {}
    for p in pids:
        zombie = state(p) == "Z"  # (a zombie has left its memory cgroup)
        group = None if zombie else autogroup(p)
        for t in threads(p):
            try:
                out[t] = (
                    os.sched_getscheduler(t),
                    os.getpriority(os.PRIO_PROCESS, t),
                    None if zombie else Path(f"/proc/{p}/task/{t}/cgroup").read_text(),
                    group,
                )
            except (ProcessLookupError, FileNotFoundError, PermissionError):
                pass
    return out


def sched_changes(before: dict[int, tuple], after: dict[int, tuple]) -> list[str]:
    """Threads whose policy, nice value, cgroups or autogroup differ between two ``sched_seen`` (None: unknown)."""
    out = []
    for t, (pol, nice, cg, ag) in after.items():
        if t not in before:
            continue
        pol0, nice0, cg0, ag0 = before[t]
        if (pol, nice) != (pol0, nice0):
            out.append(f"thread {t}: {_policy(pol)}, nice {nice} (was {_policy(pol0)}, nice {nice0})")
        elif cg is not None and cg0 is not None and cg != cg0:
            out.append(f"thread {t}: moved to other cgroups")
        elif ag is not None and ag0 is not None and ag != ag0:
            out.append(f"thread {t}: autogroup {ag!r} (was {ag0!r})")
    return out
