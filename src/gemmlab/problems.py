"""Shape sets as data. A GEMM shape is (M, N, K): C (M, N) = A (M, K) @ B (K, N)."""

from __future__ import annotations

Shape = tuple[int, int, int]

# The two seed stories: the competition's perf size, and the MoE-derived dense shape
# (M = batch 4 * seq_len 8192 * top_k 4, N = intermediate 2048, K = hidden 7168).
SEEDS: list[Shape] = [(8192, 8192, 16384), (131072, 2048, 7168)]
SQUARE: list[Shape] = [(4096, 4096, 4096), (8192, 8192, 8192)]
# Decode / MoE-expert regime: small M against LLM projection weights.
SMALL_M: list[Shape] = [(m, n, k) for m in (16, 64, 256) for (n, k) in ((7168, 2048), (4096, 4096))]
# The bar of issue 2: name -> (shapes, minimum ratio to cuBLAS, interleaved, fp16).
GEMM_BAR: dict[str, tuple[list[Shape], float]] = {
    "seeds": (SEEDS, 1.00),
    "square": (SQUARE, 0.97),
    "small-m": (SMALL_M, 0.90),
}

# Small shapes for the CPU interpreter (the `gemmlab` command without CUDA).
CPU_CHECK: list[Shape] = [(1, 1, 1), (37, 53, 71), (64, 96, 128), (300, 136, 72), (16, 256, 512)]


def suite(name: str) -> list[Shape]:
    sets = {"seeds": SEEDS, "square": SQUARE, "small-m": SMALL_M, "cpu": CPU_CHECK}
    if name == "all":
        return SEEDS + SQUARE + SMALL_M
    if name not in sets:
        raise ValueError(f"unknown suite {name!r}; known: {sorted(sets) + ['all']}")
    return sets[name]


def parse_shape(text: str) -> Shape:
    """'M,N,K' or 'MxNxK' -> (M, N, K)."""
    parts = text.replace("x", ",").split(",")
    if len(parts) != 3:
        raise ValueError(f"shape {text!r}: expected M,N,K")
    m, n, k = (int(p) for p in parts)
    if min(m, n, k) < 0:
        raise ValueError(f"shape {text!r}: sizes must be >= 0")
    return m, n, k
