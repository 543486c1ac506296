"""The FP8 dense GEMM as a graded op: ``fp8_op(cf)`` for case files of ``"mode": "fp8"``, the third instance of
``op.Op`` beside ``gemm_op`` and ``moe_op``. Legend: M, N, K as for a GEMM; C (M, N) = (A a_scale) @ (B b_scale).

Inputs (``problems.fp8_operands``, fresh per call from the grader's seeds): a (M, K) and b (N, K) e4m3, B = b^T
(the nn.Linear layout, what torch._scaled_mm takes as its second operand transposed); fp32 scales per the case's
``scales``: () and () per tensor, or (M, 1) per row of A and (1, N) per column of B. Kinds: the case's
``inputs`` (uniform or normal, quantized with amax / 448 scales), the other of the two for the third trial, and
``full-mantissa`` (every element +-1.875 2^e, all three mantissa bits set) for the secret share of timed calls.

Correct: every element within ``ref.gemm_fp8_bound`` of ``ref.gemm_fp8_ref`` (float64 on the dequantized
inputs), the contract of ``gemmlab.gemm_fp8`` (docs/fp8.md). The bound is per element, so ``Checked`` carries
the element where |C - ref| / bound is largest: ``err`` its error, ``tol`` its bound (err > tol exactly when some
element is beyond its bound).

Honest arithmetic, FP8 form (``rounding.py``'s rule on the e4m3 inputs as given): on a secret sample of outputs,
the exact sums are the float64 reference's (the products of two e4m3 values times fp32 scales are exact in
float64 to 2^-53, far below an output ulp); the counts of outputs that are not the correctly rounded value of the
exact sum, and of those more than one ulp off, are judged (``rounding.judge``) against the vendor's counts on the
same sample: ``torch._scaled_mm`` in the grader's own process (``candidate.scaled_mm_fp8``; its fallback, an fp32
matmul of the dequantized inputs, where torch._scaled_mm cannot run, as for N % 16 != 0 on a GPU). Honest = computes on
the given e4m3 values and scales with fp32 accumulation and rounds once to nearest. A candidate that
re-quantizes, rounds its inputs or partial sums to bf16, accumulates in lower precision or truncates C misses
the correctly rounded value on a large share of the sample (tens of percent) while an honest one misses it only
next to rounding midpoints. (Triton's CPU interpreter truncates fp32 to bf16 in its own casts, so on the CPU a
Triton kernel is graded with an fp16 C: ``cases/fp8-cpu.json``; gemmlab's stores round first, ``kernels.gemm.narrow``.)

FP8 experts (``moe_fp8_op(cf)``, case files of ``"mode": "moe_fp8"``; T, H, I, E, k as for MoE): the MoE layer body
on e4m3 weights with 128x128 block scales, the moe_fp8 signature (``sandbox/candidate.py``). Inputs as ``moe_op``'s
(``op.moe_fresh``) with the weights packed by ``gemmlab.pack_moe_fp8``: (x, w1, w1_scale, w2, w2_scale,
topk_weights, topk_ids), the four weight tensors fixed for the run, tokens and routing fresh per call. Correct:
``ref.moe_fp8_check``, the contract of gemmlab's FP8 experts (docs/fp8.md, "MoE experts": activations and the
intermediate quantized per 1x128 block as gemmlab does, fp32 accumulation), every element within its bound; err and tol
are those of the element nearest its bound. Baseline ``builtin:composite_fp8``: the bf16 torch composite
(``ref.moe_composite``) on the weights dequantized once (``candidate.dequantized_experts``), so it times the layer,
not the dequantization. It does not quantize activations, so it would not meet the contract: as in the bf16 moe
mode, the grader checks only the candidate's outputs, and the baseline only runs.
"""

from __future__ import annotations

import torch

from gemmlab import PackedMoEFP8, pack_moe_fp8
from gemmlab.grade import rounding
from gemmlab.grade.cases import CaseFile
from gemmlab.grade.op import Checked, Op, moe_fresh
from gemmlab.problems import fp8_operands
from gemmlab.ref import gemm_fp8_bound, gemm_fp8_ref, moe_fp8_check
from gemmlab.sandbox.candidate import SCALED_MM_FALLBACK, scaled_mm_fp8, scaled_mm_runs

SECOND_KIND = {"uniform": "normal", "normal": "uniform"}
FULL_MANTISSA = "full-mantissa"
RULE = "ref.gemm_fp8_bound per element (err, tol: at the element nearest its bound)"
MOE_RULE = "ref.moe_fp8_check per element (err, tol: at the element nearest its bound)"


def vendor_fp8(inputs: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The yardstick: the baseline's C (M, N) in ``dtype`` on the same inputs, made in the grader's process."""
    a, b, a_scale, b_scale = inputs
    c = torch.empty((a.shape[0], b.shape[0]), dtype=dtype, device=a.device)
    scaled_mm_fp8(a, b, a_scale, b_scale, c, a.shape[0], b.shape[0], a.shape[1])
    return c


def fp8_check(out: torch.Tensor, inputs: tuple, dtype: torch.dtype, gen: torch.Generator) -> Checked:
    """``out`` (M, N) against the float64 reference under ``gemm_fp8_bound``, with the rounding counts of ``out``
    and of the vendor's C on one sample of elements drawn with ``gen`` (module docstring)."""
    a, b, a_scale, b_scale = inputs
    if out.numel() == 0:
        return Checked(0.0, 0.0, RULE)
    ref = gemm_fp8_ref(a, b.t(), a_scale, b_scale)
    bound = gemm_fp8_bound(a, b.t(), a_scale, b_scale, dtype, ref)
    err = (out.to(torch.float64) - ref).abs()
    if not bool(torch.isfinite(err).all()):
        return Checked(float("inf"), 0.0, RULE)
    worst = (err / bound).argmax()
    rows, cols = rounding.sample(out.shape[0], out.shape[1], gen)
    rows, cols = rows.to(out.device), cols.to(out.device)
    exact = ref[rows][:, cols]
    vendor = vendor_fp8(inputs, dtype)
    counts = (rounding.measure(out[rows][:, cols], exact, dtype), rounding.measure(vendor[rows][:, cols], exact, dtype))
    return Checked(err.flatten()[worst].item(), bound.flatten()[worst].item(), RULE, counts)


def baseline_label(per_row: bool, dtype: torch.dtype, m: int, n: int) -> str:
    """What the baseline is on this machine at the timed M, N: torch._scaled_mm, or its labelled fallback."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    scales = "per-row/column" if per_row else "per-tensor"
    if scaled_mm_runs(device, per_row, dtype, m, n):
        return f"torch._scaled_mm ({scales} scales, fp8 signature)"
    return f"fallback: {SCALED_MM_FALLBACK} ({scales} scales, fp8 signature)"


def fp8_op(cf: CaseFile) -> Op:
    """The op of an fp8 case file: the fp8 signature, C in ``cf.dtype``, baseline builtin:scaled_mm."""
    dtype = getattr(torch, cf.dtype)
    per_row = cf.scales == "row"
    label = baseline_label(per_row, dtype, *((cf.performance.m, cf.performance.n) if cf.performance else (16, 16)))

    def fresh(case, kind, seed, device, keep=None):
        return fp8_operands(case.m, case.n, case.k, kind, per_row, seed, device)

    return Op(
        name="fp8",
        signature="fp8",
        layout="rowmajor",
        dtype=dtype,
        trials=(cf.inputs, cf.inputs, SECOND_KIND[cf.inputs]),
        timed_kind=cf.inputs,
        fresh=fresh,
        out_numel=lambda c: c.m * c.n,
        view=lambda out, c: out.view(c.m, c.n),
        check=lambda out, inputs, kind, gen: fp8_check(out, inputs, dtype, gen),
        baseline="builtin:scaled_mm",
        baseline_signature="fp8",
        baseline_label=label,
        full_kind=FULL_MANTISSA,
    )


def moe_fp8_fresh(case, routing: str, seed: int, dtype: torch.dtype, device: torch.device, keep=None) -> tuple:
    """(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids): ``moe_fresh``'s draw with its weights packed by
    ``pack_moe_fp8``; with ``keep`` its four weight tensors and a fresh x and routing."""
    if keep is None:
        x, w1, w2, weights, ids = moe_fresh(case, routing, seed, dtype, device)
        p = pack_moe_fp8(w1, w2)
        return x, p.w1, p.w1_scale, p.w2, p.w2_scale, weights, ids
    x, _, _, weights, ids = moe_fresh(case, routing, seed, dtype, device, keep)
    return (x, *keep[1:5], weights, ids)


def moe_fp8_check_op(out: torch.Tensor, inputs: tuple) -> Checked:
    """``out`` (T, H) against ``ref.moe_fp8_check`` (module docstring)."""
    x, w1, w1_scale, w2, w2_scale, weights, ids = inputs
    chk = moe_fp8_check(out, x, PackedMoEFP8(w1, w1_scale, w2, w2_scale), weights, ids)
    return Checked(chk["err"], chk["bound"], MOE_RULE)


def moe_fp8_op(cf: CaseFile) -> Op:
    """The op of a moe_fp8 case file: the moe_fp8 signature, baseline builtin:composite_fp8."""
    dtype = getattr(torch, cf.dtype)
    return Op(
        name="moe_fp8",
        signature="moe_fp8",
        layout="rowmajor",
        dtype=dtype,
        trials=("uniform", "zipf"),
        timed_kind="uniform",
        fresh=lambda case, kind, seed, device, keep=None: moe_fp8_fresh(case, kind, seed, dtype, device, keep),
        out_numel=lambda c: c.t * c.h,
        view=lambda out, c: out.view(c.t, c.h),
        check=lambda out, inputs, kind, gen=None: moe_fp8_check_op(out, inputs),
        baseline="builtin:composite_fp8",
        baseline_signature="moe_fp8",
        baseline_label="bf16 torch composite on torch._grouped_mm, weights dequantized once (not FP8)",
        fixed=(1, 2, 3, 4),
        verify_per_batch=2,
    )
