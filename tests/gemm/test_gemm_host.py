"""The eager gemm call's host path, on the CPU: the direct launch (ops.launch) hands Triton's C launcher exactly
what Triton's own CudaLauncher would, for every path; descriptors are encoded once per buffer; and a hot call
(signature cached, kernel kept) stays within a bound of Python function calls, entering neither the planner
nor the checks nor Triton. The GPU half (real launches, timings) is tests/ops/test_host_gpu.py and
benchmarks/host_cost.py."""

import cProfile
import dataclasses
import inspect
import os
import pstats
import sys
import time

import pytest
import torch

import gemmlab
from gemmlab.ops import launch
from gemmlab.ops.gemm import launch as gemm_launch
from gemmlab.ops.gemm.planner import choose
from tests.conftest import rand

pytestmark = pytest.mark.cpu_only("simulates the GPU's launcher on the interpreter")

CASES = {  # name: (M, N, K, split-K or None for the table's)
    "splitk-1": (8, 40, 64, 1),
    "splitk-2": (16, 40, 256, 2),  # a workspace and arrival counters
    "persistent": (264, 72, 96, None),
    "portable": (37, 53, 71, None),  # pointers only
    "gemv-1": (1, 37, 71, 1),  # pointers, odd K (the GEMV path, pinned)
    "gemv-3": (5, 48, 200, 3),  # pointers with a workspace and arrival counters
}
# Python and C function calls cProfile counts in one hot gemmlab.gemm(a, b, out=out): 33 (portable, one-row GEMV) to 38
# (split-K 2, GEMV split 3) at the commit that added the negated-view check (one is_neg per operand: issue 34, item 4),
# plus this test's four stand-ins (the device, the stream, the recording launcher, the profiled lambda)
HOT_CALLS_BOUND = 43


def _fake_tensordesc(arg, meta):
    """Stands in for Triton's make_tensordesc_arg (cuTensorMapEncodeTiled needs a GPU): the same layout of
    arguments, a tuple naming what was encoded in place of the CUtensorMap."""
    return [("map", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), meta), *arg.shape, *arg.strides]


def _launch(name):
    m, n, k, split = CASES[name]
    a, b = rand((m, k)), rand((k, n))
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    path = "gemv" if name.startswith("gemv") else None
    p = choose(a, b, c, False, path=path)
    if split:
        p = choose(a, b, c, False, dataclasses.replace(p.config, split_k=split), path=path)
    return p, gemm_launch.prepare(p), a, b, c


def _signature(L, runtime_args: int) -> dict:
    """The kernel's Triton signature as CudaLauncher sees it: descriptors, pointers, ints, then constexprs."""
    kinds = [f"tensordesc<fp16[{d[2][0]}, {d[2][1]}]>" if d is not None else "*fp16" for d in L.descs]
    kinds += ["*fp32", "*i32"] if L.scratch is not None else []
    kinds += ["i32"] * (runtime_args - len(kinds))
    names = list(inspect.signature(L.kernel.fn).parameters)
    return {i: kinds[i] if i < runtime_args else "constexpr" for i in range(len(names))}


def _fake_launcher(L, runtime_args, seen):
    """A CudaLauncher built by Triton's own code around a recording C launcher."""
    from triton.backends.nvidia import driver as nvidia

    n_desc = sum(d is not None for d in L.descs)
    run = object.__new__(nvidia.CudaLauncher)
    run.launch = nvidia.wrap_handle_tensordesc(
        lambda *args: seen.append(args),
        _signature(L, runtime_args),
        [{"swizzle": 3, "slot": i} for i in range(n_desc)] or None,
    )
    run.num_ctas, run.launch_cooperative_grid, run.launch_pdl = 1, False, False
    run.global_scratch_size = run.global_scratch_align = run.profile_scratch_size = run.profile_scratch_align = 0
    tail = launch.constexpr_tail(L.kernel, runtime_args, L.consts)
    compiled = type("Compiled", (), {"metadata": type("Meta", (), {"tensordesc_meta": None})()})()
    if n_desc:
        compiled.metadata.tensordesc_meta = [{"swizzle": 3, "slot": i} for i in range(n_desc)]
    return launch.Kept(run, 1234, "packed", tail, 0, compiled)


@pytest.fixture
def gpu_stand_in(monkeypatch):
    from triton.backends.nvidia import driver as nvidia

    encoded = []
    monkeypatch.setattr(
        nvidia, "make_tensordesc_arg", lambda arg, meta: (encoded.append(meta), _fake_tensordesc(arg, meta))[1]
    )
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    yield encoded
    gemm_launch.clear_cache()  # the stand-in kept launches must not outlive the stand-ins


@pytest.mark.parametrize("name", list(CASES))
def test_direct_launch_hands_the_c_launcher_what_triton_does(name, gpu_stand_in):
    """Per path: the argument tuple the C launcher gets from fire_direct equals, position by position, the one
    Triton's CudaLauncher (wrap_handle_tensordesc included) builds from the kept launch's arguments; pointers
    go as addresses (Triton's launcher would ask the driver about each tensor)."""
    p, L, a, b, c = _launch(name)
    assert p.path == name.split("-")[0].replace("splitk", "tma_splitk").replace("persistent", "tma_persistent")
    runtime_args = len(gemm_launch.jit_args(L, a, b, c))
    seen = []
    L.kept = _fake_launcher(L, runtime_args, seen)
    L.direct = launch.direct_launcher(L.kept, sum(d is not None for d in L.descs))
    assert L.direct is not None
    launch.run(L.kept, L.grid, gemm_launch.direct_args(L, a, b, c))  # Triton's way
    gemm_launch.fire_direct(L, a, b, c)  # ours
    theirs, ours = seen
    as_ptr = [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in theirs]
    assert len(ours) == len(theirs) and list(ours) == as_ptr
    assert all(not isinstance(x, torch.Tensor) for x in ours)


def test_descriptors_are_encoded_once_per_buffer(gpu_stand_in):
    encoded = gpu_stand_in
    p, L, a, b, c = _launch("persistent")
    runtime_args = len(gemm_launch.jit_args(L, a, b, c))
    L.kept = _fake_launcher(L, runtime_args, [])
    L.direct = launch.direct_launcher(L.kept, 3)
    for _ in range(3):
        gemm_launch.fire_direct(L, a, b, c)
    assert len(encoded) == 3  # a, b and c once each
    c2 = torch.empty_like(c)
    gemm_launch.fire_direct(L, a, b, c2)
    assert len(encoded) == 4  # only the new output's descriptor
    for _ in range(launch.MAPS_PER_OPERAND + 1):  # a new output each call: the kept maps stay bounded
        gemm_launch.fire_direct(L, a, b, torch.empty_like(c))
    assert all(len(m) <= launch.MAPS_PER_OPERAND for m in L.direct.maps)


def test_direct_steps_aside_for_a_launcher_it_does_not_mirror():
    """Anything but Triton's CudaLauncher as this version builds it keeps the CompiledKernel.run path."""
    from triton.backends.nvidia import driver as nvidia

    assert launch.direct_launcher(None, 0) is None
    assert launch.direct_launcher(launch.Kept(lambda *a: None, 1, "p", (), 0, None), 0) is None  # not a CudaLauncher
    run = object.__new__(nvidia.CudaLauncher)
    run.launch, run.num_ctas, run.launch_cooperative_grid, run.launch_pdl = (lambda *a: None), 1, False, False
    run.global_scratch_size, run.profile_scratch_size = 128, 0  # a kernel that needs global scratch
    meta = type("Compiled", (), {"metadata": type("Meta", (), {})()})()
    assert launch.direct_launcher(launch.Kept(run, 1, "p", (), 0, meta), 0) is None
    run.global_scratch_size = 0
    assert launch.direct_launcher(launch.Kept(run, 1, "p", (), 0, meta), 0) is not None
    # descriptors but no wrapper around it
    assert launch.direct_launcher(launch.Kept(run, 1, "p", (), 0, meta), 2) is None


def _hot(monkeypatch, a, b, launched, out=None):
    """Make the cached launch of gemm(a, b, out=out) look kept on a GPU, with a C launcher that only counts."""
    gemmlab.gemm(a, b, out=out)  # plans, prepares, runs once (interpreter)
    e = gemm_launch.CACHE[gemm_launch.signature(a, b, out)]
    L = e.launch
    L.kept = launch.Kept(lambda *x: None, 1234, "packed", tuple(L.consts.values()), 0, None)
    n_desc = sum(d is not None for d in L.descs)
    L.direct = launch.Direct(
        lambda *args: launched.append(len(args)),
        1234,
        "packed",
        False,
        False,
        L.kept.tail,
        (None,) * n_desc,
        tuple({} for _ in range(n_desc)),
    )
    return e


def _profile(call, n: int) -> pstats.Stats:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        call()
    prof.disable()
    return pstats.Stats(prof)


@pytest.mark.parametrize("name", list(CASES))
def test_a_hot_call_is_short(name, gpu_stand_in, monkeypatch, device):
    """cProfile of hot gemmlab.gemm calls: at most HOT_CALLS_BOUND function calls each, the C launcher reached
    every time, and nothing of the planner, the checks, the JIT or Triton's Python launcher entered. Counted with
    a fixed out (the CPU allocator hands out a new address almost every call, so with out=None every call here
    would encode C's descriptor again; the GPU's caching allocator hands the same block back); out=None is the
    same path with torch.empty in place of out's overlap check."""
    m, n, k, split = CASES[name]
    a, b = rand((m, k)), rand((k, n))
    if split:
        p = gemmlab.plan(a, b)
        gemm_launch.clear_cache()
        monkeypatch.setattr(
            gemm_launch, "choose", lambda *args: choose(*args[:4], dataclasses.replace(p.config, split_k=split))
        )
    for out in (torch.empty(m, n, dtype=a.dtype, device=device), None):
        launched = []
        _hot(monkeypatch, a, b, launched, out)
        gemmlab.gemm(a, b, out=out)  # the first hot call encodes the descriptors
        calls = 50
        stats = _profile(lambda out=out: gemmlab.gemm(a, b, out=out), calls)
        assert len(launched) == calls + 1
        entered = {f for (f, _, _) in stats.stats}
        assert not [
            f
            for f in entered
            if f.endswith(("gemm/planner.py", "gemm/checks.py", "gemm/route.py", "gemm/staging.py", "layout.py"))
            or "triton" in f
        ], entered
        if out is not None:
            per_call = stats.total_calls / calls
            assert per_call <= HOT_CALLS_BOUND, "\n".join([str(per_call)] + _listing(stats))


def test_a_repeat_call_passes_through_four_ops_modules(device):
    """The path of ``gemmlab.gemm(a, b)`` once its signature is planned, counted with ``sys.setprofile`` (gemmlab
    frames outside ``kernels/``): ops/gemm/api.py (the public call), ops/gemm/launch.py (the signature cache's
    launcher), ops/cache.py (the lookup) and ops/launch.py (is the call eager? then the kept kernel, or the JIT
    under the interpreter): at most four modules, none of the checks, the planner or the layout rules."""
    a, b = rand((37, 53)), rand((53, 29))
    gemmlab.gemm(a, b)
    src = os.path.dirname(gemmlab.__file__)
    entered = set()

    def profile(frame, event, arg):
        f = frame.f_code.co_filename
        if event == "call" and f.startswith(src):
            entered.add(os.path.relpath(f, src).replace(os.sep, "/"))

    sys.setprofile(profile)
    try:
        gemmlab.gemm(a, b)
    finally:
        sys.setprofile(None)
    ops = {f for f in entered if not f.startswith("kernels/")}
    assert ops == {"ops/gemm/api.py", "ops/gemm/launch.py", "ops/cache.py", "ops/launch.py"}, ops
    assert len(ops) <= 4


def _listing(stats) -> list[str]:
    return [f"{f.rsplit('/', 1)[-1]}:{fn} x{nc}" for (f, _, fn), (_, nc, *_) in stats.stats.items()]


def test_the_call_bound_can_fail(gpu_stand_in, monkeypatch, device):
    """The bound above sees a regression: the same hot call with the descriptor cache defeated (every call
    encodes again, as Triton's launcher does) costs more calls than HOT_CALLS_BOUND allows."""
    a, b = rand((264, 96)), rand((96, 72))
    out = torch.empty(264, 72, dtype=a.dtype, device=device)
    _hot(monkeypatch, a, b, [], out)
    real = launch.desc_args
    monkeypatch.setattr(launch, "desc_args", lambda d, i, *args: (d.maps[i].clear(), real(d, i, *args))[1])
    assert _profile(lambda: gemmlab.gemm(a, b, out=out), 20).total_calls / 20 > HOT_CALLS_BOUND


def test_host_microseconds_per_hot_call(gpu_stand_in, monkeypatch, capsys, device):
    """What a hot call (out given) costs here with the launch stubbed out, beside a bare torch.empty of C (what
    an out=None call adds): printed for the record, not asserted (this machine's load varies)."""
    rows = []
    for name in CASES:
        m, n, k, _ = CASES[name]
        a, b = rand((m, k)), rand((k, n))
        out = torch.empty(m, n, dtype=a.dtype, device=device)
        _hot(monkeypatch, a, b, [], out)
        for _ in range(20):
            gemmlab.gemm(a, b, out=out)
        t0 = time.perf_counter()
        for _ in range(2000):
            gemmlab.gemm(a, b, out=out)
        t1 = time.perf_counter()
        for _ in range(2000):
            torch.empty((m, n), dtype=a.dtype)
        t2 = time.perf_counter()
        rows.append(f"{name}: {(t1 - t0) / 2000 * 1e6:.1f} us per hot call, torch.empty {(t2 - t1) / 2000 * 1e6:.1f}")
    with capsys.disabled():
        print("\n" + "\n".join(rows))


def test_launch_mode_says_how_a_signature_launches(gpu_stand_in, monkeypatch):
    from gemmlab.ops.introspect import launch_mode

    a, b = rand((264, 96)), rand((96, 72))
    gemm_launch.clear_cache()
    assert launch_mode(a, b) == "uncached"
    gemmlab.gemm(a, b)
    assert launch_mode(a, b) == "jit"  # the interpreter keeps no compiled kernel
    e = _hot(monkeypatch, a, b, [])
    assert launch_mode(a, b) == "direct"
    e.launch.direct = None
    assert launch_mode(a, b) == "kept"
    assert launch_mode(rand((4, 0)), rand((0, 8))) == "uncached"
