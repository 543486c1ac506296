"""A candidate's own process, contained: ``Sandbox`` (the owner's side) and ``serve`` (the child's side).

    box = Sandbox(spec, signature, layout, timeout)      # starts nothing yet
    box.start()          # loads the kernel in the child, within ``timeout``; once (a failure is final)
    box.bind(slots)      # share input/output tensors with the child (CUDA IPC or shared CPU memory)
    box.request("call", slot=0, profile=True)            # one call on slot 0; names of what ran
    box.request("run", order=[0, 1, 2], fn="kernel")     # calls back to back between two device syncs
    box.freeze() / box.thaw()                            # SIGSTOP / SIGCONT everything the child started
    box.close()          # kill every process the child started; returns only when all are gone

Containment:
- The child is ``python .../sandbox/keeper.py``, started in a new session (``start_new_session``): it
  leads its own session and process group. Its first act, before any import, is to fork: the parent half
  is a *keeper* that only waits; the candidate runs in the keeper's child (``serve``).
  ``os.kill(os.getppid(), 9)`` kills the keeper, which the owner notices (``WorkerFailure``: the grade
  fails), not the owner.
- stdin is /dev/null; stdout and stderr go to ``log`` (a file in the owner's temp directory), so the
  candidate's prints never reach the owner's stdout. The cwd is that temp directory.
- The owner makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): a process that the
  candidate double-forks into a new session, once orphaned, becomes the owner's child instead of init's.
  ``members()`` is every process of the child's session, every descendant of the keeper, and every child
  of the owner that the owner did not start itself (with their descendants), read from /proc. ``close``
  stops them all (SIGSTOP, rescanning until no new one appears, so none can fork while being killed),
  SIGKILLs them, reaps them and waits until /proc lists none. Every timeout and every death ends in
  ``close``.
- The child's environment is built in one place, ``child_env`` (``extra_env``: e.g. LD_PRELOAD of an
  interposer library, set before the interpreter starts).
Protocol: multiprocessing ``Connection`` over a socketpair; tensors travel as torch's IPC handles; the
owner's authkey is sent first so shared CPU memory (file descriptors) can cross. Requests are dicts
``{"op": ...}`` (pickled, owner to child only); replies are JSON objects (``_reply``): the owner never
unpickles what the child sends, since unpickling runs code the sender chose; ``{"error": ...}`` when the
candidate raised. (Left: on the CPU the child holds the owner's authkey, so it could connect to the
owner's multiprocessing resource sharer, which unpickles what a client sends; on a GPU tensors cross by
CUDA IPC and no sharer runs.)
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

MAX_REPLY_BYTES = 1 << 24  # a reply longer than this is refused (a child cannot make the owner buffer gigabytes)
PR_SET_CHILD_SUBREAPER = 36
_OWN_CHILDREN: set[int] = set()  # pids of processes the owner started (keepers): never treated as orphans


class WorkerFailure(RuntimeError):
    """The child timed out, died, could not load the kernel, or lost its keeper."""


class CandidateError(RuntimeError):
    """The candidate raised (its process lives on)."""


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _procs() -> dict[int, tuple[int, int]]:
    """{pid: (ppid, session)} of every process /proc lists (zombies included)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
        out[int(d)] = (int(fields[1]), int(fields[3]))
    return out


def _state(pid: int) -> str:
    """The process state letter from /proc (R, S, T, Z, ...); "" when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2]


def _descendants(roots: set[int], procs: dict[int, tuple[int, int]]) -> set[int]:
    found, frontier = set(roots), set(roots)
    while frontier:
        frontier = {p for p, (pp, _) in procs.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def child_env(interpret: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the owner's, this gemmlab first on PYTHONPATH, the interpreter flag, and
    ``extra`` (the one place where LD_PRELOAD and friends are added)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env.update(extra or {})
    return env


class Sandbox:
    def __init__(self, spec: str | None, signature: str, layout: str, timeout: float, interpret: bool,
                 log_dir: str | None = None, extra_env: dict[str, str] | None = None, name: str = "candidate"):
        target, sep, fn = (spec or "").rpartition(":")
        if target.endswith(".py"):  # the child runs in its own directory
            spec = f"{Path(target).resolve()}{sep}{fn}"
        self.spec, self.signature, self.layout = spec, signature, layout
        self.timeout, self.interpret, self.extra_env, self.name = timeout, interpret, extra_env, name
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="gemmlab-grade-")
        self.log = str(Path(self.log_dir) / f"{name}.log")
        self.proc: subprocess.Popen | None = None
        self._hello_by: float | None = None  # loading must be done by then (monotonic clock)
        self.conn: Connection | None = None
        self.starts = 0
        self.failed: str | None = None  # once set, the sandbox is gone for good (loading happens once)

    # ------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the child and load the kernel there, all within ``timeout`` seconds of ``launch``."""
        if self.proc is None:
            self.launch()
        if self._hello_by is not None:
            deadline, self._hello_by = self._hello_by, None
            hello = self._recv(max(0.0, deadline - time.monotonic()), "loading the kernel")
            if not hello.get("ok"):
                self._fail(f"kernel could not be loaded: {hello.get('error')}")

    def launch(self) -> None:
        """Start the child without waiting for it to load (``start`` or the first request waits)."""
        if self.failed:
            raise WorkerFailure(self.failed)
        import multiprocessing

        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        mine, theirs = socket.socketpair()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("keeper.py")), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.log_dir, start_new_session=True,
                env=child_env(self.interpret, self.extra_env))
        theirs.close()
        _OWN_CHILDREN.add(self.proc.pid)
        self.starts += 1
        self.conn = Connection(mine.detach())
        self.conn.send_bytes(bytes(multiprocessing.current_process().authkey))
        self.conn.send({"spec": self.spec, "signature": self.signature, "layout": self.layout,
                        "interpret": self.interpret, "sys_path": list(sys.path)})
        self._hello_by = time.monotonic() + self.timeout


    def request(self, op: str, timeout: float | None = None, **req) -> dict:
        if self.proc is None or self._hello_by is not None:
            self.start()
        try:
            self.conn.send({"op": op, **req})
        except (OSError, ValueError) as e:
            self._fail(f"the {self.name}'s process is gone ({type(e).__name__}: {e}){self.log_tail()}")
        reply = self._recv(timeout or self.timeout, op)
        if self.proc.poll() is not None:  # the keeper died: something in the sandbox killed it
            self._fail(f"the sandbox's keeper process died (exit status {self.proc.returncode}): the candidate "
                       "killed its parent")
        if "error" in reply:
            raise CandidateError(reply["error"])
        return reply

    def bind(self, slots: list) -> None:
        """Share ``slots`` (a list of (inputs tuple, flat output)) with the child; replaces earlier ones."""
        self.request("bind", slots=slots)

    def _recv(self, timeout: float, what: str) -> dict:
        if not self.conn.poll(timeout):
            self._fail(f"no answer within {timeout:g} s ({what}; time limit); the {self.name}'s processes were "
                       "killed")
        try:
            raw = self.conn.recv_bytes(MAX_REPLY_BYTES)
        except (EOFError, OSError) as e:
            code = self.proc.poll()
            self._fail(f"{self.name} process died (keeper exit status {code}; e.g. an illegal memory access or a "
                       f"crash){self.log_tail()}", e)
        # Replies are JSON, never pickles: unpickling runs code the sender chose, in the grader's process.
        try:
            reply = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            self._fail(f"the {self.name} sent a reply that is not JSON ({what})", e)
        if not isinstance(reply, dict):
            self._fail(f"the {self.name} sent a reply that is not a JSON object ({what})")
        return reply

    def _fail(self, reason: str, cause: BaseException | None = None):
        self.failed = reason
        self.close()
        raise WorkerFailure(reason) from cause

    def log_tail(self, chars: int = 600) -> str:
        """The end of the child's output, without the profiler's chatter."""
        try:
            lines = Path(self.log).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        text = "\n".join(line for line in lines if not line.startswith("USDT:"))[-chars:].strip()
        return f"; its output ends: {text}" if text else ""

    # ------------------------------------------------------------------------------------- containment

    def members(self) -> set[int]:
        """Every live process the child started (see the module docstring); empty before start."""
        if self.proc is None:
            return set()
        procs = _procs()
        me, root = os.getpid(), self.proc.pid
        roots = {p for p, (_, sid) in procs.items() if sid == root} | {root}
        strays = {p for p, (pp, _) in procs.items() if pp == me and p not in _OWN_CHILDREN}
        return (_descendants(roots | strays, procs) & set(procs)) - {me}

    def _signal(self, pids: set[int], sig: int) -> None:
        for p in pids:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def freeze(self) -> None:
        """SIGSTOP every process of the sandbox (between its timed batches: no CPU work, no new launches)."""
        self._signal(self.members(), signal.SIGSTOP)

    def thaw(self, wait_s: float = 1.0) -> None:
        """SIGCONT every process of the sandbox, and wait (up to ``wait_s``) until none is stopped, so that
        waking up is not inside the next timed window."""
        pids = self.members()
        self._signal(pids, signal.SIGCONT)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_state(p) == "T" for p in pids):
            time.sleep(0.0005)

    def close(self, graceful: bool = True) -> None:
        """Stop the child and kill everything it started; returns when /proc lists none of them (raises
        WorkerFailure if some survive 10 s of this)."""
        if self.proc is None:
            return
        if graceful and self.failed is None and self.proc.poll() is None:
            try:
                self.thaw()
                self.conn.send({"op": "stop"})
                self.proc.wait(2)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        seen: set[int] = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            live = self.members() - {self.proc.pid} if self.proc.poll() is not None else self.members()
            new = live - seen
            if new:  # stop first, so nothing forks while we look for more
                self._signal(new, signal.SIGSTOP)
                seen |= new
                continue
            self._signal(seen | {self.proc.pid}, signal.SIGKILL)
            self._reap(seen)
            if not (self.members() - {self.proc.pid}):
                break
            time.sleep(0.01)
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._reap(seen)
        if self.conn is not None:
            self.conn.close()
        left = self.members() - {self.proc.pid}
        _OWN_CHILDREN.discard(self.proc.pid)
        self.proc = None
        if left:
            raise WorkerFailure(f"processes started by the candidate outlived the kill: {sorted(left)[:5]}")

    def _reap(self, pids: set[int]) -> None:
        """Collect the exit status of killed processes that became our children (no zombies left)."""
        for p in pids:
            try:
                os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                pass
        deadline = time.monotonic() + 2
        procs = _procs()
        while time.monotonic() < deadline and any(p in procs and procs[p][0] == os.getpid() for p in pids):
            for p in pids:
                try:
                    os.waitpid(p, os.WNOHANG)
                except ChildProcessError:
                    pass
            time.sleep(0.01)
            procs = _procs()


# ======================================================================================= child side


class _Server:
    def __init__(self, spec, signature, layout):
        from gemmlab.sandbox.candidate import load_kernel

        self.signature, self.layout = signature, layout
        self.spec = spec
        self.fn = load_kernel(spec, signature)
        self.slots: list = []

    def bind(self, slots):
        self.slots = slots
        return {}

    def _call(self, i: int):
        from gemmlab.sandbox.candidate import invoke

        inputs, out = self.slots[i]
        return invoke(self.fn, self.signature, self.layout, inputs, out)

    def call(self, slot: int = 0, profile: bool = False):
        """One call, profiled when asked (advisory: the names of the GPU kernels and aten ops that ran)."""
        import torch

        inputs, out = self.slots[slot]
        # poison what the caching allocator hands out next: unwritten elements of a result read as NaN
        del_me = torch.full((out.numel(),), float("nan"), dtype=out.dtype, device=out.device)
        del del_me
        if not profile:
            problem = self._call(slot)
            _sync(out.device)
            return {"problem": problem, "kernels": [], "ops": [], "path": None}
        problem, kernels, ops = _profiled(lambda: self._call(slot), out.device)
        return {"problem": problem, "kernels": kernels, "ops": ops, "path": self._plan_path(inputs, out)}

    def run(self, order: list[int], fn: str = "kernel", flush: bool = False):
        """The calls of a timed batch back to back, between device syncs; the times are advisory. ``flush``:
        an L2 flush before each call (bench; the grader flushes from its own process instead)."""
        from gemmlab.instruments.timing import time_calls

        device = self.slots[0][1].device
        it = iter(order)
        problems: list = []
        if fn == "empty":
            call = lambda: next(it)  # noqa: E731
        else:
            call = lambda: problems.append(self._call(next(it)))  # noqa: E731
        ms = time_calls(call, len(order), device, flush=flush)
        return {"ms": ms, "problem": next((p for p in problems if p), None)}

    def _plan_path(self, inputs, out):
        if self.spec is not None or self.signature == "moe":
            return None
        import gemmlab
        from gemmlab.sandbox.candidate import logical_out

        a, b = inputs
        return gemmlab.plan(a, b, out=logical_out(out, a.shape[0], b.shape[1], self.layout)).path


def _sync(device) -> None:
    from gemmlab.instruments.timing import _sync as sync  # imported here: the child imports nothing before its fork

    sync(device)


def _profiled(call, device):
    """(result, GPU kernel names, aten op names) of ``call``: the profiler on CUDA; on the CPU the legacy
    profiler (kineto takes seconds to start there)."""
    import torch
    from torch.autograd import DeviceType

    if device.type != "cuda":
        from torch.autograd.profiler_legacy import profile

        with profile() as prof:
            out = call()
        return out, [], sorted({e.name for e in prof.function_events if e.name.startswith("aten::")})
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda" and "GEMMLAB_OBSERVER_SOCK" not in os.environ:  # else the kernel observer owns CUPTI
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        out = call()
        _sync(device)
    events = prof.events()
    kernels = sorted({e.name for e in events if e.device_type == DeviceType.CUDA})
    ops = sorted({e.name for e in events if e.name.startswith("aten::")})
    return out, kernels, ops


def serve(fd: int) -> None:
    """The candidate's side: receive the authkey and what to load, load it, answer requests."""
    import multiprocessing
    import traceback

    conn = Connection(fd)
    multiprocessing.current_process().authkey = conn.recv_bytes()
    init = conn.recv()
    sys.path[:] = init["sys_path"]
    import torch.multiprocessing  # noqa: F401  (tensor reductions for the connection)

    try:
        server = _Server(init["spec"], init["signature"], init["layout"])
        _reply(conn, {"ok": True})
    except BaseException as e:  # a kernel that cannot even be loaded
        _reply(conn, {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            return
        op = req.pop("op")
        if op == "stop":
            return
        try:
            reply = getattr(server, op)(**req)
        except BaseException as e:  # the candidate raised: report it, the owner decides
            reply = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        try:
            _reply(conn, reply)
        except Exception as e:  # e.g. the candidate made something that cannot cross the connection
            _reply(conn, {"error": f"reply could not be sent: {type(e).__name__}: {e}"})


def _reply(conn, reply: dict) -> None:
    """Child -> owner: JSON bytes (the owner never unpickles what the child sends)."""
    conn.send_bytes(json.dumps(reply, default=str).encode())
