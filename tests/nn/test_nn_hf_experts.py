"""experts_implementation="gemmlab" (``gemmlab.nn.hf_experts``): every experts class of the installed transformers
that uses its experts interface, and every tiny model family of hf_tiny, against transformers' "grouped_mm" (the
default) and a float64 eager copy: outputs and gradients, with test_nn_families' tolerance (the error against
float64 at most twice grouped_mm's, plus ulps of the largest reference value). Also: registration (import order,
from_pretrained), weights changed in place, and transformers older than 5."""

import copy
import importlib
import inspect
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import gemmlab
import gemmlab.nn as gnn
from gemmlab.nn import hf_experts
from gemmlab.ops import moe as ops_moe
from tests.nn.hf_tiny import FAMILIES, build_experts, experts_modules, float64, output, tf, tiny, within

gnn.register_transformers()  # whatever the import order of the test session


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls of moe_forward made through gemmlab.nn.hf_experts."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    real = ops_moe.moe_forward
    monkeypatch.setattr(hf_experts.ops_moe, "moe_forward", counted)
    return calls


def _interface_classes(module: str) -> list[type]:
    """The experts classes of transformers.models.<module> decorated with use_experts_implementation."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return [
        c
        for n, c in vars(modeling).items()
        if inspect.isclass(c)
        and c.__module__ == modeling.__name__
        and n.endswith("Experts")
        and hasattr(c.forward, "__wrapped__")
        and hasattr(c, "_apply_gate")
    ]


def _run(experts: nn.Module, impl: str, x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor):
    """(output, {name: gradient}) of one forward and backward of a fixed projection, under ``impl``."""
    experts.config._experts_implementation = impl
    x, wts = x.detach().requires_grad_(), wts.detach().requires_grad_()
    y = experts(x, ids, wts)
    proj = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(y.device)
    (y.double() * proj).sum().backward()
    grads = {n: p.grad for n, p in experts.named_parameters()} | {"x": x.grad, "top_k_weights": wts.grad}
    return y.detach(), grads


@pytest.mark.parametrize("module", [m for m in experts_modules() if _interface_classes(m)])
def test_every_interface_experts_class_runs_as_gemmlab(module, device, spy, monkeypatch):
    """Classes that fit run moe_forward and match; the others run grouped_mm exactly, with a warning naming why."""
    monkeypatch.setattr(hf_experts, "_WARNED", set())  # each class warns afresh
    config_mod = importlib.import_module(f"transformers.models.{module}.configuration_{module}")
    built = 0
    for experts_cls in _interface_classes(module):
        torch.manual_seed(0)
        experts = build_experts(experts_cls, config_mod)
        if experts is None:
            continue  # needs arguments a config does not give
        built += 1
        with torch.no_grad():
            for p in experts.parameters():
                nn.init.normal_(p, std=0.3)
        experts = experts.to(device=device, dtype=torch.bfloat16).train()
        e, h = experts.num_experts, getattr(experts, "hidden_dim", None) or experts.config.hidden_size
        x = torch.randn(7, h, device=device, dtype=torch.bfloat16)
        ids = torch.stack([torch.randperm(e)[:2] for _ in range(7)]).to(device)
        wts = torch.rand(7, 2, device=device)
        ours_m, theirs_m = experts, copy.deepcopy(experts)
        ref_m = copy.deepcopy(experts).double()
        calls = len(spy)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = _run(ours_m, "gemmlab", x, ids, wts)
        theirs = _run(theirs_m, "grouped_mm", x, ids, wts)
        ref = _run(ref_m, "eager", x.double(), ids, wts.double())
        why = hf_experts.verdict(experts)  # experts_fit, or oai_fit for gpt-oss
        if why is None:
            assert len(spy) == calls + 1, f"{experts_cls.__name__} fits but moe_forward did not run"
            within(ours[0], theirs[0], ref[0], f"{experts_cls.__name__} output")
            for n, g in ours[1].items():
                assert g is not None, f"{experts_cls.__name__}: no gradient reached {n}"
                within(g, theirs[1][n], ref[1][n], f"{experts_cls.__name__} d{n}", ulps=4)
        else:
            assert len(spy) == calls and torch.equal(ours[0], theirs[0]), experts_cls.__name__
            assert all(
                g is None and theirs[1][n] is None or torch.equal(g, theirs[1][n]) for n, g in ours[1].items()
            ), experts_cls.__name__
            assert any(experts_cls.__name__ in str(w.message) and why in str(w.message) for w in caught), why
    if not built:
        pytest.skip(f"{module}: no experts class builds from a default config")


INTERFACE_FAMILIES = [n for n in FAMILIES if n not in ("dbrx", "llama4")]  # those two have their own experts forward


@pytest.mark.parametrize("name", INTERFACE_FAMILIES)
def test_family_model_runs_as_gemmlab(name, device, spy):
    """A whole tiny model with set_experts_implementation("gemmlab"): logits and every parameter's gradient."""
    model = tiny(name, device=device).train()
    assert model._can_set_experts_implementation(), name
    theirs, ref64 = copy.deepcopy(model), float64(model)
    model.set_experts_implementation("gemmlab")
    theirs.set_experts_implementation("grouped_mm")
    ids = torch.randint(3, 128, (2, 3), device=device)
    outs, grads, proj = {}, {}, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what does not fit runs grouped_mm (the test above checks the warning)
        for key, m in (("ours", model), ("theirs", theirs), ("ref", ref64)):
            out = output(m, ids)
            if proj is None:
                proj = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
            (out.double() * proj.double()).sum().backward()
            outs[key] = out.detach()
            grads[key] = {n: p.grad for n, p in m.named_parameters() if p.requires_grad}
    fits = [m for m in model.modules() if hasattr(type(m).forward, "__wrapped__") and hf_experts.verdict(m) is None]
    assert bool(spy) == bool(fits), (name, len(spy), len(fits))
    within(outs["ours"], outs["theirs"], outs["ref"], "output")
    for n, g in grads["ours"].items():
        if grads["ref"][n] is None:
            assert g is None, n
            continue
        within(g, grads["theirs"][n], grads["ref"][n], n, ulps=4)


def test_from_pretrained_with_experts_implementation_gemmlab(tmp_path, device, spy):
    model = tiny("qwen3-moe", device="cpu")
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = (
            tf.AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="gemmlab", dtype=torch.bfloat16)
            .to(device)
            .eval()
        )
        theirs = tf.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).to(device).eval()
    assert ours.config._experts_implementation == "gemmlab"
    ids = torch.randint(3, 128, (2, 5), device=device)
    with torch.no_grad():
        y, ref = output(ours, ids), output(theirs, ids)
        ref64 = output(float64(theirs), ids)
    assert len(spy) == ours.config.num_hidden_layers
    within(y, ref, ref64, "logits")


def test_weights_changed_in_place_are_seen(device, spy):
    """Nothing is packed or cached: an optimizer step on the Parameters changes the next output."""
    model = tiny("mixtral", device=device).train()
    model.set_experts_implementation("gemmlab")
    ids = torch.randint(3, 128, (1, 6), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    output(model, ids).float().pow(2).mean().backward()
    experts = model.model.layers[0].mlp.experts
    before = experts.gate_up_proj.detach().clone()
    opt.step()
    assert not torch.equal(before, experts.gate_up_proj)
    theirs = copy.deepcopy(model)
    theirs.set_experts_implementation("grouped_mm")
    with torch.no_grad():
        ours, ref = output(model, ids), output(theirs, ids)
        ref64 = output(float64(theirs), ids)
    within(ours, ref, ref64, "after a step")


def test_bad_ids_raise(device):
    experts = tiny("mixtral", device=device).model.layers[0].mlp.experts
    experts.config._experts_implementation = "gemmlab"
    x = torch.randn(3, experts.hidden_dim, device=device, dtype=torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 9], [1, 0]], device=device)
    with pytest.raises(ValueError, match=r"topk_ids must be in \[0, E=4\)"):
        experts(x, ids, torch.rand(3, 2, device=device))


def test_fp32_runs_the_model_own_forward(device, spy):
    """gemmlab runs fp16/bf16: an fp32 model's experts run their own eager forward, exactly."""
    experts = tiny("mixtral", torch.float32, device=device).model.layers[0].mlp.experts
    x = torch.randn(5, experts.hidden_dim, device=device)
    ids, wts = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]], device=device), torch.rand(5, 2, device=device)
    experts.config._experts_implementation = "eager"
    ref = experts(x, ids, wts)
    experts.config._experts_implementation = "gemmlab"
    assert torch.equal(experts(x, ids, wts), ref) and not spy


def _python(code: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_import_gemmlab_registers_when_transformers_is_imported_and_loads_no_kernel():
    out = _python(
        "import sys, transformers, gemmlab\n"
        "from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS\n"
        "kernels = any(m.startswith('gemmlab.kernels') for m in sys.modules)\n"
        "print('gemmlab' in ALL_EXPERTS_FUNCTIONS, kernels)\n"
        "import gemmlab.nn\n"
        "print(gemmlab.nn.hf_experts.registered())"
    )
    assert out.split() == ["True", "False", "True"]


def test_import_gemmlab_first_leaves_transformers_alone_until_asked():
    out = _python(
        "import sys, gemmlab\n"
        "print('transformers' in sys.modules)\n"
        "import gemmlab.nn\n"
        "print(gemmlab.nn.hf_experts.registered())\n"
        "gemmlab.nn.register_transformers()\n"
        "print(gemmlab.nn.hf_experts.registered())"
    )
    assert out.split() == ["False", "False", "True"]


def test_old_transformers_is_refused_with_the_version_needed(monkeypatch, device):
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.57.1")  # the module imported now
    with pytest.raises(RuntimeError, match=r"transformers 4\.57\.1 has no experts interface: .*transformers>=5"):
        gnn.register_transformers()
    model = tiny("mixtral", device=device)
    with pytest.warns(UserWarning, match=r"transformers 4\.57\.1 is too old for the MoE swap .*transformers>=5"):
        gemmlab.patch(model)
    assert hf_experts.too_old("4.57.1") and not hf_experts.too_old("5.0.0") and not hf_experts.too_old("main")


def test_old_transformers_import_hook_skips_quietly():
    out = _python(
        "import transformers\n"
        "transformers.__version__ = '4.57.1'\n"
        "import gemmlab\n"
        "from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS\n"
        "print('gemmlab' in ALL_EXPERTS_FUNCTIONS)"
    )
    assert out == "False"


def test_the_hf_extra_requires_the_transformers_the_code_needs():
    from pathlib import Path

    import tomllib

    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert f"transformers>={hf_experts.MIN_TRANSFORMERS}" in meta["project"]["optional-dependencies"]["hf"]


def test_a_changed_module_is_read_again(device, spy, monkeypatch):
    """The fit verdict is kept per module, and read again when the module changes (another activation: GELU)."""
    monkeypatch.setattr(hf_experts, "_WARNED", set())
    experts = tiny("mixtral", device=device).model.layers[0].mlp.experts
    experts.config._experts_implementation = "gemmlab"
    x = torch.randn(5, experts.hidden_dim, device=device, dtype=torch.bfloat16)
    ids, wts = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]], device=device), torch.rand(5, 2, device=device)
    experts(x, ids, wts)
    assert len(spy) == 1
    experts.act_fn = nn.GELU()
    with pytest.warns(UserWarning, match=r"MixtralExperts runs transformers' grouped_mm \(activation GELU"):
        ours = experts(x, ids, wts)
    experts.config._experts_implementation = "grouped_mm"
    assert len(spy) == 1 and torch.equal(ours, experts(x, ids, wts))


def test_compiles_fullgraph(device):
    torch._dynamo.reset()
    model = tiny("qwen2-moe", device=device).eval()
    model.set_experts_implementation("gemmlab")
    ids = torch.randint(3, 128, (1, 4), device=device)
    with torch.no_grad():
        eager = output(model, ids)
        compiled = output(torch.compile(model, fullgraph=True, backend="aot_eager"), ids)
    torch.testing.assert_close(compiled, eager)
