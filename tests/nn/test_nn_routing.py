"""The model's own routing: a patched model sends every token to the experts the unpatched model sends it to.

Expert ids are read where every block hands them over: the (hidden_states, top_k_index, top_k_weights) call of its
experts module (a forward pre-hook, before and after patch swaps that module). Compared exactly, per MoE layer, for
every tiny family of hf_tiny in bf16: the whole model (its router weights scaled up, as hf_tiny builds them) and each
MoE block alone on the same hidden states with its router at its initial scale (many near ties between experts:
a router computed by another op or in another dtype would send some tokens elsewhere)."""

import copy
import importlib
import warnings

import pytest
import torch
from torch import nn

import gemmlab
from tests.nn.hf_tiny import FAMILIES, ROUTER, expert_ids, experts_paths, output, routed_differently, tiny

NO_IDS = {"llama4"}  # Llama-4's block hands its experts pre-scaled inputs, not ids (left unpatched, see families)


def _patch(model: nn.Module) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skipped families' warnings are test_nn_families'
        return gemmlab.patch(model, return_summary=True)[1]


@pytest.mark.parametrize("name", [n for n in FAMILIES if n not in NO_IDS])
def test_patched_model_sends_every_token_to_the_same_experts(name, device):
    model = tiny(name, device=device).eval()
    ids = torch.randint(3, 128, (2, 8), device=device)
    theirs = expert_ids(model, lambda m: output(m, ids))
    _patch(model)
    ours = expert_ids(model, lambda m: output(m, ids))
    assert routed_differently(ours, theirs) == 0, name


def _unscale_routers(model: nn.Module) -> None:
    with torch.no_grad():
        for path, p in model.named_parameters():
            if p.dim() == 2 and ROUTER.search(path):
                p.div_(30)  # back to the family's own initial scale: close calls between experts


@pytest.mark.parametrize("name", [n for n in FAMILIES if n not in NO_IDS])
def test_patched_block_routes_like_the_block_on_close_calls(name, device):
    model = tiny(name, device=device).eval()
    _unscale_routers(model)
    paths = [p.rpartition(".")[0] for p in experts_paths(model)]
    h = model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.d_model
    x = torch.randn(1, 96, h, generator=torch.Generator().manual_seed(2)).to(device, torch.bfloat16)
    theirs = expert_ids(model, lambda m: [m.get_submodule(p)(x.clone()) for p in paths])
    _patch(model)
    ours = expert_ids(model, lambda m: [m.get_submodule(p)(x.clone()) for p in paths])
    assert routed_differently(ours, theirs) == 0, name


def test_the_comparison_fires_on_another_routing(device):
    """Two experts' router rows swapped: the recorded ids differ for the tokens that chose either."""
    model = tiny("qwen3-moe", device=device).eval()
    ids = torch.randint(3, 128, (2, 8), device=device)
    theirs = expert_ids(model, lambda m: output(m, ids))
    other = copy.deepcopy(model)
    gate = other.model.layers[0].mlp.gate.weight
    with torch.no_grad():
        gate[[0, 1]] = gate[[1, 0]].clone()
    assert routed_differently(expert_ids(other, lambda m: output(m, ids)), theirs) > 0


@pytest.mark.parametrize(
    "name, router",
    [("hunyuan-v1-moe", "model.layers.0.mlp.gate.wg"), ("dbrx", "transformer.blocks.0.ffn.router.layer")],
)
def test_router_linears_stay_the_model_own(name, router, device, monkeypatch):
    """A router that is a plain nn.Linear is kept (summary "routers"); without that guard patch would swap it."""
    model = tiny(name, device=device)
    summary = _patch(model)
    assert summary["routers"] == [router] and type(model.get_submodule(router)) is nn.Linear
    assert router not in summary["linear"]
    monkeypatch.setattr(importlib.import_module("gemmlab.nn.patch"), "router_linears", lambda _model: set())
    unguarded = _patch(tiny(name, device=device))
    assert router in unguarded["linear"]


def test_patch_twice_keeps_the_routers(device):
    model = tiny("hunyuan-v1-moe", device=device)
    _patch(model)
    again = _patch(model)
    assert again["routers"] == ["model.layers.0.mlp.gate.wg"] and not again["linear"]


@pytest.mark.parametrize("name", ["mixtral", "qwen3-moe", "deepseek-v3", "granite-moe"])
def test_patched_fp16_model_sends_every_token_to_the_same_experts(name, device):
    model = tiny(name, torch.float16, device=device).eval()
    ids = torch.randint(3, 128, (2, 8), device=device)
    theirs = expert_ids(model, lambda m: output(m, ids))
    _patch(model)
    ours = expert_ids(model, lambda m: output(m, ids))
    assert routed_differently(ours, theirs) == 0, name
