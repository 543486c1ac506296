"""patch() on every MoE family transformers ships: a tiny random model of each (built from the family's config class,
nothing downloaded, bf16) against the unpatched model, forward (logits), backward (every parameter's gradient) and
a torch.compile(fullgraph=True) forward; and the structural match (``experts_fit``) against a float64 oracle for
every experts class in the installed transformers. Tolerances as in test_nn.py: the error against a float64 copy
may be at most twice what the unpatched bf16 model makes, plus one ulp of the largest reference value."""

import copy
import importlib
import inspect
import warnings

import pytest
import torch
from torch import nn

import gemmlab
import gemmlab.nn as gnn
from gemmlab.nn import families
from gemmlab.nn.patch import experts_fit
from gemmlab.ref import moe_ref
from tests.nn.hf_tiny import FAMILIES, build_experts, experts_modules, float64, output, tf, tiny, within

# compiled whole (one family per way patch swaps, and the skipped families whose own code traces; tracing a whole
# model takes 5-20 s on the CPU): the others compile each patched MoE block (the block's own router and shared
# experts, gemmlab's experts and Linears), or, where patch swapped only Linears (DBRX, whose own experts loop
# breaks the graph), each patched Linear
WHOLE_MODEL = {"mixtral", "qwen2-moe", "deepseek-v3", "gpt-oss", "llama4"}


def _patch(model: nn.Module, name: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, summary = gemmlab.patch(model, return_summary=True)
    expect = FAMILIES[name][3]
    for path in summary["moe_experts"]:  # recognized by its row in gemmlab.nn.families
        assert summary["matched"][path].startswith(f"{name} ("), summary["matched"]
    if expect in ("experts", "swiglu_oai"):
        cls = gnn.MoEExperts if expect == "experts" else gnn.MoEExpertsOAI
        assert summary["moe_experts"], summary
        assert all(isinstance(model.get_submodule(p), cls) for p in summary["moe_experts"])
    else:  # left as it was, named, with the reason, and warned about
        assert not summary["moe_experts"], summary
        note = next(f.note for f in families.FAMILIES if f.name == name)
        assert any(s.split(" ")[0].endswith("experts") and s.endswith(note) for s in summary["skipped"]), summary
        assert any("left" in str(w.message) and "Experts" in str(w.message) for w in caught)
    assert summary["linear"], summary
    return summary


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_forward_matches_the_unpatched_model(name, device):
    model = tiny(name, device=device).eval()
    ref64 = float64(model)
    params, keys = dict(model.named_parameters()), set(model.state_dict())
    ids = torch.randint(3, 128, (2, 3), device=device)
    with torch.no_grad():
        theirs, ref = output(model, ids), output(ref64, ids)
    _patch(model, name)
    after = dict(model.named_parameters())
    assert set(after) == set(params) and all(after[n] is params[n] for n in params)  # the same Parameters
    assert set(model.state_dict()) == keys  # checkpoints load into the patched model unchanged
    with torch.no_grad():
        ours = output(model, ids)
    within(ours, theirs, ref, "output")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_gradients_match_the_unpatched_model(name, device):
    """One backward of a fixed random projection of the output: every parameter's gradient."""
    model = tiny(name, device=device).train()
    ref64, theirs = float64(model), copy.deepcopy(model)
    _patch(model, name)
    ids = torch.randint(3, 128, (2, 3), device=device)
    proj = None
    grads = {}
    for key, m in (("ours", model), ("theirs", theirs), ("ref", ref64)):
        out = output(m, ids)
        if proj is None:
            proj = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
        (out.double() * proj.double()).sum().backward()
        grads[key] = {n: p.grad for n, p in m.named_parameters() if p.requires_grad}
    assert set(grads["ours"]) == set(grads["ref"])
    for n, g in grads["ours"].items():
        if grads["ref"][n] is None:  # a parameter the forward does not reach (in the unpatched model too)
            assert g is None and grads["theirs"][n] is None, n
            continue
        assert g is not None, f"no gradient reached {n}"
        # 4 ulps: a gradient is the end of a long chain of bf16 roundings (through attention, Mamba scans and
        # routers), and both models' errors are one sample each; a wrong gradient is off by its own size
        within(g, grads["theirs"][n], grads["ref"][n], n, ulps=4)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_compiles_fullgraph(name, device):
    """The patched model (``WHOLE_MODEL``) or each patched MoE block traces with fullgraph=True and matches eager."""
    torch._dynamo.reset()  # the families share transformers' forward wrappers: fresh recompile counts per family
    model = tiny(name, device=device).eval()
    summary = _patch(model, name)
    ids = torch.randint(3, 128, (1, 4), device=device)
    with torch.no_grad():
        if name in WHOLE_MODEL:
            eager = output(model, ids)
            compiled = output(torch.compile(model, fullgraph=True, backend="aot_eager"), ids)
            torch.testing.assert_close(compiled, eager)
            return
        moe_paths = summary["moe_experts"]
        blocks = [model.get_submodule(p.removesuffix(".experts")) for p in moe_paths]
        assert blocks or FAMILIES[name][3] == "skip"
        for block in blocks or [model.get_submodule(p) for p in summary["linear"]]:
            h = block.experts.hidden_dim if hasattr(block, "experts") else block.in_features
            x = torch.randn(1, 4, h, device=device, dtype=torch.bfloat16)
            eager = block(x)
            compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(x)
            for a, b in zip(*(o if isinstance(o, tuple) else (o,) for o in (compiled, eager)), strict=True):
                torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------- every experts class, structurally


@pytest.mark.parametrize("module", experts_modules())
def test_structure_match_is_exact_for_every_experts_class(module):
    """For every experts class of ``module``: when experts_fit accepts it, its own float64 forward equals
    gemmlab's reference (SiLU(gate) * up, (E, 2I, H), (E, H, I)) on random inputs; when it refuses, it says why."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        config_mod = importlib.import_module(f"transformers.models.{module}.configuration_{module}")
    classes = [
        c
        for n, c in vars(modeling).items()
        if inspect.isclass(c) and c.__module__ == modeling.__name__ and n.endswith("Experts")
    ]
    for experts_cls in classes:
        torch.manual_seed(0)
        experts = build_experts(experts_cls, config_mod)
        if experts is None:
            continue  # needs arguments a config does not give (e.g. JetMoe's per-linear experts)
        with torch.no_grad():
            for p in experts.parameters():
                nn.init.normal_(p, std=0.3)
        why = experts_fit(experts.to(torch.bfloat16))
        if why is not None:
            assert isinstance(why, str) and len(why) > 10, (experts_cls.__name__, why)
            continue
        assert _exact(experts), f"{experts_cls.__name__} fits by structure but computes something else"


def _exact(experts: nn.Module) -> bool:
    """The experts module's own float64 forward equals gemmlab's reference on random routed tokens."""
    e64 = copy.deepcopy(experts).double()
    e64.config._experts_implementation = "eager"
    w1, w2 = e64.gate_up_proj, e64.down_proj
    x = torch.randn(5, w1.shape[2], dtype=torch.float64)
    ids = torch.stack([torch.randperm(w1.shape[0])[:2] for _ in range(5)])
    wts = torch.rand(5, 2, dtype=torch.float64)
    with torch.no_grad():
        theirs = e64(x, ids, wts)
    return torch.allclose(theirs.float(), moe_ref(x, w1, w2, wts, ids), rtol=1e-4, atol=1e-4)


def test_the_exactness_oracle_fires_on_other_experts():
    """_exact tells a SiLU experts module from one computing GELU(gate) * up with the same weights."""
    experts = tf.models.mixtral.modeling_mixtral.MixtralExperts(
        tf.MixtralConfig(hidden_size=16, intermediate_size=8, num_local_experts=4)
    )
    with torch.no_grad():
        for p in experts.parameters():
            nn.init.normal_(p, std=0.3)
    assert experts_fit(experts.to(torch.bfloat16)) is None and _exact(experts)
    experts.act_fn = nn.GELU()
    assert not _exact(experts)
