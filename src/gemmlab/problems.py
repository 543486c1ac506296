"""Shape sets and MoE model configurations, as data.

A GEMM shape is (M, N, K): C (M, N) = A (M, K) @ B (K, N).
MoE legend: T tokens (= batch * seq_len), H hidden, I expert intermediate, E experts, k top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

Shape = tuple[int, int, int]

# The two seed stories: the competition's perf size, and the MoE-derived dense shape
# (M = batch 4 * seq_len 8192 * top_k 4, N = intermediate 2048, K = hidden 7168).
SEEDS: list[Shape] = [(8192, 8192, 16384), (131072, 2048, 7168)]
SQUARE: list[Shape] = [(4096, 4096, 4096), (8192, 8192, 8192)]
# Decode / MoE-expert regime: small M against LLM projection weights.
SMALL_M: list[Shape] = [(m, n, k) for m in (16, 64, 256) for (n, k) in ((7168, 2048), (4096, 4096))]
# LLM projections at 4096 prefill tokens (Llama-3-8B: qkv, o, gate+up, down) and a 70B-class gate+up.
LLM: list[Shape] = [(4096, 6144, 4096), (4096, 4096, 4096), (4096, 28672, 4096), (4096, 4096, 14336),
                    (4096, 57344, 8192)]
# The bar of issue 2: name -> (shapes, minimum ratio to cuBLAS, interleaved, fp16).
GEMM_BAR: dict[str, tuple[list[Shape], float]] = {
    "seeds": (SEEDS, 1.00),
    "square": (SQUARE, 0.97),
    "small-m": (SMALL_M, 0.90),
}

# Small shapes for the CPU interpreter (the `gemmlab` command without CUDA).
CPU_CHECK: list[Shape] = [(1, 1, 1), (37, 53, 71), (64, 96, 128), (300, 136, 72), (16, 256, 512)]


SUITES: dict[str, list[Shape]] = {"seeds": SEEDS, "square": SQUARE, "llm": LLM, "small-m": SMALL_M,
                                  "cpu": CPU_CHECK}


def suite(name: str) -> list[Shape]:
    """A named shape set; "all" is every GPU set (seeds, square, llm, small-m) without repeats."""
    if name == "all":
        return list(dict.fromkeys(SEEDS + SQUARE + LLM + SMALL_M))
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {sorted(SUITES) + ['all']}")
    return SUITES[name]


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


def moe_gemm_shape(batch_size: int, seq_len: int, top_k: int, hidden_size: int, intermediate_size: int) -> Shape:
    """The dense GEMM an MoE layer's first projection amounts to when every (token, expert) pair is a row
    (the seed's collect_gemm_table): M = batch_size * seq_len * top_k, N = intermediate, K = hidden."""
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("top_k", top_k),
                    ("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return batch_size * seq_len * top_k, intermediate_size, hidden_size


def parse_shape(text: str) -> Shape:
    """'M,N,K' or 'MxNxK' -> (M, N, K)."""
    parts = text.replace("x", ",").split(",")
    if len(parts) != 3:
        raise ValueError(f"shape {text!r}: expected M,N,K")
    m, n, k = (int(p) for p in parts)
    if min(m, n, k) < 0:
        raise ValueError(f"shape {text!r}: sizes must be >= 0")
    return m, n, k


def resolve_moe(model: str | None = None, top_k: int | None = None, hidden_size: int | None = None,
                intermediate_size: int | None = None) -> tuple[int, int, int]:
    """(top_k, hidden, intermediate): explicit values first, then the ``model`` preset, then the seed's
    defaults (top-k 4, hidden 7168, intermediate 2048)."""
    if model is not None and model not in MOE_MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MOE_MODELS)}")
    preset = MOE_MODELS.get(model) if model else MoEModel(hidden=7168, intermediate=2048, experts=0, top_k=4)
    return (preset.top_k if top_k is None else top_k, preset.hidden if hidden_size is None else hidden_size,
            preset.intermediate if intermediate_size is None else intermediate_size)
