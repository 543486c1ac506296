"""patch() on gpt-oss (issue 33): GptOssExperts -> gemmlab.nn.MoEExpertsOAI (moe_forward's activation="swiglu_oai"
on the model's own interleaved, transposed, biased Parameters). A tiny random GptOss model (2 layers, 4 experts,
biases large enough that the SwiGLU clamps bite): no warning, the same routing, logits and a training step's
gradients within bf16 noise of the unpatched model (``within``: at most twice the unpatched bf16 model's error
against a float64 copy, plus ulps of the largest value). Legend: T tokens, H hidden, I intermediate, E experts."""

import copy
import warnings

import pytest
import torch
from torch import nn

import gemmlab
import gemmlab.nn as gnn
from gemmlab.nn.gpt_oss import oai_fit
from tests.nn.hf_tiny import COMMON, FAMILIES, expert_ids, float64, output, routed_differently, tf, within


def _model(device, dtype=torch.bfloat16) -> nn.Module:
    config_cls, model_cls, kw, _ = FAMILIES["gpt-oss"]
    cfg = getattr(tf, config_cls)(**{**COMMON, **kw, "num_hidden_layers": 2, "layer_types": ["full_attention"] * 2})
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(tf, model_cls)(cfg)
    with torch.no_grad():
        for path, p in model.named_parameters():
            if path.endswith("router.weight"):
                p.mul_(30)  # wide routing margins (as hf_tiny): one rounding must not flip a choice
            elif path.endswith("experts.gate_up_proj_bias"):
                p.normal_(0, 4.0)  # pre-activations past +-limit: the clamps bite
            elif path.endswith("experts.down_proj_bias"):
                p.normal_(0, 0.5)
            elif path.endswith("experts.gate_up_proj"):
                p.normal_(0, 0.3)
    return model.to(device=device, dtype=dtype)


def _patch(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, summary = gemmlab.patch(model, return_summary=True)
    return summary, [str(w.message) for w in caught]


def test_patch_swaps_gpt_oss_experts_without_warning(device):
    model = _model(device).eval()
    ref64 = float64(model)
    ids = torch.randint(3, 128, (2, 5), device=device)
    with torch.no_grad():
        theirs, ref = output(model, ids), output(ref64, ids)
    routes_before = expert_ids(model, lambda m: output(m, ids))
    params = dict(model.named_parameters())
    summary, caught = _patch(model)
    assert not [w for w in caught if "GptOss" in w or "experts" in w.lower()], caught
    assert summary["moe_experts"] == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"], summary
    assert all(summary["matched"][p] == "gpt-oss (GptOssExperts)" for p in summary["moe_experts"])
    assert all(isinstance(model.get_submodule(p), gnn.MoEExpertsOAI) for p in summary["moe_experts"])
    assert all(params[n] is p for n, p in model.named_parameters())  # the model's own Parameters, shared
    assert not any(s.startswith("model.layers.0.mlp.experts") for s in summary["skipped"])
    with torch.no_grad():
        ours = output(model, ids)
    within(ours, theirs, ref, "logits")
    routes_after = expert_ids(model, lambda m: output(m, ids))
    assert routed_differently(routes_after, routes_before) == 0
    again, _ = _patch(model)  # patching again swaps nothing more
    assert again["moe_experts"] == [], again


def test_training_step_matches_the_unpatched_model(device):
    """Every parameter's gradient of one backward, then one SGD step on both models: the next logits agree too
    (the patched experts read the same, updated Parameters)."""
    model = _model(device).train()
    theirs, ref64 = copy.deepcopy(model), float64(model)
    _patch(model)
    ids = torch.randint(3, 128, (2, 4), device=device)
    proj = None
    grads = {}
    for key, m in (("ours", model), ("theirs", theirs), ("ref", ref64)):
        out = output(m, ids)
        if proj is None:
            proj = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
        (out.double() * proj.double()).sum().backward()
        grads[key] = {n: p.grad for n, p in m.named_parameters() if p.requires_grad}
    expert_grads = [n for n in grads["ours"] if ".experts." in n]
    assert len(expert_grads) == 8, expert_grads  # 4 expert Parameters per layer, 2 layers
    for n, g in grads["ours"].items():
        if grads["ref"][n] is None:
            assert g is None and grads["theirs"][n] is None, n
            continue
        assert g is not None, f"no gradient reached {n}"
        within(g, grads["theirs"][n], grads["ref"][n], n, ulps=4)
    for m in (model, theirs, ref64):
        torch.optim.SGD(m.parameters(), lr=0.05).step()
    with torch.no_grad():
        within(output(model, ids), output(theirs, ids), output(ref64, ids), "logits after a step")


def test_fp32_fallback_and_direct_module_match_hf(device):
    """MoEExpertsOAI.sharing(GptOssExperts): fp32 runs the torch loop (== HF's eager, to fp32 rounding); bf16 runs
    moe_forward, within twice HF's bf16 error against float64."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    hf = _model(device, torch.float32).model.layers[0].mlp.experts
    assert isinstance(hf, GptOssExperts)
    hf.config._experts_implementation = "eager"
    x = torch.randn(7, 64, device=device)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(7)]).to(device)
    w = torch.softmax(torch.randn(7, 2), -1).to(device)
    ours = gnn.MoEExpertsOAI.sharing(hf)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, ids, w), hf(x, ids, w), rtol=1e-5, atol=1e-5)
        ref = copy.deepcopy(hf).double()(x.double(), ids, w.double())
        hf16 = copy.deepcopy(hf).to(torch.bfloat16)
        ours16 = gnn.MoEExpertsOAI.sharing(hf16)
        xb, wb = x.bfloat16(), w.bfloat16()
        within(ours16(xb, ids, wb), hf16(xb, ids, wb), ref, "experts")
        y3 = ours16(xb.view(7, 1, 64), ids.view(7, 1, 2), wb.view(7, 1, 2))
        within(y3.view(7, 64), hf16(xb, ids, wb), ref, "3-D")


def test_oai_fit_refuses_what_it_cannot_run(device):
    hf = _model(device, torch.float32).model.layers[0].mlp.experts
    assert "gemmlab runs fp16/bf16" in oai_fit(hf)
    hf16 = copy.deepcopy(hf).to(torch.bfloat16)
    assert oai_fit(hf16) is None
    hf16.extra = nn.Parameter(torch.zeros(2))
    assert oai_fit(hf16).startswith("parameters [")
    del hf16.extra
    hf16.limit = None
    assert "limit" in oai_fit(hf16)
    model = _model(device)  # one layer's experts in fp32: left, with the reason, and a warning
    model.model.layers[1].mlp.experts.float()
    summary, caught = _patch(model)
    assert summary["moe_experts"] == ["model.layers.0.mlp.experts"]
    assert any("GptOssExperts" in s and "fp16/bf16" in s for s in summary["skipped"]), summary["skipped"]
    assert any("GptOssExperts" in w for w in caught), caught


def test_module_argument_errors(device):
    with pytest.raises(ValueError, match="MoEExpertsOAI"):
        gnn.MoEExpertsOAI(0, 16, 8)
    m = gnn.MoEExpertsOAI(4, 16, 8, device=device, dtype=torch.bfloat16)
    ids = torch.zeros(3, 2, dtype=torch.int64, device=device)
    w = torch.ones(3, 2, device=device)
    with pytest.raises((ValueError, TypeError), match="MoEExpertsOAI"):
        m(torch.zeros(3, 15, device=device, dtype=torch.bfloat16), ids, w)
    assert m(torch.zeros(3, 16, device=device, dtype=torch.bfloat16), ids, w).shape == (3, 16)
    assert "alpha=1.702, limit=7.0" in repr(m)
