"""gemmlab.nn: Linear against nn.Linear, MoE against the reference, patch() on tiny Hugging Face models built
from configs with random weights (nothing downloaded). Tolerances as the style guide derives them: the
error against a float64 copy may be at most twice what the unpatched fp16/bf16 model makes, plus one ulp."""

import copy

import pytest
import torch
from torch import nn

import gemmlab
import gemmlab.nn as gnn
from conftest import DEVICE
from gemmlab.ops.moe import route
from gemmlab.ref import mantissa_bits, moe_check, moe_ref

DTYPES = [torch.float16, torch.bfloat16]


def _close(ours: torch.Tensor, theirs: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
           ulps: int = 1) -> tuple[float, float]:
    """(our error, allowed): allowed = 2 * torch's own error against the float64 ref + ``ulps`` ulps of max |ref|."""
    ref = ref.double()
    err = (ours.double() - ref).abs().max().item()
    floor = ulps * 2.0 ** -mantissa_bits(dtype) * ref.abs().max().item()
    allowed = 2 * (theirs.double() - ref).abs().max().item() + floor
    assert torch.isfinite(ours).all()
    return err, allowed


# ------------------------------------------------------------------------------------------------ Linear


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(5,), (2, 3)])  # 2-D and N-D activations
def test_linear_matches_nn_linear(dtype, bias, lead):
    torch.manual_seed(len(lead) + 2 * bias)
    ref_mod = nn.Linear(48, 40, bias=bias, device=DEVICE, dtype=dtype)
    mod = gnn.Linear(48, 40, bias=bias, device=DEVICE, dtype=dtype)
    mod.load_state_dict(ref_mod.state_dict())  # an nn.Linear state_dict loads unchanged
    assert isinstance(mod, nn.Linear) and list(dict(mod.named_parameters())) == list(dict(ref_mod.named_parameters()))
    x = torch.randn(*lead, 48, device=DEVICE, dtype=dtype)
    y = mod(x)
    assert y.shape == (*lead, 40) and y.dtype == dtype
    b64 = ref_mod.bias.double() if bias else 0
    err, allowed = _close(y, ref_mod(x), x.double() @ ref_mod.weight.double().t() + b64, dtype)
    assert err <= allowed, (err, allowed)


def test_linear_runs_gemmlab_on_a_strided_weight_view(monkeypatch):
    """forward hands gemm weight.t() (a view of the Parameter's storage), and the rows of x."""
    import gemmlab.ops.gemm as og

    seen = []
    real = og.gemm

    def spy(a, b, **kw):
        seen.append((a.shape, b.data_ptr(), b.stride()))
        return real(a, b, **kw)

    monkeypatch.setattr(og, "gemm", spy)
    mod = gnn.Linear(16, 24, device=DEVICE, dtype=torch.float16)
    mod(torch.randn(2, 3, 16, device=DEVICE, dtype=torch.float16))
    assert seen == [((6, 16), mod.weight.data_ptr(), (1, 16))]


def test_linear_fp32_falls_back_to_f_linear(monkeypatch):
    import gemmlab.ops.gemm as og

    monkeypatch.setattr(og, "gemm", lambda *a, **k: pytest.fail("fp32 must not reach gemmlab.gemm"))
    mod = gnn.Linear(8, 4, device=DEVICE)
    x = torch.randn(3, 8, device=DEVICE)
    assert torch.equal(mod(x), torch.nn.functional.linear(x, mod.weight, mod.bias))


def test_linear_sharing_copies_nothing():
    src = nn.Linear(8, 4, device=DEVICE, dtype=torch.bfloat16)
    new = gnn.Linear.sharing(src)
    assert new.weight is src.weight and new.bias is src.bias


# --------------------------------------------------------------------------------------------------- MoE


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_moe_matches_ref(dtype, scoring):
    torch.manual_seed(1)
    h, i, e, k, t = 32, 16, 4, 2, 6
    moe = gnn.MoE(h, i, e, k, scoring=scoring, device=DEVICE, dtype=dtype)
    x = torch.randn(2, t // 2, h, device=DEVICE, dtype=dtype)  # N-D tokens
    y = moe(x)
    assert y.shape == x.shape and y.dtype == dtype
    x2 = x.reshape(t, h)
    wts, ids = route(moe.gate(x2), k, scoring=scoring)
    w1, w2 = moe.experts.gate_up_proj.detach(), moe.experts.down_proj.detach()
    c = moe_check(y.reshape(t, h).detach(), x2, w1, w2, wts.detach(), ids)
    assert c["ok"], c


def test_moe_fp32_fallback_matches_ref():
    torch.manual_seed(2)
    moe = gnn.MoE(16, 8, 4, 2, device=DEVICE)
    x = torch.randn(5, 16, device=DEVICE)
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


# ------------------------------------------------------------------------------------------------- patch

COMMON = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)


def tiny_model(name: str, dtype: torch.dtype) -> nn.Module:
    """A one-layer model of ``name``'s architecture with random weights; router weights scaled up so that
    routing margins are wide (near-uniform router scores would let one rounding flip an expert choice)."""
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "mixtral":
        m = tf.MixtralForCausalLM(tf.MixtralConfig(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                                   **COMMON))
    elif name == "qwen3-moe":
        m = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(intermediate_size=64, moe_intermediate_size=32, num_experts=4,
                                                     num_experts_per_tok=2, head_dim=16, **COMMON))
    elif name == "olmoe":
        m = tf.OlmoeForCausalLM(tf.OlmoeConfig(intermediate_size=32, num_experts=4, num_experts_per_tok=2, **COMMON))
    else:
        m = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
            intermediate_size=64, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
            topk_group=1, n_shared_experts=1, first_k_dense_replace=0, q_lora_rank=32, kv_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, **COMMON))
    with torch.no_grad():
        for mod in m.modules():
            if type(mod).__name__.endswith(("TopKRouter", "TopkRouter")):
                mod.weight.mul_(30)
    return m.to(device=DEVICE, dtype=dtype)


def _float64(model: nn.Module) -> nn.Module:
    m64 = copy.deepcopy(model).double()
    if hasattr(m64, "set_experts_implementation"):  # torch._grouped_mm has no float64
        m64.set_experts_implementation("eager")
    else:
        m64.config._experts_implementation = "eager"
    return m64


MODELS = ["mixtral", "qwen3-moe", "olmoe", "deepseek-v3"]


@pytest.mark.parametrize("name", MODELS)
def test_patch_matches_the_unpatched_model(name):
    dtype = torch.bfloat16
    model = tiny_model(name, dtype).eval()
    ref64 = _float64(model)
    before = {n: p for n, p in model.named_parameters()}
    keys = set(model.state_dict())
    ids = torch.randint(3, 128, (2, 3), device=DEVICE)
    with torch.no_grad():
        theirs, ref = model(ids).logits, ref64(ids).logits
    patched, summary = gemmlab.patch(model, return_summary=True)
    assert patched is model and not summary["skipped"], summary
    if name == "deepseek-v3":  # its own router stays; experts swapped, shared experts' Linears patched
        assert summary["moe_experts"] == ["model.layers.0.mlp.experts"]
        assert type(model.model.layers[0].mlp.gate).__name__ == "DeepseekV3TopkRouter"
        assert isinstance(model.model.layers[0].mlp.shared_experts.up_proj, gnn.Linear)
    else:
        assert summary["moe_block"] == ["model.layers.0.mlp"] and isinstance(model.model.layers[0].mlp, gnn.MoE)
    assert isinstance(model.lm_head, gnn.Linear) and isinstance(model.model.layers[0].self_attn.o_proj, gnn.Linear)
    after = {n: p for n, p in model.named_parameters()}
    assert set(after) == set(before) and all(after[n] is before[n] for n in before)  # the same Parameters
    assert set(model.state_dict()) == keys  # checkpoints load into the patched model unchanged
    with torch.no_grad():
        ours = model(ids).logits
    err, allowed = _close(ours, theirs, ref, dtype)
    assert err <= allowed, (err, allowed)


def test_patched_model_compiles_fullgraph():
    """The patched modules trace without graph breaks (gemmlab's custom ops), and match eager."""
    model = tiny_model("mixtral", torch.bfloat16).eval()
    gemmlab.patch(model)
    ids = torch.randint(3, 128, (1, 4), device=DEVICE)
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(ids).logits
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mixtral", "deepseek-v3"])  # a whole-block swap and an experts-only swap
def test_patch_training_step_gradients_match(name):
    """One training step (cross-entropy on the logits) through gemmlab's backward kernels."""
    dtype = torch.bfloat16
    model = tiny_model(name, dtype).train()
    ref64 = _float64(model)
    theirs = copy.deepcopy(model)
    gemmlab.patch(model)
    ids = torch.randint(3, 128, (2, 3), device=DEVICE)
    grads = {}
    for key, m in (("ours", model), ("theirs", theirs), ("ref", ref64)):
        loss = m(ids, labels=ids).loss
        loss.backward()
        grads[key] = {n: p.grad for n, p in m.named_parameters() if p.requires_grad}
    assert set(grads["ours"]) == set(grads["ref"])
    for n, g in grads["ours"].items():
        assert g is not None, f"no gradient reached {n}"
        # 4 ulps, as tests/test_moe_backward.py: the MoE backward rounds its intermediates (gate/up, dgu, the
        # expert rows of dx) where torch's composite rounds others, and a whole model sums many such products
        err, allowed = _close(g, grads["theirs"][n], grads["ref"][n], dtype, ulps=4)
        assert err <= allowed, (n, err, allowed)


def test_patch_leaves_fp32_and_reports_why():
    model = tiny_model("mixtral", torch.float32)
    _, summary = gemmlab.patch(model, return_summary=True)
    assert summary["linear"] == [] and summary["moe_block"] == []
    assert summary["skipped"] == ["model.layers.0.mlp: expert weights in torch.float32: gemmlab runs fp16/bf16"]
    assert type(model.lm_head) is nn.Linear


def test_patch_experts_mode_keeps_every_router():
    model = tiny_model("mixtral", torch.bfloat16)
    _, summary = gemmlab.patch(model, moe="experts", return_summary=True)
    assert summary["moe_experts"] == ["model.layers.0.mlp.experts"] and not summary["moe_block"]
    assert type(model.model.layers[0].mlp.gate).__name__ == "MixtralTopKRouter"


def test_patch_keeps_routers_when_the_model_returns_router_logits():
    """output_router_logits (the load-balancing loss) is recorded from the model's own router modules."""
    model = tiny_model("mixtral", torch.bfloat16)
    model.config.output_router_logits = True
    _, summary = gemmlab.patch(model, return_summary=True)
    assert summary["moe_experts"] == ["model.layers.0.mlp.experts"] and not summary["moe_block"]
    ids = torch.randint(3, 128, (1, 4), device=DEVICE)
    with torch.no_grad():
        out = model(ids, labels=ids)
    assert torch.isfinite(out.aux_loss) and out.aux_loss > 0


def test_patch_skips_per_expert_modules():
    """An experts module in the transformers 4 layout (one module per expert) is named and left alone."""

    class MixtralSparseMoeBlock(nn.Module):  # the class name patch() matches
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(8, 2, bias=False)
            self.experts = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])

    model = nn.Sequential(MixtralSparseMoeBlock())
    _, summary = gemmlab.patch(model.to(torch.bfloat16), return_summary=True)
    assert len(summary["skipped"]) == 1 and "one module per expert" in summary["skipped"][0]
    assert isinstance(model[0].experts, nn.ModuleList)


def test_patch_refuses_bad_arguments():
    with pytest.raises(ValueError, match="moe"):
        gemmlab.patch(nn.Sequential(), moe="all")
    with pytest.raises(ValueError, match="model itself"):
        gemmlab.patch(nn.Linear(4, 4, dtype=torch.float16))
