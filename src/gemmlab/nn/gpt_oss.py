"""``MoEExpertsOAI``: gpt-oss's experts (transformers' GptOssExperts layout) through ``gemmlab.moe_forward``'s
``activation="swiglu_oai"``. Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k.

    gate_up_proj (E, H, 2I), gate and up columns interleaved (gate [..., ::2], up [..., 1::2]); gate_up_proj_bias
    (E, 2I); down_proj (E, I, H); down_proj_bias (E, H); alpha (1.702), limit (config.swiglu_limit)
    forward(hidden_states (T, H), router_indices (T, k), routing_weights (T, k)) -> (T, H)
        y[t] = sum_j w[t, j] * (act(x[t] @ gate_up_e + b_e) @ down_e + c_e),  e = router_indices[t, j]
        act: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit)

fp16/bf16 run ``moe_forward`` on transposed views of the Parameters (``interleaved=True``; nothing is kept, so an
optimizer step is seen on the next call, and gradients reach every Parameter). The grouped GEMM reads (E, N, K)
weights with unit K stride, so each call makes a transposed contiguous copy of both expert weights (and its
backward again): correct, but a weight-sized copy per call; inference that can hold a second layout packs once
instead (``pack_moe_weights(gate_up_proj.transpose(1, 2), down_proj.transpose(1, 2), interleaved=True)``). Other
dtypes run a torch loop over the experts hit (what GptOssExperts computes). ``patch`` swaps a GptOssExperts for
one sharing its Parameters (``sharing``); ``oai_fit`` says why one cannot be swapped.
"""

from __future__ import annotations

import torch
from torch import nn

from gemmlab.nn.linear import DTYPES, bad_input, check_dtype, check_dtypes, check_sizes, gemmlab_runs
from gemmlab.ops import moe as ops_moe

PARAMS = ("down_proj", "down_proj_bias", "gate_up_proj", "gate_up_proj_bias")


def oai_fit(mod: nn.Module) -> str | None:
    """Why a gpt-oss experts module cannot run as MoEExpertsOAI, or None when it can."""
    names = sorted(n for n, _ in mod.named_parameters())
    if names != list(PARAMS):
        return f"parameters {names}: MoEExpertsOAI reads {', '.join(PARAMS)}"
    gu, gb, dn, db = mod.gate_up_proj, mod.gate_up_proj_bias, mod.down_proj, mod.down_proj_bias
    e, h, i2 = gu.shape if gu.dim() == 3 else (0, 0, 0)
    if gu.dim() != 3 or i2 % 2 or tuple(dn.shape) != (e, i2 // 2, h):
        return f"expert weights {tuple(gu.shape)}, {tuple(dn.shape)} are not (E, H, 2I), (E, I, H)"
    if tuple(gb.shape) != (e, i2) or tuple(db.shape) != (e, h):
        return f"expert biases {tuple(gb.shape)}, {tuple(db.shape)} are not (E, 2I), (E, H)"
    if gu.dtype not in DTYPES or any(t.dtype != gu.dtype for t in (gb, dn, db)):
        return f"expert weights in {gu.dtype}: gemmlab runs fp16/bf16 (all four in one dtype)"
    for name in ("alpha", "limit"):
        v = getattr(mod, name, None)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"no numeric {name} attribute (got {v!r})"
    if getattr(mod, "_is_expert_parallel", False):
        return "sharded expert-parallel"
    return None


def _oai_torch(x, gu, gb, dn, db, weights, ids, alpha, limit) -> torch.Tensor:
    """The fallback (fp32, CPU without the interpreter), in x's dtype, as GptOssExperts computes it."""
    y = torch.zeros_like(x)
    hit = torch.unique(ids).tolist()  # a host sync: this path is not the fast one
    if hit and not (0 <= hit[0] and hit[-1] < gu.shape[0]):
        raise ValueError(f"moe: topk_ids must be in [0, E={gu.shape[0]}), got ids {hit[0]}..{hit[-1]}")
    for e in hit:
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        g = x[tok] @ gu[e] + gb[e]
        gate, up = g[:, 0::2].clamp(max=limit), g[:, 1::2].clamp(-limit, limit)
        o = ((up + 1) * (gate * torch.sigmoid(gate * alpha))) @ dn[e] + db[e]
        y = y.index_add(0, tok, o * weights[tok, slot, None].to(x.dtype))
    return y


def oai_forward(experts: nn.Module, hidden_states, router_indices, routing_weights) -> torch.Tensor:
    """gemmlab's forward of a gpt-oss experts module (``oai_fit`` passed, fp16/bf16): ``moe_forward`` with
    activation="swiglu_oai" on transposed views of its Parameters, ids checked on the device."""
    return ops_moe.moe_forward(
        hidden_states,
        experts.gate_up_proj.transpose(1, 2),
        experts.down_proj.transpose(1, 2),
        routing_weights,
        router_indices,
        validate=True,
        activation="swiglu_oai",
        alpha=float(experts.alpha),
        limit=float(experts.limit),
        w1_bias=experts.gate_up_proj_bias,
        w2_bias=experts.down_proj_bias,
        interleaved=True,
    )


class MoEExpertsOAI(nn.Module):
    """E gpt-oss experts (see the module docstring); forward through ``gemmlab.moe_forward`` (fp16/bf16)."""

    def __init__(
        self,
        num_experts: int,
        hidden: int,
        intermediate: int,
        *,
        alpha: float = 1.702,
        limit: float = 7.0,
        device=None,
        dtype=None,
    ):
        check_sizes("MoEExpertsOAI", 1, num_experts=num_experts, hidden=hidden, intermediate=intermediate)
        check_dtype("MoEExpertsOAI", dtype)
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden, intermediate
        self.alpha, self.limit = float(alpha), float(limit)
        self.gate_up_proj = nn.Parameter(torch.zeros(num_experts, hidden, 2 * intermediate, **kw))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, 2 * intermediate, **kw))
        self.down_proj = nn.Parameter(torch.zeros(num_experts, intermediate, hidden, **kw))
        self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden, **kw))

    def forward(
        self, hidden_states: torch.Tensor, router_indices: torch.Tensor, routing_weights: torch.Tensor
    ) -> torch.Tensor:
        """hidden_states (T, H) or (..., H); router_indices, routing_weights (T, k) or (..., k)."""
        gu, gb, dn, db = self.gate_up_proj, self.gate_up_proj_bias, self.down_proj, self.down_proj_bias
        h = gu.shape[1]
        if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() == 0 or hidden_states.shape[-1] != h:
            raise bad_input("MoEExpertsOAI", hidden_states, h, "hidden")
        if hidden_states.dtype != gu.dtype:
            check_dtypes("MoEExpertsOAI", hidden_states, gu)
        if not gemmlab_runs(hidden_states, gu, gb, dn, db):
            k = router_indices.shape[-1]
            x2, w2, i2 = hidden_states.reshape(-1, h), routing_weights.reshape(-1, k), router_indices.reshape(-1, k)
            y = _oai_torch(x2, gu, gb, dn, db, w2, i2, self.alpha, self.limit)
            return y.view(hidden_states.shape)
        return oai_forward(self, hidden_states, router_indices, routing_weights)

    @classmethod
    def sharing(cls, experts: nn.Module) -> MoEExpertsOAI:
        """MoEExpertsOAI holding a GptOssExperts' own Parameters, alpha and limit (``oai_fit`` must pass)."""
        e, h, i2 = experts.gate_up_proj.shape
        new = cls(e, h, i2 // 2, alpha=experts.alpha, limit=experts.limit, device="meta")
        for name in PARAMS:
            setattr(new, name, getattr(experts, name))
        new.train(experts.training)
        return new

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, hidden={self.hidden_dim}, intermediate={self.intermediate_dim}, "
            f"alpha={self.alpha}, limit={self.limit}"
        )
