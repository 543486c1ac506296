"""Root in the sandbox (the grader's uid, as with CUDA) past the read-only host and the network namespace
(``tests/bad_kernels/host_reach.py``):
- ``/proc/GRADER/root`` is the grader's mount namespace, where nothing is read-only: with CAP_SYS_PTRACE (kept where
  the undumpable grader is off, as the probe may leave it with CUDA) a write there lands on the host whatever the
  read-only host says. The read-only host drops CAP_SYS_PTRACE from the candidate too (``keeper.no_ptrace``).
- A network namespace of the sandbox's own is no wall for CAP_NET_ADMIN of the initial user namespace: rtnetlink
  makes links in any namespace named by a pid (a veth pair with an end in the host's). The keeper drops CAP_NET_ADMIN
  once the namespace is made (``sockets.own_network``).
Each with its control, where the same kernel gets through."""

import os
import secrets
import shutil
import socket
import subprocess
import threading

import pytest

from gemmlab.grade import grade
from gemmlab.sandbox.tool import Tool
from tests.grade.test_grade import TINY, passed
from tests.paths import BAD_KERNELS

KERNELS = BAD_KERNELS / "host_reach.py"


def _root_as_with_cuda(tmp_path, monkeypatch, **env):
    if os.geteuid() != 0:
        pytest.skip("root in the sandbox, as with CUDA (mount and network namespaces of the keeper's own)")
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(out))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(out))
    for var, value in {"UID": "0", "LANDLOCK": "0", "TERMINALS": "1", "TOOL": "none", **env}.items():
        monkeypatch.setenv(f"GEMMLAB_SANDBOX_{var}", value)
    return out


def _noted(out, name) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in (out / name).read_text().splitlines())


def _proc_root(tmp_path, monkeypatch, **env):
    out = _root_as_with_cuda(tmp_path, monkeypatch, **env)
    host = tmp_path / "host"
    host.mkdir()
    monkeypatch.setenv("BAD_HOST_DIR", str(host))
    r = grade(TINY, kernel=f"{KERNELS}:writes_through_proc_root")
    return r, _noted(out, "proc_root"), host


@pytest.mark.parametrize("tool", ["bwrap", "none"])
def test_the_read_only_host_holds_against_the_graders_root_in_proc(tmp_path, monkeypatch, tool):
    """The read-only host (the keeper's, or bubblewrap's whose parent process stays in the grader's mount namespace)
    without the undumpable grader (a set the probe may choose with CUDA): neither by its path nor through
    ``/proc/GRADER/root`` does the candidate write the host's directory, and it still passes."""
    if tool == "bwrap" and Tool.choose(True).path is None:
        pytest.skip("bubblewrap is not usable here")
    r, noted, host = _proc_root(tmp_path, monkeypatch, READONLY="1", UNDUMPABLE="0", TOOL=tool)
    iso = r["isolation"]["candidate"]
    if not iso["terminals"].startswith("hidden ("):
        pytest.skip(f"no mount namespace here: {iso['terminals']}")
    assert set(noted) == {"direct", "proc_root"}, noted
    assert "written" not in noted.values(), noted
    assert tool == "bwrap" or iso["host_files"].startswith("read-only but for"), iso
    assert iso["ptrace"].startswith("no CAP_SYS_PTRACE"), iso
    assert not list(host.iterdir())
    assert passed(r), (r["verdict"], r["failures"])


def test_without_the_read_only_host_the_same_kernel_writes_the_host(tmp_path, monkeypatch):
    """The control: with neither the read-only host nor the undumpable grader, both writes land."""
    r, noted, host = _proc_root(tmp_path, monkeypatch, READONLY="0", UNDUMPABLE="0")
    assert noted == {"direct": "written", "proc_root": "written"}, noted
    assert (host / "planted.py").exists()


def _veth(tmp_path, monkeypatch, **env):
    """Grade ``joins_the_host_network`` while watching this (the grader's) network namespace for its link; (report,
    what the kernel noted, whether the link was seen here)."""
    out = _root_as_with_cuda(tmp_path, monkeypatch, **env)
    peer = f"gl{secrets.token_hex(4)}"
    monkeypatch.setenv("BAD_VETH", peer)
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set() and not seen:
            if any(name == peer for _, name in socket.if_nameindex()):
                seen.append(peer)
            done.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = grade(TINY, kernel=f"{KERNELS}:joins_the_host_network")
    finally:
        done.set()
        watcher.join(10)
        if any(name == peer for _, name in socket.if_nameindex()):  # left in the host's namespace: take it away
            subprocess.run(["ip", "link", "del", peer], capture_output=True, timeout=60)
    return r, _noted(out, "netlink"), bool(seen)


@pytest.mark.parametrize("tool", ["bwrap", "none"])
def test_the_network_namespace_holds_against_cap_net_admin(tmp_path, monkeypatch, tool):
    """With a network namespace of its own (keeper or bubblewrap), root in the sandbox cannot make a link in the
    grader's network namespace; it still passes."""
    if tool == "bwrap" and Tool.choose(True, netns=True).path is None:
        pytest.skip("bubblewrap is not usable here")
    r, noted, seen = _veth(tmp_path, monkeypatch, NETNS="1", TOOL=tool, UNDUMPABLE="0")  # (that layer drops it too)
    assert not seen and list(noted) == ["refused"], (noted, seen)
    assert r["isolation"]["candidate"]["network"].startswith("own ("), r["isolation"]
    assert "CAP_NET_ADMIN" in r["isolation"]["candidate"]["network"], r["isolation"]
    assert passed(r), (r["verdict"], r["failures"])


def test_without_a_network_namespace_root_makes_links_in_the_hosts(tmp_path, monkeypatch):
    """The control (and what "What is not enforced" says of a grade without the namespace): the same kernel's link
    appears in the grader's network namespace."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` to take the control's link away afterwards")
    r, noted, seen = _veth(tmp_path, monkeypatch, NETNS="0", UNDUMPABLE="0")
    assert list(noted) == ["made"] and seen, (noted, seen)


def _device(tmp_path, monkeypatch, **env):
    """Grade ``writes_a_device`` against a loop device on a file of the test's; (report, what the kernel noted, what
    the file holds afterwards)."""
    out = _root_as_with_cuda(tmp_path, monkeypatch, **env)
    if shutil.which("losetup") is None:
        pytest.skip("no losetup to attach a loop device")
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"\0" * (1 << 20))
    attach = subprocess.run(["losetup", "-f", "--show", str(disk)], capture_output=True, text=True, timeout=120)
    if attach.returncode != 0:
        pytest.skip(f"no loop device here: {attach.stderr.strip()}")
    dev = attach.stdout.strip()
    monkeypatch.setenv("BAD_BLOCK_DEV", dev)
    left = f"/dev/shm/gemmlab-test-{secrets.token_hex(6)}"  # as an earlier grade's candidate would leave it
    os.mknod(left, 0o60600, os.stat(dev).st_rdev)  # S_IFBLK | 0600
    monkeypatch.setenv("BAD_SHM_NODE", left)
    try:
        r = grade(TINY, kernel=f"{KERNELS}:writes_a_device")
    finally:
        os.unlink(left)
        subprocess.run(["losetup", "-d", dev], capture_output=True, timeout=120)
    return r, _noted(out, "device"), disk.read_bytes()


@pytest.mark.parametrize("layer", ["readonly", "landlock"])
def test_no_device_is_written_under_the_read_only_host_or_landlock(tmp_path, monkeypatch, layer):
    """Root in the sandbox (as with CUDA) under the read-only host alone, or Landlock alone: the host's block device
    is not written, neither by its node (hidden behind /dev/null under the read-only host; not writable by path under
    Landlock) nor by a node of its own made in its scratch directory or /dev/shm (mounted nodev; Landlock grants no
    MAKE_BLOCK), and the kernel still passes."""
    env = {"READONLY": "1", "LANDLOCK": "0"} if layer == "readonly" else {"READONLY": "0", "LANDLOCK": "1"}
    r, noted, disk = _device(tmp_path, monkeypatch, UNDUMPABLE="0", **env)
    assert b"planted" not in disk, noted
    assert noted.get("host_node") and "written" not in noted.values(), noted
    assert passed(r), (r["verdict"], r["failures"])


def test_without_either_layer_the_device_is_written(tmp_path, monkeypatch):
    """The control: neither the read-only host nor Landlock; the same kernel writes the device."""
    r, noted, disk = _device(tmp_path, monkeypatch, READONLY="0", LANDLOCK="0", UNDUMPABLE="0")
    assert noted.get("host_node") == "written" and b"planted by the candidate (host_node)" in disk, noted


def _host_admin(tmp_path, monkeypatch, **env):
    out = _root_as_with_cuda(tmp_path, monkeypatch, READONLY="0", UNDUMPABLE="0", NETNS="0", **env)
    r = grade(TINY, kernel=f"{KERNELS}:adjusts_the_clock")
    return r, _noted(out, "host_admin")


def _audit_here() -> bool:
    """Whether this kernel has audit (a NETLINK_AUDIT socket opens)."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9):
            return True
    except OSError:
        return False


def test_the_hosts_clock_rate_and_audit_are_out_of_reach_under_the_filter(tmp_path, monkeypatch):
    """Every probed layer off (the least a grade with CUDA may have): with the seccomp filter's step (on by default,
    with CUDA too) root in the sandbox holds neither CAP_SYS_TIME (``adjtimex``'s tick sets how fast the grader's
    ``perf_counter`` runs), CAP_SYS_BOOT nor CAP_AUDIT_CONTROL; the kernel asks for a tick out of range, ``reboot``
    for no command and audit for nothing, so the machine is left as it was either way. It still passes."""
    r, noted = _host_admin(tmp_path, monkeypatch)
    keys = ("tick", "reboot", "audit") if _audit_here() else ("tick", "reboot")  # (a kernel without audit)
    assert {k: noted.get(k) for k in keys} == dict.fromkeys(keys, "Operation not permitted"), noted
    assert r["isolation"]["candidate"]["host_caps"].startswith("dropped CAP_SYS_BOOT, CAP_SYS_TIME"), r["isolation"]
    assert passed(r), (r["verdict"], r["failures"])


def test_without_the_filter_root_sets_the_hosts_clock_rate_and_audit(tmp_path, monkeypatch):
    """The control: with ``GEMMLAB_SANDBOX_SECCOMP=0`` the same kernel's tries get past the capability checks (audit
    where the kernel has it)."""
    r, noted = _host_admin(tmp_path, monkeypatch, SECCOMP="0")
    expected = {"tick": "set", "reboot": "in reach", "audit": "set"}
    keys = expected if _audit_here() else ("tick", "reboot")
    assert {k: noted.get(k) for k in keys} == {k: expected[k] for k in keys}, noted
    assert "host_caps" not in r["isolation"]["candidate"], r["isolation"]


@pytest.mark.parametrize("tool", ["bwrap", "none"])
def test_root_in_the_sandbox_renames_only_its_own_uts_namespace(tmp_path, monkeypatch, tool):
    """Every probed layer off, the terminals hidden (the keeper's namespaces: with CUDA too) or bubblewrap: the
    kernel's ``sethostname`` succeeds in a UTS namespace of the sandbox's own, and the host keeps its name."""
    if tool == "bwrap" and Tool.choose(True).path is None:
        pytest.skip("bubblewrap is not usable here")
    out = _root_as_with_cuda(tmp_path, monkeypatch, READONLY="0", UNDUMPABLE="0", NETNS="0", TOOL=tool)
    before = socket.gethostname()
    monkeypatch.setenv("BAD_HOSTNAME", f"gl{secrets.token_hex(4)}")
    try:
        r = grade(TINY, kernel=f"{KERNELS}:renames_the_host")
    finally:
        after = socket.gethostname()
        if after != before:  # the hole open: give the machine its name back
            subprocess.run(["hostname", before], capture_output=True, timeout=60)
    assert after == before, (before, after)
    assert (out / "hostname").read_text().split() == ["set"]
    assert r["isolation"]["candidate"]["hostname"].startswith("own ("), r["isolation"]
    assert passed(r), (r["verdict"], r["failures"])


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kernel, env",
    [
        ("writes_through_proc_root", {"GEMMLAB_SANDBOX_READONLY": "1", "GEMMLAB_SANDBOX_UNDUMPABLE": "0"}),
        ("joins_the_host_network", {"GEMMLAB_SANDBOX_NETNS": "1"}),
        ("adjusts_the_clock", {}),
    ],
)
def test_with_cuda_root_in_the_sandbox_reaches_none_of_it(tmp_path, monkeypatch, capsys, kernel, env):
    """On a GPU (the sandbox keeps the grader's uid, root): the layer each kernel meets holds with CUDA running under
    it, and the grade passes; the other probed switches are left to the probe."""
    if os.geteuid() != 0:
        pytest.skip("root in the sandbox, as the grader is on the H200")
    out, host = tmp_path / "out", tmp_path / "host"
    out.mkdir()
    host.mkdir()
    for var, value in {
        "BAD_KERNEL_OUT_DIR": str(out),
        "GEMMLAB_SANDBOX_WRITABLE": str(out),
        "BAD_HOST_DIR": str(host),
        "BAD_VETH": f"gl{secrets.token_hex(4)}",
        **env,
    }.items():
        monkeypatch.setenv(var, value)
    r = grade(TINY, kernel=f"{KERNELS}:{kernel}")
    noted = {}
    for name in ("proc_root", "netlink", "host_admin"):
        noted.update(_noted(out, name) if (out / name).exists() else {})
    with capsys.disabled():
        print(f"\n{kernel}: {noted}; isolation {r['isolation']['candidate']}")
    assert noted and "written" not in noted.values() and "set" not in noted.values(), noted
    assert "made" not in noted and "in reach" not in noted.values(), noted
    assert not list(host.iterdir())
    assert passed(r), (r["verdict"], r["failures"])


def _fanotify(tmp_path, monkeypatch, **env):
    """Grade ``denies_the_hosts_opens`` while a thread of the test opens the marked file again and again; (report,
    what the kernel noted, what the opens got)."""
    out = _root_as_with_cuda(tmp_path, monkeypatch, READONLY="0", UNDUMPABLE="0", NETNS="0", **env)
    target = tmp_path / "host-file"
    target.write_text("the host's\n")
    monkeypatch.setenv("BAD_DENY_FILE", str(target))
    got, done = set(), threading.Event()

    def opens():
        while not done.is_set():
            try:
                target.read_text()
                got.add("read")
            except OSError as e:
                got.add(e.strerror)
            done.wait(0.05)

    opener = threading.Thread(target=opens, daemon=True)
    opener.start()
    try:
        r = grade(TINY, kernel=f"{KERNELS}:denies_the_hosts_opens")
    finally:
        done.set()
        opener.join(60)  # an open still waiting on the kernel's answer is let through when its process is killed
    return r, (out / "fanotify").read_text().split(), got


def test_the_filter_refuses_a_permission_mark_on_the_hosts_files(tmp_path, monkeypatch):
    """Every probed layer off (as the least a grade with CUDA may have), the filter on: ``fanotify_init`` is refused,
    every open of the host's file succeeds, and the kernel passes."""
    r, noted, got = _fanotify(tmp_path, monkeypatch)
    assert noted == ["Operation", "not", "permitted"], noted
    assert got == {"read"}, got
    assert passed(r), (r["verdict"], r["failures"])


def test_without_the_filter_the_candidate_denies_the_hosts_opens(tmp_path, monkeypatch):
    """The control: ``GEMMLAB_SANDBOX_SECCOMP=0``; the test's own opens of its file are denied by the kernel."""
    r, noted, got = _fanotify(tmp_path, monkeypatch, SECCOMP="0")
    assert noted[0] == "denied" and "Operation not permitted" in got, (noted, got)


def _sysv(tmp_path, monkeypatch, **env):
    """Grade ``writes_sysv_memory`` against a SysV segment of the test's (mode 0600, root's); (report, what the kernel
    noted, the segment's first bytes afterwards)."""
    import ctypes

    out = _root_as_with_cuda(tmp_path, monkeypatch, READONLY="0", UNDUMPABLE="0", NETNS="0", **env)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    key = 0x6C000000 + secrets.randbelow(1 << 20)
    shm = libc.shmget(key, 4096, 0o1000 | 0o2000 | 0o600)  # IPC_CREAT | IPC_EXCL
    if shm < 0:
        pytest.skip(f"no SysV segment here: {os.strerror(ctypes.get_errno())}")
    at = libc.shmat(shm, None, 0)
    monkeypatch.setenv("BAD_SHM_KEY", str(key))
    try:
        r = grade(TINY, kernel=f"{KERNELS}:writes_sysv_memory")
        head = ctypes.string_at(at, 24)
    finally:
        libc.shmdt(ctypes.c_void_p(at))
        libc.shmctl(shm, 0, None)  # IPC_RMID
    return r, (out / "sysv").read_text().strip(), head


def test_root_in_the_sandbox_reaches_no_sysv_segment_of_the_hosts(tmp_path, monkeypatch):
    """Without CUDA, the keeper's namespaces (root: the grader's uid, as with CUDA) include an IPC namespace of its own:
    the host's segment is not found, its bytes stay, and the kernel passes."""
    r, noted, head = _sysv(tmp_path, monkeypatch)
    assert noted == "No such file or directory" and head == b"\0" * 24, (noted, head)
    assert r["isolation"]["candidate"]["sysv_ipc"].startswith("own ("), r["isolation"]
    assert passed(r), (r["verdict"], r["failures"])


def test_without_the_keepers_namespaces_root_writes_the_hosts_sysv_segment(tmp_path, monkeypatch):
    """The control (and the case with CUDA, which keeps the host's IPC namespace): ``GEMMLAB_SANDBOX_TERMINALS=0``."""
    r, noted, head = _sysv(tmp_path, monkeypatch, TERMINALS="0")
    assert noted == "written" and head == b"planted by the candidate", (noted, head)
