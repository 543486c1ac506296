"""Known-bad kernels against freeze accounting (tests/sandbox/test_freeze_accounting.py): a helper that works in
short-lived threads, each gone before anyone reads its CPU time, and the same helper with its main thread exited (a
zombie leader). Competition signature FN(A, B, C, M, N, K); they compute honestly. The helper notes its pid in
$BAD_KERNEL_OUT_DIR/helper.pid and the number of bursts it finished in ``bursts`` (after each burst's thread has
exited), then rests ``REST_S``, so a test that stops it right after a burst finds no burner thread alive."""

import os
import platform
import threading
import time

BURST_CPU_S = 0.03  # CPU each short-lived thread burns before it exits
REST_S = 0.05  # between bursts (asleep: no CPU)
_state = {}


def honest(A, B, C, M, N, K):
    a, b = A[: M * K].view(K, M).t(), B[: K * N].view(N, K).t()
    C[: M * N].view(N, M).t().copy_((a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype))


def _out(name: str) -> str:
    return os.path.join(os.environ.get("BAD_KERNEL_OUT_DIR", "/tmp"), name)


def _burn() -> None:
    end = time.thread_time() + BURST_CPU_S
    x = 0
    while time.thread_time() < end:
        x += 1


def _bursts_forever() -> None:
    n = 0
    while True:
        t = threading.Thread(target=_burn)
        t.start()
        t.join()  # gone: its CPU time is no live thread's any more
        n += 1
        with open(_out("bursts.tmp"), "w") as f:
            f.write(str(n))
        os.replace(_out("bursts.tmp"), _out("bursts"))
        time.sleep(REST_S)


def _helper(zombie: bool) -> None:
    with open(_out("helper.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(_out("helper.pid.tmp"), _out("helper.pid"))
    if not zombie:
        _bursts_forever()
    import ctypes

    threading.Thread(target=_bursts_forever, daemon=True).start()
    time.sleep(0.05)
    ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)  # exit: this thread only


def short_lived_threads(A, B, C, M, N, K):
    """Computes honestly; at its first call leaves a helper working in bursts, each in a thread of its own that
    exits when done."""
    honest(A, B, C, M, N, K)
    if not _state.get("helper"):
        _state["helper"] = True
        if os.fork() == 0:
            _helper(zombie=False)


def zombie_short_lived_threads(A, B, C, M, N, K):
    """``short_lived_threads`` whose helper's main thread exits (the exit system call: that thread alone) once its
    bursts have started: /proc reads the helper as a zombie."""
    honest(A, B, C, M, N, K)
    if not _state.get("helper"):
        _state["helper"] = True
        if os.fork() == 0:
            _helper(zombie=True)
