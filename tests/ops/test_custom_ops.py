"""The torch.library custom ops (torch.ops.gemmlab.*): schemas and fakes (torch.library.opcheck), torch.compile
(fullgraph) of a small model against eager, N-D activations, and the out= checks every public op makes.
CPU tests compile with backend="aot_eager" (the ops are opaque, so the graph around them is what is tested);
the gpu-marked test uses the default inductor backend."""

import os
import subprocess
import sys

import pytest
import torch

import gemmlab
from gemmlab.ref import gemm_check, moe_check
from tests.conftest import rand
from tests.paths import REPO

SRC = REPO / "src"
OPS = [
    "gemm",
    "gemm_out",
    "grouped_gemm",
    "grouped_gemm_out",
    "grouped_gemm_backward",
    "moe_forward",
    "moe_backward",
    "route",
]


def test_ops_are_registered():
    for name in OPS:
        assert hasattr(torch.ops.gemmlab, name), name


def test_import_registers_the_ops_and_loads_no_kernel():
    """``import gemmlab`` alone: every torch.ops.gemmlab op exists, no Triton kernel module (nor Triton) is loaded;
    the first call of an op loads its launcher (here under the interpreter)."""
    code = (
        "import sys, torch, gemmlab\n"
        f"names = {OPS + ['moe_forward_saving']!r}\n"
        "missing = [n for n in names if not hasattr(torch.ops.gemmlab, n)]\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('gemmlab.kernels', 'triton')))\n"
        "assert not missing and not loaded, (missing, loaded)\n"
        "w, ids = torch.ops.gemmlab.route(torch.randn(3, 4), 2)\n"
        "assert 'gemmlab.kernels.gemm' not in sys.modules  # route needs no kernel\n"
        "a = torch.randn(4, 8, dtype=torch.float16)\n"
        "c = torch.ops.gemmlab.gemm(a, a.t().contiguous())\n"
        "assert 'gemmlab.kernels.gemm' in sys.modules and c.shape == (4, 4)\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(SRC))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_op_schemas_have_the_python_defaults(device):
    """torch.ops.gemmlab.route(logits, 2) is route(logits, 2): renormalize=True, scoring="softmax"; validate and
    gather default as in the Python functions."""
    logits = torch.randn(6, 4, device=device)
    for got, want in zip(torch.ops.gemmlab.route(logits, 2), gemmlab.route(logits, 2), strict=True):
        assert torch.equal(got, want)
    assert torch.allclose(torch.ops.gemmlab.route(logits, 2)[0].sum(-1), torch.ones(6, device=device))
    schemas = {name: str(getattr(torch.ops.gemmlab, name).default._schema) for name in OPS + ["moe_forward_saving"]}
    assert 'renormalize=True, str scoring="softmax"' in schemas["route"]
    assert 'bool validate=True, str gather="auto"' in schemas["moe_forward"]
    assert "bool validate=True" in schemas["grouped_gemm"] and "bool validate=True" in schemas["grouped_gemm_out"]
    assert "bool need_w1=True, bool need_w2=True, Tensor? gate_up=None" in schemas["moe_backward"]
    x, w1, w2, tw, ids = _moe_inputs()
    assert moe_check(torch.ops.gemmlab.moe_forward(x, w1, w2, tw, ids), x, w1, w2, tw, ids)["ok"]
    assert moe_check(torch.ops.gemmlab.moe_forward_saving(x, w1, w2, tw, ids)[0], x, w1, w2, tw, ids)["ok"]
    offs = torch.tensor([2, 2, 6], dtype=torch.int32, device=device)
    w = rand((3 * 24, 32)).view(3, 24, 32)
    assert torch.equal(torch.ops.gemmlab.grouped_gemm(x, w, offs), torch.ops.gemmlab.grouped_gemm(x, w, offs, True))
    dx, dw1, dw2, dtw = torch.ops.gemmlab.moe_backward(rand((6, 32)), x, w1, w2, tw, ids)
    assert dw1.shape == w1.shape and dw2.shape == w2.shape and dtw.shape == tw.shape


def _bad_calls():
    """(name, call, exception, message) of op calls with one bad argument each."""
    a, b = rand((8, 16)), rand((16, 24))
    x, w1, w2, tw, ids = _moe_inputs()
    offs = torch.tensor([2, 2, 6], dtype=torch.int32, device=a.device)
    w = rand((3 * 24, 32)).view(3, 24, 32)
    logits = torch.randn(6, 4, device=a.device)
    g = torch.ops.gemmlab
    return [
        ("route scoring", lambda: g.route(logits, 2, True, "bad"), ValueError, "scoring 'bad'"),
        ("route top_k", lambda: g.route(logits, 5), ValueError, "top_k must be an integer in"),
        ("route 3-D", lambda: g.route(logits.view(2, 3, 4), 2), ValueError, "must be a \\(T, E\\) tensor"),
        ("route ints", lambda: g.route(logits.int(), 2), TypeError, "floating point"),
        ("gemm inner", lambda: g.gemm(a, a), ValueError, "inner dimensions differ"),
        ("gemm dtype", lambda: g.gemm(a.float(), b.float()), TypeError, "dtype"),
        (
            "gemm_out shape",
            lambda: g.gemm_out(a, b, torch.empty(8, 23, dtype=a.dtype, device=a.device)),
            ValueError,
            "out has shape",
        ),
        ("gemm_out overlap", lambda: g.gemm_out(a, b, b[:8]), ValueError, "overlaps"),
        ("grouped offsets dtype", lambda: g.grouped_gemm(x, w, offs.long()), TypeError, "offsets has dtype"),
        ("grouped K", lambda: g.grouped_gemm(x[:, :16], w, offs), ValueError, "K = 16"),
        (
            "grouped out",
            lambda: g.grouped_gemm_out(x, w, offs, torch.empty(6, 23, dtype=x.dtype, device=x.device)),
            ValueError,
            "row-major \\(6, 24\\)",
        ),
        ("grouped backward dy", lambda: g.grouped_gemm_backward(rand((6, 23)), x, w, offs), ValueError, "dy must be"),
        ("moe gather", lambda: g.moe_forward(x, w1, w2, tw, ids, True, "bad"), ValueError, "gather 'bad'"),
        ("moe H", lambda: g.moe_forward(x[:, :16], w1, w2, tw, ids), ValueError, "x has H = 16"),
        ("moe ids dtype", lambda: g.moe_forward(x, w1, w2, tw, ids.float()), TypeError, "topk_ids has dtype"),
        ("moe backward dy", lambda: g.moe_backward(rand((6, 16)), x, w1, w2, tw, ids), ValueError, "dy must be"),
        (
            "moe backward gate_up",
            lambda: g.moe_backward(rand((6, 32)), x, w1, w2, tw, ids, True, True, rand((3, 3))),
            ValueError,
            "gate_up must be",
        ),
        (
            "moe backward ids",
            lambda: g.moe_backward(rand((6, 32)), x, w1, w2, tw, ids[:, :1]),
            ValueError,
            "must both be",
        ),
        (
            "saving k",
            lambda: g.moe_forward_saving(x, w1, w2, tw.repeat(1, 3), ids.repeat(1, 3)),
            ValueError,
            "top-k = 6",
        ),
    ]


@pytest.mark.parametrize("case", range(19))
def test_every_op_checks_its_arguments(case):
    """A direct torch.ops.gemmlab call with one bad argument gets one clear error from the op itself (real
    implementation), and the same from its fake implementation (what torch.compile traces)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = _bad_calls()
    assert len(cases) == 19
    name, call, exc, match = cases[case]
    with pytest.raises(exc, match=match):
        call()
    if name == "gemm_out overlap":  # fake tensors have no memory to overlap
        return
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(exc, match=match):
        call()


def _moe_inputs(t=6, h=32, i=16, e=4, k=2, dtype=torch.float16):
    x = rand((t, h), dtype)
    w1 = rand((e * 2 * i, h), dtype).view(e, 2 * i, h)
    w2 = rand((e * h, i), dtype).view(e, h, i)
    tw, ids = gemmlab.route(torch.randn(t, e, device=x.device), k)
    return x, w1, w2, tw, ids


def test_opcheck_schemas_fakes_and_autograd_registration(device):
    a, b = rand((8, 16)), rand((16, 24))
    x, w1, w2, tw, ids = _moe_inputs()
    offs = torch.tensor([3, 3, 8], dtype=torch.int32, device=device)
    w = rand((3 * 24, 16)).view(3, 24, 16)
    tests = ("test_schema", "test_faketensor", "test_autograd_registration")
    cases = [
        (torch.ops.gemmlab.gemm, (a.requires_grad_(), b)),
        (torch.ops.gemmlab.gemm_out, (a.detach(), b, torch.empty(8, 24, dtype=a.dtype, device=device))),
        (torch.ops.gemmlab.grouped_gemm, (a.detach(), w.requires_grad_(), offs, True)),
        (torch.ops.gemmlab.moe_forward, (x.requires_grad_(), w1, w2, tw, ids, True, "auto")),
        (torch.ops.gemmlab.route, (torch.randn(6, 4, device=device, requires_grad=True), 2, True, "softmax")),
        (torch.ops.gemmlab.route, (torch.randn(6, 4, device=device), 2)),  # the schema's defaults
        (
            torch.ops.gemmlab.grouped_gemm_out,
            (a.detach(), w.detach(), offs, torch.empty(8, 24, dtype=a.dtype, device=device)),
        ),
        (torch.ops.gemmlab.grouped_gemm_backward, (rand((8, 24)), a.detach(), w.detach(), offs)),
        (torch.ops.gemmlab.moe_forward_saving, (x.detach(), w1, w2, tw, ids)),
        (torch.ops.gemmlab.moe_backward, (rand((6, 32)), x.detach(), w1, w2, tw, ids)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=tests)


class TinyMoE(torch.nn.Module):
    """A projection (gemm on a 3-D activation), a router and an MoE body: every public op in one graph."""

    def __init__(self, h=32, i=16, e=4, k=2, dtype=torch.float16):
        super().__init__()
        self.k = k
        self.proj = torch.nn.Parameter(rand((h, h), dtype))
        self.router = torch.nn.Parameter(rand((h, e), torch.float32))
        self.w1 = torch.nn.Parameter(rand((e * 2 * i, h), dtype).view(e, 2 * i, h))
        self.w2 = torch.nn.Parameter(rand((e * h, i), dtype).view(e, h, i))

    def forward(self, x):  # x (B, L, H)
        h = gemmlab.gemm(x, self.proj)
        tw, ids = gemmlab.route(h.float() @ self.router, self.k)
        return gemmlab.moe_forward(h, self.w1, self.w2, tw, ids) + h


def _compile_matches_eager(backend):
    torch._dynamo.reset()
    model = TinyMoE()
    x = rand((6, 32)).view(2, 3, 32)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, fullgraph=True, backend=backend)(x)
    assert got.shape == want.shape
    if backend == "aot_eager":
        assert torch.equal(got, want)  # the same kernels on the same inputs
    else:  # inductor generates the code around the ops (fused casts and adds)
        assert torch.allclose(got.float(), want.float(), rtol=2e-3, atol=2e-3), (got - want).abs().max()
    # training through the compiled graph: the custom ops' autograd inside AOT autograd
    eager_grads = torch.autograd.grad(model(x).float().sum(), list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    comp_grads = torch.autograd.grad(compiled(x).float().sum(), list(model.parameters()))
    for g, c in zip(eager_grads, comp_grads, strict=True):
        assert torch.allclose(g.float(), c.float(), rtol=1e-2, atol=1e-2), (g - c).abs().max()


def test_compile_fullgraph_matches_eager_cpu():
    _compile_matches_eager("aot_eager")


@pytest.mark.gpu
def test_compile_fullgraph_matches_eager_inductor():
    _compile_matches_eager("inductor")


def test_compile_out_variant(device):
    torch._dynamo.reset()
    a, b = rand((8, 16)), rand((16, 24))

    def f(a, b, out):
        gemmlab.gemm(a, b, out=out)
        return out * 2

    out = torch.full((8, 24), float("nan"), dtype=a.dtype, device=device)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(a, b, out)
    assert gemm_check(out, a, b)["ok"] and torch.equal(got, out * 2)


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(5, 7, 16, dtype=torch.float16)
        b = torch.empty(16, 24, dtype=torch.float16)
        assert gemmlab.gemm(a, b).shape == (5, 7, 24)
        x, w1, w2 = (
            torch.empty(6, 32, dtype=torch.float16),
            torch.empty(4, 32, 32, dtype=torch.float16),
            torch.empty(4, 32, 16, dtype=torch.float16),
        )
        tw, ids = gemmlab.route(torch.empty(6, 4), 2)
        assert tw.shape == ids.shape == (6, 2) and ids.dtype == torch.int32
        assert gemmlab.moe_forward(x, w1, w2, tw, ids).shape == (6, 32)


# ------------------------------------------------------------------------------------------ N-D inputs


def test_gemm_nd_and_vectors_follow_matmul(device):
    b = rand((16, 24))
    a3 = rand((6, 16)).view(2, 3, 16)
    c = gemmlab.gemm(a3, b)
    assert c.shape == (2, 3, 24) and gemm_check(c.view(6, 24), a3.reshape(6, 16), b)["ok"]
    at = rand((16, 6)).t().reshape(3, 2, 16)  # a copy: not viewable as (6, 16)
    assert gemm_check(gemmlab.gemm(at, b).view(6, 24), at.reshape(6, 16), b)["ok"]
    v = rand((1, 16))[0]
    cv = gemmlab.gemm(v, b)  # (K,) @ (K, N) -> (N,)
    assert cv.shape == (24,) and gemm_check(cv[None], v[None], b)["ok"]
    bv = rand((1, 16))[0]
    a2 = rand((5, 16))
    mv = gemmlab.gemm(a2, bv)  # (M, K) @ (K,) -> (M,)
    assert mv.shape == (5,) and gemm_check(mv[:, None], a2, bv[:, None])["ok"]
    out = torch.full((2, 3, 24), float("nan"), dtype=b.dtype, device=device)
    assert gemmlab.gemm(a3, b, out=out) is out and gemm_check(out.view(6, 24), a3.reshape(6, 16), b)["ok"]
    assert gemmlab.gemm(torch.empty(0, 4, 16, dtype=b.dtype, device=device), b).shape == (0, 4, 24)
    with pytest.raises(ValueError, match="cannot be viewed"):
        gemmlab.gemm(a3, b, out=torch.empty(3, 2, 24, dtype=b.dtype, device=device).transpose(0, 1))
    with pytest.raises(ValueError, match="expected \\(2, 3, 24\\)"):
        gemmlab.gemm(a3, b, out=torch.empty(6, 24, dtype=b.dtype, device=device))


def test_moe_forward_nd():
    x, w1, w2, tw, ids = _moe_inputs()
    y = gemmlab.moe_forward(x.view(2, 3, 32), w1, w2, tw.view(2, 3, 2), ids.view(2, 3, 2))
    assert y.shape == (2, 3, 32) and moe_check(y.view(6, 32), x, w1, w2, tw, ids)["ok"]


# ------------------------------------------------------------------------------------------ out= checks


def test_grouped_gemm_out_overlap_and_stride0_refused(device):
    """Issue 11: grouped_gemm(x, w, offsets, out=x) was silently wrong and an expanded out was accepted."""
    x = rand((10, 16))
    w = rand((2 * 16, 16)).view(2, 16, 16)
    offs = torch.tensor([4, 10], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="out overlaps x"):
        gemmlab.grouped_gemm(x, w, offs, out=x)
    with pytest.raises(ValueError, match="out overlaps w"):
        gemmlab.grouped_gemm(x, w, offs, out=w.view(32, 16)[:10])
    with pytest.raises(ValueError, match="share memory"):
        gemmlab.grouped_gemm(x, w, offs, out=torch.empty(1, 16, dtype=x.dtype, device=device).expand(10, 16))
    with pytest.raises(ValueError, match="share memory"):  # rows overlapping each other
        gemmlab.grouped_gemm(x, w, offs, out=torch.empty(40, dtype=x.dtype, device=device).as_strided((10, 16), (2, 1)))
    out = torch.full((10, 16), float("nan"), dtype=x.dtype, device=device)
    assert gemmlab.grouped_gemm(x, w, offs, out=out) is out and torch.isfinite(out).all()


def test_gemm_out_overlap_and_stride0_refused(device):
    a, b = rand((16, 32)), rand((32, 16))
    with pytest.raises(ValueError, match="out overlaps a"):
        gemmlab.gemm(a, b, out=a[:, :16])
    with pytest.raises(ValueError, match="out overlaps b"):
        gemmlab.gemm(a, b, out=b[:16])
    with pytest.raises(ValueError, match="share memory"):
        gemmlab.gemm(a, b, out=torch.empty(1, 16, dtype=a.dtype, device=device).expand(16, 16))
    out = torch.empty(16, 16, dtype=a.dtype, device=device)
    gemmlab.gemm(a, b, out=out)  # cached signature: the overlap is still checked on every call
    with pytest.raises(ValueError, match="out overlaps a"):
        big = rand((16, 48))
        gemmlab.gemm(big[:, :32], b, out=big[:, 32:])


# ------------------------------------------------------------------------------------ the direct launch


@pytest.mark.parametrize(
    "shape,path,split",
    [
        ((8, 40, 64), "tma_splitk", 1),
        ((16, 40, 256), "tma_splitk", 2),
        ((264, 72, 96), "tma_persistent", 0),
        ((37, 53, 71), "portable", 0),
    ],
)
def test_direct_launch_arguments_are_the_jit_bindings(shape, path, split, device):
    """What the kept launch hands ``CompiledKernel.run`` (after the grid/stream header) is, position by
    position, what the JIT binds from the same call: the runtime arguments, then every constexpr in parameter
    order (the GPU runs this path; here the argument lists are compared)."""
    import dataclasses
    import inspect

    from gemmlab.ops.gemm import launch as gemm_ops
    from gemmlab.ops.gemm.planner import choose
    from gemmlab.ops.launch import HostDesc, constexpr_tail

    m, n, k = shape
    a, b = rand((m, k)), rand((k, n))
    c = torch.empty(m, n, dtype=a.dtype, device=device)
    p = choose(a, b, c, False)
    if split:
        p = choose(a, b, c, False, dataclasses.replace(p.config, split_k=split))
        assert p.config.split_k == split
    assert p.path == path
    L = gemm_ops.prepare(p)
    jit = gemm_ops.jit_args(L, a, b, c)
    bound = list(inspect.signature(L.kernel.fn).bind(*jit, **L.consts).arguments.values())
    direct = gemm_ops.direct_args(L, a, b, c) + list(constexpr_tail(L.kernel, len(jit), L.consts))
    assert len(direct) == len(bound)
    for ours, theirs in zip(direct, bound, strict=True):
        if isinstance(ours, HostDesc):
            assert ours.base is theirs.base and ours.shape == theirs.shape and ours.strides == theirs.strides
        elif isinstance(ours, torch.Tensor):
            assert ours.shape == theirs.shape and ours.dtype == theirs.dtype  # (a fresh split-K workspace)
        else:
            assert ours == theirs and type(ours) is type(theirs)
    gemm_ops.launch(L, a, b, c)  # and the JIT launch of the same Launch is correct
    assert gemm_check(c, a, b)["ok"]


@pytest.mark.cpu_only("simulates the GPU's kept-kernel launch on the interpreter")
def test_cached_direct_launch_path_end_to_end(monkeypatch, device):
    """The hit path of launch_gemm with a kept kernel, on the CPU: a stand-in for CompiledKernel.run takes
    exactly what the GPU's launcher would (grid, stream, function, metadata, hooks, then every parameter) and
    runs the interpreted kernel with it. Results must match on fresh buffers, for each path and a column-major out."""
    import inspect

    from triton.tools.tensor_descriptor import TensorDescriptor

    from gemmlab.ops.gemm import launch as gemm_ops
    from gemmlab.ops.launch import HostDesc, Kept, constexpr_tail

    calls = []

    def fake_run(g0, g1, g2, stream, function, packed, launch_metadata, enter, exit_, *params):
        assert (stream, function, packed, launch_metadata, enter, exit_) == (7, "fn", "meta", None, None, None)
        L = calls[-1]
        names = list(inspect.signature(L.kernel.fn).parameters)
        assert len(params) == len(names)
        args = [
            TensorDescriptor(p.base, p.shape, p.strides, spec[2]) if isinstance(p, HostDesc) else p
            for p, spec in zip(params, list(L.descs) + [None] * len(params), strict=False)
        ]
        n_rt = len(names) - len(L.consts)
        L.kernel[(g0, g1, g2)](*args[:n_rt], **dict(zip(names[n_rt:], args[n_rt:], strict=True)), **L.opts)

    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 7, raising=False)
    real_launch = gemm_ops.launch

    def spy(L, a, b, c):
        if L.keep and L.kept is None:  # keep it as the GPU would after its first launch
            real_launch(L, a, b, c)
            L.kept = Kept(
                fake_run, "fn", "meta", constexpr_tail(L.kernel, len(gemm_ops.jit_args(L, a, b, c)), L.consts), 0
            )
            return
        calls.append(L)
        real_launch(L, a, b, c)

    monkeypatch.setattr(gemm_ops, "launch", spy)
    gemm_ops.clear_cache()
    for m, n, k in ((8, 40, 64), (264, 72, 96), (37, 53, 71)):
        for rep in range(3):
            a, b = rand((m, k), seed=rep), rand((k, n), seed=rep + 3)
            assert gemm_check(gemmlab.gemm(a, b), a, b)["ok"]
            out = torch.full((n, m), float("nan"), dtype=a.dtype, device=device).t()
            gemmlab.gemm(a, b, out=out)
            assert gemm_check(out, a, b)["ok"]
    assert len(calls) == 3 * 2 * 2  # every call after the first of each signature went the direct way
    gemm_ops.clear_cache()


def test_compile_with_a_packed_b():
    torch._dynamo.reset()
    a, b = rand((8, 16)), rand((16, 24))
    pk = gemmlab.pack_b(b)
    gemmlab.gemm(a, pk)  # an eager call first keeps a view in the PackedB; the compiled call makes its own
    got = torch.compile(lambda a: gemmlab.gemm(a, pk), fullgraph=True, backend="aot_eager")(a)
    assert gemm_check(got, a, b)["ok"]


def test_kept_launch_steps_aside_for_hooks_and_other_devices(monkeypatch):
    """A kept kernel launches directly only with no launch hook (profilers add one) and on its own device."""
    from triton import knobs

    from gemmlab.ops import launch

    k = launch.Kept(lambda *a: None, "fn", "meta", (), 0)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    assert launch.usable(k) and not launch.usable(None)

    def hook(metadata):
        return None

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert not launch.usable(k)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert launch.usable(k)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
    assert not launch.usable(k)


def _two_args(x_ptr, n, BLOCK):  # a kernel signature for test_direct_launch_switch
    pass


def test_direct_launch_switch(monkeypatch):
    """A compiled JIT kernel is kept (launched directly from then on) unless GEMMLAB_DIRECT_LAUNCH=0
    (launch.DIRECT False) or the interpreter runs."""
    from triton import knobs
    from triton.runtime.jit import JITFunction

    from gemmlab.ops import launch

    class Compiled:
        packed_metadata, function, run = "meta", "fn", (lambda *a: None)

    kernel = JITFunction(_two_args)
    monkeypatch.setattr(knobs.runtime, "interpret", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kept = launch.keep(kernel, Compiled(), 2, {"BLOCK": 64})
    assert kept is not None and kept.tail == (64,) and kept.packed == "meta"
    monkeypatch.setattr(launch, "DIRECT", False)
    assert launch.keep(kernel, Compiled(), 2, {"BLOCK": 64}) is None
    monkeypatch.setattr(launch, "DIRECT", True)
    monkeypatch.setattr(knobs.runtime, "interpret", True)
    assert launch.keep(kernel, Compiled(), 2, {"BLOCK": 64}) is None


def test_config_reload_clears_the_signature_cache():
    from gemmlab.ops import configs
    from gemmlab.ops.gemm import launch as gemm_launch

    a, b = rand((8, 16)), rand((16, 24))
    gemmlab.gemm(a, b)
    assert gemm_launch.CACHE
    configs.reload()
    assert not gemm_launch.CACHE
    assert gemm_check(gemmlab.gemm(a, b), a, b)["ok"]
