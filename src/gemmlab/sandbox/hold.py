"""Holding a sandbox's processes (the owner's side; ``Sandbox.freeze`` and ``Sandbox.close`` use it): stopping them
all, the CPU time they used, the cgroup they must stay in, and killing them all.

    stop_all(members, freezer, deadline)     SIGSTOP (and the frozen cgroup) until two scans agree; the members
    cpu_ns(freezer, members)                 the sandbox's CPU time so far (ns), exited threads included
    accounting(freezer, keeper)              how that time is counted, for the report ("cgroup" | "per-process")
    outside(freezer, keeper, members)        live members found outside the sandbox's cgroup
    kill_all(members, keeper)                stop, then kill every member; those left after 10 s

Freeze accounting: a frozen sandbox may use no CPU (``FROZEN_CPU_NS`` of slack) from the end of its freeze to the
start of its next wake, nor during another sandbox's window. Where the sandbox has a cgroup v2 (``contain.Freezer``)
its ``cpu.stat`` ``usage_usec`` counts every process and thread that ever ran in it, exited ones included, and every
member must be inside it (``outside``: one found elsewhere fails the sandbox; ``clone3`` with CLONE_INTO_CGROUP is
refused by the seccomp filter, and with a uid of its own or inside bubblewrap the cgroup's files cannot be written).
Without one, each member's threads are read from /proc (``process_ns``): the live threads' ``schedstat`` plus what
exited threads and reaped children used (the process's ``stat`` times less its live threads', in clock ticks), so a
short-lived thread's CPU is not lost when it exits, nor a process's whose main thread exited (a zombie leader).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gemmlab.sandbox import contain

FROZEN_CPU_NS = 1_000_000  # CPU a frozen sandbox may show (accounting slack)
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _ticks(stat_path: str, fields: tuple[int, ...]) -> int:
    """The sum of ``fields`` (0: the state letter) of a /proc stat file after its "(comm)"; 0 when unreadable."""
    try:
        text = Path(stat_path).read_text()
        rest = text[text.rfind(")") + 2 :].split()
        return sum(int(rest[i]) for i in fields)
    except (OSError, ValueError, IndexError):
        return 0


def process_ns(pid: int) -> int:
    """CPU time of process ``pid`` (ns): its live threads' ``schedstat`` (exact) plus, in clock ticks, what its
    exited threads and reaped children used (utime + stime + cutime + cstime of the process less its live threads'
    utime + stime). A frozen process's value does not change; one whose threads ran and exited grows."""
    live_ns, live_ticks = 0, 0
    for t in contain.threads(pid):
        try:
            live_ns += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        live_ticks += _ticks(f"/proc/{pid}/task/{t}/stat", (11, 12))
    dead = _ticks(f"/proc/{pid}/stat", (11, 12, 13, 14)) - live_ticks
    return live_ns + max(0, dead) * TICK_NS


def cpu_ns(freezer: contain.Freezer | None, members: set[int]) -> int:
    """CPU time used so far by a sandbox: its cgroup's count plus ``process_ns`` of members outside it; or
    ``process_ns`` of every member."""
    usage = freezer.usage_ns() if freezer is not None else None
    if usage is None:
        return sum(map(process_ns, members))
    return usage + sum(map(process_ns, members - freezer.pids()))


def accounting(freezer: contain.Freezer | None, keeper: int) -> str:
    """How a frozen sandbox's CPU is counted, for the report: "cgroup" or "per-process" (and why)."""
    if freezer is not None and not freezer.holds(keeper):
        return "per-process (the keeper could not join its cgroup: /proc times, exited threads included)"
    if freezer is not None and freezer.usage_ns() is not None:
        return f"cgroup (cpu.stat of {freezer.rel}: exited threads included; every member checked to be inside)"
    if freezer is not None:
        return "per-process (a cgroup v1 freezer: no cpu.stat; /proc times, exited threads included)"
    return "per-process (no writable cgroup here: /proc times, exited threads included)"


def outside(freezer: contain.Freezer | None, keeper: int, members: set[int]) -> list[int]:
    """Live members (not zombies) outside the sandbox's cgroup, where its keeper got in; [] without a cgroup."""
    if freezer is None or not freezer.holds(keeper):
        return []
    return sorted(
        p for p in members if contain.state(p, leader=True) not in ("Z", "X", "") and freezer.holds(p) is False
    )


def stop_all(members, freezer: contain.Freezer | None, deadline: float) -> tuple[set[int], set[int]]:
    """Hold every member (``members()``: a fresh scan): the cgroup frozen (the caller froze it) or SIGSTOP, until two
    scans in a row find the same members, every one held. Returns (members, those still loose: none unless past
    ``deadline``)."""
    last = None
    while True:
        found = members()
        caged = freezer.pids() if freezer is not None and freezer.frozen() else set()
        loose = {p for p in found if p not in caged and contain.state(p) not in ("T", "t", "Z", "X", "")}
        if not loose and found == last:
            return found, loose
        if time.monotonic() > deadline:
            return found, loose
        last = None if loose else found
        contain.signal_all(loose, signal.SIGSTOP)
        time.sleep(0.0002 if loose else 0)


def kill_all(members, keeper: int, keeper_gone) -> set[int]:
    """Stop every member (``members()``: a fresh scan; the keeper ``keeper`` left out once ``keeper_gone()``) first,
    so nothing forks while more are looked for, then SIGKILL them and reap those the owner adopted; returns the
    members seen (to reap again later). Gives up after 10 s."""
    seen: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        live = members() - {keeper} if keeper_gone() else members()
        new = live - seen
        if new:
            contain.signal_all(new, signal.SIGSTOP)
            seen |= new
            continue
        contain.signal_all(seen | {keeper}, signal.SIGKILL)
        contain.reap(seen)
        if not (members() - {keeper}):
            break
        time.sleep(0.01)
    return seen
