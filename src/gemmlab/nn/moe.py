"""``MoEExperts`` (E SwiGLU experts, transformers 5's layout) and ``MoE`` (router + experts).

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k.

    MoEExperts: gate_up_proj (E, 2I, H) (gate rows [0, I), up rows [I, 2I)), down_proj (E, H, I);
        forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)
        y[t] = sum_j w[t, j] * down_e (silu(gate_e x[t]) * up_e x[t]),  e = top_k_index[t, j]
    MoE: gate (a Linear, weight (E, H), no bias) + experts; route (softmax or sigmoid, top-k, renormalized) then
        experts; x (..., H).

fp16/bf16 run ``gemmlab.moe_forward`` (its expert-id check on: ids outside [0, E) raise, checked on the device
without a host sync; a device-side assert on a GPU); other dtypes a torch loop over the experts hit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gemmlab.nn.linear import Linear, bad_input, check_dtype, check_dtypes, check_sizes, gemmlab_runs
from gemmlab.ops import moe as ops_moe


def _experts_torch(x, w1, w2, weights, ids) -> torch.Tensor:
    """The fallback (fp32, CPU without the interpreter): a loop over the experts hit, in x's dtype. x (T, H),
    ids and weights (T, k)."""
    e_count, i = w1.shape[0], w2.shape[2]
    y = torch.zeros_like(x)
    hit = torch.unique(ids).tolist()  # a host sync: this path is not the fast one
    if hit and not (0 <= hit[0] and hit[-1] < e_count):
        raise ValueError(f"moe: topk_ids must be in [0, E={e_count}), got ids {hit[0]}..{hit[-1]}")
    for e in hit:
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        gate, up = F.linear(x[tok], w1[e]).split(i, dim=-1)
        o = F.linear(F.silu(gate) * up, w2[e]) * weights[tok, slot, None].to(x.dtype)
        y = y.index_add(0, tok, o)
    return y


class MoEExperts(nn.Module):
    """E SwiGLU experts: ``gate_up_proj`` (E, 2I, H), ``down_proj`` (E, H, I); forward through
    ``gemmlab.moe_forward`` (fp16/bf16) or a torch loop (other dtypes)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, device=None, dtype=None):
        check_sizes("MoEExperts", 1, num_experts=num_experts, hidden=hidden, intermediate=intermediate)
        check_dtype("MoEExperts", dtype)
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

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """hidden_states (T, H) or (..., H); top_k_index, top_k_weights (T, k) or (..., k)."""
        w1, w2 = self.gate_up_proj, self.down_proj
        if (
            not isinstance(hidden_states, torch.Tensor)
            or hidden_states.dim() == 0
            or hidden_states.shape[-1] != w1.shape[2]
        ):
            raise bad_input("MoEExperts", hidden_states, w1.shape[2], "hidden")
        if hidden_states.dtype != w1.dtype:
            check_dtypes("MoEExperts", hidden_states, w1)
        if not gemmlab_runs(hidden_states, w1, w2):
            h = hidden_states.shape[-1]
            k = top_k_index.shape[-1]
            y = _experts_torch(
                hidden_states.reshape(-1, h), w1, w2, top_k_weights.reshape(-1, k), top_k_index.reshape(-1, k)
            )
            return y.view(hidden_states.shape)
        # validate: the ids are checked on the device, inside the op (no host sync; eager, autograd and compiled)
        return ops_moe.moe_forward(hidden_states, w1, w2, top_k_weights, top_k_index, validate=True)

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
    ``torch.distributed.group.WORLD``): expert parallel, ``experts`` holds only this rank's E / world experts
    (``gemmlab.distributed.expert_range``: rows [first, end) of the full tensors) and forward goes through
    ``gemmlab.distributed.moe_forward_ep`` (collective; forward only, fp16/bf16)."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        num_experts: int,
        top_k: int,
        *,
        renormalize: bool = True,
        scoring: str = "softmax",
        device=None,
        dtype=None,
        ep_group=None,
    ):
        super().__init__()
        check_sizes("MoE", 1, hidden=hidden, intermediate=intermediate, num_experts=num_experts, top_k=top_k)
        check_dtype("MoE", dtype)
        if scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"MoE: scoring {scoring!r}: softmax or sigmoid")
        if not isinstance(renormalize, bool):
            raise TypeError(f"MoE: renormalize must be a bool, got {renormalize!r}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"MoE: top_k = {top_k} must be in [1, num_experts={num_experts}]")
        self.top_k, self.renormalize, self.scoring = top_k, renormalize, scoring
        self.gate = Linear(hidden, num_experts, bias=False, device=device, dtype=dtype)
        self.ep_group = ep_group
        if ep_group is not None:
            from gemmlab.distributed import expert_range

            first, end = expert_range(num_experts, ep_group)  # ValueError when E does not divide evenly
        self.experts = MoEExperts(
            num_experts if ep_group is None else end - first, hidden, intermediate, device=device, dtype=dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.gate.in_features:
            raise bad_input("MoE", x, self.gate.in_features, "hidden")
        if x.dtype != self.gate.weight.dtype:
            check_dtypes("MoE", x, self.gate.weight)
        x2 = x.reshape(-1, x.shape[-1])  # (T, H)
        weights, ids = ops_moe.route(self.gate(x2), self.top_k, renormalize=self.renormalize, scoring=self.scoring)
        if self.ep_group is not None:
            from gemmlab.distributed import moe_forward_ep

            e = self.experts
            return moe_forward_ep(x2, e.gate_up_proj, e.down_proj, weights, ids, self.ep_group).reshape(x.shape)
        return self.experts(x2, ids, weights).reshape(x.shape)

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, renormalize={self.renormalize}, scoring={self.scoring!r}"
