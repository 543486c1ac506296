"""Open models' layer sizes, as data (from their config.json): the dense projections as nn.Linear shapes
(``MODEL_LINEARS``) and the MoE layers (``MOE_MODELS``). ``problems`` builds suites and inputs from them.

MoE legend: H hidden, I expert intermediate, E experts, k top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

# Ten open models' dense projections as nn.Linear (out_features N, in_features K), from their config.json:
# H hidden, q/kv heads x head_dim, I intermediate. QKV fused (N = (heads + 2 kv_heads) * head_dim), gate+up fused
# (N = 2I), O (K = heads * head_dim), down (K = I).
#   llama3-8b    H 4096, 32/8 heads x 128, I 14336        mistral-7b: the same sizes (its own M rotation)
#   llama3-70b   H 8192, 64/8 x 128, I 28672              mixtral-8x7b: llama3-8b's sizes per expert, router 8
#   qwen2.5-7b   H 3584, 28/4 x 128, I 18944              qwen3-32b: H 5120, 64/8 x 128, I 25600
#   gemma2-9b    H 3584, 16/8 x 256, I 14336              phi3-mini: H 3072, 32/32 x 96, I 8192
#   deepseek-v3  H 7168, MLA (q_lora 1536, kv_lora 512 + rope 64, 128 heads: q_b 128 x 192, kv_b 128 x 256,
#                v 128), dense MLP I 18432 (its first three layers)
#   gpt-oss-20b  attention only (its experts are MoE): H 2880, 64/8 x 64; router 32 experts
MODEL_LINEARS: dict[str, dict[str, tuple[int, int]]] = {
    "llama3-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate+up": (28672, 4096), "down": (4096, 14336)},
    "llama3-70b": {"qkv": (10240, 8192), "o": (8192, 8192), "gate+up": (57344, 8192), "down": (8192, 28672)},
    "mistral-7b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate+up": (28672, 4096), "down": (4096, 14336)},
    "mixtral-8x7b": {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "w1+w3": (28672, 4096),
        "w2": (4096, 14336),
        "router": (8, 4096),
    },
    "qwen2.5-7b": {"qkv": (4608, 3584), "o": (3584, 3584), "gate+up": (37888, 3584), "down": (3584, 18944)},
    "qwen3-32b": {"qkv": (10240, 5120), "o": (5120, 8192), "gate+up": (51200, 5120), "down": (5120, 25600)},
    "gemma2-9b": {"qkv": (8192, 3584), "o": (3584, 4096), "gate+up": (28672, 3584), "down": (3584, 14336)},
    "phi3-mini": {"qkv": (9216, 3072), "o": (3072, 3072), "gate+up": (16384, 3072), "down": (3072, 8192)},
    "deepseek-v3": {
        "kv_a": (576, 7168),
        "q_b": (24576, 1536),
        "o": (7168, 16384),
        "gate+up": (36864, 7168),
        "down": (7168, 18432),
        "kv_b": (32768, 512),
        "q_a": (1536, 7168),
    },
    "gpt-oss-20b": {"qkv": (5120, 2880), "o": (2880, 4096), "router": (32, 2880)},
}


@dataclass(frozen=True)
class MoEModel:
    """The MoE layer sizes of a model: H hidden, I expert intermediate, E experts, k top-k."""

    hidden: int
    intermediate: int
    experts: int
    top_k: int


MOE_MODELS: dict[str, MoEModel] = {
    "deepseek-v3": MoEModel(hidden=7168, intermediate=2048, experts=256, top_k=8),
    "mixtral-8x7b": MoEModel(hidden=4096, intermediate=14336, experts=8, top_k=2),
    "qwen3-30b-a3b": MoEModel(hidden=2048, intermediate=768, experts=128, top_k=8),
    "olmoe-1b-7b": MoEModel(hidden=2048, intermediate=1024, experts=64, top_k=8),
    # gpt-oss-120b's expert sizes in our layout (its SwiGLU is clamped, biased and interleaved; ours is not)
    "gpt-oss-120b-like": MoEModel(hidden=2880, intermediate=2880, experts=128, top_k=4),
}
