"""The host's Unix sockets out of the sandbox's reach (``sandbox/sockets.py``): root in the sandbox (the grader's
uid, as with CUDA) connected to a socket bound to a path, which neither the read-only host nor Landlock refuses: a
tmux server's (its ``send-keys`` types into the user's terminal), the system bus's. The keeper's mount namespace now
binds /dev/null over every such socket; without that namespace (``GEMMLAB_SANDBOX_TERMINALS=0``) it is reached."""

import os
import socket
import tempfile
import threading

import pytest

from gemmlab.grade import grade
from gemmlab.sandbox.tool import Tool
from tests.grade.test_grade import TINY
from tests.paths import BAD_KERNELS


def serve(srv: socket.socket, got: list, done: threading.Event) -> None:
    """Accept on ``srv`` until ``done``, keeping what each connection sends first in ``got``."""
    srv.settimeout(1.0)
    while not done.is_set():
        try:
            conn, _ = srv.accept()
        except OSError:
            continue
        conn.settimeout(5.0)
        try:
            got.append(conn.recv(100))
        except OSError:
            pass
        conn.close()


def _graded(tmp_path, monkeypatch, **env) -> tuple[dict, str, bytes]:
    """Grade ``talks_to_a_host_socket`` against a socket the test listens on (root's, mode 0600 in a 0700
    directory, as tmux's); (report, what the kernel noted, what the socket got)."""
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", "0")  # the grader's uid, as with CUDA
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    d = tempfile.mkdtemp(prefix="tmux-")
    path = os.path.join(d, "default")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    os.chmod(path, 0o600)
    srv.listen(4)
    got, done = [], threading.Event()
    t = threading.Thread(target=serve, args=(srv, got, done), daemon=True)
    t.start()
    monkeypatch.setenv("BAD_SOCK", path)
    try:
        r = grade(TINY, kernel=f"{BAD_KERNELS / 'redteam.py'}:talks_to_a_host_socket")
    finally:
        done.set()
        t.join(5)
        srv.close()
        os.unlink(path)
        os.rmdir(d)
    return r, (tmp_path / "socket").read_text().strip(), b"".join(got)


@pytest.mark.parametrize("tool", ["bwrap", "none"])
def test_a_host_socket_is_hidden_from_root_in_the_sandbox(tmp_path, monkeypatch, tool):
    if os.geteuid() != 0:
        pytest.skip("root in the sandbox (a mount namespace of the keeper's own)")
    if tool == "bwrap" and Tool.choose(True).path is None:
        pytest.skip("bubblewrap is not usable here")
    r, noted, got = _graded(tmp_path, monkeypatch, GEMMLAB_SANDBOX_TOOL=tool)
    assert got == b"" and noted != "sent", (noted, got)
    assert r["isolation"]["candidate"]["host_sockets"].split()[0] != "0", r["isolation"]


def test_without_the_mount_namespace_the_same_socket_is_reached(tmp_path, monkeypatch):
    """The control: the same kernel, no mount namespace of the keeper's: the socket gets its line."""
    if os.geteuid() != 0:
        pytest.skip("root in the sandbox, as with CUDA")
    r, noted, got = _graded(tmp_path, monkeypatch, GEMMLAB_SANDBOX_TERMINALS="0", GEMMLAB_SANDBOX_TOOL="none")
    assert noted == "sent" and got.startswith(b"send-keys"), (noted, got)
    assert "host_sockets" not in r["isolation"]["candidate"], r["isolation"]
