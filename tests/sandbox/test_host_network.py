"""The host's network out of the sandbox's reach (``sockets.own_network``, ``GEMMLAB_SANDBOX_NETNS``): root in the
sandbox (the grader's uid, as with CUDA) connected to listeners that no path names, where neither the hidden socket
paths nor a read-only host can stand in the way: an abstract Unix socket (an X server's, a daemon's; Landlock's
scope refuses it only from Linux 6.12 and, with CUDA, only where Landlock is asked for) and a TCP port on the
loopback (a notebook server's, a TCPStore's). A network namespace of the sandbox's own refuses both, in the keeper's
namespaces and in bubblewrap; without it both get their line."""

import os
import secrets
import socket
import threading

import pytest

from gemmlab.grade import grade
from gemmlab.sandbox.tool import Tool
from tests.grade.test_grade import TINY, passed
from tests.paths import BAD_KERNELS
from tests.sandbox.test_host_sockets import serve


def _graded(tmp_path, monkeypatch, **env) -> tuple[dict, dict[str, str], bytes]:
    """Grade ``reaches_a_listener`` against an abstract socket and a loopback port the test listens on; (report,
    what the kernel noted per target, what the listeners got)."""
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", "0")  # the grader's uid, as with CUDA
    monkeypatch.setenv("GEMMLAB_SANDBOX_LANDLOCK", "0")  # as with CUDA by default: no scope on abstract sockets
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    name = f"gemmlab-test-{secrets.token_hex(8)}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0" + name.encode())
    tcp = socket.socket(socket.AF_INET)
    tcp.bind(("127.0.0.1", 0))
    got, done = [], threading.Event()
    threads = []
    for srv in (abstract, tcp):
        srv.listen(4)
        threads.append(threading.Thread(target=serve, args=(srv, got, done), daemon=True))
        threads[-1].start()
    monkeypatch.setenv("BAD_ABSTRACT", name)
    monkeypatch.setenv("BAD_TCP_PORT", str(tcp.getsockname()[1]))
    try:
        r = grade(TINY, kernel=f"{BAD_KERNELS / 'redteam.py'}:reaches_a_listener")
    finally:
        done.set()
        for t in threads:
            t.join(5)
        abstract.close()
        tcp.close()
    lines = (tmp_path / "listeners").read_text().splitlines()
    return r, dict(line.split(" ", 1) for line in lines), b"".join(got)


@pytest.mark.parametrize("tool", ["bwrap", "none"])
def test_the_hosts_listeners_are_out_of_reach_of_root_in_the_sandbox(tmp_path, monkeypatch, tool):
    if os.geteuid() != 0:
        pytest.skip("root in the sandbox (a network namespace of the keeper's own)")
    if tool == "bwrap" and Tool.choose(True, netns=True).path is None:
        pytest.skip("bubblewrap is not usable here")
    r, noted, got = _graded(tmp_path, monkeypatch, GEMMLAB_SANDBOX_TOOL=tool)
    assert got == b"", (noted, got)
    assert set(noted) == {"abstract", "tcp"} and "sent" not in noted.values(), noted
    assert r["isolation"]["candidate"]["network"].startswith("own ("), r["isolation"]
    assert r["isolation"]["baseline"]["network"].startswith("own ("), r["isolation"]
    assert passed(r), (r["verdict"], r["failures"])


def test_without_a_network_namespace_both_listeners_are_reached(tmp_path, monkeypatch):
    """The control: the same kernel with ``GEMMLAB_SANDBOX_NETNS=0``: both listeners get their line."""
    if os.geteuid() != 0:
        pytest.skip("root in the sandbox, as with CUDA")
    r, noted, got = _graded(tmp_path, monkeypatch, GEMMLAB_SANDBOX_NETNS="0", GEMMLAB_SANDBOX_TOOL="none")
    assert noted == {"abstract": "sent", "tcp": "sent"}, noted
    assert got.count(b"run something for me") == 2, got
    assert "network" not in r["isolation"]["candidate"], r["isolation"]
