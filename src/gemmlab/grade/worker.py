"""The candidate's process. The grader (parent) owns inputs, references, checks and verdicts; this child
only loads the kernel and calls it on tensors the parent shares with it (CUDA IPC or shared memory).

Requests (dicts over a multiprocessing Pipe) and replies:
    call   {a, b, c}            -> {out, path, kernels, ops}   one call, profiled (kernel and aten op names)
    warmup {a, b, c, seconds}   -> {}
    time   {sets, reps, samples, sample_at, flush, profile} -> {device_ms, host_ms, kernels, ops, path}
``a`` (M, K) and ``b`` (K, N) are logical views in the case's layout; ``c`` is the NaN-poisoned flat
output buffer for the colmajor signature (None for rowmajor, whose result is returned).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path


def load_kernel(spec: str | None, signature: str):
    """``FILE.py:FN`` or ``package.module:FN``; None means gemmlab's own kernel for the signature."""
    if spec is None:
        import gemmlab

        return {"colmajor": gemmlab.gemm_colmajor, "moe": gemmlab.moe_forward}.get(signature, gemmlab.gemm)
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ValueError(f"--kernel {spec!r}: expected FILE.py:FN or package.module:FN")
    if target.endswith(".py"):
        path = Path(target).resolve()
        mod_spec = importlib.util.spec_from_file_location(f"gemmlab_candidate_{path.stem}", path)
        if mod_spec is None or not path.exists():
            raise FileNotFoundError(f"--kernel: no file {path}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"--kernel {spec!r}: {name!r} is not a function of {target}")
    return fn


def invoke(fn, signature: str, layout: str, a, b, c):
    """Call the candidate on logical A (M, K), B (K, N) stored in ``layout``; return its result as a
    logical (M, N) tensor."""
    m, k = a.shape
    n = b.shape[1]
    if signature == "rowmajor":
        return fn(a, b)
    if layout == "colmajor":  # the buffers are the operands' own memory
        fn(a.t().reshape(-1), b.t().reshape(-1), c, m, n, k)
        return c.view(n, m).t()
    # rowmajor case, colmajor kernel: row-major X is column-major X^T, so C^T = B^T A^T
    fn(b.reshape(-1), a.reshape(-1), c, n, m, k)
    return c.view(m, n)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profiled(call, device):
    import torch
    from torch.autograd import DeviceType

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        out = call()
        _sync(device)
    events = prof.events()
    kernels = sorted({e.name for e in events if e.device_type == DeviceType.CUDA})
    ops = sorted({e.name for e in events if e.name.startswith("aten::")})
    return out, kernels, ops


def _plan_path(spec, signature, a, b, out):
    if spec is not None:
        return None
    import gemmlab

    return gemmlab.plan(a, b, out=out if signature == "colmajor" else None).path


class _Server:
    def __init__(self, spec, signature, layout):
        self.spec, self.signature, self.layout = spec, signature, layout
        self.fn = load_kernel(spec, signature)
        self.keep = []  # results shared with the parent stay alive until the next request

    def call(self, a, b, c):
        import torch

        # poison what the caching allocator will hand out next, so unwritten elements of a returned
        # tensor read as NaN rather than as a stale correct answer
        del_me = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=a.dtype, device=a.device)
        del del_me
        out, kernels, ops = _profiled(lambda: invoke(self.fn, self.signature, self.layout, a, b, c), a.device)
        path = _plan_path(self.spec, self.signature, a, b, out)
        if self.signature == "colmajor":
            out = None  # the parent reads its own C buffer (a CUDA tensor received cannot be sent back)
        elif isinstance(out, torch.Tensor) and any(out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                                                    for t in (a, b)):
            out = out.clone()  # the candidate returned (a view of) an input; let the parent judge a copy
        self.keep = [out]
        return {"out": out, "path": path, "kernels": kernels, "ops": ops}

    def call_args(self, args):
        """One call FN(*args) (the MoE signature: x, w1, w2, topk_weights, topk_ids), profiled."""
        import torch

        out, kernels, ops = _profiled(lambda: self.fn(*args), args[0].device)
        if isinstance(out, torch.Tensor) and any(out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                                                  for t in args):
            out = out.clone()
        self.keep = [out]
        return {"out": out, "path": None, "kernels": kernels, "ops": ops}

    def warmup_args(self, args, seconds):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.fn(*args)
            _sync(args[0].device)
        return {}

    def time_args(self, sets, reps, samples, sample_at, flush, profile):
        """Like ``time`` for FN(*args): before a sampled call its set's first argument is negated in place;
        the parent holds the references for both signs."""
        def before(i):
            if i in sample_at:
                sets[i % len(sets)][0].neg_()

        def after(i, out):
            if i in sample_at:
                samples[sample_at[i]].copy_(out)

        call = lambda i: self.fn(*sets[i % len(sets)])  # noqa: E731
        device_ms, host_ms = timed_loop(call, reps, sets[0][0].device, flush, before, after)
        reply = {"device_ms": device_ms, "host_ms": host_ms, "kernels": [], "ops": [], "path": None}
        if profile:
            _, reply["kernels"], reply["ops"] = _profiled(lambda: call(0), sets[0][0].device)
        return reply

    def warmup(self, a, b, c, seconds):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            invoke(self.fn, self.signature, self.layout, a, b, c)
            _sync(a.device)
        return {}

    def time(self, sets, reps, samples, sample_at, flush, profile):
        """reps calls rotating over the input sets (see timed_loop). Before each call in sample_at, outside
        the timed region, its set's A is negated in place (fresh inputs at the same address: a result
        cached by pointer is now wrong) and its C poisoned; after it, the output is copied into the
        parent's sample buffer. The parent expects -C for every negation."""
        def before(i):
            if i in sample_at:
                a, _, c = sets[i % len(sets)]
                a.neg_()
                if c is not None:
                    c.fill_(float("nan"))

        def after(i, out):
            if i in sample_at:
                samples[sample_at[i]].copy_(out)

        call = lambda i: invoke(self.fn, self.signature, self.layout, *sets[i % len(sets)])  # noqa: E731
        device_ms, host_ms = timed_loop(call, reps, sets[0][0].device, flush, before, after)
        reply = {"device_ms": device_ms, "host_ms": host_ms, "kernels": [], "ops": [], "path": None}
        if profile:
            out, reply["kernels"], reply["ops"] = _profiled(lambda: call(0), sets[0][0].device)
            reply["path"] = _plan_path(self.spec, self.signature, sets[0][0], sets[0][1], out)
        return reply


def timed_loop(call, reps: int, device, flush: bool, before=None, after=None) -> tuple[list[float], list[float]]:
    """Time ``call(i)`` for i < reps: on CUDA each call is bracketed by events on the current stream and by
    host clocks around a device-wide synchronize (work on any stream lands inside the host time), after an
    optional L2 flush; on the CPU by host clocks. ``before(i)`` and ``after(i, out)`` run outside the timed
    region. Shared by the candidate's process and the grader's baseline, so both are timed alike."""
    import torch

    cuda = device.type == "cuda"
    if cuda and flush:
        from gemmlab.bench.timing import l2_flush_buffer

        flusher = l2_flush_buffer(device)
    device_ms, host_ms = [], []
    for i in range(reps):
        if before is not None:
            before(i)
        if cuda:
            if flush:
                flusher.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            start.record()
            out = call(i)
            end.record()
            torch.cuda.synchronize(device)
            host_ms.append((time.perf_counter() - t0) * 1e3)
            device_ms.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = call(i)
            host_ms.append((time.perf_counter() - t0) * 1e3)
            device_ms.append(host_ms[-1])
        if after is not None:
            after(i, out)
    return device_ms, host_ms


def serve(conn, spec: str | None, signature: str, layout: str, interpret: bool, log_path: str) -> None:
    """Child entry point: load the kernel, then answer requests until 'stop' or the pipe closes. The
    child's stderr goes to ``log_path`` (the grader quotes its tail when the process dies)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch.multiprocessing  # noqa: F401  (tensor reductions for the pipe)

    try:
        server = _Server(spec, signature, layout)
        conn.send({"ok": True})
    except BaseException as e:  # a kernel that cannot even be loaded
        conn.send({"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            return
        op = req.pop("op")
        if op == "stop":
            return
        try:
            reply = getattr(server, op)(**req)
        except BaseException as e:  # the candidate raised: report it, the parent decides
            reply = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        try:
            conn.send(reply)
        except Exception as e:  # e.g. the candidate returned something that cannot cross the pipe
            conn.send({"error": f"reply could not be sent: {type(e).__name__}: {e}"})
