"""Shape sets and GEMM cases as data (the models' layer sizes they use: ``models``), and the one generator of
their inputs.

A GEMM shape is (M, N, K): C (M, N) = A (M, K) @ B (K, N). A case (``Case``) is a shape with its dtype, B's
layout ("row" or the nn.Linear "linear") and its storage (padded rows, an offset base); ``cases(name)`` gives
the broad suite (issue 14: odd, prime, unaligned, decode to prefill, the LLM projections, the seeds).
MoE legend: T tokens (= batch * seq_len), H hidden, I expert intermediate, E experts, k top-k.

Inputs (every test, bench, tuner and the grader draw here, from a generator or seed the caller owns; they live
in ``gemmlab.operands`` and are importable from here):
    draw(shape, dist, gen, dtype)            a contiguous tensor of one of ``DISTRIBUTIONS``
    matrix(rows, cols, dist, gen, dtype)     an operand in its storage (column-major, padded rows, offset)
    gemm_operands(m, n, k, dtype, device)    A, B as the benches draw them: "centered", seeded by the shape
    moe_inputs(model, tokens, routing)       x, w1, w2 and a routing (weights, ids); ``moe_tokens``: new x
                                             and routing for weights drawn before
    fp8_operands(m, n, k, kind, per_row)     e4m3 A (M, K), B^T (N, K) and their fp32 scales
"""

from __future__ import annotations

from dataclasses import dataclass

from gemmlab.models import MODEL_LINEARS, MOE_MODELS, MoEModel
from gemmlab.operands import (
    DISTRIBUTIONS,
    FP8_KINDS,
    LAYOUTS,
    case_operands,
    draw,
    fp8_operands,
    gemm_operands,
    generator,
    matrix,
    moe_inputs,
    moe_tokens,
    routing_logits,
    shape_seed,
)

__all__ = [
    "BROAD",
    "BROAD_CPU",
    "BROAD_ISSUE",
    "BROAD_LLM",
    "BROAD_ODD",
    "BROAD_QUICK",
    "BROAD_QUICK_LABELS",
    "BROAD_UNALIGNED",
    "CASE_DTYPES",
    "CASE_SUITES",
    "CPU_CHECK",
    "Case",
    "DENSE",
    "DISTRIBUTIONS",
    "FP8_KINDS",
    "LAYOUTS",
    "LLM",
    "MODEL_LINEARS",
    "MODEL_M",
    "MOE_MODELS",
    "MoEModel",
    "SEEDS",
    "SMALL_M",
    "SQUARE",
    "SUITES",
    "Shape",
    "case_operands",
    "cases",
    "draw",
    "fp8_operands",
    "gemm_operands",
    "generator",
    "matrix",
    "model_cases",
    "moe_gemm_shape",
    "moe_inputs",
    "moe_tokens",
    "parse_shape",
    "resolve_moe",
    "routing_logits",
    "shape_seed",
    "suite",
]

Shape = tuple[int, int, int]

# The two seed stories: the competition's perf size, and the MoE-derived dense shape
# (M = batch 4 * seq_len 8192 * top_k 4, N = intermediate 2048, K = hidden 7168).
SEEDS: list[Shape] = [(8192, 8192, 16384), (131072, 2048, 7168)]
SQUARE: list[Shape] = [(4096, 4096, 4096), (8192, 8192, 8192)]
# Decode / MoE-expert regime: small M against LLM projection weights.
SMALL_M: list[Shape] = [(m, n, k) for m in (16, 64, 256) for (n, k) in ((7168, 2048), (4096, 4096))]
# LLM projections at 4096 prefill tokens (Llama-3-8B: qkv, o, gate+up, down) and a 70B-class gate+up.
LLM: list[Shape] = [
    (4096, 6144, 4096),
    (4096, 4096, 4096),
    (4096, 28672, 4096),
    (4096, 4096, 14336),
    (4096, 57344, 8192),
]
# Small shapes for the CPU interpreter (the `gemmlab` command without CUDA).
CPU_CHECK: list[Shape] = [(1, 1, 1), (37, 53, 71), (64, 96, 128), (300, 136, 72), (16, 256, 512)]


SUITES: dict[str, list[Shape]] = {"seeds": SEEDS, "square": SQUARE, "llm": LLM, "small-m": SMALL_M, "cpu": CPU_CHECK}


def suite(name: str) -> list[Shape]:
    """A named shape set; "all" is every GPU set (seeds, square, llm, small-m) without repeats. A case suite
    (broad, broad-quick, broad-cpu, dense) gives its shapes without repeats (``cases`` keeps dtype and layout)."""
    if name == "all":
        return list(dict.fromkeys(SEEDS + SQUARE + LLM + SMALL_M))
    if name in CASE_SUITES:
        return list(dict.fromkeys(c.shape for c in CASE_SUITES[name]))
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {sorted(SUITES) + ['all'] + sorted(CASE_SUITES)}")
    return SUITES[name]


# ------------------------------------------------------------------------------------------------ cases
# A case is a shape with its dtype and operand layout: what a caller actually hands to a GEMM.
CASE_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class Case:
    """One GEMM problem C (M, N) = A (M, K) @ B (K, N) as a caller hands it over.

    layout "row": B (K, N) row-major. "linear": the nn.Linear layout, B = W^T with W (N, K) contiguous
    (B is a column-major view, strides (1, K)). ``pad``: extra elements at the end of every stored row of
    A and of B's storage (A's row stride K + pad, W's K + pad, row B's N + pad): A and B are slices of wider
    buffers, an odd pad breaks the 16-byte alignment of every row. ``offset``: elements before the first one
    (the base address is then misaligned by offset * 2 bytes). ``note`` says where the shape comes from."""

    m: int
    n: int
    k: int
    dtype: str = "float16"
    layout: str = "row"
    pad: int = 0
    offset: int = 0
    note: str = ""

    def __post_init__(self):
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"case {name} must be an integer >= 0, got {v!r}")
        if self.dtype not in CASE_DTYPES:
            raise ValueError(f"case dtype {self.dtype!r}: one of {', '.join(CASE_DTYPES)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"case layout {self.layout!r}: one of {', '.join(LAYOUTS)}")
        if self.pad < 0 or self.offset < 0:
            raise ValueError(f"case pad {self.pad} / offset {self.offset}: must be >= 0")

    @property
    def shape(self) -> Shape:
        return self.m, self.n, self.k

    @property
    def aligned(self) -> bool:
        """Every row of A and B starts 16-byte aligned (2-byte elements: the row strides and the offset are
        multiples of 8)."""
        b_ld = self.k if self.layout == "linear" else self.n
        return all(v % 8 == 0 for v in (self.k + self.pad, b_ld + self.pad, self.offset))

    @property
    def label(self) -> str:
        """'MxNxK dtype layout[ pad P][ offset O]': unique within a suite."""
        dt = {"float16": "fp16", "bfloat16": "bf16"}[self.dtype]
        extra = (f" pad{self.pad}" if self.pad else "") + (f" off{self.offset}" if self.offset else "")
        return f"{self.m}x{self.n}x{self.k} {dt} {self.layout}{extra}"


def _lin(m: int, n: int, k: int, dtype: str, note: str) -> Case:
    return Case(m, n, k, dtype, "linear", note=note)


# LLM projections as nn.Linear (out_features N, in_features K) at decode M (1, 16, 64) and prefill M (2048-16384).
# QKV N = heads * head_dim + 2 * kv_heads * head_dim; O K = heads * head_dim; gate+up fused N = 2 * I; down K = I.
#   Llama-3-8B     H 4096, 32 heads, 8 kv, head_dim 128: QKV N 4096 + 2*1024 = 6144, O 4096 x 4096, I 14336
#   Llama-3-70B    H 8192, 64 heads, 8 kv, head_dim 128: QKV N 8192 + 2*1024 = 10240, O 8192 x 8192, I 28672
#   Mixtral-8x7B   H 4096, 32 heads, 8 kv, head_dim 128: attention as Llama-3-8B; experts I 14336 (8, top-2)
#   Qwen3-32B      H 5120, 64 heads, 8 kv, head_dim 128 (config.json): QKV N 8192 + 2*1024 = 10240,
#                  O N 5120 from K 64*128 = 8192, I 25600
#   DeepSeek-V3    H 7168, MLA: q_a N 1536 (q_lora_rank), kv_a N 512 + 64 = 576 (kv_lora_rank + rope dim),
#                  O from K 128 heads * v_head_dim 128 = 16384, dense MLP (first 3 layers) I 18432
BROAD_LLM: list[Case] = [
    _lin(1, 6144, 4096, "bfloat16", "llama3-8b qkv decode"),
    _lin(16, 6144, 4096, "float16", "llama3-8b qkv decode"),
    _lin(2048, 6144, 4096, "bfloat16", "llama3-8b qkv prefill"),
    _lin(1, 28672, 4096, "float16", "llama3-8b gate+up decode"),
    _lin(4096, 28672, 4096, "bfloat16", "llama3-8b gate+up prefill"),
    _lin(16, 4096, 14336, "bfloat16", "llama3-8b down decode"),
    _lin(16384, 4096, 14336, "bfloat16", "llama3-8b down prefill"),
    _lin(1, 10240, 8192, "float16", "llama3-70b qkv decode"),
    _lin(4096, 10240, 8192, "bfloat16", "llama3-70b qkv prefill"),
    _lin(2048, 8192, 8192, "float16", "llama3-70b o prefill"),
    _lin(64, 57344, 8192, "bfloat16", "llama3-70b gate+up decode"),
    _lin(2048, 57344, 8192, "bfloat16", "llama3-70b gate+up prefill"),
    _lin(1, 8192, 28672, "bfloat16", "llama3-70b down decode"),
    _lin(8192, 8192, 28672, "float16", "llama3-70b down prefill"),
    _lin(64, 6144, 4096, "float16", "mixtral-8x7b qkv decode"),
    _lin(16384, 6144, 4096, "bfloat16", "mixtral-8x7b qkv prefill"),
    _lin(1024, 28672, 4096, "bfloat16", "mixtral-8x7b one expert w1+w3 at 4096 tokens (4096*2/8 rows)"),
    _lin(1, 10240, 5120, "bfloat16", "qwen3-32b qkv decode"),
    _lin(4096, 10240, 5120, "bfloat16", "qwen3-32b qkv prefill"),
    _lin(16, 5120, 8192, "float16", "qwen3-32b o decode"),
    _lin(2048, 5120, 8192, "bfloat16", "qwen3-32b o prefill"),
    _lin(4096, 51200, 5120, "float16", "qwen3-32b gate+up prefill"),
    _lin(1, 5120, 25600, "bfloat16", "qwen3-32b down decode"),
    _lin(8192, 5120, 25600, "bfloat16", "qwen3-32b down prefill"),
    _lin(1, 1536, 7168, "bfloat16", "deepseek-v3 q_a decode"),
    _lin(16, 576, 7168, "bfloat16", "deepseek-v3 kv_a decode"),
    _lin(2048, 576, 7168, "float16", "deepseek-v3 kv_a prefill"),
    _lin(64, 7168, 16384, "bfloat16", "deepseek-v3 o decode"),
    _lin(4096, 7168, 16384, "bfloat16", "deepseek-v3 o prefill"),
    _lin(16, 36864, 7168, "bfloat16", "deepseek-v3 dense gate+up decode"),
    _lin(2048, 36864, 7168, "float16", "deepseek-v3 dense gate+up prefill"),
    _lin(1, 7168, 18432, "float16", "deepseek-v3 dense down decode"),
    _lin(16384, 7168, 18432, "bfloat16", "deepseek-v3 dense down prefill"),
]
# Odd and prime sizes (odd K also breaks the 16-byte alignment of every row of a contiguous A).
BROAD_ODD: list[Case] = [
    Case(8191, 8193, 4097, note="odd, issue 14"),
    Case(777, 3333, 1024, note="odd, issue 14"),
    Case(3000, 5000, 7000, note="round but not a power of 2, issue 14"),
    Case(3000, 5000, 7000, "bfloat16", "linear", note="the same as nn.Linear"),
    Case(1021, 2039, 4093, note="primes"),
    Case(4093, 8191, 2039, "bfloat16", "linear", note="primes"),
    Case(127, 4099, 8191, "bfloat16", note="primes, small M"),
    Case(1, 4093, 4099, "float16", "linear", note="primes, decode"),
    Case(13, 12289, 1021, "bfloat16", "linear", note="primes, small M"),
]
# Unaligned leading dimensions: A and B sliced out of wider buffers (odd row strides), a misaligned base.
BROAD_UNALIGNED: list[Case] = [
    Case(4096, 4096, 4096, pad=1, note="row strides K+1 and N+1"),
    Case(2048, 6144, 4096, "bfloat16", "linear", pad=3, note="nn.Linear weight sliced from a wider one"),
    Case(64, 14336, 4096, "float16", "linear", pad=1, note="decode against a sliced weight"),
    Case(1024, 4096, 4096, offset=1, note="every base 2 bytes off 16-byte alignment"),
    Case(4096, 4096, 4095, "bfloat16", note="odd K: contiguous but unaligned rows"),
]
# The rows issue 14 named (nn.Linear where it says so) and the two seeds.
BROAD_ISSUE: list[Case] = [
    Case(2048, 5120, 5120, "bfloat16", "linear", note="issue 14"),
    Case(1, 14336, 4096, "float16", "linear", note="issue 14"),
    Case(64, 4096, 4096, "bfloat16", note="issue 14"),
    Case(256, 4096, 4096, note="issue 14"),
    Case(4096, 28672, 4096, note="issue 14"),
    Case(4096, 6144, 4096, note="issue 14"),
    *(Case(m, n, k, note="seed") for m, n, k in SEEDS),
]
BROAD: list[Case] = BROAD_ISSUE + BROAD_ODD + BROAD_UNALIGNED + BROAD_LLM
# A smoke test of the broad suite: both layouts and dtypes, an unaligned case, decode and prefill.
BROAD_QUICK_LABELS = (
    "8192x8192x16384 fp16 row",
    "777x3333x1024 fp16 row",
    "4096x4096x4096 fp16 row pad1",
    "2048x6144x4096 bf16 linear pad3",
    "1x6144x4096 bf16 linear",
    "4096x28672x4096 bf16 linear",
    "1x14336x4096 fp16 linear",
    "64x4096x4096 bf16 row",
)
BROAD_QUICK: list[Case] = [c for label in BROAD_QUICK_LABELS for c in BROAD if c.label == label]
# The same properties at interpreter sizes (the CPU, tests).
BROAD_CPU: list[Case] = [
    Case(37, 53, 71, note="odd"),
    Case(16, 48, 64, "bfloat16", "linear"),
    Case(1, 40, 24, "float16", "linear"),
    Case(24, 40, 32, "bfloat16", "row", pad=1),
    Case(9, 24, 40, "float16", "linear", pad=3, offset=1),
]

# --------------------------------------------------------------------------------- the models' nn.Linear shapes
# The models' projections (``models.MODEL_LINEARS``) at decode and prefill M.
MODEL_M = (1, 16, 64, 256, 2048, 8192)  # decode, speculative / small batch, prefill chunks


def model_cases(m_values: tuple[int, ...] = MODEL_M) -> list[Case]:
    """Each model at every M of ``m_values``, one projection per M in rotation (model j's t-th M takes projection
    (t + j) mod its count) and the dtype alternating the same way: every model meets decode and prefill in both
    dtypes, and the suite stays one H200 call (the full cross product is ~400 cases)."""
    out = []
    for j, (model, projs) in enumerate(MODEL_LINEARS.items()):
        names = list(projs)
        for t, m in enumerate(m_values):
            name = names[(t + j) % len(names)]
            n, k = projs[name]
            out.append(_lin(m, n, k, ("bfloat16", "float16")[(t + j) % 2], f"{model} {name}"))
    return out


# The suite of issue 23: the broad suite plus the models' shapes at every M (a model case whose shape and layout
# the broad suite already has, in either dtype, is left out).
_BROAD_KEYS = {(c.shape, c.layout) for c in BROAD}
DENSE: list[Case] = BROAD + [c for c in model_cases() if (c.shape, c.layout) not in _BROAD_KEYS]
CASE_SUITES: dict[str, list[Case]] = {
    "broad": BROAD,
    "broad-quick": BROAD_QUICK,
    "broad-cpu": BROAD_CPU,
    "dense": DENSE,
}


def cases(name: str, dtype: str = "float16") -> list[Case]:
    """A named case suite (broad, broad-quick, broad-cpu, dense), or a shape suite (``suite``) as row-major cases
    of ``dtype``."""
    if name in CASE_SUITES:
        return CASE_SUITES[name]
    return [Case(m, n, k, dtype) for m, n, k in suite(name)]


def moe_gemm_shape(batch_size: int, seq_len: int, top_k: int, hidden_size: int, intermediate_size: int) -> Shape:
    """The dense GEMM an MoE layer's first projection amounts to when every (token, expert) pair is a row
    (the seed's collect_gemm_table): M = batch_size * seq_len * top_k, N = intermediate, K = hidden."""
    for name, v in (
        ("batch_size", batch_size),
        ("seq_len", seq_len),
        ("top_k", top_k),
        ("hidden_size", hidden_size),
        ("intermediate_size", intermediate_size),
    ):
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


def resolve_moe(
    model: str | None = None,
    top_k: int | None = None,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
) -> tuple[int, int, int]:
    """(top_k, hidden, intermediate): explicit values first, then the ``model`` preset, then the seed's
    defaults (top-k 4, hidden 7168, intermediate 2048)."""
    if model is not None and model not in MOE_MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MOE_MODELS)}")
    preset = MOE_MODELS.get(model) if model else MoEModel(hidden=7168, intermediate=2048, experts=0, top_k=4)
    return (
        preset.top_k if top_k is None else top_k,
        preset.hidden if hidden_size is None else hidden_size,
        preset.intermediate if intermediate_size is None else intermediate_size,
    )
