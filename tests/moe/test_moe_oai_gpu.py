"""moe_forward(activation="swiglu_oai") on a GPU at a gpt-oss-20b layer's size (H 2880, I 2880, 32 experts, top-4;
biases, gpt-oss's interleaved layout read through transposed views): forward and every gradient (x, w1, w2, both
biases, the top-k weights) against the float64 reference ``gemmlab.ref.moe_oai_ref`` and its autograd, with the
tolerance of tests/moe/test_moe_oai.py (twice what PyTorch misses in the same dtype, plus one ulp of max |ref|).
Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k."""

import pytest
import torch

from gemmlab.ops.moe import moe_forward
from gemmlab.ref import mantissa_bits, moe_oai_ref

pytestmark = pytest.mark.gpu

GPT_OSS_20B = dict(h=2880, i=2880, e=32, k=4)


def _inputs(t, h, i, e, k, dtype, device, seed=0):
    """gpt-oss's Parameters in its own layout (gate_up (E, H, 2I) interleaved, down (E, I, H)), biases wide enough
    that the clamps at +-7 bite; uniform random top-k."""
    g = torch.Generator(device=device).manual_seed(seed)

    def r(*shape, scale=1.0):
        return ((torch.rand(shape, generator=g, device=device) - 0.5) * 2 * scale).to(dtype)

    x = r(t, h)
    gate_up, down = r(e, h, 2 * i, scale=h**-0.5 * 3), r(e, i, h, scale=i**-0.5)
    b1, b2 = r(e, 2 * i, scale=4.0), r(e, h)
    ids = torch.rand((t, e), generator=g, device=device).argsort(-1)[:, :k].to(torch.int32)
    tw = torch.softmax(torch.rand((t, k), generator=g, device=device), -1)
    return x, gate_up, down, tw, ids, b1, b2


def _bound(got, ref, same, what):
    assert bool(torch.isfinite(got).all()), what
    err = (got.double() - ref).abs().max().item()
    allowed = 2 * (same.double() - ref).abs().max().item() + 2.0 ** -mantissa_bits(got.dtype) * ref.abs().max().item()
    assert err <= allowed, (what, err, allowed)


def run_oai_check(t, h, i, e, k, dtype, device, backward=True):
    """Forward (and backward) of moe_forward's swiglu_oai at these sizes against the float64 reference."""
    x, gate_up, down, tw, ids, b1, b2 = _inputs(t, h, i, e, k, dtype, device)
    leaves = [x, gate_up, down, tw, b1, b2]

    def ours(x, gu, dn, tw, b1, b2):
        return moe_forward(x, gu.transpose(1, 2), dn.transpose(1, 2), tw, ids, activation="swiglu_oai",
                           w1_bias=b1, w2_bias=b2, interleaved=True)  # fmt: skip

    def ref(dt):
        def f(x, gu, dn, tw, b1, b2):
            return moe_oai_ref(x, gu.transpose(1, 2), dn.transpose(1, 2), tw, ids, b1, b2, interleaved=True, dtype=dt)

        return f

    with torch.no_grad():
        y = ours(*leaves)
        r64 = ref(torch.float64)(*[t.double() for t in leaves])
        _bound(y, r64, ref(dtype)(*leaves), "y")
    del r64
    if not backward:
        return
    dy = torch.rand(x.shape, generator=torch.Generator(device=device).manual_seed(1), device=device) - 0.5
    names = ("dx", "dgate_up", "ddown", "dweights", "dgate_up_bias", "ddown_bias")
    got = _grads(ours, leaves, dy)
    same = _grads(ref(dtype), leaves, dy)
    want = _grads(ref(torch.float64), [t.double() for t in leaves], dy)
    for name, g, w, s, like in zip(names, got, want, same, leaves, strict=True):
        assert g.shape == like.shape and g.dtype == like.dtype, name
        _bound(g, w, s, name)


def _grads(fn, leaves, dy):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dy.to(out.dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t", [1, 256])
def test_swiglu_oai_gpt_oss_20b_layer(t, dtype):
    run_oai_check(t, **GPT_OSS_20B, dtype=dtype, device="cuda", backward=t > 1)
