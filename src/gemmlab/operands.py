"""The one generator of the lab's inputs: every test, bench, tuner and the grader draw here, from a generator or
seed the caller owns (``gemmlab.problems`` re-exports every name; the shapes and cases they are drawn for live
there). MoE legend: T tokens, H hidden, I expert intermediate, E experts, k top-k.

    draw(shape, dist, gen, dtype)            a contiguous tensor of one of ``DISTRIBUTIONS``
    matrix(rows, cols, dist, gen, dtype)     an operand in its storage (column-major, padded rows, offset)
    gemm_operands(m, n, k, dtype, device)    A, B as the benches draw them: "centered", seeded by the shape
    case_operands(case, device)              ``gemm_operands`` of a ``problems.Case``
    moe_inputs(model, tokens, routing)       x, w1, w2 and a routing (weights, ids); ``moe_tokens``: new x
                                             and routing for weights drawn before
    fp8_operands(m, n, k, kind, per_row)     e4m3 A (M, K), B^T (N, K) and their fp32 scales
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from gemmlab import quantize_fp8
from gemmlab.instruments import timing
from gemmlab.models import MoEModel
from gemmlab.ops.moe import route

if TYPE_CHECKING:  # a type only: problems imports this module
    from gemmlab.problems import Case


LAYOUTS = ("row", "linear")  # B's layouts: "row" B (K, N); "linear" B = W^T with W (N, K) (``problems.Case``)

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
