"""gemmlab.nn: Linear against nn.Linear, MoEExperts and MoE against the reference (and their expert-id check),
patch()'s dtype rule, summary, warnings and structural match on small models (the families of Hugging Face
models: test_nn_families.py; the per-shape Linear choice: test_nn_per_shape.py). Tolerances as the style guide
derives them: the error against a float64 copy may be at most twice what torch makes in the same dtype, plus one
ulp."""

import copy
import json
import warnings

import pytest
import torch
from torch import nn

import gemmlab
import gemmlab.nn as gnn
from gemmlab.nn.patch import experts_fit
from gemmlab.ops import gemm as ops_gemm
from gemmlab.ops import moe as ops_moe
from gemmlab.ref import mantissa_bits, moe_check, moe_ref
from tests.nn.hf_tiny import float64, output, tf, tiny

route = gemmlab.route

DTYPES = [torch.float16, torch.bfloat16]


def _close(ours: torch.Tensor, theirs: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(our error, allowed): allowed = 2 * torch's own error against the float64 ref + one ulp of max |ref|."""
    ref = ref.double()
    err = (ours.double() - ref).abs().max().item()
    allowed = 2 * (theirs.double() - ref).abs().max().item() + 2.0 ** -mantissa_bits(dtype) * ref.abs().max().item()
    assert torch.isfinite(ours).all()
    return err, allowed


# ------------------------------------------------------------------------------------------------ Linear


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(5,), (2, 3)])  # 2-D and N-D activations
def test_linear_matches_nn_linear(dtype, bias, lead, device):
    torch.manual_seed(len(lead) + 2 * bias)
    ref_mod = nn.Linear(48, 40, bias=bias, device=device, dtype=dtype)
    mod = gnn.Linear(48, 40, bias=bias, device=device, dtype=dtype)
    mod.load_state_dict(ref_mod.state_dict())  # an nn.Linear state_dict loads unchanged
    assert isinstance(mod, nn.Linear) and list(dict(mod.named_parameters())) == list(dict(ref_mod.named_parameters()))
    x = torch.randn(*lead, 48, device=device, dtype=dtype)
    y = mod(x)
    assert y.shape == (*lead, 40) and y.dtype == dtype
    b64 = ref_mod.bias.double() if bias else 0
    err, allowed = _close(y, ref_mod(x), x.double() @ ref_mod.weight.double().t() + b64, dtype)
    assert err <= allowed, (err, allowed)


def test_linear_runs_gemmlab_on_a_strided_weight_view(monkeypatch, device):
    """forward hands gemm weight.t() (a view of the Parameter's storage), and the rows of x."""
    seen = []
    real = gemmlab.gemm

    def spy(a, b, **kw):
        seen.append((a.shape, b.data_ptr(), b.stride()))
        return real(a, b, **kw)

    monkeypatch.setattr(ops_gemm, "gemm", spy)
    mod = gnn.Linear(16, 24, device=device, dtype=torch.float16, dispatch="gemmlab")
    mod(torch.randn(2, 3, 16, device=device, dtype=torch.float16))
    assert seen == [((6, 16), mod.weight.data_ptr(), (1, 16))]


def test_linear_fp32_falls_back_to_f_linear(monkeypatch, device):
    monkeypatch.setattr(ops_gemm, "gemm", lambda *a, **k: pytest.fail("fp32 must not reach gemmlab.gemm"))
    mod = gnn.Linear(8, 4, device=device)
    x = torch.randn(3, 8, device=device)
    assert torch.equal(mod(x), torch.nn.functional.linear(x, mod.weight, mod.bias))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    ("k", "n", "lead"), [(0, 4, (3,)), (4, 0, (3,)), (0, 0, (2,)), (8, 4, (0,)), (8, 4, (2, 0)), (8, 4, ())]
)  # empty K, N, M; a 1-D x
def test_linear_degenerate_sizes_behave_as_nn_linear(dtype, bias, k, n, lead, device):
    """nn.Linear(0, 4) and friends: the same outputs (K = 0: the bias alone) and the same gradients."""
    torch.manual_seed(k + n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that initializing a zero-element weight is a no-op
        ref_mod = nn.Linear(k, n, bias=bias, device=device, dtype=dtype)
        mod = gnn.Linear(k, n, bias=bias, device=device, dtype=dtype, dispatch="gemmlab")
    mod.load_state_dict(ref_mod.state_dict())
    x = torch.randn(*lead, k, device=device, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y, y_ref = mod(x), ref_mod(x_ref)
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    torch.testing.assert_close(y, y_ref)
    y.sum().backward()
    y_ref.sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(mod.weight.grad, ref_mod.weight.grad)


def test_linear_dispatch_policies(monkeypatch, device):
    """ "torch" never reaches gemmlab.gemm; "gemmlab" always does; anything else is refused."""
    calls = []
    real = gemmlab.gemm
    monkeypatch.setattr(ops_gemm, "gemm", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(5, 16, device=device, dtype=torch.bfloat16)
    gnn.Linear(16, 8, device=device, dtype=torch.bfloat16, dispatch="torch")(x)
    assert calls == []
    gnn.Linear(16, 8, device=device, dtype=torch.bfloat16, dispatch="gemmlab")(x)
    assert calls == [1]
    with pytest.raises(ValueError, match="dispatch"):
        gnn.Linear(16, 8, dispatch="fastest")


def test_linear_sharing_copies_nothing(device):
    src = nn.Linear(8, 4, device=device, dtype=torch.bfloat16)
    new = gnn.Linear.sharing(src)
    assert new.weight is src.weight and new.bias is src.bias


# --------------------------------------------------------------------------------------------------- MoE


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_moe_matches_ref(dtype, scoring, device):
    torch.manual_seed(1)
    h, i, e, k, t = 32, 16, 4, 2, 6
    moe = gnn.MoE(h, i, e, k, scoring=scoring, device=device, dtype=dtype)
    x = torch.randn(2, t // 2, h, device=device, dtype=dtype)  # N-D tokens
    y = moe(x)
    assert y.shape == x.shape and y.dtype == dtype
    x2 = x.reshape(t, h)
    wts, ids = route(moe.gate(x2), k, scoring=scoring)
    w1, w2 = moe.experts.gate_up_proj.detach(), moe.experts.down_proj.detach()
    c = moe_check(y.reshape(t, h).detach(), x2, w1, w2, wts.detach(), ids)
    assert c["ok"], c


def test_moe_fp32_fallback_matches_ref(device):
    torch.manual_seed(2)
    moe = gnn.MoE(16, 8, 4, 2, device=device)
    x = torch.randn(5, 16, device=device)
    wts, ids = route(moe.gate(x), 2)
    ref = moe_ref(x, moe.experts.gate_up_proj.detach(), moe.experts.down_proj.detach(), wts.detach(), ids)
    torch.testing.assert_close(moe(x).detach(), ref, rtol=1e-5, atol=1e-5)


def test_moe_loads_a_transformers_block_state_dict():
    tf = pytest.importorskip("transformers")
    cfg = tf.MixtralConfig(hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)
    block = tf.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(cfg)
    for p in block.parameters():  # the block's own weights start uninitialized
        nn.init.normal_(p)
    moe = gnn.MoE(32, 16, 4, 2)
    moe.load_state_dict(block.state_dict())  # strict: same names and shapes
    assert torch.equal(moe.experts.gate_up_proj, block.experts.gate_up_proj)


def test_moe_refuses_bad_arguments():
    with pytest.raises(ValueError, match="scoring"):
        gnn.MoE(8, 4, 4, 2, scoring="relu")
    with pytest.raises(ValueError, match="top_k"):
        gnn.MoE(8, 4, 4, 5)


def _experts(e=4, h=32, i=16, dtype=torch.bfloat16, *, device):
    torch.manual_seed(3)
    return gnn.MoEExperts(e, h, i, device=device, dtype=dtype)


@pytest.mark.parametrize("bad", [4, -1, 1 << 20])  # E, negative, far out (a wild read on a GPU)
@pytest.mark.parametrize("grad", [False, True])  # the plain eager call and the autograd (training) one
def test_moe_experts_refuses_out_of_range_ids(bad, grad, device):
    experts = _experts(device=device)
    x = torch.randn(5, 32, device=device, dtype=torch.bfloat16, requires_grad=grad)
    ids = torch.tensor([[0, 1], [2, 3], [1, bad], [0, 2], [3, 1]], device=device)
    wts = torch.rand(5, 2, device=device)
    with torch.set_grad_enabled(grad), pytest.raises(ValueError, match=r"topk_ids must be in \[0, E=4\)"):
        experts(x, ids, wts)
    ids[2, 1] = 0
    assert torch.isfinite(experts(x, ids, wts)).all()


def test_moe_experts_fp32_fallback_refuses_out_of_range_ids(device):
    experts = _experts(dtype=torch.float32, device=device)
    x = torch.randn(3, 32, device=device)
    with pytest.raises(ValueError, match=r"topk_ids must be in \[0, E=4\)"):
        experts(x, torch.tensor([[0, 1], [-1, 2], [3, 0]], device=device), torch.rand(3, 2, device=device))


def test_moe_experts_id_check_runs_inside_the_op(monkeypatch, device):
    """MoEExperts leaves the check on (validate=True): moe_forward checks the ids on the device, inside the op, so
    it holds in eager, autograd and compiled graphs alike (on a GPU: tests/nn/test_nn_gpu.py, no host sync)."""
    seen = []
    real = gemmlab.moe_forward
    monkeypatch.setattr(ops_moe, "moe_forward", lambda *a, **k: seen.append(k.get("validate")) or real(*a, **k))
    experts = _experts(device=device)
    experts(
        torch.randn(2, 32, device=device, dtype=torch.bfloat16),
        torch.tensor([[0, 1], [2, 3]], device=device),
        torch.rand(2, 2, device=device),
    )
    assert seen == [True]


def test_moe_experts_id_check_holds_in_a_fullgraph_compile(device):
    experts = _experts(device=device)
    compiled = torch.compile(experts, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 32, device=device, dtype=torch.bfloat16)
    wts = torch.rand(3, 2, device=device)
    good = torch.tensor([[0, 1], [2, 3], [1, 0]], device=device)
    torch.testing.assert_close(compiled(x, good, wts), experts(x, good, wts))
    with pytest.raises(ValueError, match=r"topk_ids must be in \[0, E=4\)"):
        compiled(x, torch.tensor([[0, 1], [2, 4], [1, 0]], device=device), wts)


# ------------------------------------------------------------------------------------------------- patch


def _close_to(ours, theirs, ref, dtype=torch.bfloat16):
    err, allowed = _close(ours, theirs, ref, dtype)
    assert err <= allowed, (err, allowed)


def test_patch_refuses_an_fp32_model_and_leaves_it_untouched(device):
    model = tiny("mixtral", torch.float32, device=device)
    with pytest.raises(TypeError, match=r"weights are torch.float32 .*dtype=torch.bfloat16"):
        gemmlab.patch(model)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.float32


def test_patch_converts_an_fp32_model_on_request(device):
    model = tiny("mixtral", torch.float32, device=device)
    ref64 = float64(model)
    theirs = copy.deepcopy(model).to(torch.bfloat16)
    ids = torch.randint(3, 128, (2, 3), device=device)
    _, summary = gemmlab.patch(model, dtype=torch.bfloat16, return_summary=True)
    assert summary["converted"] == "float32 -> bfloat16" and summary["dtype"] == "bfloat16"
    assert summary["moe_experts"] == ["model.layers.0.mlp.experts"] and not summary["skipped"]
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.no_grad():
        _close_to(output(model, ids), output(theirs, ids), output(ref64, ids))
    with pytest.raises(ValueError, match="dtype"):
        gemmlab.patch(tiny("mixtral", torch.float32, device=device), dtype=torch.float32)


def test_patch_summary_is_json_data(device):
    model = tiny("qwen2-moe", device=device)
    _, summary = gemmlab.patch(model, return_summary=True)
    data = json.loads(json.dumps(summary))
    assert data["moe_experts"] == ["model.layers.0.mlp.experts"] and data["dispatch"] == "auto"
    assert data["matched"]["model.layers.0.mlp.experts"].startswith("qwen2-moe (Qwen2MoeExperts")
    assert "model.layers.0.mlp.shared_expert.up_proj" in data["linear"]
    assert [64, 64, "bfloat16", True] in data["linear_shapes"]  # q_proj (N, K, dtype, bias): qkv_bias


def test_patch_experts_mode_keeps_every_router(device):
    model = tiny("mixtral", device=device)
    _, summary = gemmlab.patch(model, moe="experts", return_summary=True)
    assert summary["moe_experts"] == ["model.layers.0.mlp.experts"]
    assert type(model.model.layers[0].mlp.gate).__name__ == "MixtralTopKRouter"


def test_patch_keeps_routers_when_the_model_returns_router_logits(device):
    """output_router_logits (the load-balancing loss) is recorded from the model's own router modules."""
    model = tiny("mixtral", device=device)
    model.config.output_router_logits = True
    _, summary = gemmlab.patch(model, return_summary=True)
    assert summary["moe_experts"] == ["model.layers.0.mlp.experts"]
    ids = torch.randint(3, 128, (1, 4), device=device)
    with torch.no_grad():
        out = model(ids, labels=ids)
    assert torch.isfinite(out.aux_loss) and out.aux_loss > 0


def test_patch_is_idempotent(device):
    model = tiny("deepseek-v3", device=device)
    gemmlab.patch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, again = gemmlab.patch(model, return_summary=True)
    assert again["linear"] == [] and again["moe_experts"] == [] and again["skipped"] == []


class _Block(nn.Module):
    """A MoE block of a family patch has never seen: a bias-free router Linear and the given experts."""

    def __init__(self, experts: nn.Module, k: int = 2):
        super().__init__()
        self.router = nn.Linear(experts.gate_up_proj.shape[2], experts.gate_up_proj.shape[0], bias=False)
        self.experts, self.k = experts, k

    def forward(self, x):
        w, ids = torch.topk(torch.softmax(self.router(x).float(), -1), self.k, dim=-1)
        return self.experts(x, ids, w)


def _mixtral_experts(**config):
    """transformers' own experts interface (use_experts_implementation) with tiny sizes and random weights."""
    cfg = tf.MixtralConfig(hidden_size=32, intermediate_size=16, num_local_experts=4, **config)
    experts = tf.models.mixtral.modeling_mixtral.MixtralExperts(cfg)
    with torch.no_grad():
        for p in experts.parameters():
            nn.init.normal_(p, std=0.2)
    return experts


def test_patch_matches_an_unknown_family_by_structure(device):
    class NovelExperts(type(_mixtral_experts())):  # a new family's name, transformers' layout
        pass

    experts = _mixtral_experts()
    experts.__class__ = NovelExperts
    model = nn.Sequential(_Block(experts)).to(device, torch.bfloat16)
    theirs, ref64 = copy.deepcopy(model), float64(model)
    ref64[0].experts.config._experts_implementation = "eager"
    x = torch.randn(6, 32, device=device, dtype=torch.bfloat16)
    _, summary = gemmlab.patch(model, return_summary=True)
    assert summary["moe_experts"] == ["0.experts"] and summary["matched"]["0.experts"] == "NovelExperts (by structure)"
    assert isinstance(model[0].experts, gnn.MoEExperts)
    # the router Linear (E outputs, beside the experts) stays the model's own: the same expert ids
    assert summary["routers"] == ["0.router"] and not summary["linear"] and type(model[0].router) is nn.Linear
    with torch.no_grad():
        _close_to(model(x), theirs(x), ref64(x.double()))


def _misfits():
    """(how an experts module differs from what moe_forward computes, the module, what the reason must say)."""
    rows = []
    for attr, value, says in [
        ("is_transposed", True, "transposed"),
        ("is_concatenated", False, "interleaved"),
        ("has_bias", True, "biased"),
        ("has_gate", False, "ungated"),
        ("has_post_expert_norm", True, "a norm after each expert"),
        ("_is_expert_parallel", True, "expert-parallel"),
    ]:
        e = _mixtral_experts()
        setattr(e, attr, value)
        rows.append((attr, e, says))
    e = _mixtral_experts(hidden_act="gelu")
    rows.append(("activation", e, "activation GELU"))
    e = _mixtral_experts()
    e.__class__ = type("ClampedExperts", (type(e),), {"_apply_gate": lambda self, gu: gu.chunk(2, -1)[0].clamp(max=7)})
    rows.append(("own gate", e, "ClampedExperts._apply_gate"))
    e = _mixtral_experts()
    e.scale = nn.Parameter(torch.ones(4))
    rows.append(("extra parameter", e, "parameters ['down_proj', 'gate_up_proj', 'scale']"))
    e = _mixtral_experts()
    e.down_proj = nn.Parameter(torch.randn(4, 32, 8))
    rows.append(("shapes", e, "are not (E, 2I, H), (E, H, I)"))
    e = _mixtral_experts().float()
    rows.append(("fp32", e, "expert weights in torch.float32"))

    class OwnExperts(nn.Module):  # 3-D weights, but a forward of its own
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Parameter(torch.randn(4, 16, 32))
            self.down_proj = nn.Parameter(torch.randn(4, 32, 8))

    rows.append(("not the interface", OwnExperts(), "not transformers' experts interface"))
    rows.append(("per expert", nn.ModuleList([nn.Linear(8, 8) for _ in range(2)]), "one module per expert"))
    return rows


@pytest.mark.parametrize(("what", "experts", "says"), _misfits(), ids=[r[0] for r in _misfits()])
def test_patch_names_every_misfit_and_warns(what, experts, says, device):
    """Each way an experts module can differ from moe_forward's SwiGLU: left as it was, named, the reason given."""
    assert experts_fit(_mixtral_experts().to(torch.bfloat16)) is None  # the unchanged module fits
    if what != "fp32":
        experts = experts.to(torch.bfloat16)
    assert says in (experts_fit(experts) or "")
    holder = nn.Module()
    holder.experts = experts
    holder.proj = nn.Linear(128, 128)  # outweighs the experts: the model counts as bf16 in the fp32 row
    model = nn.Sequential(holder).to(device, None if what == "fp32" else torch.bfloat16)
    if what == "fp32":
        holder.proj.to(torch.bfloat16)  # a bf16 model whose experts stayed in fp32
        model[0].experts.float()
    with pytest.warns(UserWarning, match=f"gemmlab.patch: left 1 {type(experts).__name__} as it was") as caught:
        _, summary = gemmlab.patch(model, return_summary=True)
    assert model[0].experts is experts and not summary["moe_experts"]
    assert len(summary["skipped"]) == 1 and summary["skipped"][0].startswith(f"0.experts ({type(experts).__name__}): ")
    assert says in summary["skipped"][0] and says in str(caught[0].message)


def test_patch_says_the_moe_swap_needs_transformers_5(monkeypatch, device):
    """Under transformers 4 (per-expert module lists, as its Mixtral and Qwen-MoE keep them) a skipped experts
    module's reason starts with what to do: the MoE swap needs transformers >= 5; under 5 it does not say so."""
    import sys
    import types

    def model():
        holder = nn.Module()
        holder.experts = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
        return nn.Sequential(holder).to(device, torch.bfloat16)

    _, summary = gemmlab.patch(model(), return_summary=True, warn=False)  # transformers 5 here
    assert "transformers >= 5" not in summary["skipped"][0] and "one module per expert" in summary["skipped"][0]
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(__version__="4.57.1"))
    with pytest.warns(UserWarning, match=r"MoE swap needs transformers >= 5 \(this is 4\.57\.1\)"):
        _, summary = gemmlab.patch(model(), return_summary=True)
    assert summary["skipped"][0].startswith("0.experts (ModuleList): gemmlab's MoE swap needs transformers >= 5")
    assert "one module per expert" in summary["skipped"][0] and not summary["moe_experts"]


def test_patch_warns_once_per_skipped_class(device):
    class Gate(nn.Linear):  # a Linear subclass with a forward of its own (e.g. Llama-4's router)
        pass

    model = nn.Sequential(nn.Linear(8, 8), Gate(8, 4), Gate(8, 4), nn.Linear(8, 8), nn.Linear(8, 8)).to(device)
    model[0].to(torch.bfloat16)
    model[1].to(torch.bfloat16)
    model[2].to(torch.bfloat16)
    model[3].to(torch.bfloat16)  # model[4] stays fp32 in a bf16 model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, summary = gemmlab.patch(model, return_summary=True)
    lines = sorted(str(w.message) for w in caught if "gemmlab.patch" in str(w.message))
    assert len(lines) == 2, lines
    assert lines[0].startswith("gemmlab.patch: left 1 Linear as it was (weights in torch.float32") and "4" in lines[0]
    assert lines[1].startswith("gemmlab.patch: left 2 Gate as it was (an nn.Linear subclass") and lines[1].endswith(
        ": 1 and 1 more"
    )
    assert summary["linear"] == ["0", "3"] and len(summary["skipped"]) == 3


def test_patch_says_when_it_replaces_nothing():
    with pytest.warns(UserWarning, match="nothing replaced"):
        gemmlab.patch(nn.Sequential(nn.LayerNorm(8)).to(torch.bfloat16))


def test_patch_refuses_bad_arguments():
    with pytest.raises(ValueError, match="moe"):
        gemmlab.patch(nn.Sequential(), moe="all")
    with pytest.raises(ValueError, match="dispatch"):
        gemmlab.patch(nn.Sequential(), dispatch="fastest")
    with pytest.raises(ValueError, match="model itself"):
        gemmlab.patch(nn.Linear(4, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="no floating-point parameters"):
        gemmlab.patch(nn.Sequential(nn.ReLU()))


def test_moe_names_itself_when_the_input_dtype_is_not_its_weights(device):
    """An fp16 input to a bf16 MoE is one TypeError naming MoE (not the router Linear inside it)."""
    from gemmlab.nn import MoE

    moe = MoE(32, 16, 4, 2, dtype=torch.bfloat16, device=device)
    with pytest.raises(TypeError, match=r"^MoE: input has dtype torch.float16, the weight torch.bfloat16"):
        moe(torch.randn(3, 32, dtype=torch.float16, device=device))
