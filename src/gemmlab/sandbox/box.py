"""A candidate's own process, contained: ``Sandbox``, the owner's side (the child's is ``sandbox.serve``).

    box = Sandbox(spec, signature, layout, timeout, interpret)   # starts nothing yet
    box.start()          # loads the kernel in the child, within ``timeout``; once (a failure is final)
    box.bind(slots)      # share input/output tensors with the child (``sandbox.share``: allocate CUDA ones under
                         # ``slot_memory(device)``)
    box.request("call", slot=0, profile=True)            # one call on slot 0; names of what ran
    box.request("run", order=[0, 1, 2], fn="kernel")     # calls back to back between two device syncs
    box.freeze() / box.thaw()                            # stop / wake everything the child started, checked
    box.ready(); t0 = now(); box.wake()                  # a timed window: the checks before t0, only waking after
    box.close()          # kill every process the child started; returns only when all are gone

What each guard enforces, and where: the package's docstring (``gemmlab.sandbox``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

from gemmlab import output
from gemmlab.sandbox import contain, hold, owner, sched, share, wire
from gemmlab.sandbox.isolate import Isolation, appended, child_env
from gemmlab.sandbox.replies import checked, log_tail

MAX_REPLY_BYTES = 1 << 24  # a reply longer than this is refused (a child cannot make the owner buffer gigabytes)
FREEZE_S = 5.0  # a sandbox not frozen (every member stopped) within this fails
LOG_TAIL_BYTES = 1 << 16  # of a worker's log, read to quote its end
HELD_MS, HELD_SHARE = 1.0, 0.25  # a trusted sandbox's main thread may be off the run queue this long in a batch
_OWN_CHILDREN: set[int] = set()  # pids of processes the owner started (keepers): never treated as orphans
_LIVE: weakref.WeakSet = weakref.WeakSet()  # launched sandboxes (each window checks the frozen others)


class WorkerFailure(RuntimeError):
    """The child timed out, died, could not load the kernel, lost its keeper, sent a malformed reply, could not
    be frozen, or was disturbed."""


class CandidateError(RuntimeError):
    """The candidate raised (its process lives on)."""


# ---------------------------------------------------------------------------------------------- the owner


class Sandbox:
    def __init__(
        self,
        spec: str | None,
        signature: str,
        layout: str,
        timeout: float,
        interpret: bool,
        log_dir: str | None = None,
        extra_env: dict[str, str] | None = None,
        name: str = "candidate",
        layers: dict[str, bool] | None = None,
    ):
        target, sep, fn = (spec or "").rpartition(":")
        if target.endswith(".py"):  # the child runs in its own directory
            spec = f"{Path(target).resolve()}{sep}{fn}"
        self.spec, self.signature, self.layout = spec, signature, layout
        self.trusted = spec is None or spec.startswith("builtin:")  # gemmlab's own code runs in the child
        observed = bool((extra_env or {}).get("CUDA_INJECTION64_PATH"))
        self.iso = Isolation.from_env(interpret, observed, layers)  # ``layers``: the probe's, where switches are unset
        self.landlock = self.iso.landlock
        self.isolation: dict[str, str] | None = None  # what the keeper put in force (its first message)
        self.timeout, self.interpret, self.extra_env, self.name = timeout, interpret, extra_env, name
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="gemmlab-grade-")
        self.log = str(Path(self.log_dir) / f"{name}.log")
        # the only directory the sandbox may write below, where Landlock is on (its cwd, $TMPDIR, its Triton cache)
        self.scratch = Path(self.log_dir) / f"{name}.scratch"
        own_cache = self.landlock or self.iso.read_only or self.iso.uid is not None or self.iso.tool.path is not None
        self.triton_cache = str(self.scratch / "triton-cache") if own_cache else None
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.freezer: contain.Freezer | None = None
        self.sched, self.slack = sched.Sched.of_owner(), owner.timer_slack()  # the owner's, checked (``owner``)
        self._cgroups: str | None = None  # the keeper's /proc/PID/cgroup: every thread must stay there
        self._hello_by: float | None = None  # loading must be done by then (monotonic clock)
        self._others: dict = {}  # frozen sandboxes -> their CPU ns when this one's window opened
        self._frozen_ns: int | None = None  # this one's CPU ns when its freeze was done (``ready`` checks it)
        self._seen: dict | None = None  # the threads' scheduling when last frozen (sched.sched_seen)
        self._waking: set[int] | None = None  # the members ``ready`` found, for ``wake``
        self.frozen = False
        self.holds_owner = False  # this sandbox keeps the owner undumpable (``owner.dumpable``)
        self.sessions: set[int] = set()  # its sessions when its keeper reported: their orphans are its own
        self.starts = 0
        self.failed: str | None = None  # once set, the sandbox is gone for good (loading happens once)

    # ------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the child and load the kernel there, all within ``timeout`` seconds of ``launch``."""
        if self.proc is None:
            self.launch()
        if self._hello_by is not None:
            deadline, self._hello_by = self._hello_by, None
            told = self._recv(max(0.0, deadline - time.monotonic()), "keeper", {}, "starting")["isolation"]
            self.isolation = {**told, "freeze_accounting": hold.accounting(self.freezer, self.proc.pid)}
            self.sessions = contain.sessions(self.members())  # its keeper's, before any code of the child's runs
            hello = self._recv(max(0.0, deadline - time.monotonic()), "hello", {}, "loading the kernel")
            if not hello["ok"]:
                self._fail(f"kernel could not be loaded: {hello['error']}")
            try:
                self._cgroups = Path(f"/proc/{self.proc.pid}/cgroup").read_text()
            except OSError:
                self._cgroups = None

    def launch(self) -> None:
        """Start the child without waiting for it to load (``start`` or the first request waits)."""
        if self.failed:
            raise WorkerFailure(self.failed)
        contain.subreaper()
        self.freezer, self._seen, self._others = contain.Freezer.make(self.name), None, {}
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.scratch.mkdir(exist_ok=True)
        extra = [d for d in os.environ.get("GEMMLAB_SANDBOX_WRITABLE", "").split(os.pathsep) if d]  # for tests
        env = child_env(
            self.interpret,
            {
                "TMPDIR": str(self.scratch),
                **(self.extra_env or {}),
                **({"TRITON_CACHE_DIR": self.triton_cache} if self.triton_cache else {}),
                **({"HOME": str(self.scratch)} if self.iso.uid is not None else {}),
            },
        )
        self.iso.grant(self.log_dir, self.scratch, extra, env)
        args = [str(theirs.fileno())] + self.iso.keeper_args(
            [str(self.scratch), *extra], self.freezer.procs_file if self.freezer else None, appended(env), self.trusted
        )
        if self.iso.undumpable and not self.holds_owner:  # before any code of the child's runs
            owner.dumpable(hold=True)
            self.holds_owner = True
        # O_NONBLOCK | O_NOFOLLOW: a FIFO or symlink a child planted at the log's name fails the start, never blocks it
        with open(
            os.open(
                self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600
            ),
            "ab",
        ) as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("keeper.py")), *args],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.scratch,
                start_new_session=True,
                env=env,
            )
        theirs.close()
        _OWN_CHILDREN.add(self.proc.pid)
        _LIVE.add(self)
        self.starts += 1
        self.sock = mine
        wire.send(
            mine,
            {
                "spec": self.spec,
                "signature": self.signature,
                "layout": self.layout,
                "interpret": self.interpret,
                "sys_path": list(sys.path),
            },
        )
        self._hello_by = time.monotonic() + self.timeout

    def request(self, op: str, timeout: float | None = None, **req) -> dict:
        """Send one request; returns the checked reply (``replies.REPLIES[op]``). Raises CandidateError when the
        candidate raised, WorkerFailure for anything else (the sandbox is then closed for good). "bind" takes
        ``slots=`` tensors (see ``bind``)."""
        fds: list[int] = []
        if op == "bind":  # the tensors cross as plain data and descriptors (sandbox.share)
            req["slots"], fds = share.export(req["slots"])
        if self.proc is None or self._hello_by is not None:
            self.start()
        try:
            wire.send(self.sock, {"op": op, **req}, fds)
        except OSError as e:
            self._fail(f"the {self.name}'s process is gone ({type(e).__name__}: {e}){self.log_tail()}")
        reply = self._recv(timeout or self.timeout, op, req, op)
        if self.proc.poll() is not None:  # the keeper died: something in the sandbox killed it
            self._fail(
                f"the sandbox's keeper process died (exit status {self.proc.returncode}): the candidate "
                "killed its parent"
            )
        if "error" in reply:
            raise CandidateError(reply["error"])
        return reply

    def held_off(self, reply: dict) -> str | None:
        """Why a trusted sandbox's "run" batch was not its own time: its main thread was off the CPU (neither running
        nor runnable) for over ``HELD_MS`` + ``HELD_SHARE`` of the batch, stopped by another process (or, on a
        virtual machine, its CPU taken by the host); None within that, or for an untrusted sandbox."""
        held, loop = reply.get("held_ms"), reply.get("loop_ms")
        if self.trusted and held is not None and loop is not None and held > HELD_MS + HELD_SHARE * loop:
            return f"the {self.name}'s process was held off the CPU for {held:.3g} ms of its {loop:.3g} ms batch"
        return None

    def bind(self, slots: list) -> None:
        """Share ``slots`` (a list of (inputs tuple, flat output)) with the child; replaces earlier ones. CUDA
        tensors must come from ``share.slot_memory`` (ValueError otherwise)."""
        self.request("bind", slots=slots)

    def _recv(self, timeout: float, op: str, req: dict, what: str) -> dict:
        try:
            raw, _ = wire.recv(self.sock, timeout, MAX_REPLY_BYTES)
        except TimeoutError:
            self._fail(f"no answer within {timeout:g} s ({what}; time limit); the {self.name}'s processes were killed")
        except (EOFError, OSError) as e:
            code = self.proc.poll()
            self._fail(
                f"{self.name} process died (keeper exit status {code}; e.g. an illegal memory access or a "
                f"crash){self.log_tail()}",
                e,
            )
        except wire.WireError as e:
            self._fail(f"the {self.name} sent {e} ({what})", e)
        try:
            return checked(op, raw, req)
        except ValueError as e:
            self._fail(f"the {self.name} sent a malformed reply to {op!r}: {e}", e)

    def _fail(self, reason: str, cause: BaseException | None = None):
        self.failed = reason
        self.close()
        raise WorkerFailure(reason) from cause

    def log_tail(self, chars: int = 600) -> str:
        """The end of the child's output, as a clause to quote ("" when it has none): ``replies.log_tail``."""
        try:
            text = log_tail(self.log, chars, LOG_TAIL_BYTES)
        except output.UnreadableFile as e:  # the child put a FIFO or a symlink to /dev/zero there
            return f"; its log was replaced ({e})"
        return f"; its output ends: {text}" if text else ""

    # ------------------------------------------------------------------------------------- containment

    def members(self) -> set[int]:
        """Every live process the child started (see the module docstring); empty before start. Not an orphan in a
        session another sandbox's keeper had (the candidate killed that keeper: the orphans are that sandbox's, whose
        death the grader reports; a session of that id needs the keeper's pid, free only once it died)."""
        if self.proc is None:
            return set()
        others = set().union(*(box.sessions for box in list(_LIVE) if box is not self))  # its orphans are theirs
        return contain.members(
            self.proc.pid,
            self.freezer.pids() if self.freezer is not None else set(),
            None if self.trusted else _OWN_CHILDREN | others,
            self.sessions,
        )

    def cpu_ns(self) -> int:
        """CPU time used so far by the sandbox's processes, exited ones included (``hold.cpu_ns``)."""
        return hold.cpu_ns(self.freezer, self.members())

    def freeze(self) -> None:
        """Hold every process of the sandbox (between its timed batches: no CPU work, no new launches), verified;
        then check that no other frozen sandbox ran during this one's window."""
        if self.proc is None:
            return
        if self.freezer is not None:
            try:
                self.freezer.freeze()
            except OSError:
                self.freezer = None  # removed under us: signals from here on
        members, loose = hold.stop_all(self.members, self.freezer, time.monotonic() + FREEZE_S)
        if loose:
            self._fail(
                f"the {self.name}'s processes could not all be stopped within {FREEZE_S:g} s "
                f"({len(loose)} still running: a fork storm?)"
            )
        self.frozen = True
        out = hold.outside(self.freezer, self.proc.pid, members)
        if out:
            self._fail(
                f"the {self.name}'s processes {contain.described(out[:5])} left its cgroup: its CPU time and its "
                "freeze are not the cgroup's"
            )
        contain.reap({p for p in members if contain.state(p) == "Z" and p not in _OWN_CHILDREN}, wait_s=0)
        self._seen = sched.sched_seen(members - {self.proc.pid} if self.proc.poll() is not None else members)
        raised = self.sched.raised(self._seen)
        if raised:
            self._fail(f"the {self.name} raised the scheduling priority of its own threads ({'; '.join(raised[:3])})")
        self._check_group(self._seen)
        for other, before in self._others.items():
            if other.frozen:
                other.check_still(before, f"during the {self.name}'s window")
        self._others = {}
        self._frozen_ns = hold.cpu_ns(self.freezer, members)

    def check_still(self, before: int, when: str, members: set[int] | None = None) -> None:
        """Fail this (frozen) sandbox if it used over ``FROZEN_CPU_NS`` of CPU since it had ``before`` ns (``members``:
        its processes, when just scanned)."""
        used = hold.cpu_ns(self.freezer, self.members() if members is None else members) - before
        if used > hold.FROZEN_CPU_NS:
            self._fail(
                f"the {self.name}'s processes used {used / 1e6:.3g} ms of CPU while frozen, {when}: a process "
                "of it escaped the freeze"
            )

    def thaw(self, wait_s: float = 1.0) -> None:
        """``ready``, ``wake``, then ``running``: every process woken and none left stopped (outside a timed window)."""
        self.ready()
        self.wake()
        self.running(wait_s)

    def ready(self) -> None:
        """The work of waking, done while the sandbox is still frozen (so none of it lies inside a timed window, and
        nothing of the sandbox runs meanwhile): restore the scheduling of every thread (a change fails the sandbox),
        note the members to wake and the CPU time of the other frozen sandboxes (its window checks they use none)."""
        if self.proc is None:
            return
        self._check_owner()
        pids = self.members()
        if self.frozen and self._frozen_ns is not None:
            self.check_still(self._frozen_ns, "between its freeze and its wake", pids)
            self._frozen_ns = None
        self._check_sched(sched.sched_seen(pids), restore=pids)
        if self.trusted:  # its timer slack as the owner's (the candidate's own is its own business)
            owner.restore_slack(pids, self.slack)
        self._waking = pids
        self._others = {box: box.cpu_ns() for box in list(_LIVE) if box is not self and box.frozen}

    def check_held(self) -> None:
        """The checks of ``ready`` on a held sandbox, nothing restored or woken: after the last window of another
        sandbox, which no later window of this one would check."""
        if self.proc is not None and self.frozen:
            self._check_owner()
            self._check_sched(sched.sched_seen(self.members()))

    def _check_owner(self) -> None:
        """Fail where the owner's own thread's scheduling changed since this sandbox was made (``owner.changed``)."""
        changed = owner.changed(self.sched, self.slack)
        if changed:
            self._fail(f"the grader's own scheduling was changed while the {self.name} lived ({'; '.join(changed)})")

    def _check_sched(self, now: dict, restore: set[int] | None = None) -> None:
        """Fail where the scheduling of ``now`` changed since the last freeze (never frozen yet: against the
        owner's, autogroup aside: a new session's starts at nice 0 and is restored, not checked), or where a trusted
        sandbox's autogroup is not the owner's; then give ``restore``'s processes the owner's scheduling."""
        before = (
            self._seen
            if self._seen is not None
            else {t: (self.sched.policy, self.sched.nice, self._cgroups, None) for t in now}
        )
        if self._seen is not None:
            self._check_group(now)
        changed = sched.sched_changes(before, now) or (self.sched.restore(restore) if restore else [])
        if changed:
            self._fail(
                f"the scheduling of the {self.name}'s processes was changed while it was held "
                f"({'; '.join(changed[:3])}): another process reached them"
            )

    def _check_group(self, seen: dict) -> None:
        """A trusted sandbox whose autogroup nice value is not the owner's fails (it never sets its own)."""
        moved = self.sched.regrouped(seen) if self.trusted else []
        if moved:
            self._fail(f"the {self.name}'s autogroup was reniced by another process ({'; '.join(moved[:3])})")

    def wake(self) -> None:
        """Wake the members ``ready`` noted (SIGCONT, the cgroup thawed) and nothing more: in a timed window the
        only step between t0 and the request, so that nothing the sandbox does after it was frozen lies before t0."""
        if self.proc is None:
            return
        if self._waking is None:
            self.ready()
        self._wake(self._waking)
        self._waking = None
        self.frozen = False

    def running(self, wait_s: float = 1.0) -> None:
        """Wait (up to ``wait_s``) until no member is stopped, SIGCONT to each that is; one that stays stopped fails
        the sandbox (held by a tracer)."""
        if self.proc is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            stopped = {p for p in self.members() if contain.state(p) in ("T", "t")}
            if not stopped and not (self.freezer is not None and self.freezer.frozen()):
                break
            if time.monotonic() > deadline:
                self._fail(
                    f"the {self.name}'s processes stay stopped after SIGCONT ({sorted(stopped)[:5]}: traced "
                    "by another process?)"
                )
            contain.signal_all(stopped, signal.SIGCONT)
            time.sleep(0.0005)

    def _wake(self, pids: set[int]) -> None:
        contain.signal_all(pids, signal.SIGCONT)  # first: it drops a SIGSTOP queued while frozen
        if self.freezer is not None:
            try:
                self.freezer.thaw()
            except OSError:
                self.freezer = None

    def close(self, graceful: bool = True) -> None:
        """Stop the child and kill everything it started; returns when /proc lists none of them (raises
        WorkerFailure if some survive 10 s of this)."""
        if self.proc is None:
            if self.holds_owner:  # its start failed
                owner.dumpable(hold=False)
                self.holds_owner = False
            return
        if graceful and self.failed is None and self.proc.poll() is None:
            try:
                self._wake(self.members())
                wire.send(self.sock, {"op": "stop"})
                self.proc.wait(2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.freezer is not None:
            self.freezer.kill()
        seen = hold.kill_all(self.members, self.proc.pid, lambda: self.proc.poll() is not None)
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        contain.reap(seen)
        if self.sock is not None:
            self.sock.close()
        left = self.members() - {self.proc.pid}
        _OWN_CHILDREN.discard(self.proc.pid)
        _LIVE.discard(self)
        if self.holds_owner and not left:  # a survivor keeps the owner undumpable for good
            owner.dumpable(hold=False)
            self.holds_owner = False
        self.proc, self.frozen = None, False
        if self.freezer is not None:
            self.freezer.remove()
            self.freezer = None
        if left:
            raise WorkerFailure(f"processes started by the candidate outlived the kill: {sorted(left)[:5]}")
