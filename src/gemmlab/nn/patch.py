"""``patch(model)``: swap a Hugging Face model's nn.Linear layers and MoE experts for gemmlab's, in place.

Legend: T tokens, H hidden, I expert intermediate, E experts.

What is swapped, sharing the model's own Parameter objects (nothing is copied; checkpoints load unchanged):
    nn.Linear (fp16/bf16)          -> gemmlab.nn.Linear (gemmlab's GEMM or torch's, per shape: ``dispatch``)
    an experts module that fits    -> gemmlab.nn.MoEExperts (the block's own router, shared experts, scaling stay)
    gpt-oss's GptOssExperts        -> gemmlab.nn.MoEExpertsOAI (moe_forward's swiglu_oai, biases; ``oai_fit``)
The model's own routing stays: every MoE block keeps calling its own router module (router logits, softmax or
sigmoid, top-k, in the model's ops and dtypes), and a router that is a plain nn.Linear (E outputs, in the
block beside the experts: Hunyuan's ``gate.wg``, DBRX's ``router.layer``) is not swapped (``router_linears``;
the summary's "routers"), so every token goes to the experts the unpatched model sends it to.
An experts module fits when it is transformers' experts interface (``use_experts_implementation``) in the layout
moe_forward computes: (E, 2I, H) gate_up_proj (gate rows first) and (E, H, I) down_proj, nothing else, no bias,
not transposed, gated, SiLU, the default gate. That is read off the module, so families patch has never seen
match by structure. Everything else that looks like experts (a 3-D weight, a class named *Experts, a list of
per-expert modules) is left as it is and reported with the reason, as are nn.Linear subclasses and Linears in
other dtypes; ``patch`` warns once per skipped class.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from gemmlab.nn import per_shape
from gemmlab.nn.families import BY_BLOCK, BY_EXPERTS
from gemmlab.nn.gpt_oss import MoEExpertsOAI, oai_fit
from gemmlab.nn.linear import DTYPES, Linear, check_policy
from gemmlab.nn.moe import MoE, MoEExperts
from gemmlab.nn.quantize import fp8_swaps

MOE_MODES = ("auto", "experts", "none")


def old_transformers() -> str | None:
    """The running transformers' version when it is older than 5 (its MoE experts are per-expert module lists,
    which the MoE swap does not read), else None; not imported: None."""
    tf = sys.modules.get("transformers")
    version = str(getattr(tf, "__version__", "")) if tf is not None else ""
    major = version.split(".")[0]
    return version if major.isdigit() and int(major) < 5 else None


class PatchSummary(dict):
    """What ``patch`` did, as JSON-ready data: "dtype", "converted" (the dtype change asked for, or None),
    "dispatch", "linear" / "moe_experts" (module paths replaced), "matched" ({path: how the family was
    recognized}), "routers" (router Linears kept as the model's own), "skipped" (["path (Class): reason"]).
    ``choices()``: the per-shape Linear choices made so far for the patched Linears' shapes (they are made on each
    shape's first call)."""

    def choices(self) -> list[dict]:
        shapes = {tuple(s) for s in self.get("linear_shapes", [])}
        return [c for c in per_shape.choices() if (c["n"], c["k"], c["dtype"], c["bias"]) in shapes]


def _default_gate(cls: type) -> bool:
    gate = getattr(cls, "_apply_gate", None)
    return (
        getattr(gate, "__module__", "") == "transformers.integrations.moe"
        and getattr(gate, "__name__", "") == "_default_apply_gate"
    )


def _silu(act: object) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation" or act is F.silu


EXPERT_WEIGHTS = ("gate_up_proj", "up_proj", "down_proj", "w1", "w2", "w3")  # 3-D, one slice per expert


def looks_like_experts(name: str, mod: nn.Module) -> bool:
    """A module patch must either swap or report: a class named *Experts, 3-D expert weights of its own
    (``EXPERT_WEIGHTS``), or a list of per-expert modules named experts."""
    if isinstance(mod, (MoEExperts, MoEExpertsOAI)):
        return False
    if isinstance(mod, (nn.ModuleList, nn.ModuleDict)):
        return name.rsplit(".", 1)[-1] == "experts" and len(mod) > 0
    return type(mod).__name__.endswith("Experts") or any(
        p.dim() == 3 for n, p in mod.named_parameters(recurse=False) if n in EXPERT_WEIGHTS
    )


def experts_fit(mod: nn.Module) -> str | None:
    """Why an experts module cannot run as MoEExperts (exactly), or None when it can."""
    cls = type(mod)
    family = BY_EXPERTS.get(cls.__name__)
    if family is not None and family.swap == "none":
        return family.note
    if isinstance(mod, (nn.ModuleList, nn.ModuleDict)):
        first = next(iter(mod.values() if isinstance(mod, nn.ModuleDict) else mod))
        return (
            f"one module per expert ({len(mod)} x {type(first).__name__}): moe_forward reads stacked (E, 2I, H) "
            "weights, and stacking them would copy every expert's weights (their nn.Linear layers are patched)"
        )
    if not (hasattr(mod, "is_transposed") and hasattr(mod, "has_gate") and hasattr(cls, "_apply_gate")):
        return (
            "not transformers' experts interface (use_experts_implementation): its forward is its own, so what "
            "it computes cannot be read off its structure"
        )
    flags = [
        (mod.is_transposed, "stored transposed (E, H, 2I)"),
        (not mod.is_concatenated, "gate and up interleaved"),
        (mod.has_bias, "biased"),
        (not mod.has_gate, "ungated (act(up) only)"),
        (getattr(mod, "has_post_expert_norm", False), "a norm after each expert"),
        (getattr(mod, "_is_expert_parallel", False), "sharded expert-parallel"),
        (not _default_gate(cls), f"its own gate activation ({cls.__name__}._apply_gate)"),
    ]
    if any(bad for bad, _ in flags):
        return (
            "experts " + ", ".join(why for bad, why in flags if bad) + ": moe_forward computes SiLU(gate) * up "
            "on (E, 2I, H) gate_up_proj, (E, H, I) down_proj"
        )
    names = sorted(n for n, _ in mod.named_parameters())
    if names != ["down_proj", "gate_up_proj"]:
        return f"parameters {names}: moe_forward reads gate_up_proj and down_proj only"
    w1, w2 = mod.gate_up_proj, mod.down_proj
    if (
        w1.dim() != 3
        or w2.dim() != 3
        or w1.shape[0] != w2.shape[0]
        or w1.shape[1] != 2 * w2.shape[2]
        or w1.shape[2] != w2.shape[1]
    ):
        return f"expert weights {tuple(w1.shape)}, {tuple(w2.shape)} are not (E, 2I, H), (E, H, I)"
    act = getattr(mod, "act_fn", None)
    if not _silu(act):
        return f"activation {getattr(act, '__name__', type(act).__name__)}: moe_forward computes SiLU(gate) * up"
    if w1.dtype not in DTYPES or w2.dtype != w1.dtype:
        return f"expert weights in {w1.dtype}: gemmlab runs fp16/bf16"
    return None


def expert_count(mod: nn.Module) -> int | None:
    """E of an experts module: its ``num_experts``, else the first dimension of its 3-D weights, else the length
    of its per-expert module list."""
    e = getattr(mod, "num_experts", None)
    if isinstance(e, int) and not isinstance(e, bool):
        return e
    if isinstance(mod, (nn.ModuleList, nn.ModuleDict)):
        return len(mod)
    return next((p.shape[0] for n, p in mod.named_parameters(recurse=False) if p.dim() == 3), None)


def router_linears(model: nn.Module) -> set[str]:
    """Paths of the plain nn.Linear routers ``patch`` keeps: in the block holding an experts module (its parent),
    outside the experts, with E outputs (the router logits run in the model's own F.linear, so routing stays the
    model's own)."""
    found: set[str] = set()
    for name, mod in model.named_modules():
        if not name or not (isinstance(mod, (MoEExperts, MoEExpertsOAI)) or looks_like_experts(name, mod)):
            continue
        e = expert_count(mod)
        parent, _, child = name.rpartition(".")
        block = model.get_submodule(parent)
        for path, sub in block.named_modules():
            if type(sub) is nn.Linear and sub.out_features == e and path != child and not path.startswith(child + "."):
                found.add(f"{parent}.{path}" if parent else path)
    return found


def _dominant_dtype(model: nn.Module) -> torch.dtype | None:
    """The floating dtype holding most of the model's parameter elements."""
    count: Counter = Counter()
    for p in model.parameters():
        if p.is_floating_point() and p.element_size() > 1:  # (an FP8 checkpoint's e4m3 weights: not the dtype)
            count[p.dtype] += p.numel()
    return count.most_common(1)[0][0] if count else None


def _convert(model: nn.Module, dtype: torch.dtype | None) -> tuple[torch.dtype, str | None]:
    """The model's dtype after the conversion asked for; refuses a model gemmlab would leave untouched."""
    have = _dominant_dtype(model)
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"patch: dtype {dtype}: gemmlab runs torch.float16 or torch.bfloat16")
        if have is None:
            raise ValueError("patch: the model has no floating-point parameters: nothing to patch")
        if have == dtype and all(p.dtype == dtype for p in model.parameters() if p.is_floating_point()):
            return dtype, None
        model.to(dtype)
        return dtype, f"{str(have).removeprefix('torch.')} -> {str(dtype).removeprefix('torch.')}"
    if have is None:
        raise ValueError("patch: the model has no floating-point parameters: nothing to patch")
    if have not in DTYPES:
        raise TypeError(
            f"patch: the model's weights are {have} and gemmlab runs fp16/bf16: pass "
            "dtype=torch.bfloat16 (or torch.float16) to convert the model in place, or convert it first"
        )
    return have, None


def _warn_skipped(skipped: list[tuple[str, str, str]]) -> None:
    """One warning line per skipped module class."""
    by_class: dict[str, list[tuple[str, str]]] = {}
    for path, cls, why in skipped:
        by_class.setdefault(cls, []).append((path, why))
    for cls, rows in by_class.items():
        reasons = list(dict.fromkeys(why for _, why in rows))
        more = f" and {len(rows) - 1} more" if len(rows) > 1 else ""
        warnings.warn(
            f"gemmlab.patch: left {len(rows)} {cls} as it was ({'; '.join(reasons)}): {rows[0][0] or '<model>'}{more}",
            UserWarning,
            stacklevel=3,
        )


def patch(
    model: nn.Module,
    *,
    moe: str = "auto",
    linear: bool = True,
    dtype: torch.dtype | None = None,
    dispatch: str = "auto",
    return_summary: bool = False,
    warn: bool = True,
    fp8: bool = False,
):
    """Swap ``model``'s nn.Linear layers and MoE experts for gemmlab's, in place (see the module docstring).

    ``moe``: "auto" or "experts" (the same: every experts module that fits becomes MoEExperts; every block keeps
    its own router, so tokens go to the same experts and the router logits transformers records for its
    auxiliary loss are the model's own), "none" (no experts swapped).
    ``dtype``: convert the model to torch.float16 / torch.bfloat16 first (in place); without it an fp32 model is
    refused (TypeError), never silently left as it was. ``dispatch``: the patched Linears' policy ("auto": per
    shape, measured on first use; "gemmlab"; "torch"). ``warn``: one UserWarning per skipped module class.
    ``fp8``: also make the Linears and experts FP8 (``gemmlab.nn.quantize.quantize_``: e4m3 weights with 128x128
    block scales, quantized from the model's weights or taken from an FP8 checkpoint's; the lm_head, routers and
    shared-expert gates stay), the summary's "fp8" and "fp8_kept" saying which. Returns the model, or (model,
    PatchSummary) with ``return_summary``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch: model must be a torch.nn.Module, got {type(model).__name__}")
    if moe not in MOE_MODES:
        raise ValueError(f"patch: moe {moe!r}: auto, experts or none")
    check_policy(dispatch)
    if isinstance(model, (nn.Linear, MoEExperts, MoEExpertsOAI, MoE)) or BY_BLOCK.get(type(model).__name__) is not None:
        raise ValueError(
            "patch: the model itself is an nn.Linear or MoE block; patch its parent, or use "
            "gemmlab.nn.Linear.sharing / MoEExperts.sharing"
        )
    if not isinstance(fp8, bool):
        raise TypeError(f"patch: fp8 must be a bool, got {fp8!r}")
    if fp8 and (dtype is None or dtype not in DTYPES):
        _convert(model, dtype)  # (no conversion asked: only its checks, before anything changes)
    kinds = {"linears": linear, "want_experts": moe != "none"}
    first = fp8_swaps(model, **kinds) if fp8 else None  # an FP8 checkpoint's modules first (not fp16/bf16 weights)
    have, converted = _convert(model, dtype)
    if warn and moe != "none" and old_transformers() and type(model).__module__.startswith("transformers."):
        warnings.warn(
            f"gemmlab.patch: transformers {old_transformers()} is too old for the MoE swap (it reads "
            "transformers>=5's experts interface: pip install 'gemmlab[hf]'); only nn.Linear layers are "
            "patched",
            UserWarning,
            stacklevel=2,
        )
    summary = PatchSummary(
        dtype=str(have).removeprefix("torch."),
        converted=converted,
        dispatch=dispatch,
        linear=[],
        moe_experts=[],
        matched={},
        routers=[],
        skipped=[],
        linear_shapes=[],
    )
    routers = router_linears(model) if linear else set()
    swaps: list[tuple[str, nn.Module]] = []  # (submodule path, its replacement)
    skipped: list[tuple[str, str, str]] = []  # (path, class, reason)
    replaced: tuple[str, ...] = ()  # prefixes of swapped subtrees (not visited again)
    moe_done: tuple[str, ...] = ()  # prefixes of experts modules handled (their insides are not experts again)
    for name, mod in model.named_modules():
        if name.startswith(replaced):
            continue
        cls = type(mod).__name__
        if moe != "none" and not name.startswith(moe_done) and looks_like_experts(name, mod):
            moe_done += (name + ".",)
            oai = BY_EXPERTS.get(cls) is not None and BY_EXPERTS[cls].swap == "swiglu_oai"
            why = oai_fit(mod) if oai else experts_fit(mod)
            if why is not None:
                if old_transformers():
                    why = f"gemmlab's MoE swap needs transformers >= 5 (this is {old_transformers()}); {why}"
                skipped.append((name, cls, why))
                continue
            swaps.append((name, (MoEExpertsOAI if oai else MoEExperts).sharing(mod)))
            summary["moe_experts"].append(name)
            known = BY_EXPERTS.get(cls)
            summary["matched"][name] = f"{known.name} ({cls})" if known else f"{cls} (by structure)"
            replaced += (name + ".",)
            continue
        if linear and isinstance(mod, nn.Linear) and not isinstance(mod, Linear):
            if name in routers:
                summary["routers"].append(name)
            elif type(mod) is not nn.Linear:
                skipped.append((name, cls, "an nn.Linear subclass with its own forward"))
            elif mod.weight.dtype not in DTYPES or (mod.bias is not None and mod.bias.dtype != mod.weight.dtype):
                skipped.append((name, cls, f"weights in {mod.weight.dtype}: gemmlab runs fp16/bf16"))
            else:
                swaps.append((name, Linear.sharing(mod, dispatch=dispatch)))
                summary["linear"].append(name)
                shape = [
                    mod.out_features,
                    mod.in_features,
                    str(mod.weight.dtype).removeprefix("torch."),
                    mod.bias is not None,
                ]
                if shape not in summary["linear_shapes"]:
                    summary["linear_shapes"].append(shape)
    if any(not name for name, _ in swaps):
        raise ValueError(
            "patch: the model itself is an experts module; patch its parent, or use gemmlab.nn.MoEExperts.sharing"
        )
    for name, new in swaps:
        model.set_submodule(name, new)
    if first is not None:  # then what patch made gemmlab's: experts, and Linears it would have kept in bf16
        then = fp8_swaps(model, **kinds)
        summary.update(fp8=first["fp8"] + then["fp8"], fp8_kept=then["kept"])
        skipped += then["skipped"]
    summary["skipped"] = [f"{path} ({cls}): {why}" for path, cls, why in skipped]
    if warn:
        _warn_skipped(skipped)
        if not swaps:
            warnings.warn(
                "gemmlab.patch: nothing replaced (no nn.Linear or MoE experts gemmlab runs)", UserWarning, stacklevel=2
            )
    return (model, summary) if return_summary else model
