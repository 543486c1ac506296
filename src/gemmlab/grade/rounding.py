"""Honest arithmetic: how a GEMM's outputs round, counted in output ulps against the exact sum.

An honest fp16/bf16 GEMM (the inputs as given, fp32 accumulation, one final rounding to nearest) is correctly
rounded almost everywhere: its error is half an ulp plus its accumulation error, a few millionths of the output,
so it misses the correctly rounded value only where the exact sum lies that close to a rounding midpoint (well
under 1% of the elements). A kernel that quantizes its inputs (int8, fp8, fewer mantissa bits), accumulates in
lower precision (fp16/bf16 partial sums, a truncated accumulator), rounds otherwise or computes another product
misses it on a large share of them (tens of percent), even where its max error stays under the max-error bound:
output rounding dominates the max error of honest kernels too.

Per verified call, on a sample of output elements (secret rows x columns; all of them for small outputs):
    exact    the float64 sum of the products (its own error, at most K 2^-53 sum|ab|, is far below an ulp)
    floor    2^-SMALL_BITS x the rms of the exact outputs: below it, cancellation leaves an output with the
             absolute accumulation error of its large partial sums, so it is judged in the ulp of the floor
    not correctly rounded   out != exact rounded to nearest even (elements with |exact| >= floor)
    beyond one ulp          |out - exact| > the output dtype's spacing at max(|exact|, floor)
Both counts are taken of the vendor's GEMM on the same inputs too (torch.mm in the output dtype, fp32 reductions:
the yardstick). The rule (the house one: twice what the vendor makes, plus a floor) allows each count up to
``limit(vendor's) = 2 v + 6 sqrt(6 v + 1) + 6``: twice the vendor's rate, plus Poisson noise at 6 sigma (the
difference count - 2 v has a variance of at most 6 v for an honest kernel), so an honest kernel fails a call with
a probability below 1e-8. MoE layers round between their GEMMs: the rule is for GEMMs.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass

import torch

from gemmlab.ref import mantissa_bits

SAMPLE = 1 << 18  # output elements compared per call, at most
SAMPLE_ROWS = 512  # rows of the sample when the output has more than SAMPLE elements
SMALL_BITS = 6
MIN_EXPONENT = {torch.float16: -14, torch.bfloat16: -126}  # smallest normal exponent: spacing below is fixed


@dataclass(frozen=True)
class Rounding:
    elements: int  # sampled elements compared
    judged: int  # of them, those with |exact| >= floor (judged on correct rounding)
    not_rounded: int  # not the exact sum rounded to nearest even (of ``judged``)
    beyond: int  # more than one ulp from the exact sum (of ``elements``)

    def as_dict(self) -> dict:
        return asdict(self)


def sample(m: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of the elements to compare: all, or random rows and columns drawn with ``gen`` (a CPU
    generator) so that at most ``SAMPLE`` elements are compared."""
    if m * n <= SAMPLE:
        return torch.arange(m), torch.arange(n)
    r = min(m, SAMPLE_ROWS)
    c = min(n, SAMPLE // r)
    return (torch.randperm(m, generator=gen)[:r].sort().values, torch.randperm(n, generator=gen)[:c].sort().values)


@contextlib.contextmanager
def fp32_reductions():
    """torch.mm with fp32 accumulation throughout (cuBLAS may otherwise reduce split-K partials in fp16/bf16)."""
    mm = torch.backends.cuda.matmul
    prev = mm.allow_fp16_reduced_precision_reduction, mm.allow_bf16_reduced_precision_reduction
    mm.allow_fp16_reduced_precision_reduction = mm.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        mm.allow_fp16_reduced_precision_reduction, mm.allow_bf16_reduced_precision_reduction = prev


def vendor_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The yardstick: what torch.mm makes in the inputs' dtype, accumulating in fp32. (M, N)."""
    with fp32_reductions():
        return torch.mm(a, b)


def exact_product(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The sampled elements of A @ B in float64: (len(rows), len(cols))."""
    return a[rows.to(a.device)].double() @ b[:, cols.to(b.device)].double()


def spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The output dtype's spacing (one ulp) at |x| (float64), constant below the smallest normal."""
    _, e = torch.frexp(x)  # x = f 2^e with 0.5 <= |f| < 1, so floor(log2 |x|) = e - 1
    return torch.ldexp(torch.ones_like(x), (e - 1).clamp_min(MIN_EXPONENT[dtype]) - mantissa_bits(dtype))


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (float64) rounded once, to nearest even, onto the values of ``dtype`` (as float64; inf past its range).
    Exact: x / spacing is a float64 below 2^53, and the spacing a power of two."""
    step = spacing(x, dtype)
    r = torch.round(x / step) * step
    return torch.where(r.abs() > torch.finfo(dtype).max, torch.sign(r) * math.inf, r)


def measure(out: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> Rounding:
    """Counts of ``out`` (the sampled elements, any float dtype) against ``exact`` (float64, same shape)."""
    if exact.numel() == 0:
        return Rounding(0, 0, 0, 0)
    got = out.to(exact.device, torch.float64)
    floor = max(exact.square().mean().sqrt().item() * 2.0**-SMALL_BITS, torch.finfo(dtype).smallest_normal)
    judged = exact.abs() >= floor
    unit = spacing(exact.abs().clamp_min(floor), dtype)
    return Rounding(
        elements=exact.numel(),
        judged=int(judged.sum()),
        not_rounded=int(((got != round_to(exact, dtype)) & judged).sum()),
        beyond=int(((got - exact).abs() > unit).sum()),
    )


def limit(vendor_count: int) -> int:
    """The most a candidate's count may be, given the vendor's on the same inputs (module docstring)."""
    return math.floor(2 * vendor_count + 6 * math.sqrt(6 * vendor_count + 1) + 6)


def judge(cand: Rounding, vendor: Rounding) -> str | None:
    """Why the candidate's arithmetic is not an honest fp32-accumulated GEMM's, or None."""
    for what, c, v, of in (
        ("are not correctly rounded", cand.not_rounded, vendor.not_rounded, cand.judged),
        ("are more than one ulp off", cand.beyond, vendor.beyond, cand.elements),
    ):
        if c > limit(v):
            return (
                f"{c} of {of} sampled outputs ({c / max(of, 1):.1%}) {what} against the exact sum, the vendor's "
                f"GEMM on the same inputs {v} ({v / max(of, 1):.2%}), at most {limit(v)} allowed: not "
                "the product of the inputs as given with fp32 accumulation and one rounding (quantized "
                "inputs, lower-precision accumulation, or another product)"
            )
    return None


def check(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, vendor: torch.Tensor, gen: torch.Generator
) -> tuple[Rounding, Rounding]:
    """(candidate's counts, vendor's counts) on one sample: ``out`` and ``vendor`` are (M, N) in the dtype."""
    rows, cols = sample(out.shape[0], out.shape[1], gen)
    exact = exact_product(a, b, rows, cols)
    dev_rows, dev_cols = rows.to(out.device), cols.to(out.device)
    return (
        measure(out[dev_rows][:, dev_cols], exact, out.dtype),
        measure(vendor[dev_rows][:, dev_cols], exact, out.dtype),
    )
