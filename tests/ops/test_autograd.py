"""Autograd of gemm, grouped_gemm, moe_forward and route against torch.autograd on the references in gemmlab.ref
(float64 for gemm, float32 loops for MoE), with tolerances derived from what torch makes in the same dtype.
Tiny shapes: each backward runs several kernels under the CPU interpreter. Legend: T tokens, H hidden,
I expert intermediate, E experts, k top-k, S routed rows."""

import pytest
import torch

import gemmlab
from gemmlab.ops.moe.scores import route_scores as route_impl
from gemmlab.ref import gemm_check, gemm_ref, grouped_gemm_ref, mantissa_bits, moe_ref, moe_same_dtype
from tests.conftest import rand

DTYPES = [torch.float16, torch.bfloat16]


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


def _within(ours, ref, same, dtype, ulps=1):
    """|ours - ref| <= 2 |torch same dtype - ref| + ``ulps`` ulps of max |ref| (the MoE rule of gemmlab.ref)."""
    ref = ref.float()
    torch_err = (same.float() - ref).abs().max().item()
    allowed = 2 * torch_err + ulps * 2.0 ** -mantissa_bits(dtype) * ref.abs().max().item()
    err = (ours.float() - ref).abs().max().item()
    assert torch.isfinite(ours).all() and err <= allowed, (err, allowed, torch_err)


# ------------------------------------------------------------------------------------------------ gemm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NN", "TT"])
def test_gemm_grads_match_float64(dtype, layout):
    m, n, k = 24, 40, 48
    a = _leaf(rand((m, k), dtype, major="row" if layout[0] == "N" else "col"))
    b = _leaf(rand((k, n), dtype, major="row" if layout[1] == "N" else "col"))
    dc = rand((m, n), dtype)
    c = gemmlab.gemm(a, b)
    assert c.requires_grad and c.grad_fn is not None
    c.backward(dc)
    # each gradient is itself a GEMM: check it against its float64 product with the kernel tolerance
    assert gemm_check(a.grad, dc, b.detach().t())["ok"]
    assert gemm_check(b.grad, a.detach().t(), dc)["ok"]
    # and against torch.autograd through the float64 reference
    a64, b64 = _leaf(a.detach().double()), _leaf(b.detach().double())
    gemm_ref(a64, b64).backward(dc.double())
    for ours, ref in ((a.grad, a64.grad), (b.grad, b64.grad)):
        assert ours.dtype == dtype and ours.shape == ref.shape
        assert (ours.double() - ref).abs().max() <= 2.0 ** -mantissa_bits(dtype) * ref.abs().max() * 2


def test_gemm_grad_of_one_operand_and_expanded_grad(device):
    a = _leaf(rand((8, 16)))
    b = rand((16, 24))  # no grad
    gemmlab.gemm(a, b).sum().backward()  # the grad of sum() is expanded (strides 0, 0)
    assert gemm_check(a.grad, torch.ones(8, 24, dtype=a.dtype, device=device), b.t())["ok"]


def test_gemm_nd_grads():
    a = _leaf(rand((6, 16)).view(2, 3, 16))
    b = _leaf(rand((16, 8)))
    dc = rand((6, 8)).view(2, 3, 8)
    c = gemmlab.gemm(a, b)
    assert c.shape == (2, 3, 8)
    c.backward(dc)
    assert a.grad.shape == (2, 3, 16)
    assert gemm_check(a.grad.reshape(6, 16), dc.reshape(6, 8), b.detach().t())["ok"]
    assert gemm_check(b.grad, a.detach().reshape(6, 16).t(), dc.reshape(6, 8))["ok"]


def test_out_requiring_grad_is_refused(device):
    a, b = rand((8, 16)), rand((16, 8))
    out = torch.empty(8, 8, dtype=a.dtype, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="out= does not support autograd, but out requires grad"):
        gemmlab.gemm(a, b, out=out)
    with pytest.raises(RuntimeError, match="an input requires grad"):
        gemmlab.gemm(_leaf(a), b, out=torch.empty(8, 8, dtype=a.dtype, device=device))
    offs = torch.tensor([3, 8], dtype=torch.int32, device=device)
    w = rand((16, 16)).view(2, 8, 16)
    with pytest.raises(RuntimeError, match="out requires grad"):
        gemmlab.grouped_gemm(a, w, offs, out=out)
    with torch.no_grad():  # an input that requires grad is fine outside autograd
        gemmlab.gemm(_leaf(a), b, out=torch.empty(8, 8, dtype=a.dtype, device=device))


# ----------------------------------------------------------------------------------------- grouped_gemm


def _grouped_same_dtype(x, w, offsets):
    out = torch.zeros((x.shape[0], w.shape[1]), dtype=x.dtype, device=x.device)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        out[start:end] = x[start:end] @ w[e].t()
        start = end
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_gemm_grads(dtype, device):
    s, n, k = 20, 24, 32
    offsets = torch.tensor([5, 5, 17], dtype=torch.int32, device=device)  # an empty group; rows 17.. in none
    x, w = _leaf(rand((s, k), dtype)), _leaf(rand((3 * n, k), dtype).view(3, n, k))
    dy = rand((s, n), dtype)
    gemmlab.grouped_gemm(x, w, offsets).backward(dy)
    x32, w32 = _leaf(x.detach().float()), _leaf(w.detach().float())
    grouped_gemm_ref(x32, w32, offsets).backward(dy.float())
    xs, ws = _leaf(x.detach()), _leaf(w.detach())
    _grouped_same_dtype(xs, ws, offsets).backward(dy)
    _within(x.grad, x32.grad, xs.grad, dtype)
    _within(w.grad, w32.grad, ws.grad, dtype)
    assert torch.equal(x.grad[17:], torch.zeros_like(x.grad[17:]))  # rows in no group: zero gradient
    assert torch.equal(w.grad[1], torch.zeros_like(w.grad[1]))  # the empty group's weight


# ------------------------------------------------------------------------------------------ moe_forward


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_forward_grads(dtype, device):
    t, h, i, e, k = 6, 32, 16, 4, 2
    x = _leaf(rand((t, h), dtype))
    w1 = _leaf(rand((e * 2 * i, h), dtype).view(e, 2 * i, h))
    w2 = _leaf(rand((e * h, i), dtype).view(e, h, i))
    logits = torch.randn(t, e, device=device)
    tw, ids = gemmlab.route(logits, k)
    tw = _leaf(tw)
    dy = rand((t, h), dtype)
    gemmlab.moe_forward(x, w1, w2, tw, ids).backward(dy)
    refs = [_leaf(v.detach().float()) for v in (x, w1, w2, tw)]
    moe_ref(*refs, ids).backward(dy.float())
    same = [_leaf(v.detach()) for v in (x, w1, w2, tw)]
    moe_same_dtype(*same, ids).backward(dy)
    for ours, ref, sd in zip((x, w1, w2, tw), refs, same, strict=True):
        assert ours.grad is not None and ours.grad.dtype == ours.dtype and ours.grad.shape == ours.shape
        # 4 ulps: each gradient is a sum over H or I of products of values rounded to the dtype once more than in
        # torch's composite (the expert outputs, the SiLU*up activations); with 6 tokens torch's own error is
        # sometimes near zero, and bf16 d(topk_weights) then missed the 1-ulp floor by 0.3 ulp in CI
        _within(ours.grad, ref.grad, sd.grad, dtype, ulps=4)


def test_moe_forward_nd_and_partial_grads(device):
    t, h, i, e, k = 4, 16, 8, 3, 2
    x = _leaf(rand((t, h)).view(2, 2, h))
    w1, w2 = rand((e * 2 * i, h)).view(e, 2 * i, h), _leaf(rand((e * h, i)).view(e, h, i))
    tw, ids = gemmlab.route(torch.randn(t, e, device=device), k)
    y = gemmlab.moe_forward(x, w1, w2, tw.view(2, 2, k), ids.view(2, 2, k))
    assert y.shape == (2, 2, h)
    y.float().square().sum().backward()
    assert x.grad.shape == (2, 2, h) and w2.grad is not None and w1.grad is None
    ref_x, ref_w2 = _leaf(x.detach().float().view(t, h)), _leaf(w2.detach().float())
    moe_ref(ref_x, w1.float(), ref_w2, tw, ids).square().sum().backward()
    sx, sw2 = _leaf(x.detach().view(t, h)), _leaf(w2.detach())
    moe_same_dtype(sx, w1, sw2, tw, ids).float().square().sum().backward()
    _within(x.grad.view(t, h), ref_x.grad, sx.grad, torch.float16)
    _within(w2.grad, ref_w2.grad, sw2.grad, torch.float16)


# ------------------------------------------------------------------------------------------------ route


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_grads_match_torch(scoring, renormalize, device):
    logits = _leaf(torch.randn(7, 6, device=device, dtype=torch.float64))
    w, ids = gemmlab.route(logits, 3, renormalize=renormalize, scoring=scoring)
    assert not ids.requires_grad and ids.dtype == torch.int32
    g = torch.randn_like(w)
    (w * g).sum().backward()
    ref = _leaf(logits.detach())
    wr, idr = route_impl(ref, 3, renormalize, scoring)  # torch ops, differentiated by torch.autograd
    (wr * g).sum().backward()
    assert torch.equal(ids, idr)
    assert torch.allclose(logits.grad, ref.grad, rtol=1e-5, atol=1e-6), (logits.grad - ref.grad).abs().max()
