"""The host's Unix sockets hidden from the sandbox (standard library only: ``keeper.py`` loads this file by path).

Root in the sandbox (the grader's uid, with CUDA by default) may connect to any socket bound to a path: neither a
read-only mount nor Landlock's file rules refuse ``connect``. Such a socket may be a terminal's (tmux's or
screen's server: ``send-keys`` types into the user's terminal), the system bus's (systemd starts a process outside
every sandbox, root with all its capabilities) or a container daemon's. In the keeper's own mount namespace (root),
before any candidate code exists, ``/dev/null`` is bound over every socket path the kernel lists as bound
(``/proc/net/unix``), but those the sandbox must reach (the kernel observer's socket, ``keep``) and the GPU
driver's daemons' (a path with "nvidia" in it): a connect there is then refused. Abstract sockets are Landlock's
(``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET``); a socket bound after the keeper started is not hidden.

    to_hide(keep)    the socket paths to hide (``sandbox.tool`` binds /dev/null over them in bubblewrap too)
    hide(keep)       hides them in the keeper's own mount namespace; returns what the report says"""

from __future__ import annotations

import ctypes
import os
import stat

MS_BIND = 4096


def bound_paths() -> set[str]:
    """Every path a Unix socket of this network namespace is bound to (abstract names aside)."""
    try:
        with open("/proc/net/unix") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return set()
    return {r.split()[7] for r in rows if len(r.split()) >= 8 and r.split()[7].startswith("/")}


def to_hide(keep) -> list[str]:
    """The bound socket paths in this mount namespace's view but ``keep`` and the GPU driver's daemons'."""
    kept = {os.path.realpath(k) for k in keep if k}
    out = []
    for path in sorted(bound_paths()):
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode) and os.path.realpath(path) not in kept and "nvidia" not in path:
                out.append(path)
        except OSError:
            pass  # not in this mount namespace's view
    return out


def hide(keep) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    hidden, left = 0, []
    for path in to_hide(keep):
        if libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None) == 0:
            hidden += 1
        else:
            left.append(f"{path} ({os.strerror(ctypes.get_errno())})")
    return f"{hidden} hidden" + (f"; still reachable: {', '.join(left[:3])}" if left else "")
