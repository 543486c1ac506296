"""Negated views (``torch._neg_view``: the memory holds -x, the negative bit says so) through every public op
(issue 34, item 4): the kernels read raw memory, so a plain eager call once returned +a@b for -a@b. Each op must
give, bit for bit, what it gives on the materialized -x; an ``out`` with the negative bit, or e4m3 data with it
(torch has no e4m3 negation), is one clear error. Legend: T tokens, H hidden, I intermediate, E experts, k top-k.
Small sizes: the CPU interpreter runs them."""

import pytest
import torch

import gemmlab
from tests.conftest import DEVICE

neg = torch._neg_view


def _r(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(DEVICE)


@pytest.mark.parametrize("which", ["a", "b", "both", "3-D a", "packed b"])
def test_gemm_reads_a_negated_view_as_negated(which):
    a, b = _r(8, 32, seed=1), _r(32, 16, seed=2)
    if which == "a":
        got, want = gemmlab.gemm(neg(a), b), gemmlab.gemm(-a, b)
    elif which == "b":
        got, want = gemmlab.gemm(a, neg(b)), gemmlab.gemm(a, -b)
    elif which == "both":
        got, want = gemmlab.gemm(neg(a), neg(b)), gemmlab.gemm(a, b)
    elif which == "3-D a":
        a3 = a.view(2, 4, 32)
        got, want = gemmlab.gemm(neg(a3), b), gemmlab.gemm(-a3, b)
    else:
        got, want = gemmlab.gemm(a, gemmlab.pack_b(neg(b))), gemmlab.gemm(a, -b)
    assert not got.is_neg()
    assert torch.equal(got, want), (got - want).abs().max()


def test_gemm_out_and_run_refuse_a_negated_out():
    a, b = _r(8, 32, seed=3), _r(32, 16, seed=4)
    out = neg(torch.zeros(8, 16, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="gemm: out is a negated view"):
        gemmlab.gemm(a, b, out=out)
    assert (out == 0).all()  # untouched
    with pytest.raises(ValueError, match="gemm: out is a negated view"):
        gemmlab.gemm_colmajor(
            a.t().contiguous(),
            b.t().contiguous(),
            neg(torch.zeros(16 * 8, dtype=torch.float16, device=DEVICE)),
            8,
            16,
            32,
        )
    from gemmlab.ops.gemm import run

    p = gemmlab.plan(a, b)
    assert torch.equal(run(p, neg(a), b), gemmlab.gemm(-a, b))
    with pytest.raises(ValueError, match="run: out is a negated view"):
        run(p, a, b, out=out)


def test_gemm_autograd_through_a_negated_view():
    a, b = _r(8, 32, seed=5).requires_grad_(), _r(32, 16, seed=6)
    gemmlab.gemm(neg(a), b).float().sum().backward()
    ref = a.detach().clone().requires_grad_()
    gemmlab.gemm(-ref, b).float().sum().backward()
    assert torch.equal(a.grad, ref.grad)


def _moe(t=6, h=32, i=16, e=4, k=2, dtype=torch.float16):
    x = _r(t, h, dtype=dtype, seed=7)
    w1 = _r(e, 2 * i, h, dtype=dtype, seed=8) * 0.2
    w2 = _r(e, h, i, dtype=dtype, seed=9) * 0.2
    weights, ids = gemmlab.route(_r(t, e, dtype=torch.float32, seed=10), k)
    return x, w1, w2, weights, ids


def test_grouped_gemm_reads_negated_views_and_refuses_a_negated_out():
    x, w = _r(10, 32, seed=11), _r(3, 16, 32, seed=12)
    offsets = torch.tensor([3, 7, 10], dtype=torch.int32, device=DEVICE)
    assert torch.equal(gemmlab.grouped_gemm(neg(x), w, offsets), gemmlab.grouped_gemm(-x, w, offsets))
    assert torch.equal(gemmlab.grouped_gemm(x, neg(w), offsets), gemmlab.grouped_gemm(x, -w, offsets))
    from gemmlab.ops.moe import MoEConfig

    assert torch.equal(
        gemmlab.grouped_gemm(neg(x), w, offsets, config=MoEConfig(block_m=16, block_n=16, block_k=32)),
        gemmlab.grouped_gemm(-x, w, offsets, config=MoEConfig(block_m=16, block_n=16, block_k=32)),
    )
    out = neg(torch.zeros(10, 16, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="grouped_gemm: out is a negated view"):
        gemmlab.grouped_gemm(x, w, offsets, out=out)


@pytest.mark.parametrize("which", ["x", "w1", "w2", "topk_weights"])
def test_moe_forward_reads_negated_views(which):
    args = list(_moe())
    at = ["x", "w1", "w2", "topk_weights"].index(which)
    want_args = list(args)
    want_args[at] = -args[at]
    args[at] = neg(args[at])
    assert torch.equal(gemmlab.moe_forward(*args), gemmlab.moe_forward(*want_args))


def test_moe_forward_autograd_through_a_negated_x():
    x, w1, w2, weights, ids = _moe()
    x = x.requires_grad_()
    gemmlab.moe_forward(neg(x), w1, w2, weights, ids).float().sum().backward()
    ref = x.detach().clone().requires_grad_()
    gemmlab.moe_forward(-ref, w1, w2, weights, ids).float().sum().backward()
    assert torch.equal(x.grad, ref.grad)


def test_route_reads_negated_logits():
    logits = _r(5, 8, dtype=torch.float32, seed=13)
    got, want = gemmlab.route(neg(logits), 2), gemmlab.route(-logits, 2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_fp8_ops_read_negated_inputs_and_refuse_negated_e4m3_and_out():
    x, w = _r(8, 32, dtype=torch.float32, seed=14), _r(16, 32, dtype=torch.float32, seed=15)
    for granularity in ("tensor", "row", "block"):  # torch ops and the Triton kernel
        got, want = gemmlab.quantize_fp8(neg(x), granularity), gemmlab.quantize_fp8(-x, granularity)
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])
    qa, sa = gemmlab.quantize_fp8(x, "row")
    qw, sw = gemmlab.quantize_fp8(w, "row")
    want = gemmlab.gemm_fp8(qa, qw.t(), -sa, sw.t())
    assert torch.equal(gemmlab.gemm_fp8(qa, qw.t(), neg(sa), sw.t()), want)  # a negated scale: dispatched, resolved
    with pytest.raises(ValueError, match="gemm_fp8: a is a negated view .* of e4m3 data"):
        gemmlab.gemm_fp8(neg(qa), qw.t(), sa, sw.t())
    with pytest.raises(ValueError, match="gemm_fp8: out is a negated view"):
        gemmlab.gemm_fp8(qa, qw.t(), sa, sw.t(), out=neg(torch.zeros(8, 16, dtype=torch.bfloat16, device=DEVICE)))


def test_fp8_experts_read_negated_activations_and_refuse_negated_e4m3():
    x, w1, w2, weights, ids = _moe(h=32, i=16, dtype=torch.bfloat16)
    packed = gemmlab.pack_moe_fp8(w1, w2)
    assert torch.equal(
        gemmlab.moe_forward(neg(x), packed, None, weights, ids), gemmlab.moe_forward(-x, packed, None, weights, ids)
    )
    offsets = torch.tensor([2, 5, 9, 12], dtype=torch.int32, device=DEVICE)
    xs = _r(12, 32, dtype=torch.bfloat16, seed=16)
    assert torch.equal(
        gemmlab.grouped_gemm_fp8(neg(xs), packed.w1, offsets, None, packed.w1_scale),
        gemmlab.grouped_gemm_fp8(-xs, packed.w1, offsets, None, packed.w1_scale),
    )
    with pytest.raises(ValueError, match="grouped_gemm_fp8: w is a negated view .* of e4m3 data"):
        gemmlab.grouped_gemm_fp8(xs, neg(packed.w1), offsets, None, packed.w1_scale)
    with pytest.raises(ValueError, match="grouped_gemm_fp8: out is a negated view"):
        gemmlab.grouped_gemm_fp8(
            xs,
            packed.w1,
            offsets,
            None,
            packed.w1_scale,
            out=neg(torch.zeros(12, 32, dtype=torch.bfloat16, device=DEVICE)),
        )
    bad = gemmlab.PackedMoEFP8(neg(packed.w1), packed.w1_scale, packed.w2, packed.w2_scale)
    with pytest.raises(ValueError, match=r"moe_forward \(fp8\): w1 is a negated view"):
        gemmlab.moe_forward(x, bad, None, weights, ids)
    with pytest.raises(ValueError, match="pack_moe_fp8: w1 is a negated view"):
        gemmlab.pack_moe_fp8((neg(packed.w1), packed.w1_scale), (packed.w2, packed.w2_scale))


def test_nn_linear_reads_a_negated_input():
    lin = gemmlab.nn.Linear(32, 16, dtype=torch.float16, device=DEVICE)
    x = _r(4, 32, seed=17)
    with torch.no_grad():
        assert torch.equal(lin(neg(x)), lin(-x))


def test_direct_out_ops_read_negated_inputs_and_refuse_a_negated_out():
    """``torch.ops.gemmlab.*_out`` called directly: torch's Negative fallback cannot write a mutated out (it raised
    "Expected Tensor but got None"); gemmlab's Negative kernel materializes negated inputs and refuses a negated out
    or negated e4m3 data with one line (``ops.dispatch.negative_kernel``)."""
    a, b = _r(8, 32, seed=18), _r(32, 16, seed=19)
    out = torch.zeros(8, 16, dtype=torch.float16, device=DEVICE)
    torch.ops.gemmlab.gemm_out(neg(a), b, out)
    assert torch.equal(out, gemmlab.gemm(-a, b))
    torch.ops.gemmlab.gemm_out(a, b=neg(b), out=out)  # keyword arguments too
    assert torch.equal(out, gemmlab.gemm(a, -b))
    with pytest.raises(ValueError, match="gemm_out: out is a negated view"):
        torch.ops.gemmlab.gemm_out(a, b, neg(out))
    x, w = _r(10, 32, seed=20), _r(3, 16, 32, seed=21)
    offsets = torch.tensor([3, 7, 10], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="grouped_gemm_out: out is a negated view"):
        torch.ops.gemmlab.grouped_gemm_out(x, w, offsets, neg(torch.zeros(10, 16, dtype=torch.float16, device=DEVICE)))
    qa, sa = gemmlab.quantize_fp8(_r(8, 32, dtype=torch.float32, seed=22), "row")
    qw, sw = gemmlab.quantize_fp8(_r(16, 32, dtype=torch.float32, seed=23), "row")
    c = torch.zeros(8, 16, dtype=torch.bfloat16, device=DEVICE)
    torch.ops.gemmlab.gemm_fp8_out(qa, qw.t(), neg(sa), sw.t(), c)
    assert torch.equal(c, gemmlab.gemm_fp8(qa, qw.t(), -sa, sw.t()))
    with pytest.raises(ValueError, match="gemm_fp8_out: a is a negated view .* of e4m3 data"):
        torch.ops.gemmlab.gemm_fp8_out(neg(qa), qw.t(), sa, sw.t(), c)
