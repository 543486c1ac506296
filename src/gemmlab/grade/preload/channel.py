"""The grader's end of ``kernel_observer.so``'s channel: a unix socket the child's library connects to before
its interpreter starts, blocks of text lines each closed by a chained SipHash-2-4 MAC, and one request,
"flush <nonce>", answered by an ``Epoch``: every kernel name the process ran or launched since the last
answer, with counts and the observer's health. The block format is in ``kernel_observer.c``.

    ch = Channel(path)                       # listens at path (mode 0600) with a fresh key
    env = ch.env(lib, cupti)                 # what the child needs (LD_PRELOAD is the caller's to join)
    ... start the child ...
    ep = ch.epoch(keeper_pid, timeout=10)    # never raises: what went wrong is in ep.problems

Once a problem is seen (no answer, a MAC that does not verify, the socket closed, a block out of order) the
channel is failed for good: later epochs carry the same problem, since nothing after it can be trusted.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from gemmlab.sandbox import contain

MASK = (1 << 64) - 1
MAX_PENDING_BYTES = 64 << 20  # a channel that sends this much without closing a block is failed


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def _rounds(v: list[int], n: int) -> None:
    for _ in range(n):
        v[0] = (v[0] + v[1]) & MASK
        v[1] = _rotl(v[1], 13) ^ v[0]
        v[0] = _rotl(v[0], 32)  # noqa: E702
        v[2] = (v[2] + v[3]) & MASK
        v[3] = _rotl(v[3], 16) ^ v[2]  # noqa: E702
        v[0] = (v[0] + v[3]) & MASK
        v[3] = _rotl(v[3], 21) ^ v[0]  # noqa: E702
        v[2] = (v[2] + v[1]) & MASK
        v[1] = _rotl(v[1], 17) ^ v[2]
        v[2] = _rotl(v[2], 32)  # noqa: E702


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 of ``data`` under a 16-byte ``key`` (Aumasson and Bernstein), as a 64-bit integer."""
    k0, k1 = struct.unpack("<QQ", key)
    v = [0x736F6D6570736575 ^ k0, 0x646F72616E646F6D ^ k1, 0x6C7967656E657261 ^ k0, 0x7465646279746573 ^ k1]
    whole = len(data) - len(data) % 8
    for (m,) in struct.iter_unpack("<Q", data[:whole]):
        v[3] ^= m
        _rounds(v, 2)
        v[0] ^= m
    b = (len(data) & 0xFF) << 56 | int.from_bytes(data[whole:], "little")
    v[3] ^= b
    _rounds(v, 2)
    v[0] ^= b
    v[2] ^= 0xFF
    _rounds(v, 4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


class Reader:
    """Blocks out of the channel's bytes, each checked against the MAC chain; ``failed`` says why it stopped."""

    def __init__(self, key: bytes):
        self.key, self.chain, self.pending, self.failed = key, 0, b"", None
        self.lines: list[bytes] = []

    def feed(self, data: bytes) -> list[list[str]]:
        self.pending += data
        blocks = []
        while self.failed is None:
            nl = self.pending.find(b"\n")
            if nl < 0:
                if len(self.pending) > MAX_PENDING_BYTES:
                    self.failed = "the observer's channel sent a line longer than 64 MiB"
                break
            line, self.pending = self.pending[: nl + 1], self.pending[nl + 1 :]
            if not line.startswith(b"mac "):
                self.lines.append(line)
                if sum(map(len, self.lines)) > MAX_PENDING_BYTES:
                    self.failed = "the observer's channel sent a block longer than 64 MiB"
                continue
            body = b"".join(self.lines)
            self.lines = []
            want = siphash24(self.key, self.chain.to_bytes(8, "little") + body)
            if line.strip() != f"mac {want:016x}".encode():
                self.failed = (
                    "records on the observer's channel that the observer did not write (their MAC does "
                    "not verify): forged or garbled"
                )
                break
            self.chain = want
            blocks.append(body.decode("ascii", "replace").splitlines())
        return blocks


@dataclass
class Epoch:
    """One answer: ``names`` maps a kernel name to (ran, ran in a graph, launched), counted since the
    previous answer; ``totals`` the "n" line (counts since the previous answer, losses since the start);
    ``refused`` CUPTI control calls the library answered without passing on; ``problems``: why this
    answer, or the channel, cannot be trusted (empty when it can)."""

    seq: int = 0
    pid: int = 0
    names: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _pairs(words: list[str]) -> dict[str, int]:
    out = {}
    for w in words:
        k, sep, v = w.partition("=")
        if sep:
            try:
                out[k] = int(v)
            except ValueError:
                continue
    return out


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _status_ids(pid: int) -> tuple[int | None, list[int]]:
    """(parent pid, the NSpid chain: its pid in each PID namespace, outermost first) of ``pid`` from /proc."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None, []
    ppid, chain = None, []
    for line in lines:
        key, _, value = line.partition(":")
        if key == "PPid" and value.strip().isdigit():
            ppid = int(value)
        elif key == "NSpid":
            chain = [int(v) for v in value.split() if v.isdigit()]
    return ppid, chain


def in_sandbox(pid: int, keeper: int) -> bool:
    """Whether ``pid``, as a process of the sandbox reported it, is the keeper, its child, or (in a PID namespace of
    the sandbox's own, where getpid() is the namespace's number) a child or grandchild of the keeper whose innermost
    pid is ``pid``: the namespace's first process and the worker it forks."""
    if pid == keeper or _ppid(pid) == keeper:
        return True
    table = contain.procs()
    kids = [p for p, (ppid, _) in table.items() if ppid == keeper]
    for host in kids + [p for p, (ppid, _) in table.items() if ppid in kids]:
        _, chain = _status_ids(host)
        if len(chain) > 1 and chain[-1] == pid:
            return True
    return False


class Channel:
    def __init__(self, path: str | os.PathLike):
        self.path, self.key = str(path), secrets.token_bytes(16)
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(8)
        self.conn: socket.socket | None = None
        self.reader = Reader(self.key)
        self.loaded: int | None = None  # the pid whose constructor connected (the keeper)
        self.hello: dict | None = None  # InitializeInjection's report: pid and CUPTI's answers
        self.failed: str | None = None
        self.seq = 0
        self.strangers: list[int] = []  # pids of other processes that connected

    def env(self, lib: str | os.PathLike, cupti: str | None) -> dict[str, str]:
        """The child's settings; ``lib`` must also be in its LD_PRELOAD (the caller joins that list)."""
        out = {
            "CUDA_INJECTION64_PATH": str(lib),
            "GEMMLAB_OBSERVER_SOCK": self.path,
            "GEMMLAB_OBSERVER_TOKEN": self.key.hex(),
        }
        if cupti:
            out["GEMMLAB_OBSERVER_CUPTI"] = cupti
        return out

    def close(self) -> None:
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()
        self.conn = self.listener = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    def _fail(self, why: str) -> Epoch:
        self.failed = self.failed or why
        return Epoch(problems=[self.failed])

    def _accept(self, keeper: int, deadline: float) -> bool:
        """The keeper's connection (made by its constructor before any candidate code ran); others are noted."""
        while self.conn is None and self.listener is not None:
            self.listener.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                return False
            pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            if pid == keeper:
                self.conn = conn
                self.listener.close()
                self.listener = None
                os.unlink(self.path)  # nobody else can connect now
            else:
                self.strangers.append(pid)
                conn.close()
        return self.conn is not None

    def _take(self, block: list[str], keeper: int, nonce: str) -> Epoch | None:
        """Account for one verified block; the epoch if it answers ``nonce``."""
        head = block[0].split() if block else [""]
        if head[0] == "loaded" and self.loaded is None and len(head) == 2 and head[1] == str(keeper):
            self.loaded = keeper
        elif head[0] == "hello" and self.hello is None and self.loaded is not None and len(head) > 1:
            pid = int(head[1]) if head[1].isdigit() else -1
            if not in_sandbox(pid, keeper):
                self._fail(f"the observer started in pid {pid}, which is not the sandbox's process")
            self.hello = {"pid": pid, **_pairs(head[2:]), "lib": head[-1].partition("lib=")[2]}
        elif head[0] == "epoch" and self.hello is not None and len(head) == 4:
            ep = Epoch(seq=int(head[1]) if head[1].isdigit() else -1, pid=int(head[2]) if head[2].isdigit() else -1)
            if ep.seq != self.seq + 1 or ep.pid != self.hello["pid"] or head[3] != nonce:
                self._fail(f"an answer out of order (epoch {head[1]} of pid {head[2]} for {head[3]!r})")
                return None
            self.seq = ep.seq
            for line in block[1:]:
                f = line.split(" ", 4)
                if f[0] == "k" and len(f) == 5 and all(x.isdigit() for x in f[1:4]):
                    ep.names[f[4]] = (int(f[1]), int(f[2]), int(f[3]))
                elif f[0] == "r" and len(f) == 3 and f[2].isdigit():
                    ep.refused[f[1]] = int(f[2])
                elif f[0] == "n":
                    ep.totals = _pairs(line.split()[1:])
            return ep
        else:
            self._fail(f"an unexpected block on the observer's channel: {block[0][:80] if block else ''!r}")
        return None

    def epoch(self, keeper: int | None, timeout: float = 10.0) -> Epoch:
        """Ask the child for everything since the last answer; wait up to ``timeout`` seconds."""
        if self.failed:
            return Epoch(problems=[self.failed])
        if keeper is None:
            return self._fail("the sandbox's process is gone")
        deadline = time.monotonic() + timeout
        if not self._accept(keeper, deadline):
            return self._fail("the observer library never connected (not loaded in the sandbox's process)")
        nonce = secrets.token_hex(8)
        try:
            self.conn.sendall(f"flush {nonce}\n".encode(), socket.MSG_NOSIGNAL)
        except OSError as e:
            return self._fail(f"the observer's channel is closed ({type(e).__name__})")
        while time.monotonic() < deadline:
            self.conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.conn.recv(1 << 20)
            except TimeoutError:
                break
            except OSError as e:
                return self._fail(f"the observer's channel failed ({type(e).__name__})")
            if not data:
                return self._fail("the observer's channel was closed in the candidate's process")
            for block in self.reader.feed(data):
                ep = self._take(block, keeper, nonce)
                if self.failed:
                    return Epoch(problems=[self.failed])
                if ep is not None:
                    return ep
            if self.reader.failed:
                return self._fail(self.reader.failed)
        if self.hello is None:
            return self._fail(
                f"the observer never started in the candidate's process (no answer within {timeout:g} s:"
                " CUDA_INJECTION64_PATH removed, or CUDA not initialized)"
            )
        return self._fail(
            f"the observer did not answer within {timeout:g} s (its thread was stopped or its channel taken over)"
        )


__all__ = ["Channel", "Epoch", "Reader", "siphash24"]
