"""moe_forward's activation option (issue 33, gpt-oss): activation="swiglu_oai" (clamped SwiGLU, alpha, limit),
expert biases and the interleaved gate/up layout, against the float64 reference ``gemmlab.ref.moe_oai_ref``
(tolerance: twice what PyTorch itself misses in the same dtype, plus one ulp of the largest output) and against
transformers' GptOssExperts; gradients against float64 autograd of the reference; one error per bad argument.
Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k."""

import pytest
import torch

from gemmlab.ops.moe import deinterleave_gate_up, moe_forward, pack_moe_weights
from gemmlab.ref import mantissa_bits, moe_oai_ref

DTYPES = (torch.float16, torch.bfloat16)


def _case(t, h, i, e, k, dtype, device, seed=0, bias_scale=4.0):
    """Inputs where the clamps bite: w1's bias spreads the pre-activations past +-limit (7)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return ((torch.rand(shape, generator=g) - 0.5) * 2 * scale).to(dtype).to(device)

    x, w1, w2 = r(t, h), r(e, 2 * i, h, scale=h**-0.5 * 3), r(e, h, i, scale=i**-0.5)
    b1, b2 = r(e, 2 * i, scale=bias_scale), r(e, h)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32).to(device)
    tw = torch.rand((t, k), generator=g).to(device)
    return x, w1, w2, tw, ids, b1, b2


def _check(y, ref, same):
    """|y - ref| <= 2 * |same - ref| + one ulp of max |ref| (ref float64, same in y's dtype)."""
    assert y.dtype in DTYPES and bool(torch.isfinite(y).all())
    err = (y.double() - ref).abs().max().item() if y.numel() else 0.0
    torch_err = (same.double() - ref).abs().max().item() if y.numel() else 0.0
    allowed = 2 * torch_err + 2.0 ** -mantissa_bits(y.dtype) * (ref.abs().max().item() if y.numel() else 0.0)
    assert err <= allowed, (err, allowed)


# odd sizes; top-k = E; one token; an expert with no tokens is likely at T=3, E=7
SHAPES = [(7, 24, 10, 5, 2), (1, 16, 8, 3, 3), (3, 13, 5, 7, 1), (9, 32, 17, 4, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_swiglu_oai_forward(shape, dtype, interleaved, device):
    x, w1, w2, tw, ids, b1, b2 = _case(*shape, dtype, device)
    y = moe_forward(x, w1, w2, tw, ids, activation="swiglu_oai", w1_bias=b1, w2_bias=b2, interleaved=interleaved)
    kw = dict(interleaved=interleaved)
    ref = moe_oai_ref(x, w1, w2, tw, ids, b1, b2, **kw)
    _check(y, ref, moe_oai_ref(x, w1, w2, tw, ids, b1, b2, dtype=dtype, **kw))
    assert y.shape == x.shape and y.dtype == dtype


@pytest.mark.parametrize("alpha, limit", [(1.0, 0.5), (2.5, 100.0)])
def test_swiglu_oai_alpha_limit(alpha, limit, device):
    """Other alpha and limit are honoured (limit 0.5: nearly everything clamped; 100: nothing)."""
    x, w1, w2, tw, ids, b1, b2 = _case(5, 16, 6, 4, 2, torch.float16, device, seed=3)
    y = moe_forward(x, w1, w2, tw, ids, activation="swiglu_oai", alpha=alpha, limit=limit, w1_bias=b1)
    ref = moe_oai_ref(x, w1, w2, tw, ids, b1, None, alpha=alpha, limit=limit)
    _check(y, ref, moe_oai_ref(x, w1, w2, tw, ids, b1, None, alpha=alpha, limit=limit, dtype=torch.float16))
    default = moe_oai_ref(x, w1, w2, tw, ids, b1, None)
    assert (ref - default).abs().max().item() > 1e-2  # the option changes the answer


def test_silu_with_biases(device):
    """activation="silu" with biases runs the same body: SiLU(gate) * up plus the biases."""
    x, w1, w2, tw, ids, b1, b2 = _case(6, 16, 8, 4, 2, torch.bfloat16, device, seed=5, bias_scale=1.0)
    y = moe_forward(x, w1, w2, tw, ids, w1_bias=b1, w2_bias=b2)
    i = w2.shape[2]
    ref = torch.zeros(x.shape, dtype=torch.float64, device=device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            g = w1[e].double() @ x[t].double() + b1[e].double()
            o = w2[e].double() @ (torch.nn.functional.silu(g[:i]) * g[i:]) + b2[e].double()
            ref[t] += tw[t, j].double() * o
    assert (y.double() - ref).abs().max().item() <= 0.05 * ref.abs().max().item()
    plain = moe_forward(x, w1, w2, tw, ids)  # no biases: the fused body, unchanged
    assert (plain.double() - ref).abs().max().item() > 1e-2


def test_interleaved_packing(device):
    """pack_moe_weights(interleaved=True) + deinterleave_gate_up(bias) == interleaved=True at call time."""
    x, w1, w2, tw, ids, b1, b2 = _case(7, 16, 6, 3, 2, torch.float16, device, seed=7)
    y = moe_forward(x, w1, w2, tw, ids, activation="swiglu_oai", w1_bias=b1, w2_bias=b2, interleaved=True)
    packed = pack_moe_weights(w1, w2, interleaved=True)
    assert torch.equal(packed.w1[:, :6], w1[:, 0::2]) and torch.equal(packed.w1[:, 6:], w1[:, 1::2])
    y2 = moe_forward(x, packed, None, tw, ids, activation="swiglu_oai", w1_bias=deinterleave_gate_up(b1), w2_bias=b2)
    assert torch.equal(y, y2)


def test_empty_batch(device):
    x, w1, w2, tw, ids, b1, b2 = _case(3, 16, 6, 3, 2, torch.float16, device)
    y = moe_forward(x[:0], w1, w2, tw[:0], ids[:0], activation="swiglu_oai", w1_bias=b1, w2_bias=b2)
    assert y.shape == (0, 16)


def test_leading_dims(device):
    x, w1, w2, tw, ids, b1, b2 = _case(6, 16, 6, 3, 2, torch.bfloat16, device, seed=2)
    y = moe_forward(x, w1, w2, tw, ids, activation="swiglu_oai", w1_bias=b1)
    y3 = moe_forward(x.view(2, 3, 16), w1, w2, tw.view(2, 3, 2), ids.view(2, 3, 2), activation="swiglu_oai", w1_bias=b1)
    assert y3.shape == (2, 3, 16) and torch.equal(y3.view(6, 16), y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_hf_gpt_oss_experts(dtype, device):
    """transformers' GptOssExperts (gate_up_proj (E, H, 2I) interleaved, biases) on a tiny random config: the
    same parameters through moe_forward (transposed views, interleaved=True) agree within the reference's
    same-dtype tolerance; HF's own output is as far from the float64 reference as ours at most twice over."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    cfg = transformers.GptOssConfig(hidden_size=24, intermediate_size=10, num_local_experts=5, num_experts_per_tok=2)
    torch.manual_seed(0)
    hf = GptOssExperts(cfg)
    with torch.no_grad():
        scales = ((hf.gate_up_proj, 0.5), (hf.gate_up_proj_bias, 4.0), (hf.down_proj, 0.3), (hf.down_proj_bias, 1.0))
        for p, scale in scales:
            p.uniform_(-scale, scale)
    hf = hf.to(device=device, dtype=dtype)
    t, k, e = 9, 2, 5
    x = torch.randn(t, 24).to(device=device, dtype=dtype)
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)]).to(device)
    tw = torch.softmax(torch.randn(t, k), -1).to(device=device, dtype=dtype)
    with torch.no_grad():
        want = hf(x, ids, tw)
        w1, w2 = hf.gate_up_proj.transpose(1, 2), hf.down_proj.transpose(1, 2)
        b1, b2 = hf.gate_up_proj_bias, hf.down_proj_bias
        y = moe_forward(
            x,
            w1,
            w2,
            tw,
            ids,
            activation="swiglu_oai",
            limit=cfg.swiglu_limit,
            alpha=cfg.swiglu_alpha,
            w1_bias=b1,
            w2_bias=b2,
            interleaved=True,
        )
    ref = moe_oai_ref(x, w1, w2, tw, ids, b1, b2, interleaved=True)
    _check(y, ref, want)  # HF's own error in this dtype sets the bound
    same = moe_oai_ref(x, w1, w2, tw, ids, b1, b2, interleaved=True, dtype=dtype)
    _check(want, ref, same)  # and the same-dtype reference is what HF computes


@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(activation="gelu"), ValueError, "activation 'gelu'"),
        (dict(alpha=1.0), ValueError, "alpha and limit apply to activation='swiglu_oai' only"),
        (dict(activation="swiglu_oai", limit=0.0), ValueError, "limit must be > 0"),
        (dict(activation="swiglu_oai", alpha=float("nan")), ValueError, "alpha must be finite"),
        (dict(activation="swiglu_oai", alpha=True), TypeError, "alpha must be a real number"),
        (dict(activation="swiglu_oai", limit="7"), TypeError, "limit must be a real number"),
        (dict(activation="swiglu_oai", interleaved=1), TypeError, "interleaved must be a bool"),
        (dict(activation="swiglu_oai", w1_bias="b"), TypeError, "w1_bias must be a torch.Tensor"),
        (dict(activation="swiglu_oai", w1_bias=torch.zeros(3, 6, dtype=torch.float16)), ValueError, "w1_bias must be"),
        (dict(activation="swiglu_oai", w2_bias=torch.zeros(3, 16)), TypeError, "w2_bias has dtype"),
        (dict(activation="swiglu_oai", w2_bias=torch.zeros(3, 15).half()), ValueError, "w2_bias must be"),
        (dict(activation="swiglu_oai", gather="nope"), ValueError, "gather 'nope'"),
    ],
)
def test_bad_arguments(kw, err, match, device):
    x, w1, w2, tw, ids, _, _ = _case(4, 16, 6, 3, 2, torch.float16, device)
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    with pytest.raises(err, match=match.replace("(", r"\(").replace(")", r"\)")):
        moe_forward(x, w1, w2, tw, ids, **kw)


def test_bad_configs_and_packing(device):
    from gemmlab.ops.moe import MoEConfig

    x, w1, w2, tw, ids, b1, _ = _case(4, 16, 6, 3, 2, torch.float16, device)
    with pytest.raises(ValueError, match="configs= applies to activation='silu' without biases only"):
        moe_forward(x, w1, w2, tw, ids, w1_bias=b1, configs=(MoEConfig(), MoEConfig()))
    with pytest.raises(TypeError, match="pack_moe_weights: interleaved must be a bool"):
        pack_moe_weights(w1, w2, interleaved="yes")
    with pytest.raises(ValueError, match="deinterleave_gate_up: needs"):
        deinterleave_gate_up(torch.zeros(3, 5))


@pytest.mark.cpu_only("a bad id is a ValueError on the CPU (a device-side assert on a GPU)")
def test_bad_ids_refused():
    """validate=True: an id outside [0, E) is refused (a ValueError on the CPU)."""
    x, w1, w2, tw, ids, b1, _ = _case(4, 16, 6, 3, 2, torch.float16, "cpu")
    ids[2, 1] = 3
    with pytest.raises(ValueError, match=r"topk_ids must be in \[0, E=3\)"):
        moe_forward(x, w1, w2, tw, ids, activation="swiglu_oai", w1_bias=b1)


def _grads(fn, leaves, dy):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dy.to(out.dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, interleaved", [((7, 24, 10, 5, 2), True), ((5, 13, 7, 3, 3), False)])
def test_swiglu_oai_backward(shape, dtype, interleaved, device):
    """Gradients in x, w1, w2, both biases and the top-k weights against float64 autograd of the reference;
    per tensor |g - ref| <= 2 * |torch in the same dtype - ref| + one ulp of max |ref|."""
    x, w1, w2, tw, ids, b1, b2 = _case(*shape, dtype, device, seed=11)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(device)
    kw = dict(interleaved=interleaved)

    def ours(x, w1, w2, tw, b1, b2):
        return moe_forward(x, w1, w2, tw, ids, activation="swiglu_oai", w1_bias=b1, w2_bias=b2, **kw)

    def ref(dt):
        return lambda x, w1, w2, tw, b1, b2: moe_oai_ref(x, w1, w2, tw, ids, b1, b2, dtype=dt, **kw)

    leaves = (x, w1, w2, tw, b1, b2)
    got = _grads(ours, leaves, dy)
    want = _grads(ref(torch.float64), [t.double() for t in leaves], dy)
    same = _grads(ref(dtype), leaves, dy)
    for name, g, r, s, like in zip(("dx", "dw1", "dw2", "dtw", "db1", "db2"), got, want, same, leaves, strict=True):
        assert g.shape == like.shape and g.dtype == like.dtype, name
        assert bool(torch.isfinite(g).all()), name
        err, torch_err = (g.double() - r).abs().max().item(), (s.double() - r).abs().max().item()
        allowed = 2 * torch_err + 2.0 ** -mantissa_bits(dtype) * r.abs().max().item()
        assert err <= allowed, (name, err, allowed)


def test_backward_reaches_transposed_parameters(device):
    """HF's layout: gate_up_proj (E, H, 2I) and down_proj (E, I, H) Parameters passed as transposed views get
    gradients in their own layout, equal to the contiguous copies' transposed."""
    x, w1, w2, tw, ids, b1, b2 = _case(6, 16, 6, 4, 2, torch.bfloat16, device, seed=13)
    gu = w1.transpose(1, 2).contiguous().requires_grad_()  # (E, H, 2I)
    dn = w2.transpose(1, 2).contiguous().requires_grad_()  # (E, I, H)
    y = moe_forward(x, gu.transpose(1, 2), dn.transpose(1, 2), tw, ids, activation="swiglu_oai", interleaved=True)
    y.float().square().sum().backward()
    a, b = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    y2 = moe_forward(x, a, b, tw, ids, activation="swiglu_oai", interleaved=True)
    y2.float().square().sum().backward()
    assert torch.equal(y, y2)
    assert torch.allclose(gu.grad.float(), a.grad.transpose(1, 2).float(), rtol=1e-2, atol=1e-2)
    assert torch.allclose(dn.grad.float(), b.grad.transpose(1, 2).float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gradients_are_summed_in_fp32(dtype, device):
    """Many rows per expert (T=512 on E=2, k=2): each bias's gradient is a sum over its expert's rows, rounded once
    to the bias's dtype, not a running sum in it (on the H200, gpt-oss-20b's fp16 ddown_bias at T=256 missed the
    bound by 1.12x)."""
    x, w1, w2, tw, ids, b1, b2 = _case(512, 16, 8, 2, 2, dtype, device, seed=5)
    b1, b2 = b1.clone().requires_grad_(), b2.clone().requires_grad_()
    dy = torch.rand(x.shape, generator=torch.Generator().manual_seed(2)).to(device)  # same sign: the sums grow
    y = moe_forward(x, w1, w2, tw, ids, activation="swiglu_oai", w1_bias=b1, w2_bias=b2)
    db1, db2 = torch.autograd.grad(y, (b1, b2), dy.to(y.dtype))
    leaves = [t.double().requires_grad_() for t in (b1, b2)]
    y64 = moe_oai_ref(x.double(), w1.double(), w2.double(), tw.double(), ids, *leaves, dtype=torch.float64)
    want = torch.autograd.grad(y64, leaves, dy.double())
    for name, g, w in (("db1", db1, want[0]), ("db2", db2, want[1])):
        err = (g.double() - w).abs().max().item()
        assert err <= 2.0 ** -mantissa_bits(dtype) * w.abs().max().item(), (name, err)
