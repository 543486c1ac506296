"""The candidate's isolation from the grader's process and the user's terminal (gemmlab.sandbox: seccomp, keeper):
the filter's program, the filter in force in a process, and a graded candidate (tests/bad_kernels/containment.py:
``attacks_the_grader``) that tries TIOCSTI on a terminal the test holds, ptrace, process_vm_readv, prlimit and a
signal on the grader, and clone3 into the grader's cgroup, and gains nothing."""

import errno
import json
import os
import platform
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from gemmlab.grade import view
from gemmlab.sandbox import contain, seccomp
from gemmlab.sandbox.box import Sandbox, WorkerFailure
from gemmlab.sandbox.tool import Tool
from tests.grade.test_grade import passed
from tests.sandbox.test_sandbox import BOX, run_box

EPERM, ENOSYS, ALLOW = seccomp.ERRNO | errno.EPERM, seccomp.ERRNO | errno.ENOSYS, seccomp.ALLOW
OWNER, PGID = 4321, 4000


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_filter_program(arch):
    """What the program returns, call by call (its own interpreter): each denial fires, its neighbours pass."""
    prog = seccomp.program(arch, OWNER, PGID, tids=[OWNER, 4330, 4331])
    col = 0 if arch == "x86_64" else 1

    def nr(name):
        return seccomp.NR[name][col]

    def ret(name, *args, on=arch):
        return seccomp.run(prog, nr(name), args, on)

    for name in (
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "kcmp",
        "pidfd_getfd",
        "setns",
        "unshare",
        "umount2",
        "mount",
        "open_by_handle_at",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
    ):
        assert ret(name) == EPERM, name
    assert ret("ioctl", 1, 0x5412) == EPERM and ret("ioctl", 1, 0x541C) == EPERM and ret("ioctl", 1, 0x540E) == EPERM
    assert ret("ioctl", 1, (1 << 32) | 0x5412) == EPERM  # the kernel drops the high bits: so does the filter
    assert ret("ioctl", 1, 0x5401) == ALLOW and ret("ioctl", 1, 0xC0104601) == ALLOW  # TCGETS; a driver's request
    assert ret("prlimit64", 0) == ALLOW and ret("prlimit64", OWNER) == EPERM and ret("prlimit64", 1) == EPERM
    assert ret("perf_event_open", 0, 0) == ALLOW and ret("perf_event_open", 0, OWNER) == EPERM
    assert ret("kill", OWNER) == EPERM and ret("kill", -PGID & 0xFFFFFFFF) == EPERM and ret("kill", 0xFFFFFFFF) == EPERM
    assert ret("kill", OWNER + 1) == ALLOW and ret("tgkill", OWNER, 5) == EPERM and ret("tgkill", 7, 7) == ALLOW
    assert ret("kill", 4331, 9) == EPERM and ret("tkill", 4330, 9) == EPERM and ret("rt_sigqueueinfo", 4330) == EPERM
    big = seccomp.program(arch, OWNER, PGID, tids=range(10_000, 11_000))  # capped, still assembled
    assert seccomp.run(big, nr("kill"), (10_000 + seccomp.MAX_TIDS - 2,), arch) == EPERM
    assert ret("clone3") == ENOSYS
    assert ret("clone", 0x01200011) == ALLOW and ret("clone", 0x01200011 | 0x10000000) == EPERM  # fork; +NEWUSER
    assert seccomp.run(prog, 0, (), arch) == ALLOW  # read (x86_64), io_setup (aarch64): anything not named
    assert seccomp.run(prog, 0, (), "i386") == EPERM  # another ABI's numbers: refused whole
    if arch == "x86_64":
        assert seccomp.run(prog, 0x40000000 | nr("ptrace"), ()) == EPERM  # x32
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.program("riscv64", OWNER, PGID)


CHILD = textwrap.dedent("""
    import ctypes, fcntl, importlib.util, json, os, resource, sys, termios
    spec = importlib.util.spec_from_file_location("sc", sys.argv[1])
    sc = importlib.util.module_from_spec(spec); spec.loader.exec_module(sc)
    owner = os.getppid()
    missing = sc.install(owner, os.getpgid(owner))
    libc = ctypes.CDLL(None, use_errno=True)
    found = {"missing": missing}
    def attempt(name, fn):
        try:
            fn(); found[name] = True
        except OSError as e:
            found[name] = e.errno
    def check(r):
        if r == -1:
            raise OSError(ctypes.get_errno(), "")
    fd = os.open(sys.argv[2], os.O_RDWR | os.O_NOCTTY)
    attempt("tiocsti", lambda: [fcntl.ioctl(fd, termios.TIOCSTI, bytes([c])) for c in b"pwned\\n"])
    attempt("ptrace", lambda: check(libc.ptrace(0x4206, owner, None, None)))
    attempt("prlimit", lambda: resource.prlimit(owner, resource.RLIMIT_CORE))
    attempt("kill", lambda: os.kill(owner, 0))
    others = [int(t) for t in os.listdir(f"/proc/{owner}/task") if int(t) != owner]
    attempt("kill_thread", lambda: [os.kill(t, 0) for t in others] and None)
    found["threads"] = len(others)
    attempt("clone3", lambda: check(libc.syscall(435, None, ctypes.c_size_t(0))))
    attempt("own_prlimit", lambda: resource.prlimit(0, resource.RLIMIT_NOFILE))
    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    attempt("fork", fork)
    print(json.dumps(found))
""")


def test_the_filter_in_force_refuses_the_terminal_and_the_owner():
    """A process under the filter, holding a terminal of the test's (a pty, as a grader's terminal) and knowing the
    test's pid: TIOCSTI, ptrace, prlimit and a signal on the test (by its pid or a thread's id) all fail with EPERM,
    clone3 with ENOSYS, and nothing was typed into the terminal; its own prlimit and fork still work."""
    if platform.machine() not in seccomp.AUDIT_ARCH:
        pytest.skip(f"no seccomp filter for {platform.machine()}")
    import threading

    master, slave = os.openpty()
    done = threading.Event()
    waiter = threading.Thread(target=done.wait, daemon=True)  # a thread of the test's: a thread id to aim at
    waiter.start()
    try:
        r = subprocess.run(
            [sys.executable, "-c", CHILD, seccomp.__file__, os.ttyname(slave)],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        found = json.loads(r.stdout)
        os.set_blocking(slave, False)
        with pytest.raises(BlockingIOError):
            os.read(slave, 100)  # nothing was typed into the terminal
    finally:
        done.set()
        os.close(master)
        os.close(slave)
    assert found["missing"] == []
    assert found["threads"] >= 1 and found["kill_thread"] == errno.EPERM, found  # a signal by thread id
    assert {k: found[k] for k in ("tiocsti", "ptrace", "prlimit", "kill")} == dict.fromkeys(
        ("tiocsti", "ptrace", "prlimit", "kill"), errno.EPERM
    ), found
    assert found["clone3"] == errno.ENOSYS and found["own_prlimit"] is True and found["fork"] is True, found


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    """Where the bad kernel notes what it did: writable for it (the owner's GEMMLAB_SANDBOX_WRITABLE)."""
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    return tmp_path


def _attacks(out_dir, monkeypatch, **env):
    """Grade ``attacks_the_grader`` holding a pty (its path in $BAD_TTY); (report, attacks.json, what the pty got)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    master, slave = os.openpty()
    os.set_inheritable(slave, True)  # as a grader's own terminal descriptors may be: none may reach the candidate
    monkeypatch.setenv("BAD_TTY", os.ttyname(slave))
    try:
        r = run_box("attacks_the_grader")
        got = b""
        for fd in (slave, master):
            os.set_blocking(fd, False)
            try:
                got += os.read(fd, 1000)
            except BlockingIOError:
                pass
    finally:
        os.close(master)
        os.close(slave)
    assert (out_dir / "attacks.json").exists(), ("the candidate never ran its attacks", r["verdict"], r["failures"])
    return r, json.loads((out_dir / "attacks.json").read_text()), got


def _need_bwrap(tool: str) -> None:
    if tool == "bwrap" and Tool.choose(True).path is None:
        pytest.skip(f"bubblewrap is not usable here ({Tool.choose(True).why}): the hand-written path is tested")


@pytest.mark.parametrize("tool", ["none", "bwrap"])
@pytest.mark.parametrize("landlock", ["0", "1"])
def test_a_candidate_reaches_neither_the_grader_nor_its_terminal(out_dir, monkeypatch, landlock, tool, device):
    """Graded, the candidate tries TIOCSTI and a write on a terminal the grader holds, ptrace, process_vm_readv,
    the grader's /proc/PID/mem, prlimit and a signal on the grader, and clone3 into the grader's cgroup: every one
    fails, the terminal got nothing, the honest arithmetic passes, and the report says what was in force. Without
    Landlock (as with CUDA) the seccomp filter and the keeper's mount namespace alone hold; inside bubblewrap (where
    installed) its namespaces hold too, and the report names it."""
    if device == "cuda" and landlock == "1":
        pytest.skip("Landlock with CUDA is open (tests/sandbox/test_sandbox.py::test_landlock_with_cuda)")
    _need_bwrap(tool)
    r, found, got = _attacks(
        out_dir,
        monkeypatch,
        GEMMLAB_SANDBOX_LANDLOCK=landlock,
        GEMMLAB_SANDBOX_TOOL=tool,
        GEMMLAB_SANDBOX_UNDUMPABLE="1",  # on by default without CUDA; with CUDA this GPU test is what could turn it on
    )
    assert got == b"", got
    assert set(found) == {
        "tiocsti",
        "tty_write",
        "ptrace",
        "process_vm_readv",
        "proc_mem",
        "prlimit",
        "kill",
        "clone3",
        "ctty",
        "tty_fds",
    }, found
    assert not [k for k, v in found.items() if v is True], found
    assert found["tty_fds"] == [] and found["ctty"] == "ENXIO", found  # no terminal held, none to open
    assert found["clone3"] == "ENOSYS" and found["ptrace"] in ("EPERM", "invisible"), found
    iso = r["isolation"]["candidate"]
    assert iso["seccomp"] == "on" and iso["terminal_fds"] == "none", iso
    assert iso["tool"].startswith("bubblewrap " if tool == "bwrap" else "hand-written"), iso
    assert iso["landlock"].startswith("on" if landlock == "1" else "off"), iso
    assert "seccomp on" in view.markdown(r)  # report.md says it too
    assert passed(r), r["failures"]


def test_in_a_pid_namespace_the_grader_is_not_in_view(out_dir, monkeypatch):
    """GEMMLAB_SANDBOX_PIDNS=1 (root): the candidate's /proc is its namespace's, so the grader (its keeper's parent)
    is not there to aim at, even with the filter, Landlock and the uid off; the grade still passes."""
    if os.geteuid() != 0:
        pytest.skip("a PID namespace of the keeper's own needs root")
    r, found, got = _attacks(
        out_dir,
        monkeypatch,
        GEMMLAB_SANDBOX_PIDNS="1",
        GEMMLAB_SANDBOX_LANDLOCK="0",
        GEMMLAB_SANDBOX_SECCOMP="0",
        GEMMLAB_SANDBOX_UID="0",
        GEMMLAB_SANDBOX_UNDUMPABLE="0",
        GEMMLAB_SANDBOX_TOOL="none",
    )
    assert r["isolation"]["candidate"]["pid_namespace"] == "on", r["isolation"]
    attacks = ("ptrace", "process_vm_readv", "proc_mem", "prlimit", "kill")
    assert got == b"" and all(found[k] == "invisible" for k in attacks), found
    assert passed(r), r["failures"]


def test_without_the_filter_the_same_candidate_reaches_the_grader(out_dir, monkeypatch):
    """The control: with the filter, Landlock, the uid of its own, the undumpable grader and the read-only host (which
    drops CAP_SYS_PTRACE too) off, the same candidate attaches to the grader, reads its memory, sets its resource limit
    and signals it (as root, or as the grader's user); so the refusals above are the filter's (or the uid's). The
    terminal stays out of reach (the keeper's mount namespace hides it, where it is root)."""
    if os.geteuid() != 0:
        pytest.skip("the control needs the keeper's mount namespace (root) to keep the terminal out of reach")
    r, found, got = _attacks(
        out_dir,
        monkeypatch,
        GEMMLAB_SANDBOX_LANDLOCK="0",
        GEMMLAB_SANDBOX_SECCOMP="0",
        GEMMLAB_SANDBOX_UID="0",
        GEMMLAB_SANDBOX_UNDUMPABLE="0",
        GEMMLAB_SANDBOX_READONLY="0",
        GEMMLAB_SANDBOX_TOOL="none",
    )
    assert got == b"" and found["tiocsti"] == "ENOENT" and found["tty_write"] == "ENOENT", (got, found)
    assert all(found[k] is True for k in ("ptrace", "process_vm_readv", "proc_mem", "prlimit", "kill")), found
    assert r["isolation"]["candidate"]["seccomp"] == "off"


def test_a_uid_of_its_own_alone_keeps_the_grader_out_of_reach(out_dir, monkeypatch):
    """Where the grader is root, a uid of the sandbox's own (no filter, no Landlock: as with CUDA where the filter
    would be off) refuses the same attacks: no ptrace, memory, resource limit or signal reaches a process of another
    uid; the candidate still loads (its files read as the grader reads them) and writes its own directories."""
    if os.geteuid() != 0:
        pytest.skip("only a grader running as root can give the sandbox a uid of its own")
    r, found, got = _attacks(
        out_dir,
        monkeypatch,
        GEMMLAB_SANDBOX_LANDLOCK="0",
        GEMMLAB_SANDBOX_SECCOMP="0",
        GEMMLAB_SANDBOX_UID="1",
        GEMMLAB_SANDBOX_UNDUMPABLE="0",
        GEMMLAB_SANDBOX_TOOL="none",
    )
    assert got == b"", got
    attacks = ("ptrace", "process_vm_readv", "proc_mem", "prlimit", "kill")
    assert all(found[k] in ("EPERM", "EACCES") for k in attacks), found
    uid = r["isolation"]["candidate"]["uid"]
    assert "its own" in uid and int(uid.split()[0]) != 0, uid
    assert (out_dir / "attacks.json").stat().st_uid == int(uid.split()[0])
    assert passed(r), r["failures"]


def test_without_root_the_uid_is_the_graders_and_the_report_says_why(monkeypatch):
    """A grader that is not root cannot give a uid: the keeper is asked for none and the report says why."""
    from gemmlab.sandbox.isolate import Isolation

    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", "1")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    iso = Isolation.from_env(True)
    assert iso.uid is None and iso.uid_why == "the grader is not root"
    args = iso.keeper_args(["/tmp"], None)
    assert "--uid" not in args and args[args.index("--uid-why") + 1] == "the grader is not root"


def _wait_for(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} never written"
        time.sleep(0.01)
    return json.loads(path.read_text())


@pytest.mark.parametrize("uid,tool", [("0", "none"), ("1", "none"), ("0", "bwrap")])
def test_a_process_moved_out_of_the_cgroup_fails_at_the_freeze(out_dir, monkeypatch, uid, tool):
    """A helper writes itself into the grader's cgroup (root, without a Landlock domain): its CPU time would no
    longer be the sandbox's, nor its freeze the cgroup's. The next freeze fails the sandbox. With a uid of its own
    the move is refused (the cgroup's files are root's), and inside bubblewrap or the keeper's own mount namespace
    (root: the host read-only, with the terminals hidden, the default) too (the cgroup file system is read-only
    there); the freeze holds."""
    _need_bwrap(tool)
    monkeypatch.setenv("GEMMLAB_SANDBOX_LANDLOCK", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", uid)
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", tool)
    probe = contain.Freezer.make("probe")
    if probe is None or not probe.v2:
        pytest.skip("no writable cgroup v2 here")
    probe.remove()
    cand = Sandbox(f"{BOX}:leaves_its_cgroup", "colmajor", "colmajor", 60.0, True, str(out_dir))
    a = torch.rand(4, 4, dtype=torch.float16).t()
    try:
        cand.bind([((a, a), torch.full((16,), float("nan"), dtype=torch.float16))])
        cand.request("call", slot=0)
        moved = _wait_for(out_dir / "moved.json")["moved"]
        if moved is True:
            assert os.geteuid() == 0 and tool == "none", cand.isolation
            assert uid == "0" or "its own" not in cand.isolation["uid"], cand.isolation
            with pytest.raises(WorkerFailure, match="left its cgroup"):
                cand.freeze()
        else:
            # inside bubblewrap, or the keeper's own read-only mount namespace (root), the cgroup fs is read-only
            refused = moved == "EROFS" or (tool != "bwrap" and uid == "1" and moved in ("EACCES", "EPERM"))
            assert refused, (uid, tool, moved)
            cand.freeze()
            cand.thaw()
    finally:
        cand.close()
    assert not cand.members()


SWITCHES_WITH_CUDA = {  # id: the switch set (each layer the probe decides, the PID namespace and the uid, alone)
    "default": {},
    "readonly": {"GEMMLAB_SANDBOX_READONLY": "1"},
    "undumpable": {"GEMMLAB_SANDBOX_UNDUMPABLE": "1"},
    "landlock": {"GEMMLAB_SANDBOX_LANDLOCK": "1"},
    "pidns": {"GEMMLAB_SANDBOX_PIDNS": "1"},
    "netns": {"GEMMLAB_SANDBOX_NETNS": "1"},
    "uid": {"GEMMLAB_SANDBOX_UID": "1"},
}


@pytest.mark.gpu
@pytest.mark.parametrize("switch", list(SWITCHES_WITH_CUDA.values()), ids=list(SWITCHES_WITH_CUDA))
def test_isolation_with_cuda(monkeypatch, switch):
    """With CUDA: the seccomp filter and the hidden terminals (on by default there; set here all the same, with what
    comes with them and is not probed: the filter's capability drops, the UTS namespace, /dev/shm nodev), and each
    layer the grader's probe decides (the read-only host, the undumpable grader, Landlock, the network namespace),
    the PID namespace (opt-in) or one never given (a uid of its own, which CUDA does not allow: the report says why),
    each alone (every probed switch set, so no probe runs), still let both children open the slots' IPC handles, and
    gemmlab's own kernel passes; the report says what held."""
    monkeypatch.setenv("GEMMLAB_SANDBOX_SECCOMP", "1")
    monkeypatch.setenv("GEMMLAB_SANDBOX_TERMINALS", "1")
    for var in ("READONLY", "UNDUMPABLE", "LANDLOCK", "PIDNS", "NETNS", "UID"):
        monkeypatch.setenv(f"GEMMLAB_SANDBOX_{var}", "0")
    from gemmlab.grade import grade
    from tests.grade.test_grade import TINY

    for k, v in switch.items():
        monkeypatch.setenv(k, v)
    r = grade(TINY)
    assert passed(r), r["failures"]
    iso = r["isolation"]["candidate"]
    assert iso["seccomp"] == "on", iso
    root = os.geteuid() == 0
    if root:
        assert iso["proc"].startswith("writable (CUDA names its threads there), but for sys"), iso
    if "GEMMLAB_SANDBOX_READONLY" in switch and root:
        assert iso["host_files"].startswith("read-only but for"), iso
    if "GEMMLAB_SANDBOX_UNDUMPABLE" in switch:
        assert iso["ptrace"].startswith("no CAP_SYS_PTRACE (nor any other capability"), iso
        assert r["isolation"]["baseline"]["ptrace"] == "no CAP_SYS_PTRACE; this sandbox undumpable", r["isolation"]
    if "GEMMLAB_SANDBOX_LANDLOCK" in switch:
        assert iso["landlock"].startswith(("on", "partial")), iso
    if "GEMMLAB_SANDBOX_UID" in switch:
        assert "the grader's" in iso["uid"] and "IPC" in iso["uid"], iso
    if "GEMMLAB_SANDBOX_PIDNS" in switch and root:
        assert iso["pid_namespace"] == "on", iso
    if "GEMMLAB_SANDBOX_NETNS" in switch and root:
        assert iso["network"].startswith("own (loopback only"), iso


def test_the_layers_by_default_with_and_without_cuda_and_each_has_its_switch(monkeypatch):
    """Without CUDA every layer but the PID namespace is on by default; with CUDA the filter and the hidden terminals
    are on too (their GPU test passed on the H200), Landlock, the read-only host, the undumpable grader, the PID and
    the network namespace are off until asked for, and a uid
    of its own is never given (CUDA IPC across uids fails: the reason is kept for the report); each switch turns its
    layer on or off."""
    from gemmlab.sandbox.isolate import Isolation

    for var in ("LANDLOCK", "SECCOMP", "TERMINALS", "UID", "PIDNS", "NETNS", "TOOL", "READONLY", "UNDUMPABLE"):
        monkeypatch.delenv(f"GEMMLAB_SANDBOX_{var}", raising=False)
    cpu, cuda = Isolation.from_env(interpret=True), Isolation.from_env(interpret=False)
    assert cpu.seccomp and cpu.terminals and cpu.landlock and cpu.read_only and cpu.undumpable and not cpu.pidns
    assert cuda.seccomp and cuda.terminals and not (cuda.landlock or cuda.pidns or cuda.uid or cuda.read_only)
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "none")
    assert cpu.netns and "--netns" in Isolation.from_env(interpret=True).keeper_args([], None)
    assert not cuda.netns and "--netns" not in cuda.keeper_args([], None)
    monkeypatch.setenv("GEMMLAB_SANDBOX_NETNS", "1")
    assert "--netns" in Isolation.from_env(interpret=False).keeper_args([], None)
    monkeypatch.setenv("GEMMLAB_SANDBOX_NETNS", "0")
    assert "--netns" not in Isolation.from_env(interpret=True).keeper_args([], None)
    monkeypatch.delenv("GEMMLAB_SANDBOX_NETNS")
    monkeypatch.delenv("GEMMLAB_SANDBOX_TOOL")
    assert not cuda.undumpable and "--no-ptrace" not in cuda.keeper_args([], None)
    assert "--cuda" in cuda.keeper_args([], None) and "--cuda" not in cpu.keeper_args([], None)
    assert "--undumpable" in cpu.keeper_args([], None, trusted=True) and "--undumpable" not in cpu.keeper_args([], None)
    assert {"--seccomp", "--hide-terminals"} <= set(cuda.keeper_args([], None))
    assert "--read-only" not in cuda.keeper_args([], None)
    monkeypatch.setenv("GEMMLAB_SANDBOX_READONLY", "1")
    assert "--read-only" in Isolation.from_env(interpret=False).keeper_args([], None)
    monkeypatch.delenv("GEMMLAB_SANDBOX_READONLY")
    assert "IPC" in cuda.uid_why
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", "1")
    assert Isolation.from_env(interpret=False).uid is None
    monkeypatch.delenv("GEMMLAB_SANDBOX_UID")
    monkeypatch.setenv("GEMMLAB_SANDBOX_SECCOMP", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_TERMINALS", "0")
    cut = Isolation.from_env(interpret=False)
    assert not (cut.seccomp or cut.terminals)
    assert "--seccomp" not in cut.keeper_args([], None) and "--hide-terminals" not in cut.keeper_args([], None)
    monkeypatch.setenv("GEMMLAB_SANDBOX_SECCOMP", "1")
    monkeypatch.setenv("GEMMLAB_SANDBOX_TERMINALS", "1")
    on = Isolation.from_env(interpret=False)
    assert on.seccomp and on.terminals and {"--seccomp", "--hide-terminals"} <= set(on.keeper_args([], None))
    monkeypatch.setenv("GEMMLAB_SANDBOX_SECCOMP", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_TERMINALS", "0")
    off = Isolation.from_env(interpret=True)
    assert not off.seccomp and not off.terminals


def test_the_hand_written_mount_namespace_leaves_the_host_read_only(tmp_path, monkeypatch):
    """As on a GPU by default (no Landlock, no uid of its own, no bubblewrap), with the terminals hidden (the keeper's
    mount namespace, root only): the candidate writes neither into the grader's log directory nor into a directory on
    the Python path (every mount read-only but its scratch directory, /dev/shm and the observers' files), it still
    passes, and the report says so."""
    from gemmlab.grade import grade
    from tests.grade.test_grade import TINY
    from tests.paths import BAD_KERNELS

    if os.geteuid() != 0:
        pytest.skip("the mount namespace needs root")
    out, path_dir = tmp_path / "out", tmp_path / "path"
    out.mkdir()
    path_dir.mkdir()
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(out))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(out))
    monkeypatch.setenv("BAD_PATH_DIR", str(path_dir))
    for var in ("LANDLOCK", "UID"):
        monkeypatch.setenv(f"GEMMLAB_SANDBOX_{var}", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_TERMINALS", "1")
    monkeypatch.setenv("GEMMLAB_SANDBOX_TOOL", "none")
    r = grade(TINY, kernel=f"{BAD_KERNELS / 'redteam.py'}:reaches_outside_by_files")
    iso = r["isolation"]["candidate"]
    if not iso["terminals"].startswith("hidden ("):
        pytest.skip(f"no mount namespace here: {iso['terminals']}")
    assert iso["host_files"].startswith("read-only but for"), iso
    found = json.loads((out / "files.json").read_text())
    assert {"log_dir", "python_path"} <= set(found) and all(v is not True for v in found.values()), found
    assert "Read-only" in found["log_dir"] and "Read-only" in found["python_path"], found
    assert not list(path_dir.iterdir())
    assert passed(r), r["failures"]
