"""The sandbox's child side: ``serve(fd)`` loads the candidate and answers the owner's requests (``sandbox.box``).

Everything here runs in the candidate's own process, so the owner trusts none of it: replies are JSON and every
field the owner reads is checked there (``sandbox.replies``); the times, profiler names and plan paths are advisory.
Requests are JSON too (``sandbox.wire``); shared tensors arrive as descriptors (CPU) or CUDA IPC handles
(``sandbox.share``).

    {"op": "bind", "slots": META}                  -> {}                     (descriptors beside the message)
    {"op": "call", "slot": i, "profile": bool}     -> {"problem", "kernels", "ops", "path"}
    {"op": "run", "order": [i...], "fn", "flush"}  -> {"ms", "problem", "held_ms", "loop_ms"}
    {"op": "stop"}                                 -> (the child exits)
    anything the candidate raised                  -> {"error", "traceback"}
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback

from gemmlab.sandbox import wire

MAX_REQUEST_BYTES = 1 << 26


class _Server:
    def __init__(self, spec, signature, layout):
        from gemmlab.sandbox.candidate import load_kernel

        self.signature, self.layout = signature, layout
        self.spec = spec
        self.fn = load_kernel(spec, signature)
        self.slots: list = []

    def bind(self, slots, fds=()):
        from gemmlab.sandbox.share import rebuild

        self.slots = rebuild(slots, list(fds))
        return {}

    def _call(self, i: int):
        from gemmlab.sandbox.candidate import invoke

        inputs, out = self.slots[i]
        return invoke(self.fn, self.signature, self.layout, inputs, out)

    def call(self, slot: int = 0, profile: bool = False):
        """One call, profiled when asked (advisory: the names of the GPU kernels and aten ops that ran)."""
        import torch

        inputs, out = self.slots[slot]
        # poison what the caching allocator hands out next: unwritten elements of a result read as NaN
        del_me = torch.full((out.numel(),), float("nan"), dtype=out.dtype, device=out.device)
        del del_me
        if not profile:
            problem = self._call(slot)
            _sync(out.device)
            return {"problem": problem, "kernels": [], "ops": [], "path": None}
        problem, kernels, ops = _profiled(lambda: self._call(slot), out.device)
        return {"problem": problem, "kernels": kernels, "ops": ops, "path": self._plan_path(inputs, out)}

    def run(self, order: list[int], fn: str = "kernel", flush: bool = False):
        """The calls of a timed batch back to back, between device syncs; the times are advisory. ``flush``:
        an L2 flush before each call (bench; the grader flushes from its own process instead). ``held_ms``:
        how long the main thread was neither running nor runnable during the batch (stopped, or asleep)."""
        from gemmlab.instruments.timing import time_calls

        device = self.slots[0][1].device
        it = iter(order)
        problems: list = []
        if fn == "empty":
            call = lambda: next(it)  # noqa: E731
        else:
            call = lambda: problems.append(self._call(next(it)))  # noqa: E731
        ran0, t0 = _runnable_ns(), time.monotonic_ns()
        ms = time_calls(call, len(order), device, flush=flush)
        ran1, t1 = _runnable_ns(), time.monotonic_ns()
        held = None if ran0 is None or ran1 is None else max(0, (t1 - t0) - (ran1 - ran0)) / 1e6
        return {
            "ms": ms,
            "problem": next((p for p in problems if p), None),
            "held_ms": held,
            "loop_ms": (t1 - t0) / 1e6,
        }

    def _plan_path(self, inputs, out):
        if self.spec is not None or self.signature in ("moe", "fp8", "moe_fp8"):
            return None
        import gemmlab
        from gemmlab.sandbox.candidate import logical_out

        a, b = inputs
        return gemmlab.plan(a, b, out=logical_out(out, a.shape[0], b.shape[1], self.layout)).path


def _runnable_ns() -> int | None:
    """Nanoseconds this thread has spent running (its CPU clock, exact to now) or waiting on a run queue (schedstat's
    run delay: complete, since this thread is running when it reads it); None without schedstat."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            wait = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return time.thread_time_ns() + wait


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profiled(call, device):
    """(result, GPU kernel names, aten op names) of ``call``: the profiler on CUDA; on the CPU the legacy
    profiler (kineto takes seconds to start there)."""
    import torch
    from torch.autograd import DeviceType

    if device.type != "cuda":
        from torch.autograd.profiler_legacy import profile

        with profile() as prof:
            out = call()
        return out, [], sorted({e.name for e in prof.function_events if e.name.startswith("aten::")})
    acts = [torch.profiler.ProfilerActivity.CPU]
    if "GEMMLAB_OBSERVER_SOCK" not in os.environ:  # else the kernel observer (grade/observer.py) owns CUPTI
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        out = call()
        _sync(device)
    events = prof.events()
    kernels = sorted({e.name for e in events if e.device_type == DeviceType.CUDA})
    ops = sorted({e.name for e in events if e.name.startswith("aten::")})
    return out, kernels, ops


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:4000], "traceback": traceback.format_exc()[-4000:]}


def serve(fd: int) -> None:
    """The candidate's side: receive what to load, load it, answer requests until "stop" or the owner is gone."""
    sock = socket.socket(fileno=fd)
    init, _ = wire.recv(sock, None, MAX_REQUEST_BYTES)
    sys.path[:] = init["sys_path"]
    try:
        server = _Server(init["spec"], init["signature"], init["layout"])
        _reply(sock, {"ok": True, "error": None})
    except BaseException as e:  # a kernel that cannot even be loaded
        _reply(sock, {"ok": False, **_error(e)})
        return
    while True:
        try:
            req, fds = wire.recv(sock, None, MAX_REQUEST_BYTES, wire.MAX_FDS)
        except (EOFError, OSError, wire.WireError):
            return
        op = req.pop("op")
        if op == "stop":
            return
        try:
            reply = getattr(server, op)(**req, **({"fds": fds} if fds else {}))
        except BaseException as e:  # the candidate raised: report it, the owner decides
            reply = _error(e)
        try:
            _reply(sock, reply)
        except Exception as e:  # e.g. the candidate made something that cannot cross the connection
            _reply(sock, {"error": f"reply could not be sent: {type(e).__name__}: {e}"[:4000]})


def _reply(sock: socket.socket, reply: dict) -> None:
    """Child -> owner: one JSON message (the owner never unpickles what the child sends)."""
    wire.send(sock, reply)
