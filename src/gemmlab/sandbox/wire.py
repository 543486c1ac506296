"""The sandbox's one channel: JSON messages over the owner's socketpair, file descriptors beside them (SCM_RIGHTS).

    send(sock, {"op": "bind", ...}, fds=[3, 4])     # a 4-byte length, then that many bytes of JSON
    msg, fds = recv(sock, timeout, limit, max_fds)  # a dict, and the descriptors that came with it

Nothing on this channel is pickled, either way: unpickling runs code the sender chose, so the owner (the grader)
never unpickles what the child sends, and the child needs no secret of the owner's (no multiprocessing authkey:
none is sent, and no multiprocessing listener, the resource sharer included, is started for the child).
The owner receives with ``max_fds=0``: descriptors a hostile child attaches are closed by the kernel unread.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time

HEADER = struct.Struct("<I")
MAX_FDS = 253  # SCM_MAX_FD: the kernel's limit of descriptors in one message


class WireError(RuntimeError):
    """The peer closed the channel, sent something that is not a JSON object, too much, or not in time."""


def send(sock: socket.socket, msg: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
    """One message: its length and descriptors in one sendmsg, then its JSON body."""
    body = json.dumps(msg, default=str).encode()
    if len(fds) > MAX_FDS:
        raise ValueError(f"{len(fds)} file descriptors in one message: at most {MAX_FDS}")
    head = HEADER.pack(len(body))
    if fds:
        sent = socket.send_fds(sock, [head], list(fds))
        sock.sendall(head[sent:] + body)
    else:
        sock.sendall(head + body)


def _wait(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([sock], [], [], left)[0]:
        raise TimeoutError


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        _wait(sock, deadline)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def recv(sock: socket.socket, timeout: float | None, limit: int, max_fds: int = 0) -> tuple[dict, list[int]]:
    """One message within ``timeout`` seconds (the whole of it, not only its first byte; None: no limit): (the JSON
    object, the descriptors sent with it). Raises TimeoutError, EOFError (the peer is gone) or WireError (too long,
    not JSON, not an object)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    fds: list[int] = []
    _wait(sock, deadline)
    if max_fds:
        head, fds, _, _ = socket.recv_fds(sock, HEADER.size, max_fds)
    else:
        head = sock.recv(HEADER.size)
    if not head:
        raise EOFError
    try:
        head += _read(sock, HEADER.size - len(head), deadline)
        (n,) = HEADER.unpack(head)
        if n > limit:
            raise WireError(f"a message of {n} bytes (at most {limit})")
        body = _read(sock, n, deadline)
        try:
            msg = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested too deep
            raise WireError("a message that is not JSON") from e
        if not isinstance(msg, dict):
            raise WireError(f"a message that is not a JSON object ({type(msg).__name__})")
    except BaseException:
        for fd in fds:
            _close(fd)
        raise
    return msg, fds


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
