"""A well-kept sandboxing tool around the keeper, where one is installed: bubblewrap (``bwrap``). The hand-written
containment (``sandbox.keeper``) stays the fallback, and what runs inside the tool still applies its own layers
(Landlock, a uid of its own, the seccomp filter), so the tool only adds.

    mode()                               GEMMLAB_SANDBOX_TOOL, checked (ValueError)
    Tool.choose(interpret, pidns)        the tool in force for a new sandbox, or the hand-written path and why
    tool.argv(scratch, writable, files)  bwrap's command line for one sandbox (the keeper execs it, ``keeper.py``)

``GEMMLAB_SANDBOX_TOOL`` (the owner's environment): unset or ``auto``: bubblewrap where it is installed and passes
its self-test, without CUDA only (it has not run on a GPU yet); ``bwrap``: bubblewrap with CUDA too; ``none``: the
hand-written path. Any other value is a ValueError. nsjail is not used (not packaged where this was built).

What bubblewrap puts in force for the keeper and everything it starts:
- a new session (``--new-session``: no controlling terminal, so no TIOCSTI even without the filter), killed when
  the grader dies (``--die-with-parent``);
- a mount namespace whose root is the host's, read-only; writable only the sandbox's scratch directory, the
  ``GEMMLAB_SANDBOX_WRITABLE`` directories (tests) and the observers' files it appends to (``$TMPDIR`` is the
  scratch directory);
- a ``/dev`` of its own (null, zero, random, a ``/dev/pts`` of its own: no terminal of the user's can be opened),
  with the GPU's device nodes bound where CUDA is in use;
- UTS and IPC namespaces of its own (IPC without CUDA only: CUDA IPC between the grader and the child is unverified
  across one), a PID namespace of its own where ``GEMMLAB_SANDBOX_PIDNS=1`` asks for one (as for the keeper's own:
  ``sandbox.isolate``), and a ``/proc`` of its own.
The cgroup is joined before bubblewrap starts (the keeper writes its pid, then execs it), so bubblewrap's own
processes are inside it too."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from gemmlab.sandbox.sockets import to_hide

MODES = ("auto", "bwrap", "none")
GPU_NODES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")
SELF_TEST_S = 60.0  # a self-test that takes longer (a loaded machine) counts as failed


def mode() -> str:
    """``GEMMLAB_SANDBOX_TOOL`` (``auto`` when unset); ValueError naming it for any other value than ``MODES``."""
    mode = os.environ.get("GEMMLAB_SANDBOX_TOOL", "auto") or "auto"
    if mode not in MODES:
        raise ValueError(f"GEMMLAB_SANDBOX_TOOL must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


@functools.cache
def version(path: str) -> str | None:
    """bubblewrap's ``--version`` line ("bubblewrap 0.8.0"); None when it does not answer."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=SELF_TEST_S)
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    return line[:80] if line.startswith("bubblewrap") else None


@dataclass(frozen=True)
class Tool:
    """bubblewrap at ``path`` (None: the hand-written path, ``why`` says why), and the namespaces it unshares."""

    path: str | None
    name: str = "hand-written"
    why: str = ""
    cuda: bool = False
    pidns: bool = False
    netns: bool = False

    @classmethod
    def choose(cls, interpret: bool, pidns: bool = False, netns: bool = False) -> Tool:
        """The tool for a sandbox: ``interpret`` is True without CUDA; ``pidns`` and ``netns`` whether a PID and a
        network namespace are asked for (``GEMMLAB_SANDBOX_PIDNS``, ``GEMMLAB_SANDBOX_NETNS``). ValueError for an
        unknown ``GEMMLAB_SANDBOX_TOOL``."""
        asked = mode()
        if asked == "none":
            return cls(None, why="off (GEMMLAB_SANDBOX_TOOL=none)")
        if asked == "auto" and not interpret:
            return cls(None, why="bubblewrap not used with CUDA unless GEMMLAB_SANDBOX_TOOL=bwrap")
        path = shutil.which("bwrap")
        if path is None:
            return cls(None, why="bubblewrap not installed")
        name = version(path)
        if name is None:
            return cls(None, why=f"{path} --version did not answer")
        tool = cls(path, name, cuda=not interpret, pidns=pidns, netns=netns)
        failed = self_test(tool)
        return tool if failed is None else cls(None, why=f"{name} failed its self-test ({failed})")

    def argv(self, scratch: str, writable: list[str], files: list[str]) -> list[str]:
        """bwrap's command line (up to its ``--``) for one sandbox: ``scratch`` and ``writable`` directories and
        ``files`` bound writable, everything else of the host read-only."""
        assert self.path is not None
        args = [self.path, "--die-with-parent", "--new-session", "--unshare-uts"]
        args += (["--unshare-ipc"] if not self.cuda else []) + (["--unshare-pid"] if self.pidns else [])
        args += ["--unshare-net"] if self.netns else []
        args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        if self.cuda:  # the GPU's device nodes, and the host's shared memory (CUDA IPC)
            nodes = sorted({f for p in GPU_NODES for f in glob.glob(p)})
            args += [a for f in nodes for a in ("--dev-bind", f, f)] + ["--bind", "/dev/shm", "/dev/shm"]
        for d in [scratch, *writable]:
            if os.path.isdir(d):
                args += ["--bind", d, d]
        for f in files:
            if os.path.exists(f) and not os.path.islink(f):
                args += ["--bind", f, f]
        for sock in to_hide(files):  # the host's Unix sockets (a tmux server's, D-Bus's): ``sandbox.sockets``
            args += ["--ro-bind", "/dev/null", sock]
        return args


@functools.cache
def _self_test(tool: Tool) -> str | None:
    with tempfile.TemporaryDirectory(prefix="gemmlab-bwrap-") as d:
        probe = os.path.join(d, "probe")
        check = (
            f"open({probe!r}, 'w').write('ok'); "  # and no controlling terminal (tty_nr 0)
            "assert open('/proc/self/stat').read().rsplit(')')[-1].split()[4] == '0'"
        )
        cmd = tool.argv(d, [], []) + ["--", sys.executable, "-S", "-c", check]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=SELF_TEST_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            return f"{type(e).__name__}: {e}"
        if out.returncode != 0 or not os.path.exists(probe):
            tail = " ".join((out.stderr or "").split())[-200:]
            return f"exit status {out.returncode}" + (f": {tail}" if tail else "")
    return None


def self_test(tool: Tool) -> str | None:
    """Run a Python under ``tool``'s options once per process (cached): None when it started, wrote its scratch
    directory and had no controlling terminal; else why not."""
    return _self_test(tool)
