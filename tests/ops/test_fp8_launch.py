"""gemm_fp8's and quantize_fp8's launch (issue 30): a frozen plan per signature in a bounded cache, every check once
per signature and only out's overlap after that, the compiled kernel kept after its first launch and launched
directly (``ops.launch``), as ``gemm`` does.

Under the interpreter nothing is compiled, so launches stay with the JIT; the kept path's arguments are checked
here by a stand-in ``keep`` whose "compiled kernel" runs the kernel through the JIT with the arguments the kept
launch hands it. On a GPU, the ``gpu`` test counts JIT launches: only a signature's first call enters the JIT.
"""

from __future__ import annotations

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

import gemmlab
from gemmlab.ops import introspect, launch
from gemmlab.ops.fp8 import launch as fp8
from gemmlab.ops.fp8 import quantize as fp8_quantize
from gemmlab.ref import gemm_fp8_check
from tests.conftest import DEVICE

FP8 = torch.float8_e4m3fn


def _operands(m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    qa, sa = gemmlab.quantize_fp8(torch.randn(m, k, generator=g).to(DEVICE), "row")
    qw, sw = gemmlab.quantize_fp8(torch.randn(n, k, generator=g).to(DEVICE), "row")
    return qa, qw.t(), sa, sw.t()


@pytest.fixture
def fresh():
    """Empty plan caches before and after (no plan or stand-in kept kernel outlives the test)."""
    fp8.clear_plans()
    fp8_quantize.PLANS.clear()
    yield
    fp8.clear_plans()
    fp8_quantize.PLANS.clear()


def test_a_signature_is_checked_and_planned_once(fresh, monkeypatch):
    planned = []
    real = fp8.plan_fp8
    monkeypatch.setattr(fp8, "plan_fp8", lambda *a, **kw: planned.append(1) or real(*a, **kw))
    qa, qb, sa, sb = _operands(9, 32, 48)
    for seed in range(3):  # new values, the same layout: one plan
        qa, qb, sa, sb = _operands(9, 32, 48, seed)
        out = torch.full((9, 32), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        gemmlab.gemm_fp8(qa, qb, sa, sb, out=out)
        assert gemm_fp8_check(out, qa, qb, sa, sb)["ok"], seed
    assert len(planned) == 1
    assert introspect.fp8_launch_mode(qa, qb, sa, sb) == "uncached"  # (without out: another signature)
    gemmlab.gemm_fp8(qa, qb, sa, sb)
    assert introspect.fp8_launch_mode(qa, qb, sa, sb) == ("jit" if DEVICE == "cpu" else "direct")
    assert len(planned) == 2


def test_a_misaligned_operand_is_checked_not_served_from_the_cache(fresh):
    """The key holds each base's 16-byte alignment: a view one byte off, same shape and strides, is a new signature
    and its full check refuses it."""
    qa, qb, sa, sb = _operands(4, 32, 32)
    gemmlab.gemm_fp8(qa, qb, sa, sb)
    buf = torch.empty(4 * 32 + 16, dtype=torch.uint8, device=DEVICE)
    off = buf[1 : 1 + 4 * 32].view(FP8).view(4, 32)
    off.copy_(qa)
    assert off.shape == qa.shape and off.stride() == qa.stride()
    with pytest.raises(ValueError, match="not TMA-aligned"):
        gemmlab.gemm_fp8(off, qb, sa, sb)


def test_an_out_overlapping_an_input_is_refused_on_a_cached_signature(fresh):
    """The one check a hit still makes: out's memory against the inputs' (the signature cannot prove it)."""
    qa, qb, _, sb = _operands(4, 32, 32)
    mem = torch.zeros(4 * 32 + 64, dtype=torch.float32, device=DEVICE)
    sa = mem[:4].view(4, 1).fill_(0.5)  # a's row scales, at the start of mem
    fresh_out = torch.empty_like(mem)[: 4 * 32].view(4, 32)
    gemmlab.gemm_fp8(qa, qb, sa, sb, out=fresh_out)  # the signature's first call: every check, cached
    assert introspect.fp8_launch_mode(qa, qb, sa, sb, torch.float32, fresh_out) != "uncached"
    clash = mem[: 4 * 32].view(4, 32)  # the same layout and alignment, over a_scale's memory
    with pytest.raises(ValueError, match="out overlaps a_scale"):
        gemmlab.gemm_fp8(qa, qb, sa, sb, out=clash)


@pytest.mark.parametrize("m", [5, 65], ids=["decode", "tma"])
def test_the_kept_launch_passes_what_the_jit_launch_does(fresh, monkeypatch, m):
    """A stand-in kept kernel that runs the kernel through the JIT on exactly the arguments a kept launch hands it
    (descriptors as ``HostDesc``, rebuilt with the planned blocks; the decode path's pointers and split-K scratch):
    the second call launches it, not the JIT, and writes the right values into a poisoned out."""
    kept_calls = []

    def keep(kernel, compiled, runtime_args, consts):
        if kernel.fn.__name__ not in ("gemm_fp8_tma_kernel", "gemv_fp8_kernel"):
            return None  # (quantize_fp8's launches stay with the JIT here)

        def run(g0, g1, g2, stream, function, packed, meta, enter, exit_, *args):
            (e,) = fp8.PLANS.values()
            kept_calls.append(args)
            args = list(args[:runtime_args])
            for i, spec in enumerate(e.descs):
                if spec is not None:
                    assert isinstance(args[i], launch.HostDesc), (i, args[i])
                    args[i] = TensorDescriptor(args[i].base, args[i].shape, args[i].strides, spec[3])
            kernel[(g0, g1, g2)](*args, **consts, **e.slot.opts)

        return launch.Kept(run, "fn", "meta", launch.constexpr_tail(kernel, runtime_args, consts), 0)

    monkeypatch.setattr(launch, "keep", keep)
    monkeypatch.setattr(launch, "usable", lambda k: k is not None)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    for seed, mode in ((0, "uncached"), (1, "kept"), (2, "kept")):
        qa, qb, sa, sb = _operands(m, 48, 32, seed)
        assert introspect.fp8_launch_mode(qa, qb, sa, sb) == mode
        out = gemmlab.gemm_fp8(qa, qb, sa, sb)
        assert gemm_fp8_check(out, qa, qb, sa, sb)["ok"], seed
    assert len(kept_calls) == 2
    (e,) = fp8.PLANS.values()
    assert e.plan.path == ("decode" if m <= 64 else "tma"), e.plan.reason


def test_quantize_plans_once_and_bad_arguments_still_fail(fresh, monkeypatch):
    checked = []
    real = fp8_quantize.check_quantize_args
    monkeypatch.setattr(fp8_quantize, "check_quantize_args", lambda *a: checked.append(1) or real(*a))
    x = torch.randn(6, 40).to(DEVICE)
    for _ in range(3):
        q, s = gemmlab.quantize_fp8(x, "row")
        q_ref, s_ref = fp8_quantize.quantize_torch(x, "row", (1, 128))
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    assert len(checked) == 1
    with pytest.raises(ValueError, match="granularity"):
        gemmlab.quantize_fp8(x, "rows")  # another key: checked, refused
    with pytest.raises(ValueError, match="block"):
        gemmlab.quantize_fp8(x, "block", (0, 128))
    with pytest.raises(ValueError, match="granularity"):
        gemmlab.quantize_fp8(x, ["row"])  # not hashable: no key, the check says what is wrong


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 128], ids=["decode", "tma"])
def test_only_a_signatures_first_call_enters_the_jit(fresh, monkeypatch, m):
    """On the GPU: the second and later calls of a signature launch the kept kernel (``ops.launch``), never the
    JIT, for gemm_fp8 (its decode and TMA paths) and quantize_fp8, and their results stay right."""
    from gemmlab.kernels.gemm_fp8 import gemm_fp8_tma_kernel, quantize_groups_kernel
    from gemmlab.kernels.gemv_fp8 import gemv_fp8_kernel

    entered = {"gemm_fp8": 0, "quantize": 0}
    gemm_kernel = gemv_fp8_kernel if m <= 64 else gemm_fp8_tma_kernel
    for name, kernel in (("gemm_fp8", gemm_kernel), ("quantize", quantize_groups_kernel)):
        real = kernel.run

        def counted(*args, _name=name, _real=real, **kwargs):
            entered[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernel, "run", counted)
    for seed in range(4):
        qa, qb, sa, sb = _operands(m, 256, 512, seed)
        out = torch.full((m, 256), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        gemmlab.gemm_fp8(qa, qb, sa, sb, out=out)
        assert gemm_fp8_check(out, qa, qb, sa, sb)["ok"], seed
    assert entered["gemm_fp8"] == 1, entered
    assert entered["quantize"] == 2, entered  # (a (m, 512) and a (256, 512): two signatures)
    assert introspect.fp8_launch_mode(qa, qb, sa, sb, torch.bfloat16, out) == "direct"
    assert introspect.last_kernel("gemm_fp8") is not None


@pytest.fixture
def gpu_stand_in(monkeypatch):
    """What a kept launch needs of a GPU, on the CPU: a device, a stream, and descriptors "encoded" as tuples naming
    what was encoded (cuTensorMapEncodeTiled needs a GPU)."""
    from triton.backends.nvidia import driver as nvidia

    encoded = []

    def fake_tensordesc(arg, meta):
        encoded.append(meta)
        return [("map", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), meta), *arg.shape, *arg.strides]

    monkeypatch.setattr(nvidia, "make_tensordesc_arg", fake_tensordesc)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    yield encoded


def _fake_launcher(e: fp8.Fp8Entry, runtime_args: int, seen: list) -> launch.Kept:
    """A CudaLauncher built by Triton's own code (``wrap_handle_tensordesc``) around a recording C launcher."""
    import inspect

    from triton.backends.nvidia import driver as nvidia

    metas = [{"swizzle": 3, "slot": i} for i, s in enumerate(s for s in e.descs if s is not None)]
    kinds = [f"tensordesc<fp8e4nv[{s[3][0]}, {s[3][1]}]>" if s is not None else "*bf16" for s in e.descs]
    kinds += ["*fp32", "*fp32"] + ["i32"] * (runtime_args - 5)
    names = list(inspect.signature(e.slot.kernel.fn).parameters)
    sig = {i: kinds[i] if i < runtime_args else "constexpr" for i in range(len(names))}
    run = object.__new__(nvidia.CudaLauncher)
    run.launch = nvidia.wrap_handle_tensordesc(lambda *args: seen.append(args), sig, metas or None)
    run.num_ctas, run.launch_cooperative_grid, run.launch_pdl = 1, False, False
    run.global_scratch_size = run.global_scratch_align = run.profile_scratch_size = run.profile_scratch_align = 0
    compiled = type("Compiled", (), {"metadata": type("Meta", (), {"tensordesc_meta": metas or None})()})()
    return launch.Kept(
        run, 1234, "packed", launch.constexpr_tail(e.slot.kernel, runtime_args, e.slot.consts), 0, compiled
    )


@pytest.mark.parametrize(
    "m, n, k",
    [(65, 48, 32), (65, 20, 32), (5, 20, 32), (1, 97, 1040)],
    ids=["tma-c-tma", "tma-c-pointer", "decode", "decode-split-k"],
)
def test_the_direct_launch_hands_the_c_launcher_what_triton_does(fresh, gpu_stand_in, m, n, k):
    """The argument tuple the C launcher gets from gemm_fp8's direct launch equals, position by position, the one
    Triton's CudaLauncher (wrap_handle_tensordesc included) builds from the kept launch's arguments, pointers as
    addresses (the decode path's split-K workspace and counters the per-stream ones); a hot public call then
    launches it again, entering none of the checks, the planner or Triton, and encodes no descriptor again for the
    same buffers."""
    import cProfile
    import pstats

    from gemmlab.ops import launch as direct

    qa, qb, sa, sb = _operands(m, n, k)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=DEVICE)
    gemmlab.gemm_fp8(qa, qb, sa, sb, out=out)  # plans, runs once through the JIT (interpreter)
    e = fp8.PLANS[fp8.signature(qa, qb, sa, sb, torch.bfloat16, out)]
    if m <= 64:
        assert e.plan.path == "decode" and e.descs == (None, None, None)
        assert bool(e.scratch[0]) == (k > 32), e.plan.reason  # split-K where K has steps to share
    else:
        assert (e.descs[2] is not None) == (n == 48)
    seen = []
    runtime_args = len(fp8.jit_args(e, qa, qb, sa, sb, out))
    e.slot.kept = _fake_launcher(e, runtime_args, seen)
    e.direct = direct.direct_launcher(e.slot.kept, sum(s is not None for s in e.descs))
    assert e.direct is not None
    launch.run(e.slot.kept, e.slot.grid, fp8.kept_args(e, qa, qb, sa, sb, out))  # Triton's way
    ptrs = tuple(t.data_ptr() for t in (qa, qb, sa, sb, out))
    fp8.launch_fp8(e, qa, qb, sa, sb, out, ptrs)  # ours
    theirs, ours = seen
    assert len(ours) == len(theirs) and list(ours) == [
        x.data_ptr() if isinstance(x, torch.Tensor) else x for x in theirs
    ]
    assert all(not isinstance(x, torch.Tensor) for x in ours)
    encoded = len(gpu_stand_in)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        gemmlab.gemm_fp8(qa, qb, sa, sb, out=out)
    prof.disable()
    assert len(seen) == 22 and len(gpu_stand_in) == encoded  # launched each time, nothing encoded again
    entered = {(f, fn) for (f, _, fn) in pstats.Stats(prof).stats}
    checks = ("check_gemm_fp8_args", "scale_mode", "plan_fp8", "check_out", "_admit")  # (fp8_out_dtype stays)
    assert not [
        (f, fn)
        for f, fn in entered
        if fn in checks or "triton" in f or f.endswith(("gemm/checks.py", "layout.py", "configs.py"))
    ], entered
    assert introspect.fp8_launch_mode(qa, qb, sa, sb, torch.bfloat16, out) == "direct"
