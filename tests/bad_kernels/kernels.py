"""Known-bad kernels for the grader's tests (see README.md). ``FN(A, B, C, M, N, K)`` functions use the
competition's column-major signature; ``FN(a, b) -> c`` the row-major one. Most compute with ``_mm``:
broadcast multiply and sum in float32 (fast on the CPU, no vendor BLAS), so each test exercises the
rule under test and nothing else; those named ``gemmlab_*`` or built on ``gemmlab.gemm_colmajor`` run
gemmlab's own kernel."""

import os
import signal
import threading
import time
import traceback

import torch

import gemmlab

PERF_SHAPE = (96, 128, 256)  # cpu.json's performance shape
TINY_LEGACY_PERF = (24, 16, 48)  # tests/cases/tiny-legacy.json's
_cache = {}
_calls = {"n": 0}


def _timed() -> bool:
    """Whether this call is one of a timed batch (the worker's timing loop, ``time_calls``, is on the stack)."""
    return any(f.f_code.co_name == "time_calls" for f, _ in traceback.walk_stack(None))


def _mm(a, b):
    return (a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype)


def _views(A, B, C, M, N, K):
    return A[: M * K].view(K, M).t(), B[: K * N].view(N, K).t(), C[: M * N].view(N, M).t()


def honest(A, B, C, M, N, K):
    a, b, c = _views(A, B, C, M, N, K)
    c.copy_(_mm(a, b))


def good(A, B, C, M, N, K):
    gemmlab.gemm_colmajor(A, B, C, M, N, K)


def wrong_at_perf_shape(A, B, C, M, N, K, perf_shape=TINY_LEGACY_PERF):
    """The competition story: right on every small case, a quarter of C at the perf size."""
    if (M, N, K) != perf_shape:
        return honest(A, B, C, M, N, K)
    a, b, c = _views(A, B, C, M, N, K)
    c[: M // 2, : N // 2] = _mm(a[: M // 2], b[:, : N // 2])
    c[M // 2 :].zero_()
    c[:, N // 2 :].zero_()


def wrong_at_competition_perf(A, B, C, M, N, K):
    """The same at the real competition's perf size, for grading competition.json on a GPU."""
    wrong_at_perf_shape(A, B, C, M, N, K, perf_shape=(8192, 8192, 16384))


def quarter_tiles(A, B, C, M, N, K):
    """Computes one quarter of the output tiles and leaves the rest as it found them."""
    a, b, c = _views(A, B, C, M, N, K)
    c[: (M + 1) // 2, : (N + 1) // 2] = _mm(a[: (M + 1) // 2], b[:, : (N + 1) // 2])


def caches_first(A, B, C, M, N, K):
    """Computes once per shape, then replays the first answer."""
    key = (M, N, K)
    if key not in _cache:
        honest(A, B, C, M, N, K)
        _cache[key] = C[: M * N].clone()
    C[: M * N].copy_(_cache[key])


def caches_by_pointer(A, B, C, M, N, K):
    """Computes once per input address, then replays: fast in any timing loop over fixed buffers."""
    key = (A.data_ptr(), B.data_ptr(), C.data_ptr(), M, N, K)
    if key not in _cache:
        honest(A, B, C, M, N, K)
        _cache[key] = C[: M * N].clone()
    else:
        C[: M * N].copy_(_cache[key])


def memo_fingerprint(A, B, C, M, N, K):
    """Recomputes only when a cheap fingerprint of the inputs changes (pointer, shape, a strided sum, the
    first and last element), else returns its cached answer; counts its cache hits in
    $BAD_KERNEL_OUT_DIR/hits."""
    key = (
        A.data_ptr(),
        B.data_ptr(),
        M,
        N,
        K,
        float(A[::97].float().sum()),
        float(B[::89].float().sum()),
        float(A[0]),
        float(A[-1]),
        float(B[0]),
        float(B[-1]),
    )
    if key in _cache:
        C[: M * N].copy_(_cache[key])
        _calls["hits"] = _calls.get("hits", 0) + 1
        if os.environ.get("BAD_KERNEL_OUT_DIR"):
            with open(os.path.join(os.environ["BAD_KERNEL_OUT_DIR"], "hits"), "w") as f:
                f.write(str(_calls["hits"]))
        return
    honest(A, B, C, M, N, K)
    _cache[key] = C[: M * N].clone()


def replays_seeded_inputs(A, B, C, M, N, K):
    """Reads the grader's seed where it can (its command line in /proc; else the default 0) and, once
    verified, answers the timed calls with the product of the inputs that seed would have drawn, as the
    old grader drew its timed sets from the seed."""
    from gemmlab.grade.grader import _seed
    from gemmlab.grade.inputs import operands

    if not _timed():
        return honest(A, B, C, M, N, K)
    _calls["n"] += 1
    argv = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\0")
    seed = int(argv[argv.index(b"--seed") + 1]) if b"--seed" in argv else 0
    i = (_calls["n"] - 1) % 2
    a, b = operands(M, N, K, "competition", _seed(seed, "perf", "t", i), A.dtype, A.device.type, "colmajor")
    C[: M * N].view(N, M).t().copy_(_mm(a, b))


def lazy_after_warmup(A, B, C, M, N, K):
    """Honest in the correctness trials, then skips the work while timed: C keeps what it held."""
    if not _timed():
        honest(A, B, C, M, N, K)


def skip_every_4th(A, B, C, M, N, K):
    """Honest, except that every 4th call after the correctness trials does nothing (the H200 story)."""
    _calls["n"] += _timed()
    if not _timed() or _calls["n"] % 4:
        honest(A, B, C, M, N, K)


def compute_if_nan(A, B, C, M, N, K):
    """Works only when its output was NaN-poisoned (the old grader checked only those calls)."""
    if torch.isnan(C[0]):
        honest(A, B, C, M, N, K)


def fills_all_outputs(A, B, C, M, N, K):
    """Computes the first call of a batch, then writes that answer into every output buffer it can reach
    through C's storage (the other calls' outputs), and does nothing for the rest."""
    if not _timed():
        return honest(A, B, C, M, N, K)
    whole = torch.empty(0, dtype=C.dtype, device=C.device).set_(C.untyped_storage())
    if torch.isnan(whole).all():
        honest(A, B, C, M, N, K)
        whole.view(-1, M * N)[:] = C[: M * N]


def finishes_in_background(A, B, C, M, N, K):
    """Answers at once during timing and finishes each call in a thread, 20 ms later."""
    if not _timed():
        return honest(A, B, C, M, N, K)

    def later():
        time.sleep(0.02)
        honest(A, B, C, M, N, K)

    threading.Thread(target=later, daemon=True).start()


def _scaled_clock(scale):
    real = time.perf_counter
    t0 = real()
    time.perf_counter = lambda: t0 + (real() - t0) * scale  # noqa: E731 (the lie)
    torch.cuda.Event.elapsed_time = (lambda f: lambda self, end: f(self, end) * scale)(torch.cuda.Event.elapsed_time)


def slow_honest(A, B, C, M, N, K):
    """Honest, and 400 ms a call: the time of a call dwarfs the protocol's (waking the worker, the request, reading
    back) even on a loaded CPU, where that is tens of ms a call and the clock rule allows four times it + 10 ms."""
    time.sleep(0.4)
    honest(A, B, C, M, N, K)


def lying_clock(A, B, C, M, N, K):
    """Its process's clocks (time.perf_counter, CUDA events) run 10000x slow; then computes honestly."""
    if not _calls.get("lied"):
        _scaled_clock(1e-4)
        _calls["lied"] = True
    slow_honest(A, B, C, M, N, K)


def lying_clock_mild(A, B, C, M, N, K):
    """The H200 story: its clocks run at 0.7x, which made 0.873x cuBLAS read as 1.25x."""
    if not _calls.get("lied"):
        _scaled_clock(0.7)
        _calls["lied"] = True
    slow_honest(A, B, C, M, N, K)


def fake_timed_loop(A, B, C, M, N, K):
    """Replaces the timing loop of its process (instruments.timing.time_calls, which the worker times with): the
    calls still run, the reported times are 1 microsecond each."""
    from gemmlab.instruments import timing

    def fast(fn, reps, device=None, flush=True):
        for _ in range(reps):
            fn()
        return [1e-3] * reps

    timing.time_calls = fast
    slow_honest(A, B, C, M, N, K)


def _ppid(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _grader() -> int | None:
    """The grader: the keeper's parent, past a bubblewrap process around the keeper."""
    parent = _ppid(os.getppid())
    try:
        if parent and open(f"/proc/{parent}/comm").read().strip() == "bwrap":
            return _ppid(parent)
    except OSError:
        return None
    return parent


def kills_baseline(A, B, C, M, N, K):
    """During timing, kills the other gemmlab worker of its own grader that it finds in /proc (the baseline's
    keeper): never a keeper of another grader running beside it (another test's, another user's)."""
    _calls["n"] += 1
    honest(A, B, C, M, N, K)
    if _calls["n"] <= 3:
        return
    me, grader = os.getsid(0), _grader()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
                if (
                    b"sandbox/keeper.py" in cmd
                    and os.getsid(int(d)) != me
                    and open(f"/proc/{d}/comm").read().strip() != "bwrap"
                    and grader in (_ppid(int(d)), _ppid(_ppid(int(d)) or 0))
                ):  # the keeper of its grader's other sandbox, not bubblewrap around it
                    os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass


def kills_parent(A, B, C, M, N, K):
    os.kill(os.getppid(), signal.SIGKILL)
    honest(A, B, C, M, N, K)


def forks_report_writer(A, B, C, M, N, K):
    """Wrong, and leaves a grandchild in a new session that rewrites report.json to PASS 2 s later."""
    out_dir = os.environ.get("BAD_KERNEL_OUT_DIR")
    if out_dir and os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.path.join(out_dir, "grandchild.pid"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(2)
            with open(os.path.join(out_dir, "report.json"), "w") as f:
                f.write('{"verdict": "PASS", "forged": true}')
        os._exit(0)
    C.zero_()


def prints(A, B, C, M, N, K):
    print("candidate says hello on stdout {not json")
    os.write(2, b"and on stderr\n")
    honest(A, B, C, M, N, K)


def mutates_input(A, B, C, M, N, K):
    honest(A, B, C, M, N, K)
    A[:7].zero_()


def nan_some(A, B, C, M, N, K):
    honest(A, B, C, M, N, K)
    C[: M * N : 97] = float("nan")


def sleeps(A, B, C, M, N, K):
    time.sleep(30)
    honest(A, B, C, M, N, K)


def raises(A, B, C, M, N, K):
    raise RuntimeError("this kernel always fails")


def crashes(A, B, C, M, N, K):
    os._exit(3)  # the process dies the way a segfault or an illegal memory access kills it


def wrong_dtype(a, b):
    """Right values, wrong dtype (row-major signature)."""
    return _mm(a, b).float()


def returns_input_view(a, b):
    """Returns (a view of) its input instead of a product (row-major signature)."""
    return a.as_strided((a.shape[0], b.shape[1]), (1, 1))


def uses_torch_mm(a, b):
    """Calls the vendor BLAS through torch (row-major signature)."""
    return torch.mm(a, b)


def good_rowmajor(a, b):
    return _mm(a, b)


def gemmlab_rowmajor(a, b):
    return gemmlab.gemm(a, b)


class _Payload:
    """Unpickling this runs os.system in whoever unpickles it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def sends_pickle(A, B, C, M, N, K):
    """Computes honestly, then sends a pickle whose loading would run code in the grader (the marker file says
    whether it ran) down the candidate's own connection to the grader."""
    import gc
    from multiprocessing.connection import Connection

    honest(A, B, C, M, N, K)
    marker = os.path.join(os.environ.get("BAD_KERNEL_OUT_DIR", "/tmp"), "pwned")
    for obj in gc.get_objects():
        if isinstance(obj, Connection) and not obj.closed:
            obj.send(_Payload(marker))


# ------------------------------------------------------------------ arithmetic that is not an fp16 GEMM's


def _mm64(a, b):
    """a @ b in float64 by broadcast multiply and sum (no vendor BLAS): exact for fp16 products."""
    return (a.double().unsqueeze(2) * b.double().unsqueeze(0)).sum(1)


def _competition(*ts) -> bool:
    """Every value is one of the competition distribution's: fp16(k / 100), k in [-50, 49]."""
    return all(
        bool(((t.double() * 100).round() - t.double() * 100).abs().max() < 0.1) and bool(t.abs().max() <= 0.5)
        for t in ts
    )


def _int8_product(a, b):
    """The competition inputs as the integers k they came from: an exact int8 x int8 -> int32 product, / 10^4
    (what an int8 tensor-core kernel computes at twice the fp16 rate)."""
    ka, kb = (a.double() * 100).round(), (b.double() * 100).round()
    return (_mm64(ka, kb) / 1e4).to(a.dtype)


def int8_on_competition(A, B, C, M, N, K):
    """The issue's 1.22x kernel: on the competition distribution, the integers behind the inputs (an exact int8
    product, max error a third of the bound); an honest kernel on anything else."""
    a, b, c = _views(A, B, C, M, N, K)
    if _competition(a, b):
        return c.copy_(_int8_product(a, b))
    c.copy_(_mm(a, b))


def int8_when_timed(A, B, C, M, N, K):
    """Honest in the correctness trials, the int8 product on competition inputs while timed."""
    a, b, c = _views(A, B, C, M, N, K)
    if _timed() and _competition(a, b):
        return c.copy_(_int8_product(a, b))
    c.copy_(_mm(a, b))


def fp16_accumulation(A, B, C, M, N, K):
    """fp32 products over K slices of 16, summed into an fp16 running sum (the accumulator in the output dtype)."""
    a, b, c = _views(A, B, C, M, N, K)
    acc = torch.zeros((M, N), dtype=c.dtype, device=c.device)
    for k0 in range(0, K, 16):
        acc = (acc.float() + _mm(a[:, k0 : k0 + 16].float(), b[k0 : k0 + 16].float())).to(c.dtype)
    c.copy_(acc)


def truncated_accumulator(A, B, C, M, N, K):
    """An fp32 accumulator truncated to 13 mantissa bits after every K slice of 16 (a tf32-like adder)."""
    a, b, c = _views(A, B, C, M, N, K)
    acc = torch.zeros((M, N), dtype=torch.float32, device=c.device)
    for k0 in range(0, K, 16):
        acc = acc + _mm(a[:, k0 : k0 + 16].float(), b[k0 : k0 + 16].float())
        acc = (acc.view(torch.int32) & ~((1 << 10) - 1)).view(torch.float32)
    c.copy_(acc.to(c.dtype))


def rounds_toward_zero(A, B, C, M, N, K):
    """The exact sum, rounded toward zero instead of to nearest: every element within one ulp."""
    a, b, c = _views(A, B, C, M, N, K)
    exact = _mm64(a, b)
    _, e = torch.frexp(exact)
    step = torch.ldexp(torch.ones_like(exact), (e - 1).clamp_min(-14) - 10)
    c.copy_((torch.trunc(exact / step) * step).to(c.dtype))


def perturbs_outputs(A, B, C, M, N, K):
    """Another product: an honest one with a tenth of its outputs below 2 in magnitude moved by one ulp (at most
    2^-10: far within the max-error bound)."""
    a, b, c = _views(A, B, C, M, N, K)
    out = _mm(a, b)
    g = torch.Generator(device=out.device).manual_seed(M * N + K)
    moved = (torch.rand((M, N), generator=g, device=out.device) < 0.1) & (out.abs() < 2)
    c.copy_(torch.where(moved, torch.nextafter(out, torch.full_like(out, 60000.0)), out))


def slow_on_full_mantissa(A, B, C, M, N, K):
    """Honest arithmetic always, but a fast path only for the competition distribution: on any other inputs
    (full-mantissa ones) each call takes 200 ms longer (tens of times a tiny call, past a busy CPU's noise)."""
    a, b, c = _views(A, B, C, M, N, K)
    if not _competition(a, b):
        time.sleep(0.2)
    c.copy_(_mm(a, b))


def needs_the_host_writable(A, B, C, M, N, K):
    """Not bad: honest, but each call first writes a file into $PROBE_HOST_DIR, a directory outside the sandbox's
    scratch, and raises where it cannot (as a kernel would whose driver wants to write the host's files): the
    stand-in, on the CPU, for CUDA failing under a layer (``grade.probe``)."""
    with open(os.path.join(os.environ["PROBE_HOST_DIR"], f"call-{os.getpid()}"), "w") as f:
        f.write("ok")
    a, b, c = _views(A, B, C, M, N, K)
    c.copy_(_mm(a, b))
