"""Shape sets and GEMM cases as data (the models' layer sizes they use: ``models``), and the one generator of
their inputs.

A GEMM shape is (M, N, K): C (M, N) = A (M, K) @ B (K, N). A case (``Case``) is a shape with its dtype, B's
layout ("row" or the nn.Linear "linear") and its storage (padded rows, an offset base); ``cases(name)`` gives
the broad suite (issue 14: odd, prime, unaligned, decode to prefill, the LLM projections, the seeds).
MoE legend: T tokens (= batch * seq_len), H hidden, I expert intermediate, E experts, k top-k.

Inputs (every test, bench, tuner and the grader draw here, from a generator or seed the caller owns):
    draw(shape, dist, gen, dtype)            a contiguous tensor of one of ``DISTRIBUTIONS``
    matrix(rows, cols, dist, gen, dtype)     an operand in its storage (column-major, padded rows, offset)
    gemm_operands(m, n, k, dtype, device)    A, B as the benches draw them: "centered", seeded by the shape
    moe_inputs(model, tokens, routing)       x, w1, w2 and a routing (weights, ids); ``moe_tokens``: new x
                                             and routing for weights drawn before
    fp8_operands(m, n, k, kind, per_row)     e4m3 A (M, K), B^T (N, K) and their fp32 scales
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gemmlab import quantize_fp8
from gemmlab.instruments import timing
from gemmlab.models import MODEL_LINEARS, MOE_MODELS, MoEModel
from gemmlab.ops.moe import route

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
LAYOUTS = ("row", "linear")
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


# ------------------------------------------------------------------------------------------------ inputs
# The one input generator. A draw is made in float32 and rounded once to the dtype; the caller owns the
# generator (the grader keeps its seeds secret), so the same generator state gives the same values everywhere.
DISTRIBUTIONS = {
    "competition": "(r % 100 - 50) / 100 from seeded integers: uniform on {-0.50, -0.49, ..., 0.49}",
    "uniform": "U[-1, 1)",
    "normal": "N(0, 1)",
    "centered": "U[-0.5, 0.5): the operands of the benches, the tuner, the profiler and the tests",
}


def generator(seed: int, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def shape_seed(m: int, n: int, k: int, seed: int = 0) -> int:
    """The seed of a shape's operands in the benches: every (M, N, K) its own values, ``seed`` another set."""
    return seed * 1_000_003 + 1009 * m + 17 * n + k


def draw(
    shape: tuple[int, ...],
    dist: str,
    gen: torch.Generator | None,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A contiguous tensor of ``shape`` from ``dist`` (``DISTRIBUTIONS``), drawn with ``gen`` on its device
    (None: torch's default generator on ``device``)."""
    device = gen.device if device is None and gen is not None else device
    if dist == "competition":
        r = torch.randint(0, 1 << 30, shape, generator=gen, device=device)
        return ((r % 100 - 50).to(torch.float32) / 100).to(dtype)
    if dist == "uniform":
        return (torch.rand(shape, generator=gen, device=device) * 2 - 1).to(dtype)
    if dist == "normal":
        return torch.randn(shape, generator=gen, device=device).to(dtype)
    if dist == "centered":
        return (torch.rand(shape, generator=gen, device=device) - 0.5).to(dtype)
    raise ValueError(f"unknown input distribution {dist!r}; known: {', '.join(DISTRIBUTIONS)}")


def matrix(
    rows: int,
    cols: int,
    dist: str,
    gen: torch.Generator | None,
    dtype: torch.dtype,
    *,
    colmajor: bool = False,
    pad: int = 0,
    offset: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A (rows, cols) operand of ``dist``. Stored row-major with row stride cols + pad, or with ``colmajor``
    as the transpose of a row-major (cols, rows) with row stride rows + pad (strides (1, rows + pad): the
    nn.Linear weight's layout for B); ``offset`` elements into a buffer of its own. The values are drawn in
    storage order, so without pad and offset the storage is one plain draw of the stored shape."""
    stored = (cols, rows) if colmajor else (rows, cols)
    if pad or offset:
        ld = stored[1] + pad
        flat = draw((offset + stored[0] * ld,), dist, gen, dtype, device)
        t = flat.as_strided(stored, (ld, 1), offset)
    else:
        t = draw(stored, dist, gen, dtype, device)
    return t.t() if colmajor else t


def gemm_operands(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
    *,
    layout: str = "row",
    pad: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M, K) and B (K, N), "centered", A then B from one generator seeded by the shape (``shape_seed``).
    layout "row": B (K, N) row-major; "linear": B = W^T with W (N, K) row-major. ``pad``, ``offset`` as
    ``Case`` says."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    g = generator(shape_seed(m, n, k, seed), device)
    a = matrix(m, k, "centered", g, dtype, pad=pad, offset=offset)
    b = matrix(k, n, "centered", g, dtype, colmajor=layout == "linear", pad=pad, offset=offset)
    return a, b


def case_operands(case: Case, device: torch.device | str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``gemm_operands`` of a case, in its dtype, layout and storage."""
    return gemm_operands(
        case.m,
        case.n,
        case.k,
        getattr(torch, case.dtype),
        device,
        seed,
        layout=case.layout,
        pad=case.pad,
        offset=case.offset,
    )


def routing_logits(tokens: int, experts: int, routing: str, gen: torch.Generator) -> torch.Tensor:
    """Router logits (T, E) float32, N(0, 1): "uniform" (experts alike) or "zipf" (expert j's logit lowered
    by 1.5 ln(j + 1): a few experts take most tokens)."""
    if routing not in ("uniform", "zipf"):
        raise ValueError(f"routing {routing!r}: uniform or zipf")
    logits = torch.randn((tokens, experts), generator=gen, device=gen.device)
    if routing == "zipf":
        ranks = torch.arange(1, experts + 1, device=gen.device, dtype=torch.float32)
        logits = logits - 1.5 * torch.log(ranks)[None, :]
    return logits


def _scaled(shape: tuple[int, ...], scale: float, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """``scale`` * "centered", drawn in slices of ~2^28 elements (no full-size float32 temporary)."""
    out = torch.empty(shape, dtype=dtype, device=gen.device)
    step = max(1, (1 << 28) // max(1, math.prod(shape[1:])))
    for j in range(0, shape[0], step):
        part = torch.rand((min(step, shape[0] - j), *shape[1:]), generator=gen, device=gen.device)
        out[j : j + step] = part.sub_(0.5).mul_(scale)
    return out


def moe_inputs(
    model: MoEModel,
    tokens: int,
    routing: str = "uniform",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> dict:
    """An MoE layer's inputs from one generator seeded with ``seed``, in this order: x (T, H) U[-1, 1);
    w1 (E, 2I, H) and w2 (E, H, I) "centered" scaled by 2 sqrt(3 / K) (unit variance per weight row's dot
    product: activations stay O(1)); the routing (``routing_logits``, then ``ops.moe.route``: weights (T, k)
    float32, ids (T, k)). Never constant (``require_random``). -> {"x", "w1", "w2", "weights", "ids"}."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = generator(seed, device)
    h, i, e, k = model.hidden, model.intermediate, model.experts, model.top_k
    x = _scaled((tokens, h), 2.0, g, dtype)
    w1 = _scaled((e, 2 * i, h), 2.0 * math.sqrt(3.0 / h), g, dtype)
    w2 = _scaled((e, h, i), 2.0 * math.sqrt(3.0 / i), g, dtype)
    weights, ids = route(routing_logits(tokens, e, routing, g), k)
    timing.require_random(x=x, w1=w1, w2=w2)
    return {"x": x, "w1": w1, "w2": w2, "weights": weights, "ids": ids}


def moe_tokens(
    tokens: int,
    hidden: int,
    experts: int,
    top_k: int,
    routing: str,
    dtype: torch.dtype,
    seed: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """New tokens for weights drawn before (the grader's timed calls, whose weights are too big to draw per
    call): x (T, H) U[-1, 1) in one draw, then the routing, from a generator seeded with ``seed``.
    -> (x, weights (T, k), ids (T, k))."""
    g = generator(seed, device)
    x = (torch.rand((tokens, hidden), generator=g, device=g.device) - 0.5).mul_(2.0).to(dtype)
    weights, ids = route(routing_logits(tokens, experts, routing, g), top_k)
    return x, weights, ids


FP8_KINDS = ("uniform", "normal", "full-mantissa")


def fp8_operands(m: int, n: int, k: int, kind: str, per_row: bool, seed: int, device: torch.device | str) -> tuple:
    """(a (M, K), b (N, K), a_scale, b_scale): e4m3 A and B^T (the nn.Linear layout), scales fp32 () per tensor or,
    ``per_row``, (M, 1) per row of A and (1, N) per column of B; A from a generator seeded 2 seed + 1, B 2 seed + 2.
    uniform, normal: x of that distribution (``draw``) quantized (``quantize_fp8``: amax / 448), so the
    values spread over e4m3's range up to +-448; full-mantissa: +-1.875 2^e (all 3 mantissa bits set), e uniform over
    [-6, 7] (the normal exponents whose all-ones mantissa is finite), random signs, scales (1 + U[0, 1)) 2^-8."""
    if kind not in FP8_KINDS:
        raise ValueError(f"fp8 inputs {kind!r}: one of {', '.join(FP8_KINDS)}")
    out = []
    for rows, s in ((m, 2 * seed + 1), (n, 2 * seed + 2)):
        g = generator(s, device)
        if kind == "full-mantissa":
            e = torch.randint(-6, 8, (rows, k), generator=g, device=g.device).float()
            sign = torch.randint(0, 2, (rows, k), generator=g, device=g.device).float() * 2 - 1
            q = (sign * 1.875 * torch.exp2(e)).to(torch.float8_e4m3fn)
            scale = (1 + torch.rand((rows, 1) if per_row else (), generator=g, device=g.device)) * 2.0**-8
        else:
            x = draw((rows, k), kind, g, torch.float32)
            if per_row:  # per row as the columns of x^T: torch ops on any device, the row kernel's bits
                q, scale = quantize_fp8(x.t(), "col")
                q, scale = q.t().contiguous(), scale.reshape(rows, 1)  # (rows, 1), strides (1, 1)
            else:
                q, scale = quantize_fp8(x, "tensor")
        out.append((q, scale))
    (a, a_scale), (b, b_scale) = out
    return a, b, a_scale, b_scale.reshape(1, n) if per_row else b_scale
