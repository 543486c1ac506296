"""Building the models ``bench model`` and ``bench layer`` time: random weights, shared copies, the variants.

    init_weights(module, seed)          every weight uniform with its fan-in's variance (activations O(1))
    build(config, dtype, device, seed)  a transformers *ForCausalLM from a config, random weights, eval
    shared_copy(module)                 a copy of the module tree sharing every Parameter and buffer
    gemmlab_variant(model)              gemmlab.patch of a shared copy: (copy, patch summary)
    liger_variant(model)                Liger-Kernel's apply_liger_kernel_to_<model_type> on a shared copy, its
                                        changes to module globals scoped to the copy's own calls
    noisy(model, rel)                   a context: every decoder layer's output (and the embeddings) moved by
                                        about one bf16 ulp, random sign per element: the rounding-level noise
                                        the derived tolerances are measured with

Weights: a matrix (..., fan_in) uniform on +-sqrt(3 / fan_in), so each output has about the variance of the
input (RMSNorm'd inputs, so O(1)); router weights too, so router logits have unit variance: routing is neither
uniform nor one-hot. Embeddings have unit variance; RMSNorm scales are 1; other vectors (DeepSeek's score
correction bias) small and positive. Rotary buffers are left as the model computed them.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import math
import os
from collections.abc import Callable, Iterator

import torch

LIGER_NAMESPACES = ("torch.nn.functional", "transformers.loss.loss_utils")  # besides the model's own module


def init_weights(module: torch.nn.Module, seed: int = 0) -> None:
    """Random weights in place (the rule in the module docstring); sliced, so no full-size fp32 temporary."""
    device = next(module.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    embeddings = {id(m.weight) for m in module.modules() if isinstance(m, torch.nn.Embedding)}
    tensors = list(module.named_parameters()) + [(n, b) for n, b in module.named_buffers() if "rotary" not in n]
    with torch.no_grad():
        for name, p in tensors:
            if not p.is_floating_point():
                continue
            if p.dim() == 1 and "norm" in name:  # RMSNorm scales
                p.fill_(1.0)
                continue
            if p.dim() == 1:  # biases (DeepSeek's score correction): small
                p.copy_(torch.rand(p.shape, generator=g, device=device).mul_(1e-2))
                continue
            bound = math.sqrt(3.0) if id(p) in embeddings else math.sqrt(3.0 / p.shape[-1])
            step = max(1, (1 << 28) // math.prod(p.shape[1:]))
            for j in range(0, p.shape[0], step):
                part = torch.rand((min(step, p.shape[0] - j), *p.shape[1:]), generator=g, device=device)
                p[j : j + step].copy_(part.sub_(0.5).mul_(2 * bound))


def set_impl(config, name: str, value: str) -> None:
    """config._attn_implementation / _experts_implementation, across transformers 5 versions."""
    try:
        setattr(config, name, value)
    except Exception:  # a read-only property: the internal field behind it
        setattr(config, name + "_internal", value)


def build(config, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """The config's causal LM with random weights, built in ``dtype`` on ``device`` (no fp32 copy), eval mode.
    Attention "sdpa"; experts "grouped_mm" on CUDA (transformers' fastest own MoE path), "eager" on the CPU."""
    from transformers import AutoModelForCausalLM

    set_impl(config, "_attn_implementation", "sdpa")
    set_impl(config, "_experts_implementation", "grouped_mm" if device.type == "cuda" else "eager")
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    finally:
        torch.set_default_dtype(old)
    init_weights(model, seed)
    return model.eval()


def shared_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of the module tree whose Parameters and buffers are the original's (no data copied)."""
    memo = {id(t): t for t in list(module.parameters()) + list(module.buffers())}
    return copy.deepcopy(module, memo)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = getattr(model, getattr(model, "base_model_prefix", "model"), model)
    return base.layers


def gemmlab_variant(model: torch.nn.Module) -> tuple[torch.nn.Module, dict]:
    """``gemmlab.patch`` (the public entry point, looked up at call time) of a shared copy."""
    import gemmlab

    patched, summary = gemmlab.patch(shared_copy(model), return_summary=True)
    return patched, summary


def load_liger() -> tuple[dict | None, dict]:
    """Liger-Kernel's per-model-type patch functions, or None and why. Its fused MoE (LigerExperts) autotunes
    on its first call per (H, I) unless LIGER_FUSED_MOE_AUTOTUNE=0 pins one config: the info says which."""
    from importlib import metadata

    try:
        monkey = importlib.import_module("liger_kernel.transformers.monkey_patch")
    except Exception as e:  # not installed, or broken: its rows are skipped, never a crash
        return None, {
            "available": False,
            "reason": f"liger-kernel is not importable ({type(e).__name__}: "
            f"{str(e)[:200]}): the Liger rows are skipped",
        }
    try:
        version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        version = None
    fns = dict(getattr(monkey, "MODEL_TYPE_TO_APPLY_LIGER_FN", {}))
    for name in dir(monkey):  # a patch function the table does not list
        if name.startswith("apply_liger_kernel_to_"):
            fns.setdefault(name.removeprefix("apply_liger_kernel_to_"), getattr(monkey, name))
    autotune = os.environ.get("LIGER_FUSED_MOE_AUTOTUNE", "1") not in ("0", "false", "no")
    return fns, {"available": True, "version": version, "model_types": sorted(fns), "fused_moe_autotune": autotune}


def _namespaces(model: torch.nn.Module) -> dict[str, object]:
    """What Liger's patch functions write besides the instance: the modeling module, its classes, and the
    loss modules (``cross_entropy=True`` replaces torch.nn.functional.cross_entropy)."""
    found = {}
    for name in (type(model).__module__, *LIGER_NAMESPACES):
        with contextlib.suppress(ImportError):
            mod = importlib.import_module(name)
            found[name] = mod
            for attr, value in vars(mod).items():
                if isinstance(value, type) and value.__module__ == name:
                    found[f"{name}.{attr}"] = value
    return found


def _snapshot(spaces: dict[str, object]) -> dict[str, dict]:
    return {key: dict(vars(obj)) for key, obj in spaces.items()}


def liger_variant(model: torch.nn.Module, fns: dict | None) -> tuple[torch.nn.Module | None, Callable, dict]:
    """(copy, scope, info): Liger's patch of the model's type applied to a shared copy (``model=copy``, the
    function's defaults: rope, RMSNorm, SwiGLU / experts, fused linear cross entropy). What it also writes
    into module globals or classes (e.g. ``modeling_mixtral.apply_rotary_pos_emb``, which every Mixtral
    reads) is undone at once and reinstated only inside ``scope()``, around the copy's own calls: the
    unpatched and gemmlab models in the same process stay as they were. (None, scope, why) without a patch."""
    model_type = getattr(model.config, "model_type", None)
    if fns is None or model_type not in fns:
        why = (
            "liger-kernel is not installed"
            if fns is None
            else f"liger-kernel has no apply_liger_kernel_to_* for model_type {model_type!r}"
        )
        return None, contextlib.nullcontext, {"applied": False, "reason": why}
    spaces = _namespaces(model)
    before = _snapshot(spaces)
    patched = shared_copy(model)
    try:
        fns[model_type](model=patched)
    finally:
        after = _snapshot(spaces)
        changed = {
            key: {a: v for a, v in after[key].items() if before[key].get(a, _MISSING) is not v} for key in spaces
        }
        changed = {k: v for k, v in changed.items() if v}
        _install(spaces, {k: {a: before[k].get(a, _MISSING) for a in v} for k, v in changed.items()})
    originals = {k: {a: before[k].get(a, _MISSING) for a in v} for k, v in changed.items()}

    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        _install(spaces, changed)
        try:
            yield
        finally:
            _install(spaces, originals)

    return (
        patched,
        scope,
        {
            "applied": True,
            "function": getattr(fns[model_type], "__name__", str(model_type)),
            "scoped_globals": sorted(f"{k}.{a}" for k, v in changed.items() for a in v),
        },
    )


_MISSING = object()


def _install(spaces: dict[str, object], values: dict[str, dict]) -> None:
    for key, attrs in values.items():
        for attr, value in attrs.items():
            if value is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(spaces[key], attr)
            else:
                setattr(spaces[key], attr, value)


@contextlib.contextmanager
def noisy(model: torch.nn.Module, rel: float = 2.0**-7, seed: int = 1) -> Iterator[None]:
    """Inside: each decoder layer's output and the embeddings' output multiplied by (1 +- ``rel``), the sign
    random per element (a fresh draw per call: noise, not a fixed offset; bench layer's measure, per layer)."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)

    def bump(t: torch.Tensor) -> torch.Tensor:
        sign = torch.where(torch.rand(t.shape, generator=g, device=t.device) < 0.5, -rel, rel)
        return t * (1 + sign).to(t.dtype)

    def hook(_mod, _args, out):
        if isinstance(out, torch.Tensor):
            return bump(out)
        if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            return (bump(out[0]), *out[1:])
        return out

    mods = [model.get_input_embeddings(), *decoder_layers(model)]
    handles = [m.register_forward_hook(hook) for m in mods]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
