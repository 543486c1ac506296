"""The host's Unix sockets hidden from the sandbox (standard library only: ``keeper.py`` loads this file by path).

Root in the sandbox (the grader's uid, with CUDA by default) may connect to any socket bound to a path: neither a
read-only mount nor Landlock's file rules refuse ``connect``. Such a socket may be a terminal's (tmux's or
screen's server: ``send-keys`` types into the user's terminal), the system bus's (systemd starts a process outside
every sandbox, root with all its capabilities) or a container daemon's. In the keeper's own mount namespace (root),
before any candidate code exists, ``/dev/null`` is bound over every socket path the kernel lists as bound
(``/proc/net/unix``), but those the sandbox must reach (the kernel observer's socket, ``keep``) and the GPU
driver's daemons' (a path with "nvidia" in it): a connect there is then refused. A socket bound after the keeper
started is not hidden.

What no path names, a network namespace of the sandbox's own takes out of reach (``own_network``, root only): the
host's abstract Unix sockets (an X server's, some daemons'; also Landlock's scope, which CUDA may not have) and
every listener on the host's loopback and interfaces (a notebook server's, a TCPStore's, a debugger's port). A
socket bound to a path is still reached across network namespaces: the observer's (kept), and the ones hidden above.
Root keeps CAP_NET_ADMIN over every network namespace it can name by a pid (rtnetlink makes a link in the host's), so
the keeper drops it once in a namespace of its own (``keeper.drop_caps``).

    to_hide(keep)    the socket paths to hide (``sandbox.tool`` binds /dev/null over them in bubblewrap too)
    hide(keep)       hides them in the keeper's own mount namespace; returns what the report says
    own_network()    a network namespace of its own, loopback up; returns what the report says"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import stat
import struct

MS_BIND = 4096
CLONE_NEWNET = 0x40000000
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40


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


def own_network() -> str:
    """This process (the keeper, before any candidate code exists) in a new network namespace with only a loopback,
    brought up so that the candidate's own local sockets work: nothing of the host's network is in reach. Needs
    CAP_SYS_ADMIN (root); else the report says why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return f"the host's (unshare: {os.strerror(ctypes.get_errno())})"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))
    except OSError as e:
        return f"own (loopback down: {e.strerror})"
    return "own (loopback only: the host's listeners and abstract sockets out of reach)"
