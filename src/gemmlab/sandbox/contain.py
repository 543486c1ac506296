"""The owner's view of a sandbox's processes, read from /proc and the cgroup filesystem (Linux; CPU and GPU alike).

    procs()                      {pid: (ppid, session)} of every process
    descendants(roots, procs)    roots and everything below them
    state(pid)                   R, S, D, T, t, Z, ... ("" when gone)
    members(keeper, caged, ...)  every live process of one sandbox (``Sandbox.members``)
    reap(pids) / subreaper()     the owner collects the orphans it adopted / adopts them
    Freezer.make(tag)            a freezer cgroup of one sandbox, or None where none can be made here
(The threads' scheduling: ``sandbox.sched``.)

Freezer: cgroup v2 (``cgroup.freeze``, ``cgroup.kill``, ``cpu.stat``) where a cgroup2 hierarchy is writable, else the
cgroup v1 freezer (``freezer.state``). The keeper writes its own pid into ``procs_file`` before it forks, so every
process the candidate ever starts is born inside; freezing a cgroup stops its members all at once, forks in flight
included, which SIGSTOP sent process by process cannot do (a process that forks and exits every millisecond escapes a
snapshot). Where no cgroup can be made (read-only /sys/fs/cgroup, no permission) the sandbox falls back to SIGSTOP,
re-scanning until two scans in a row find every member stopped.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def procs() -> dict[int, tuple[int, int]]:
    """{pid: (ppid, session)} of every process /proc lists (zombies included)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        out[int(d)] = (int(fields[1]), int(fields[3]))
    return out


def sessions(pids) -> set[int]:
    """The session ids of ``pids`` (those still listed)."""
    table = procs()
    return {table[p][1] for p in pids if p in table}


def described(pids) -> str:
    """``pids`` as a report names them: each with its command name, parent and session ("gone" once it exited)."""
    table, out = procs(), []
    for p in pids:
        try:
            comm = Path(f"/proc/{p}/comm").read_text().strip()
        except OSError:
            comm = "gone"
        parent, session = table.get(p, ("?", "?"))
        out.append(f"{p} ({comm}, parent {parent}, session {session})")
    return "[" + ", ".join(out) + "]"


def state(pid: int, leader: bool = False) -> str:
    """The process state letter from /proc (R, S, D, T, t, Z, ...); "" when it is gone. A process whose main thread
    exited while others live reads as a zombie there: its state is then that of its threads (a running one's first,
    else a stopped one's; "Z" only when every thread is dead). ``leader``: the main thread's own letter."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    letter = stat[stat.rfind(")") + 2]
    if letter != "Z" or leader:
        return letter
    seen = []
    for t in threads(pid):
        try:
            task = Path(f"/proc/{pid}/task/{t}/stat").read_text()
        except OSError:
            continue
        seen.append(task[task.rfind(")") + 2])
    return next((x for x in seen if x not in "TtZX"), next((x for x in seen if x in "Tt"), letter))


def descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    found, frontier = set(roots), set(roots)
    while frontier:
        frontier = {p for p, (pp, _) in table.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def members(root: int, caged: set[int], orphans_but: set[int] | None, sessions: set[int] = frozenset()) -> set[int]:
    """Every live process of a sandbox whose keeper is ``root``: its session and ``sessions`` (those its processes had
    at its start: a keeper under bubblewrap leads its own), the processes of its cgroup (``caged``), their descendants
    and, unless ``orphans_but`` is None (a trusted sandbox), every child of the owner
    outside the owner's session whose pid and session are not in ``orphans_but`` (the owner's own keepers, and the
    sessions of its other sandboxes: the orphans of a killed keeper are its own sandbox's); never the owner."""
    table = procs()
    me = os.getpid()
    roots = {p for p, (_, sid) in table.items() if sid == root or sid in sessions} | {root} | caged
    if orphans_but is not None:  # orphans it left: no process of the sandbox can join the owner's session
        own_sid = os.getsid(0)
        roots |= {
            p
            for p, (pp, sid) in table.items()
            if pp == me and sid != own_sid and p not in orphans_but and sid not in orphans_but
        }
    return (descendants(roots, table) & set(table)) - {me}


def reap(pids: set[int], wait_s: float = 2.0) -> None:
    """Collect the exit status of dead processes that became the owner's children (no zombies left)."""
    deadline = time.monotonic() + wait_s
    while True:
        for p in pids:
            try:
                os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                pass
        table = procs()
        if time.monotonic() > deadline or not any(p in table and table[p][0] == os.getpid() for p in pids):
            return
        time.sleep(0.01)


def subreaper() -> bool:
    """Make the owner a child subreaper (an orphan of a sandbox becomes its child, not init's)."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def signal_all(pids, sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


# --------------------------------------------------------------------------------------------- cgroups


def _mounts() -> list[tuple[str, str, str, str]]:
    """(fstype, mount point, root inside the hierarchy, super options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if r and r[0] in ("cgroup", "cgroup2"):
            out.append((r[0], f[4], f[3], r[2] if len(r) > 2 else ""))
    return out


def _own(kind: str) -> str | None:
    """This process's path in the cgroup2 hierarchy ("0::PATH") or the v1 freezer's ("N:...freezer...:PATH")."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, ctrls, path = line.split(":", 2)
        if (kind == "cgroup2" and num == "0" and not ctrls) or (kind == "cgroup" and "freezer" in ctrls.split(",")):
            return path
    return None


@dataclass
class Freezer:
    path: Path
    v2: bool
    rel: str = ""  # its path inside the hierarchy, as /proc/PID/cgroup names it

    @classmethod
    def make(cls, tag: str) -> Freezer | None:
        """A new cgroup below this process's own, with a freezer: v2 first, then the v1 freezer; None if neither
        can be created here."""
        try:
            mounts = _mounts()
        except OSError:
            return None
        for kind in ("cgroup2", "cgroup"):
            for fstype, point, root, opts in mounts:
                if fstype != kind or (kind == "cgroup" and "freezer" not in opts.split(",")):
                    continue
                own = _own(kind)
                if own is None or not own.startswith(root):
                    continue
                path = Path(point + own[len(root) :].rstrip("/"), f"gemmlab-{tag}-{secrets.token_hex(4)}")
                try:
                    path.mkdir()
                except OSError:
                    continue
                if (path / ("cgroup.freeze" if kind == "cgroup2" else "freezer.state")).exists():
                    return cls(path, kind == "cgroup2", f"{own.rstrip('/')}/{path.name}")
                _rmdir(path)
        return None

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def pids(self) -> set[int]:
        try:
            return {int(p) for p in (self.path / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            return set()

    def holds(self, pid: int) -> bool | None:
        """Whether ``pid`` is in this cgroup (its /proc/PID/cgroup, set when it is born: a process still being
        forked reads as its parent's); None when it is gone."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            num, ctrls, path = line.split(":", 2)
            if (self.v2 and num == "0" and not ctrls) or (not self.v2 and "freezer" in ctrls.split(",")):
                return path == self.rel
        return False

    def freeze(self) -> None:
        self._write("cgroup.freeze" if self.v2 else "freezer.state", "1" if self.v2 else "FROZEN")

    def thaw(self) -> None:
        self._write("cgroup.freeze" if self.v2 else "freezer.state", "0" if self.v2 else "THAWED")

    def frozen(self) -> bool:
        try:
            if self.v2:
                return "frozen 1" in (self.path / "cgroup.events").read_text().splitlines()
            return (self.path / "freezer.state").read_text().strip() == "FROZEN"
        except OSError:
            return False

    def usage_ns(self) -> int | None:
        """CPU time of every process that ever ran in the cgroup, exited ones included (v2); None on v1."""
        if not self.v2:
            return None
        try:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) * 1000
        except (OSError, ValueError):
            pass
        return None

    def kill(self) -> None:
        """SIGKILL every member at once (v2 ``cgroup.kill``; else frozen, killed one by one, thawed)."""
        try:
            if self.v2 and (self.path / "cgroup.kill").exists():
                self._write("cgroup.kill", "1")
                return
            self.freeze()
            signal_all(self.pids(), signal.SIGKILL)
            self.thaw()
        except OSError:
            pass

    def remove(self) -> None:
        _rmdir(self.path)


def _rmdir(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # still populated for a moment after its last member died
            time.sleep(0.01)
