"""Drop-in modules: ``Linear``, ``MoEExperts``, ``MoE``; and ``patch(model)`` for Hugging Face models.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k.

    Linear(in_features, out_features, bias=True, device=None, dtype=None)   an nn.Linear (subclass): same
        parameters ``weight`` (out, in) and ``bias`` (out,), so an nn.Linear state_dict loads unchanged;
        forward y (..., out) = x (..., in) @ weight^T + bias through ``gemmlab.gemm`` (weight^T is a strided
        view: no copy). fp16/bf16 on CUDA (or the CPU interpreter) go to gemmlab; anything else (fp32,
        CPU without the interpreter, mixed dtypes) falls back to ``F.linear``.
    MoEExperts(num_experts, hidden, intermediate)  parameters ``gate_up_proj`` (E, 2I, H) (gate rows [0, I),
        up rows [I, 2I)) and ``down_proj`` (E, H, I), as transformers 5 stores them; forward(x (T, H),
        top_k_index (T, k), top_k_weights (T, k)) -> (T, H) through ``gemmlab.moe_forward`` (SiLU gate).
    MoE(hidden, intermediate, num_experts, top_k)  ``gate`` (a Linear E x H, no bias) + ``experts``:
        route (``gemmlab.route``: softmax or sigmoid, top-k, renormalized) then experts; x (..., H).
        ``ep_group=group``: expert parallel over a torch.distributed group: ``experts`` holds only this rank's
        E / world experts (``gemmlab.distributed.expert_range``: rows [first, end) of the full tensors) and
        forward goes through ``gemmlab.distributed.moe_forward_ep`` (collective; forward only, fp16/bf16).
    patch(model)  swaps nn.Linear (fp16/bf16) for Linear and the MoE blocks of Mixtral, Qwen3-MoE, OLMoE
        (whole block -> MoE) and DeepSeek-V3 (its own router, group-limited sigmoid and shared experts kept;
        experts -> MoEExperts), sharing the model's Parameter objects: nothing is copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DTYPES = (torch.float16, torch.bfloat16)


def _interpreting() -> bool:
    from triton import knobs

    return bool(knobs.runtime.interpret)


# read once (torch.compile cannot trace Triton's environment knobs); kernels choose at their import too
_INTERPRET = _interpreting()


def _on_gemmlab(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """True when gemmlab can run this call: fp16/bf16, one dtype, on CUDA or the CPU interpreter."""
    if x.dtype not in DTYPES or any(w.dtype != x.dtype for w in weights):
        return False
    if x.device.type == "cuda":
        return True
    return x.device.type == "cpu" and _INTERPRET


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(..., K) -> (M, K) for gemm: a view where one exists, with one unit-stride dim."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1 and x2.stride(0) != 1:
        x2 = x2.contiguous()
    return x2


class Linear(nn.Linear):
    """``nn.Linear`` computed by ``gemmlab.gemm`` (fp16/bf16; other dtypes: ``F.linear``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight  # (out, in)
        if not _on_gemmlab(x, w) or (self.bias is not None and self.bias.dtype != x.dtype):
            return F.linear(x, w, self.bias)
        from gemmlab.ops.gemm import gemm

        y = gemm(_rows(x), w.t())  # (M, out); w.t() is the (in, out) strided view, no copy
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], w.shape[0])

    @classmethod
    def sharing(cls, linear: nn.Linear) -> Linear:
        """A Linear holding ``linear``'s own Parameter objects (no copy; training updates both)."""
        new = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new


def _experts_torch(x, w1, w2, weights, ids) -> torch.Tensor:
    """The fallback (fp32, CPU without the interpreter): a loop over the experts hit, in x's dtype."""
    i = w2.shape[2]
    y = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        gate, up = F.linear(x[tok], w1[e]).split(i, dim=-1)
        o = F.linear(F.silu(gate) * up, w2[e]) * weights[tok, slot, None].to(x.dtype)
        y = y.index_add(0, tok, o)
    return y


class MoEExperts(nn.Module):
    """E SwiGLU experts: ``gate_up_proj`` (E, 2I, H), ``down_proj`` (E, H, I); forward through
    ``gemmlab.moe_forward`` (fp16/bf16) or a torch loop (other dtypes)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden, intermediate
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden, **kw))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.gate_up_proj, self.down_proj):  # each expert as nn.Linear initializes its weight
            if w.device.type != "meta":
                bound = w.shape[2] ** -0.5
                nn.init.uniform_(w, -bound, bound)

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        w1, w2 = self.gate_up_proj, self.down_proj
        if not _on_gemmlab(x, w1, w2):
            return _experts_torch(x, w1, w2, top_k_weights, top_k_index)
        from gemmlab.ops.moe import moe_forward

        # ids come from a router's top-k: in range by construction, so no host-side check (no sync)
        return moe_forward(x, w1, w2, top_k_weights, top_k_index, validate=False)

    @classmethod
    def sharing(cls, experts: nn.Module) -> MoEExperts:
        """MoEExperts holding a transformers 5 experts module's own ``gate_up_proj`` / ``down_proj``."""
        e, i2, h = experts.gate_up_proj.shape
        new = cls(e, h, i2 // 2, device="meta")
        new.gate_up_proj, new.down_proj = experts.gate_up_proj, experts.down_proj
        new.train(experts.training)
        return new

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.hidden_dim}, intermediate={self.intermediate_dim}"


class MoE(nn.Module):
    """Router + experts: y (..., H) = sum over the top-k experts e of x of weight_e * expert_e(x).
    ``scoring``: "softmax" (Mixtral, Qwen3-MoE, OLMoE) or "sigmoid"; ``renormalize``: the k weights of a
    token sum to 1. Parameter names as in transformers' MoE blocks: ``gate.weight`` (E, H),
    ``experts.gate_up_proj``, ``experts.down_proj``. ``ep_group``: a process group (e.g.
    ``torch.distributed.group.WORLD``): expert-parallel mode, this rank's experts only (see the module legend)."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, *, renormalize: bool = True,
                 scoring: str = "softmax", device=None, dtype=None, ep_group=None):
        super().__init__()
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"MoE: scoring {scoring!r}: softmax or sigmoid")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"MoE: top_k = {top_k} must be in [1, num_experts={num_experts}]")
        self.top_k, self.renormalize, self.scoring = top_k, renormalize, scoring
        self.gate = Linear(hidden, num_experts, bias=False, device=device, dtype=dtype)
        self.ep_group = ep_group
        if ep_group is not None:
            from gemmlab.distributed import expert_range

            first, end = expert_range(num_experts, ep_group)  # ValueError when E does not divide evenly
        self.experts = MoEExperts(num_experts if ep_group is None else end - first, hidden, intermediate,
                                  device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from gemmlab.ops.moe import route

        x2 = x.reshape(-1, x.shape[-1])  # (T, H)
        weights, ids = route(self.gate(x2), self.top_k, renormalize=self.renormalize, scoring=self.scoring)
        if self.ep_group is not None:
            from gemmlab.distributed import moe_forward_ep

            e = self.experts
            return moe_forward_ep(x2, e.gate_up_proj, e.down_proj, weights, ids, self.ep_group).reshape(x.shape)
        return self.experts(x2, ids, weights).reshape(x.shape)

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, renormalize={self.renormalize}, scoring={self.scoring!r}"


# ------------------------------------------------------------------------------------------------- patch
# One row per Hugging Face MoE block (transformers 5: experts stored fused as 3-D Parameters, the layout
# moe_forward reads). "block": the whole block becomes a MoE (the router's softmax top-k is route's);
# "experts": only block.experts is swapped, the model's own router (and anything else) stays.
HF_MOE_BLOCKS = {
    "MixtralSparseMoeBlock": "block",
    "Qwen3MoeSparseMoeBlock": "block",
    "OlmoeSparseMoeBlock": "block",
    "DeepseekV3MoE": "experts",  # group-limited sigmoid routing with a score-correction bias, scaled weights
}


def _experts_fit(experts: nn.Module) -> str | None:
    """Why a transformers experts module cannot run as MoEExperts, or None when it can."""
    w1, w2 = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if not isinstance(w1, torch.Tensor) or not isinstance(w2, torch.Tensor):
        return ("experts are not stored fused as 3-D gate_up_proj/down_proj (transformers < 5 keeps one "
                "module per expert; stacking them would copy the weights): not patched")
    if getattr(experts, "is_transposed", False) or not getattr(experts, "is_concatenated", True) \
            or getattr(experts, "has_bias", False) or not getattr(experts, "has_gate", True):
        return "experts are transposed, interleaved, gateless or biased: not the (E, 2I, H) SwiGLU layout"
    if w1.dim() != 3 or w2.dim() != 3 or w1.shape[0] != w2.shape[0] or w1.shape[1] != 2 * w2.shape[2] \
            or w1.shape[2] != w2.shape[1]:
        return f"expert weights {tuple(w1.shape)}, {tuple(w2.shape)} are not (E, 2I, H), (E, H, I)"
    if type(getattr(experts, "act_fn", nn.SiLU())).__name__ not in ("SiLU", "SiLUActivation"):
        return f"activation {type(experts.act_fn).__name__}: moe_forward computes SiLU(gate) * up"
    if w1.dtype not in DTYPES or w2.dtype != w1.dtype:
        return f"expert weights in {w1.dtype}: gemmlab runs fp16/bf16"
    return None


def _moe_from_block(block: nn.Module) -> MoE | None:
    """A MoE sharing a softmax-routed block's router weight and experts; None when its routing differs
    (router jitter noise in training)."""
    gate, experts = block.gate, block.experts
    if getattr(block, "jitter_noise", 0) or gate.weight.dtype != experts.gate_up_proj.dtype:
        return None
    e, i2, h = experts.gate_up_proj.shape
    moe = MoE(h, i2 // 2, e, gate.top_k, renormalize=bool(getattr(gate, "norm_topk_prob", True)), device="meta")
    moe.gate.weight = gate.weight
    moe.experts = MoEExperts.sharing(experts)
    moe.train(block.training)
    return moe


def patch(model: nn.Module, *, moe: str = "auto", linear: bool = True, return_summary: bool = False):
    """Swap ``model``'s fp16/bf16 ``nn.Linear`` modules for ``Linear`` and its Hugging Face MoE blocks (see
    ``HF_MOE_BLOCKS``) for gemmlab ones, in place, sharing the model's Parameter objects (no copy).
    ``moe``: "auto" (per ``HF_MOE_BLOCKS``; experts only when the model's config asks for its router logits),
    "experts" (swap only the experts everywhere: every model keeps its own router, and the router logits
    transformers records for its auxiliary loss), "none".
    Returns the model, or (model, summary) with ``return_summary``: what was replaced and what was not, why."""
    if moe not in ("auto", "experts", "none"):
        raise ValueError(f"patch: moe {moe!r}: auto, experts or none")
    summary: dict[str, list[str]] = {"linear": [], "moe_block": [], "moe_experts": [], "skipped": []}
    # a model that returns its router logits (the auxiliary load-balancing loss) records them from its own
    # router modules: keep those
    keep_routers = bool(getattr(getattr(model, "config", None), "output_router_logits", False))
    swaps: list[tuple[str, nn.Module]] = []  # (submodule path, its replacement)
    for name, mod in model.named_modules():
        kind = HF_MOE_BLOCKS.get(type(mod).__name__) if moe != "none" else None
        if kind is not None:
            why = _experts_fit(getattr(mod, "experts", None))
            if why:
                summary["skipped"].append(f"{name}: {why}")
                continue
            new = _moe_from_block(mod) if kind == "block" and moe == "auto" and not keep_routers else None
            if new is not None:
                swaps.append((name, new))
                summary["moe_block"].append(name)
            else:
                path = f"{name}.experts" if name else "experts"
                swaps.append((path, MoEExperts.sharing(mod.experts)))
                summary["moe_experts"].append(path)
    replaced = tuple(n + "." for n in summary["moe_block"])
    for name, mod in model.named_modules():
        if (linear and type(mod) is nn.Linear and mod.weight.dtype in DTYPES and not name.startswith(replaced)):
            swaps.append((name, Linear.sharing(mod)))
            summary["linear"].append(name)
    if any(not name for name, _ in swaps):
        raise ValueError("patch: the model itself is an nn.Linear or MoE block; patch its parent, or use "
                         "gemmlab.nn.Linear.sharing / MoEExperts.sharing")
    for name, new in swaps:
        model.set_submodule(name, new)
    return (model, summary) if return_summary else model
