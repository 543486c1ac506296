"""What the owner asks the keeper to put in force (``sandbox.keeper`` does it; its first message says what it got,
``Sandbox.isolation``), and the child's environment.

    Isolation.from_env(interpret)   the switches, from the owner's environment (below)
    iso.keeper_args(...)            the keeper's command line for them
    iso.grant(...)                  the owner's part before the keeper starts: what the sandbox's uid must own
    child_env(interpret, extra)     the child's environment

The owner's environment (unset: the default). With CUDA, the four layers of ``PROBED_WITH_CUDA`` whose switch is
unset are the grader's probe's to decide (``grade.probe``: on where gemmlab's own kernel ran under them on this
machine, passed in as ``layers``); without a probe (a sandbox made outside the grader) they are off with CUDA:
- ``GEMMLAB_SANDBOX_LANDLOCK``: a Landlock domain (``keeper.landlock``); unset: on without CUDA, and with CUDA
  where the grader's probe ran CUDA under it (``PROBED_WITH_CUDA``; ``cudaGetDeviceCount`` once failed under it on
  an H200, which writing below /proc, now allowed with CUDA, should mend: ``mounts.PROC_READ_ONLY``), ``1`` on,
  ``0`` off.
- ``GEMMLAB_SANDBOX_SECCOMP``: the seccomp filter (``sandbox.seccomp``); unset or ``1``: on, with CUDA too
  (tests/sandbox/test_isolation.py's GPU test), ``0`` off.
- ``GEMMLAB_SANDBOX_TERMINALS``: the terminals hidden in a mount namespace of the keeper's own (root only:
  ``mounts.namespaces``); unset or ``1``: on, with CUDA too, ``0`` off.
- ``GEMMLAB_SANDBOX_READONLY``: in that namespace, the host read-only but for the scratch directory, ``/dev/shm``
  and the observers' files (``mounts.read_only_host``: those ``nodev``, every device node but the GPU's and the harmless
  ones ``/dev/null``), the candidate without CAP_SYS_PTRACE (``/proc/GRADER/root`` would bypass it): the stand-in for
  Landlock's file rules where Landlock is off;
  unset: on without CUDA, and with CUDA where the probe ran CUDA under it (/proc then stays writable:
  ``mounts.PROC_READ_ONLY``), ``1`` on, ``0`` off.
- ``GEMMLAB_SANDBOX_UID``: a uid of the sandbox's own, where the grader runs as root and there is no CUDA (unset or
  ``1``: on; ``0`` off). With CUDA the sandbox keeps the grader's uid whatever the switch says, and the report says
  why (``CUDA_UID_WHY``): the seccomp filter and the hidden terminals then stand between it and the grader.
  Each sandbox gets an unused uid (no process runs as it, ``/etc/passwd`` names none), owning its scratch directory
  and the observers' files it appends to; it keeps
  ``CAP_DAC_READ_SEARCH`` (read any file, as the grader's root can: the interpreter, torch, the kernel's own
  directory), nothing else: no signal, ptrace, ``prlimit`` or scheduling change reaches a process of another uid,
  no file is written but its own (and world-writable ones), no cgroup is left. A grader that is not root cannot
  give one: the report says "the grader's", and the rest holds.
- ``GEMMLAB_SANDBOX_PIDNS``: ``1``: a PID namespace of its own (root only), with a /proc of its own in the keeper's
  mount namespace: the grader, the other sandbox and every process outside are not in its view; unset or ``0``: off.
- ``GEMMLAB_SANDBOX_NETNS``: a network namespace of its own, loopback only (root only: ``sockets.own_network``;
  bubblewrap's ``--unshare-net``; CAP_NET_ADMIN dropped in it): the host's listeners and abstract Unix sockets out of
  reach; unset: on without CUDA,
  and with CUDA where the probe ran CUDA under it, ``1`` on, ``0`` off.
- ``GEMMLAB_SANDBOX_UNDUMPABLE``: no sandbox holds CAP_SYS_PTRACE, and the grader (while a sandbox lives) and the
  baseline are undumpable (``keeper.no_ptrace``, ``owner.dumpable``): the candidate cannot ptrace them or reach
  their memory (``/proc/PID/mem``, ``process_vm_*``), root and of their uid alike; a candidate that keeps the
  grader's uid (with CUDA) also drops every other capability but CAP_DAC_READ_SEARCH (root without powers over the
  host); unset: on without CUDA, and with CUDA where the probe ran CUDA under it (its IPC included), ``1`` on, ``0``
  off.
- ``GEMMLAB_SANDBOX_TOOL``: ``auto`` (unset), ``bwrap`` or ``none``: the keeper inside bubblewrap where it is
  installed and passes its self-test (``sandbox.tool``; with CUDA only for ``bwrap``), which then gives the new
  session, the hidden terminals (a ``/dev`` of its own) and the PID namespace in place of the keeper's own; the rest
  above still applies inside it.
- ``GEMMLAB_SANDBOX_WRITABLE`` (``os.pathsep``-separated): more directories the sandbox may write below (tests);
  with a uid of its own they are made writable to any user (mode 1777).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from gemmlab.sandbox.tool import Tool
from gemmlab.sandbox.tool import mode as tool_mode

UID_BASE, UID_SPAN = 0x60000000, 1 << 24  # where a sandbox's own uid is drawn from
# with CUDA a sandbox keeps the grader's uid: a process of another uid cannot map the slots' CUDA IPC handles
CUDA_UID_WHY = "with CUDA another uid cannot map the slots' IPC memory (mapping of buffer object failed)"


# with CUDA, where their switch is unset, on where a trusted sandbox ran CUDA under them on this machine (the grader's
# probe, ``grade.probe``), else off; without CUDA on by default
PROBED_WITH_CUDA = (
    "GEMMLAB_SANDBOX_READONLY",
    "GEMMLAB_SANDBOX_UNDUMPABLE",
    "GEMMLAB_SANDBOX_LANDLOCK",
    "GEMMLAB_SANDBOX_NETNS",
)


def _mode(var: str, default: str, interpret: bool, layers: dict[str, bool] | None = None) -> bool:
    """A layer's switch: the owner's environment ("1", "0" or "cpu": on without CUDA only); unset, what ``layers``
    says of it (the probe's decision), else ``default``."""
    mode = os.environ.get(var)
    if mode is None and layers is not None and var in layers:
        return bool(layers[var])
    mode = default if mode is None else mode
    return mode == "1" or (mode == "cpu" and interpret)


def unset_probed() -> tuple[str, ...]:
    """The layers of ``PROBED_WITH_CUDA`` whose switch the owner's environment leaves unset (the probe's to decide)."""
    return tuple(v for v in PROBED_WITH_CUDA if v not in os.environ)


def unused_uid() -> int:
    """A uid no process runs as and ``/etc/passwd`` does not name (drawn at random from a range of its own)."""
    taken = set()
    try:
        taken |= {
            int(line.split(":")[2])
            for line in Path("/etc/passwd").read_text().splitlines()
            if line.count(":") >= 3 and line.split(":")[2].isdigit()
        }
    except OSError:
        pass
    for d in os.listdir("/proc"):
        try:
            if d.isdigit():
                taken.add(os.stat(f"/proc/{d}").st_uid)
        except OSError:
            pass
    while True:
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        if uid not in taken:
            return uid


@dataclass
class Isolation:
    landlock: bool
    seccomp: bool
    pidns: bool
    uid: int | None  # the sandbox's own uid, None: the grader's
    uid_why: str = ""  # why it has none though one was asked for
    terminals: bool = True  # hide the terminals (a mount namespace of the keeper's own, where it is root)
    tool: Tool = Tool(None, why="not asked for")  # bubblewrap around the keeper, or none (``tool.why`` says why)
    read_only: bool = True  # in that namespace, the host read-only but for the sandbox's own paths
    undumpable: bool = True  # no CAP_SYS_PTRACE in the sandbox; the grader (and a trusted sandbox) undumpable
    cuda: bool = False  # the sandbox runs CUDA: /proc stays writable to it (``mounts.PROC_READ_ONLY`` says why)
    netns: bool = False  # a network namespace of its own: the host's listeners and abstract sockets out of reach

    @classmethod
    def from_env(cls, interpret: bool, observed: bool = False, layers: dict[str, bool] | None = None) -> Isolation:
        """The switches; ``observed``: the kernel observer (CUPTI injection) is loaded into the sandbox, whose
        channel is the keeper's, inherited by fork, so it cannot cross bubblewrap's exec: no tool then; ``layers``:
        {switch: on} for switches the environment leaves unset (the grader's probe with CUDA, ``grade.probe``)."""
        uid, why = None, ""
        if _mode("GEMMLAB_SANDBOX_UID", "1", interpret):
            if not interpret:
                why = CUDA_UID_WHY
            elif os.geteuid() == 0:
                uid = unused_uid()
            else:
                why = "the grader is not root"
        pidns = _mode("GEMMLAB_SANDBOX_PIDNS", "0", interpret)
        netns = _mode("GEMMLAB_SANDBOX_NETNS", "cpu", interpret, layers)
        return cls(
            _mode("GEMMLAB_SANDBOX_LANDLOCK", "cpu", interpret, layers),
            _mode("GEMMLAB_SANDBOX_SECCOMP", "1", interpret),
            pidns,
            uid,
            why,
            _mode("GEMMLAB_SANDBOX_TERMINALS", "1", interpret),
            Tool(None, why="bubblewrap not used: the kernel observer's channel cannot cross it yet")
            if observed and tool_mode() != "none"
            else Tool.choose(interpret, pidns, netns),
            _mode("GEMMLAB_SANDBOX_READONLY", "cpu", interpret, layers),
            _mode("GEMMLAB_SANDBOX_UNDUMPABLE", "cpu", interpret, layers),
            cuda=not interpret,
            netns=netns,
        )

    def keeper_args(
        self, writable: list[str], cgroup: str | None, files: list[str] = (), trusted: bool = False
    ) -> list[str]:
        """The keeper's arguments; ``writable[0]`` is the scratch directory, ``files`` those it appends to (bound
        writable inside bubblewrap); ``trusted``: the baseline's (undumpable, where that layer is on)."""
        wrap = self.tool.path is not None
        return (
            (["--cgroup", cgroup] if cgroup else [])
            + (
                [
                    "--wrap",
                    json.dumps(self.tool.argv(*(writable[:1] or [""]), writable[1:], list(files))),
                    "--tool",
                    self.tool.name,
                ]
                + (["--tool-pidns"] if self.tool.pidns else [])
                + (["--tool-netns"] if self.tool.netns else [])
                if wrap
                else ["--tool-why", self.tool.why]
            )
            + ([a for d in writable for a in ("--writable", d)] if self.landlock or self.read_only else [])
            + (["--landlock"] if self.landlock else [])
            + (["--read-only", *[a for f in files for a in ("--file", f)]] if self.read_only and not wrap else [])
            + (
                ["--no-ptrace"]
                + (["--undumpable"] if trusted and self.undumpable else [])
                + (["--trusted"] if trusted else ["--every"] if self.undumpable else [])
                if self.undumpable or self.read_only or wrap  # a read-only host: /proc/PID/root would bypass it
                else []
            )
            + (["--uid", str(self.uid)] if self.uid is not None else [])
            + (["--uid-why", self.uid_why] if self.uid_why else [])
            + (["--seccomp", str(os.getpid()), str(os.getpgid(0))] if self.seccomp else [])
            + (["--pidns"] if self.pidns and not wrap else [])
            + (["--netns"] if self.netns and not wrap else [])
            + (["--hide-terminals"] if self.terminals and not wrap else [])
            + (["--cuda"] if self.cuda else [])
        )

    def grant(self, log_dir: str, scratch: Path, writable: list[str], env: dict[str, str]) -> None:
        """With a uid of its own: the sandbox can reach its scratch directory (the log directory searchable, not
        listable) and owns it, the observers' files it appends to (created empty where missing), their sockets;
        the ``writable`` directories are open to any user."""
        if self.uid is None:
            return
        os.chmod(log_dir, 0o711)
        os.chown(scratch, self.uid, self.uid)
        for var in OBSERVER_FILES:
            path = env.get(var)
            if path and var != "GEMMLAB_OBSERVER_SOCK" and not os.path.exists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            if path and os.path.exists(path) and not os.path.islink(path):
                os.chown(path, self.uid, self.uid)
        for d in writable:
            if os.path.isdir(d):
                os.chmod(d, 0o1777)


OBSERVER_FILES = ("GEMMLAB_VENDOR_LOG", "GEMMLAB_VENDOR_COUNTS", "GEMMLAB_OBSERVER_SOCK")  # the sandbox writes these


def appended(env: dict[str, str]) -> list[str]:
    """The observers' files (and socket) a sandbox with environment ``env`` writes by path."""
    return [env[v] for v in OBSERVER_FILES if env.get(v)]


def child_env(interpret: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the owner's, this gemmlab first on PYTHONPATH, the interpreter flag, and
    ``extra`` (the one place where LD_PRELOAD and friends are added). Without CUDA both sides compute on one CPU
    thread (torch's and the BLAS's pools of one): a main thread that waits on a pool sleeps, and on a busy machine
    that sleep read as the baseline held off the CPU (the off-CPU check, ``HELD_MS``)."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.pop("TRITON_INTERPRET", None)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
        env.update({v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    env.update(extra or {})
    return env
