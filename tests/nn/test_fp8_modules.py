"""gemmlab.nn's FP8 modules on their own: Fp8Linear and Fp8MoEExperts against the float64 FP8 references and their
derived bounds (``gemm_fp8_check``, ``moe_fp8_check``), the torch emulation against the same references, state-dict
loading (DeepSeek-V3's ``weight`` + ``weight_scale_inv``) and every guard fed a bad case. Tiny shapes: the FP8
kernels run under Triton's CPU interpreter here (a few 128-multiples, plus the odd sizes the modules must handle)."""

import pytest
import torch

import gemmlab
import gemmlab.nn as gnn
from gemmlab.ops.moe_fp8 import PackedMoEFP8
from gemmlab.ref import gemm_fp8_check, moe_fp8_check

BF16 = torch.bfloat16


def _linear(k: int, n: int, bias: bool, device: str) -> torch.nn.Linear:
    torch.manual_seed(k * 1000 + n)
    return torch.nn.Linear(k, n, bias=bias, device=device, dtype=BF16)


def _check_linear(f: gnn.Fp8Linear, x: torch.Tensor, y: torch.Tensor) -> dict:
    """y (..., N) of ``f`` without bias against gemm_fp8_ref on the operands the op sees (x quantized per 1x128)."""
    xq, xs = gemmlab.quantize_fp8(x.reshape(-1, x.shape[-1]), "block", (1, 128))
    return gemm_fp8_check(y.reshape(-1, f.out_features), xq, f.weight.t(), xs, f.weight_scale_inv.t())


# (leading dims, K, N): a 128-multiple, partial 128-blocks of K and N, K % 16 != 0 (padded), one row, no rows
@pytest.mark.parametrize(
    "lead,k,n", [((2, 3), 256, 128), ((5,), 144, 200), ((7,), 40, 24), ((1,), 128, 16), ((0,), 128, 128)]
)
@pytest.mark.parametrize("dispatch", ["auto", "torch"])
def test_fp8_linear_within_the_fp8_bound(lead, k, n, dispatch, device):
    f = gnn.Fp8Linear.from_linear(_linear(k, n, False, device), dispatch=dispatch)
    x = torch.randn(*lead, k, device=device, dtype=BF16)
    with torch.no_grad():
        y = f(x)
    assert y.shape == (*lead, n) and y.dtype == BF16
    res = _check_linear(f, x, y)
    assert res["ok"], res


def test_the_linear_check_sees_a_wrong_block_scale(device):
    """The bound above has teeth: one 128x128 block's scale off by 1/64 (as a swapped or misread scale would be, far
    more) fails it."""
    f = gnn.Fp8Linear.from_linear(_linear(256, 256, False, device))
    x = torch.randn(4, 256, device=device, dtype=BF16)
    with torch.no_grad():
        right = f(x)
        f.weight_scale_inv[1, 0] *= 1 + 2.0**-6
        wrong = f(x)
        f.weight_scale_inv[1, 0] /= 1 + 2.0**-6
    assert _check_linear(f, x, right)["ok"] and not _check_linear(f, x, wrong)["ok"]


def test_fp8_linear_bias_and_the_dequantized_weight(device):
    lin = _linear(256, 136, True, device)
    f = gnn.Fp8Linear.from_linear(lin)
    assert f.bias is lin.bias  # shared, in its own dtype
    x = torch.randn(6, 256, device=device, dtype=BF16)
    with torch.no_grad():
        y = f(x)
        bias, f.bias = f.bias, None
        y0 = f(x)
    assert torch.equal(y, y0 + bias)
    # the weight it holds is the Linear's, to e4m3's precision per 128x128 block (half an e4m3 ulp, 2^-4, of the
    # block's amax-scaled values)
    deq = gnn.fp8.dequantize(f.weight, f.weight_scale_inv, 128, 128)
    w = lin.weight.float()
    assert ((deq - w).abs() <= 2.0**-4 * w.abs() + 2.0**-9 * w.abs().max()).all()


def test_fp8_linear_loads_a_checkpoint_state_dict(device):
    f = gnn.Fp8Linear.from_linear(_linear(256, 256, True, device))
    sd = f.state_dict()
    assert {k: v.dtype for k, v in sd.items()} == {
        "weight": torch.float8_e4m3fn,
        "weight_scale_inv": torch.float32,
        "bias": BF16,
    }
    g = gnn.Fp8Linear(256, 256, device=device, dtype=BF16)
    g.load_state_dict(sd)
    x = torch.randn(3, 256, device=device, dtype=BF16)
    with torch.no_grad():
        assert torch.equal(f(x), g(x))
    # UE8M0 (power-of-two) scales load too, converted to fp32 exactly
    if hasattr(torch, "float8_e8m0fnu"):
        pow2 = torch.exp2(torch.log2(sd["weight_scale_inv"]).ceil())
        g.load_state_dict({**sd, "weight_scale_inv": pow2.to(torch.float8_e8m0fnu)})
        assert torch.equal(g.weight_scale_inv, pow2) and g.weight_scale_inv.dtype == torch.float32
    g.load_state_dict({**sd, "weight_scale_inv": sd["weight_scale_inv"].to(BF16)}, assign=True)
    assert g.weight_scale_inv.dtype == torch.float32  # (assign=True too: the scales are held in fp32)


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"weight": torch.zeros(256, 256, dtype=BF16)}, "weight must be float8_e4m3fn of shape"),
        ({"weight": torch.zeros(256, 128, dtype=torch.float8_e4m3fn)}, "weight must be float8_e4m3fn of shape"),
        ({"weight_scale_inv": torch.ones(2, 1)}, "weight_scale_inv must be fp32 of shape \\(2, 2\\)"),
        ({"weight_scale_inv": torch.ones(2, 2, dtype=torch.float8_e4m3fn)}, "weight_scale_inv must be fp32"),
    ],
)
def test_fp8_linear_refuses_a_bad_checkpoint(bad, match):
    g = gnn.Fp8Linear(256, 256, bias=False)
    sd = {"weight": torch.zeros(256, 256, dtype=torch.float8_e4m3fn), "weight_scale_inv": torch.ones(2, 2), **bad}
    with pytest.raises(ValueError, match=match):
        g.load_state_dict(sd)
    assert torch.equal(g.weight_scale_inv, torch.ones(2, 2))  # nothing was loaded


def test_fp8_linear_refuses_bad_calls(device):
    f = gnn.Fp8Linear.from_linear(_linear(128, 128, False, device))
    with pytest.raises(ValueError, match="Fp8Linear: input must be \\(..., in_features=128\\)"):
        f(torch.randn(2, 64, device=device, dtype=BF16))
    with pytest.raises(TypeError, match="Fp8Linear: input has dtype torch.float64"):
        f(torch.randn(2, 128, device=device, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="inference only"):
        f(torch.randn(2, 128, device=device, dtype=BF16, requires_grad=True))
    with pytest.raises(ValueError, match="dispatch 'gemmlab'"):
        gnn.Fp8Linear(128, 128, dispatch="gemmlab")
    with pytest.raises(ValueError, match="weight must be float8_e4m3fn of shape \\(64, 32\\), got torch.bfloat16"):
        gnn.Fp8Linear.from_fp8(torch.zeros(64, 32, dtype=BF16), torch.ones(1, 1))
    with pytest.raises(ValueError, match="weight_scale_inv must be fp32 of shape \\(2, 1\\)"):
        gnn.Fp8Linear.from_fp8(torch.zeros(256, 32, dtype=torch.float8_e4m3fn), torch.ones(1, 1))
    with pytest.raises(ValueError, match="weight must be a 2-D"):
        gnn.Fp8Linear.from_fp8(torch.zeros(4, dtype=torch.float8_e4m3fn), torch.ones(1, 1))
    with pytest.raises(ValueError, match="from_linear: needs a Linear whose weight is a materialized"):
        gnn.Fp8Linear.from_linear(torch.nn.Linear(128, 128, device="meta"))


def test_fp8_buffers_keep_their_dtypes_through_to(device):
    f = gnn.Fp8Linear.from_linear(_linear(128, 128, True, device))
    w, s = f.weight.clone(), f.weight_scale_inv.clone()
    torch.nn.Sequential(f).to(torch.float16)
    assert f.weight.dtype == torch.float8_e4m3fn and torch.equal(f.weight.float(), w.float())
    assert f.weight_scale_inv.dtype == torch.float32 and torch.equal(f.weight_scale_inv, s)
    assert f.bias.dtype == torch.float16


def _experts(e: int, h: int, i: int, device: str) -> gnn.MoEExperts:
    torch.manual_seed(e + h + i)
    return gnn.MoEExperts(e, h, i, device=device, dtype=BF16)


# (E, H, I, T, k): a 128-multiple H, partial blocks of I and 2I, one expert hit by every token (k = E)
@pytest.mark.parametrize("e,h,i,t,k", [(4, 128, 32, 6, 2), (3, 256, 144, 5, 3)])
@pytest.mark.parametrize("dispatch", ["auto", "torch"])
def test_fp8_experts_within_the_fp8_bound(e, h, i, t, k, dispatch, device):
    fe = gnn.Fp8MoEExperts.from_experts(_experts(e, h, i, device), dispatch=dispatch)
    assert isinstance(fe, gnn.MoEExperts) and fe.gate_up_proj.dtype == torch.float8_e4m3fn
    x = torch.randn(t, h, device=device, dtype=BF16)
    ids = torch.stack([torch.randperm(e, device=device)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, device=device)
    with torch.no_grad():
        y = fe(x, ids, w)
        y3 = fe(x.view(1, t, h), ids.view(1, t, k), w.view(1, t, k))  # any leading dims
    assert torch.equal(y3.view(t, h), y)
    packed = PackedMoEFP8(fe.gate_up_proj, fe.gate_up_proj_scale_inv, fe.down_proj, fe.down_proj_scale_inv)
    res = moe_fp8_check(y, x, packed, w, ids)
    assert res["ok"], res


def test_fp8_experts_hold_the_experts_weights(device):
    """from_experts holds each expert's weights to e4m3's precision per 128x128 block (half an e4m3 ulp, 2^-4,
    relative; blocks straddle gate and up where I % 128 != 0, as the op's layout has them)."""
    ex = _experts(3, 256, 144, device)
    fe = gnn.Fp8MoEExperts.from_experts(ex)
    for name in ("gate_up_proj", "down_proj"):
        w = getattr(ex, name).detach().float()
        deq = gnn.fp8.dequantize(getattr(fe, name), getattr(fe, name + "_scale_inv"), 128, 128)
        assert ((deq - w).abs() <= 2.0**-4 * w.abs() + 2.0**-9 * w.abs().amax(dim=(1, 2), keepdim=True)).all(), name


def test_fp8_experts_load_and_refuse_checkpoints(device):
    fe = gnn.Fp8MoEExperts.from_experts(_experts(2, 128, 64, device))
    sd = fe.state_dict()
    assert sorted(sd) == ["down_proj", "down_proj_scale_inv", "gate_up_proj", "gate_up_proj_scale_inv"]
    g = gnn.Fp8MoEExperts(2, 128, 64, device=device)
    g.load_state_dict(sd)
    assert all(torch.equal(g.state_dict()[n].float(), v.float()) for n, v in sd.items())
    with pytest.raises(ValueError, match="gate_up_proj must be float8_e4m3fn"):
        g.load_state_dict({**sd, "gate_up_proj": sd["gate_up_proj"].to(BF16)})
    # transformers allocates two scale rows for 2I <= 128 (gate and up apart): not gemmlab's 128-row blocks
    with pytest.raises(ValueError, match="gate_up_proj_scale_inv must be fp32 of shape \\(2, 1, 1\\)"):
        g.load_state_dict({**sd, "gate_up_proj_scale_inv": torch.ones(2, 2, 1, device=device)})
    with pytest.raises(ValueError, match="multiples of 16"):
        gnn.Fp8MoEExperts(2, 120, 64)
    with pytest.raises(ValueError, match="multiples of 16"):
        gnn.Fp8MoEExperts.from_experts(_experts(2, 128, 40, device))
    with pytest.raises(TypeError, match="Fp8MoEExperts: input has dtype torch.int64"):
        g(torch.zeros(2, 128, dtype=torch.int64, device=device), torch.zeros(2, 1, dtype=torch.int64), torch.ones(2, 1))


def test_quantize_swaps_linears_and_experts_and_keeps_routers_and_lm_head(device):
    model = torch.nn.Module()
    model.moe = gnn.MoE(128, 32, 4, 2, device=device, dtype=BF16)
    model.proj = torch.nn.Linear(128, 128, device=device, dtype=BF16)
    model.lm_head = torch.nn.Linear(128, 64, device=device, dtype=BF16)
    _, summary = gemmlab.quantize_(model, return_summary=True)
    assert sorted(summary["fp8"]) == ["moe.experts", "proj"], summary
    assert isinstance(model.moe.experts, gnn.Fp8MoEExperts) and isinstance(model.proj, gnn.Fp8Linear)
    assert type(model.moe.gate) is gnn.Linear and type(model.lm_head) is torch.nn.Linear
    assert any(k.startswith("moe.gate: beside moe.experts") for k in summary["kept"]), summary
    x = torch.randn(5, 128, device=device, dtype=BF16)
    with torch.no_grad():
        y = model.moe(x)  # the router in bf16, the experts in FP8
    assert y.shape == x.shape and torch.isfinite(y).all()
    with pytest.warns(UserWarning, match="nothing became FP8"):
        gemmlab.quantize_(model)  # a second call: all done
    with pytest.raises(TypeError, match="quantize_: model must be a torch.nn.Module"):
        gemmlab.quantize_("model")
    with pytest.raises(ValueError, match="the model itself is a Linear"):
        gemmlab.quantize_(torch.nn.Linear(16, 16))


def test_fp8_experts_refuse_bad_calls(device):
    fe = gnn.Fp8MoEExperts.from_experts(_experts(4, 128, 32, device), dispatch="torch")
    x = torch.randn(3, 128, device=device, dtype=BF16)
    ids, w = torch.zeros(3, 2, dtype=torch.int64, device=device), torch.ones(3, 2, device=device)
    with pytest.raises(ValueError, match="Fp8MoEExperts: input must be \\(..., hidden=128\\)"):
        fe(x[:, :64], ids, w)
    with pytest.raises(RuntimeError, match="inference only"):
        fe(x.requires_grad_(), ids, w)
    with torch.no_grad(), pytest.raises(ValueError, match="top_k_index must be in \\[0, E=4\\)"):
        fe(x, ids + 7, w)  # the torch emulation's own id check (the op checks on the device)
    with pytest.raises(ValueError, match="from_experts: needs materialized 3-D"):
        gnn.Fp8MoEExperts.from_experts(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="down_proj must be a 3-D"):
        gnn.Fp8MoEExperts.from_fp8(None, None, torch.zeros(4, 4), None)
    q = torch.zeros(128, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="weight and its scale must be on one device"):
        gnn.Fp8Linear.from_fp8(q, torch.ones(1, 1, device="meta"))


def test_quantize_reports_what_it_cannot_make_fp8(device):
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    model = torch.nn.Module()
    model.odd = gnn.MoE(120, 32, 4, 2, device=device, dtype=BF16)  # H % 16 != 0
    model.other = fp8.FP8Linear(128, 128, block_size=(64, 64))  # another FP8 scheme
    with pytest.warns(UserWarning) as caught:
        _, summary = gemmlab.quantize_(model, return_summary=True)
    assert summary["fp8"] == [] and len(summary["skipped"]) == 2, summary
    said = " ".join(str(w.message) for w in caught)
    assert "H=120, I=32: FP8 experts need multiples of 16" in said and "weight block size (64, 64)" in said, said
    with pytest.raises(TypeError, match="skip must be a tuple of module names"):
        gemmlab.quantize_(model, skip="lm_head")
    with pytest.raises(ValueError, match="dispatch 'gemmlab': auto or torch"):
        gemmlab.quantize_(model, dispatch="gemmlab")
