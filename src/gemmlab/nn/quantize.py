"""``quantize_(model)``: swap a model's Linear layers and MoE experts for FP8 ones (``gemmlab.nn.fp8``), in place.

Legend: T tokens, H hidden, I expert intermediate, E experts; N out_features, K in_features.

What becomes FP8 (e4m3 weights, one fp32 scale per 128x128 block, activations quantized per 1x128 block):
    nn.Linear or gemmlab.nn.Linear (fp16/bf16/fp32)  -> Fp8Linear (its weight quantized; its bias shared)
    gemmlab.nn.MoEExperts                            -> Fp8MoEExperts (each expert quantized per 128x128 block)
    transformers' FP8Linear / FP8Experts (a model loaded from an FP8 checkpoint: e4m3 weights with their 128x128
    ``weight_scale_inv``, dynamic activation scales, SiLU experts) -> Fp8Linear / Fp8MoEExperts over the same tensors
What stays (listed under "kept"): modules named in ``skip`` (default the ``lm_head``, as transformers' FP8 models keep
it), and a Linear beside an ``experts`` module (a router or a shared-expert gate: its outputs choose or weigh the
experts, so its precision is the model's routing). What cannot become FP8 is left and reported ("skipped": experts
with H or I not a multiple of 16, expert-parallel experts, an FP8 module of another scheme); a Hugging Face experts
module in bf16 is one of them: ``gemmlab.patch(model, fp8=True)`` swaps it for MoEExperts first, then quantizes it.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from gemmlab.nn.fp8 import FP8, IN_DTYPES, Fp8Linear, Fp8MoEExperts
from gemmlab.nn.linear import Linear
from gemmlab.nn.moe import MoE, MoEExperts

_SILU = ("SiLU", "SiLUActivation")


def _scheme_128(mod: nn.Module) -> str | None:
    """Why a transformers FP8 module's scheme is not gemmlab's (128x128 fp32-convertible block scales, activations
    quantized on the fly), or None."""
    block = getattr(mod, "block_size", None)
    if block is None or tuple(block) != (128, 128):
        return f"weight block size {block}: gemmlab's FP8 weights have 128x128 block scales"
    if getattr(mod, "activation_scheme", "dynamic") != "dynamic":
        return f"activation scheme {mod.activation_scheme!r}: gemmlab quantizes activations on the fly (dynamic)"
    return None


def _hf_fp8_experts_fit(mod: nn.Module) -> str | None:
    """Why transformers' FP8Experts module cannot run as Fp8MoEExperts, or None."""
    why = _scheme_128(mod)
    if why is not None:
        return why
    act = getattr(mod, "act_fn", None)
    flags = [
        (not getattr(mod, "has_gate", True), "ungated"),
        (getattr(mod, "has_bias", False), "biased"),
        (
            any(getattr(mod, a, None) is not None for a in ("limit", "swiglu_alpha", "gate_softcap")),
            "a clamped or soft-capped gate",
        ),
        (type(act).__name__ not in _SILU, f"activation {type(act).__name__}"),
    ]
    if any(bad for bad, _ in flags):
        return "FP8 experts " + ", ".join(why for bad, why in flags if bad) + ": gemmlab computes SiLU(gate) * up"
    return None


def _hf_experts(mod: nn.Module) -> bool:
    """A module holding 3-D expert weights of its own in a 16- or 32-bit float (a Hugging Face experts module)."""
    return any(
        p.dim() == 3 and p.dtype in IN_DTYPES
        for n, p in mod.named_parameters(recurse=False)
        if n in ("gate_up_proj", "down_proj", "up_proj")
    )


def fp8_swaps(
    model: nn.Module,
    skip: tuple[str, ...] = ("lm_head",),
    dispatch: str = "auto",
    *,
    linears: bool = True,
    want_experts: bool = True,
) -> dict:
    """The swaps of ``quantize_``, done: {"fp8": paths replaced, "kept": ["path: why"], "skipped": [(path, class,
    why)], "hf_experts": paths of bf16 Hugging Face experts modules left (``patch(model, fp8=True)`` swaps them)}.
    ``linears`` / ``want_experts`` False: leave that kind as it is (patch's ``linear=False`` and ``moe="none"``)."""
    mods = dict(model.named_modules())
    done: dict = {"fp8": [], "kept": [], "skipped": [], "hf_experts": []}
    swaps: list[tuple[str, nn.Module]] = []
    replaced: tuple[str, ...] = ()
    for name, mod in mods.items():
        if name.startswith(replaced) or isinstance(mod, (Fp8Linear, Fp8MoEExperts)):
            continue
        cls, leaf = type(mod).__name__, name.rpartition(".")[2]
        parent = mods.get(name.rpartition(".")[0]) if name else None
        fp8_weight = getattr(mod, "weight", None) is not None and getattr(mod.weight, "dtype", None) == FP8
        linear = linears and (type(mod) in (nn.Linear, Linear) or (cls == "FP8Linear" and isinstance(mod, nn.Linear)))
        experts = (
            isinstance(mod, MoEExperts)
            or _hf_experts(mod)
            or (getattr(getattr(mod, "gate_up_proj", None), "dtype", None) == FP8)
        )
        if experts and not want_experts:
            replaced += (name + ".",)
            continue
        if (linear or experts) and (name in skip or leaf in skip):
            done["kept"].append(f"{name}: named in skip")
            replaced += (name + ".",)
            continue
        new, why = None, None
        if linear and parent is not None and isinstance(getattr(parent, "experts", None), nn.Module):
            done["kept"].append(f"{name}: beside {name.rpartition('.')[0]}.experts (a router or shared-expert gate)")
            continue
        if linear and fp8_weight:  # transformers' FP8Linear over an FP8 checkpoint
            why = _scheme_128(mod)
            new = Fp8Linear.from_fp8(mod.weight, mod.weight_scale_inv, mod.bias, dispatch=dispatch) if not why else None
        elif linear:
            if mod.weight.dtype in IN_DTYPES:
                new = Fp8Linear.from_linear(mod, dispatch=dispatch)
            else:
                why = f"weights in {mod.weight.dtype}: gemmlab quantizes fp16, bf16 or fp32"
        elif isinstance(mod, MoEExperts):
            h, i = mod.hidden_dim, mod.intermediate_dim
            if isinstance(parent, MoE) and parent.ep_group is not None:
                why = "expert-parallel experts (MoE ep_group): FP8 experts run on one device"
            elif h % 16 or i % 16:
                why = f"H={h}, I={i}: FP8 experts need multiples of 16 (TMA rows of e4m3); left in their dtype"
            else:
                new = Fp8MoEExperts.from_experts(mod, dispatch=dispatch)
        elif experts and getattr(mod.gate_up_proj, "dtype", None) == FP8:  # transformers' FP8Experts
            why = _hf_fp8_experts_fit(mod)
            new = None if why else Fp8MoEExperts.sharing(mod)
            if new is not None:
                new.dispatch = dispatch
        elif experts:
            done["hf_experts"].append(name)
            replaced += (name + ".",)
            continue
        else:
            continue
        if not name:
            raise ValueError(
                "quantize_: the model itself is a Linear or experts module; quantize its parent, or use "
                "gemmlab.nn.Fp8Linear.from_linear / Fp8MoEExperts.from_experts"
            )
        replaced += (name + ".",)
        if new is None:
            done["skipped"].append((name, cls, why))
            continue
        new.train(mod.training)
        swaps.append((name, new))
        done["fp8"].append(name)
    for name, new in swaps:
        model.set_submodule(name, new)
    return done


def warn_skipped(done: dict, stacklevel: int = 3) -> None:
    """One UserWarning per class ``fp8_swaps`` could not make FP8."""
    by_class: dict[str, list[tuple[str, str]]] = {}
    for path, cls, why in done["skipped"]:
        by_class.setdefault(cls, []).append((path, why))
    for cls, rows in by_class.items():
        reasons = "; ".join(dict.fromkeys(why for _, why in rows))
        more = f" and {len(rows) - 1} more" if len(rows) > 1 else ""
        warnings.warn(
            f"gemmlab FP8: left {len(rows)} {cls} in its dtype ({reasons}): {rows[0][0]}{more}",
            UserWarning,
            stacklevel=stacklevel,
        )


def quantize_(
    model: nn.Module,
    *,
    skip: tuple[str, ...] = ("lm_head",),
    dispatch: str = "auto",
    return_summary: bool = False,
    warn: bool = True,
):
    """Swap ``model``'s Linear layers and gemmlab's experts for FP8 ones in place (see the module docstring);
    ``skip``: module names (the last part of the path, or the whole path) left as they are. ``dispatch``: the FP8
    modules' policy ("auto": gemmlab's FP8 kernels where they run; "torch": the torch emulation). ``warn``: one
    UserWarning per class left (and one when nothing was swapped, or when Hugging Face experts were left). Returns
    the model, or (model, summary) with ``return_summary``: {"fp8", "kept", "skipped" (["path (Class): why"]),
    "hf_experts"}."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(skip, (tuple, list)) or not all(isinstance(s, str) for s in skip):
        raise TypeError(f"quantize_: skip must be a tuple of module names, got {skip!r}")
    if dispatch not in ("auto", "torch"):
        raise ValueError(f"quantize_: dispatch {dispatch!r}: auto or torch")
    with torch.no_grad():
        done = fp8_swaps(model, tuple(skip), dispatch)
    if warn:
        warn_skipped(done)
        if done["hf_experts"]:
            warnings.warn(
                f"gemmlab.quantize_: {len(done['hf_experts'])} Hugging Face experts modules left in their "
                f"dtype ({done['hf_experts'][0]}...): gemmlab.patch(model, fp8=True) swaps and quantizes "
                "them",
                UserWarning,
                stacklevel=2,
            )
        if not done["fp8"]:
            warnings.warn(
                "gemmlab.quantize_: nothing became FP8 (no Linear or experts it quantizes)", UserWarning, stacklevel=2
            )
    summary = dict(done, skipped=[f"{p} ({c}): {w}" for p, c, w in done["skipped"]])
    return (model, summary) if return_summary else model
