"""Root of the grader's uid (the candidate with CUDA) holds no capability but CAP_DAC_READ_SEARCH
(``keeper.no_ptrace(every=True)``, with the undumpable layer): without it, root in the sandbox could power the host
off (``reboot``), run the grader's monotonic clock up to 10% slow or fast (``adjtimex``'s tick: a timing attack on
every CPU grade), open the host's disk raw through a device node of its own (``mknod``), do port I/O, swap off, load
a module. ``redteam.py:uses_root_powers`` tries the first three in ways that change nothing (a wrong magic number, a
tick out of range, /dev/null's numbers), where the kernel's answer still tells whether the capability was held; its
control holds them all."""

import ast
import os

import pytest

from gemmlab.grade import grade
from gemmlab.sandbox import keeper
from gemmlab.sandbox.tool import Tool
from tests.grade.test_grade import TINY, passed
from tests.paths import BAD_KERNELS


def _graded(tmp_path, monkeypatch, **env) -> tuple[dict, dict[str, str]]:
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", "0")  # the grader's uid, as with CUDA
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = grade(TINY, kernel=f"{BAD_KERNELS / 'redteam.py'}:uses_root_powers")
    lines = (tmp_path / "powers").read_text().splitlines()
    return r, dict(line.split(" ", 1) for line in lines)


@pytest.mark.parametrize("tool", ["bwrap", "none"])
def test_root_of_the_graders_uid_has_no_power_over_the_host(tmp_path, monkeypatch, tool):
    if os.geteuid() != 0:
        pytest.skip("root in the sandbox, as with CUDA")
    if tool == "bwrap" and Tool.choose(True).path is None:
        pytest.skip("bubblewrap is not usable here")
    r, tried = _graded(tmp_path, monkeypatch, GEMMLAB_SANDBOX_TOOL=tool)
    assert int(tried["cap_eff"], 16) == 1 << 2, tried  # CAP_DAC_READ_SEARCH alone: reading, as the grader can
    assert {k: v for k, v in tried.items() if k not in ("cap_eff", "mknod")} == dict.fromkeys(
        ("reboot", "adjtimex"), "Operation not permitted"
    ), tried
    assert tried["mknod"] in ("Operation not permitted", "Permission denied"), tried  # (Landlock refuses it first)
    assert "nor any other capability" in r["isolation"]["candidate"]["ptrace"], r["isolation"]
    assert passed(r), (r["verdict"], r["failures"])


def test_without_the_layer_root_holds_those_powers(tmp_path, monkeypatch):
    """The control: the same tries with ``GEMMLAB_SANDBOX_UNDUMPABLE=0`` find each capability held (the kernel
    answers "Invalid argument" past the capability check; the node is made, and removed)."""
    if os.geteuid() != 0:
        pytest.skip("root in the sandbox, as with CUDA")
    _, tried = _graded(
        tmp_path,
        monkeypatch,
        GEMMLAB_SANDBOX_UNDUMPABLE="0",
        GEMMLAB_SANDBOX_TOOL="none",
        GEMMLAB_SANDBOX_SECCOMP="0",  # (its step drops CAP_SYS_BOOT and CAP_SYS_TIME too: host_reach.py)
        GEMMLAB_SANDBOX_LANDLOCK="0",  # (it refuses every mknod too)
    )
    assert int(tried["cap_eff"], 16) != 0, tried
    assert (tried["reboot"], tried["adjtimex"], tried["mknod"]) == ("Invalid argument", "Invalid argument", "ok"), tried


@pytest.mark.skipif(os.geteuid() != 0, reason="becomes another uid: needs root")
def test_a_grader_that_is_not_root_has_the_layers_too():
    """A keeper of a grader that is not root holds no capability, and may not clear its bounding set (no
    CAP_SETPCAP): the drops still hold (nothing held, and no_new_privs: no exec grants one), so the report says so
    and the undumpable layer stays in force, not "off (capability kept)"."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody (setuid drops every capability), then drop as the keeper does
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            got = [keeper.drop_caps(list(keeper.HOST_DROPS.values())), keeper.no_ptrace(True, False, every=True)]
            status = open("/proc/self/status").read()
            got.append(next(line for line in status.splitlines() if line.startswith("NoNewPrivs")))
            os.write(write, repr(got).encode())
        finally:
            os._exit(0)
    os.close(write)
    out = b""
    while chunk := os.read(read, 4096):
        out += chunk
    os.close(read)
    os.waitpid(pid, 0)
    host, ptrace, nnp = ast.literal_eval(out.decode())
    assert host is None
    assert ptrace == "no CAP_SYS_PTRACE; this sandbox undumpable"
    assert nnp.split() == ["NoNewPrivs:", "1"]
