"""What the grader grades, as data: an ``Op`` says how to make inputs, how the candidate is called, what
a correct output is (reference and tolerance), the work done (flops) and the baseline. One grader
(``grader.py``) serves every op; ``gemm_op`` and ``moe_op`` are two instances, ``grade/fp8.py``'s ``fp8_op``
the third.

An op's inputs are a tuple of tensors. ``fresh(case, kind, seed, keep)`` draws them (``kind``: the input
distribution or routing; ``keep``: inputs of an earlier draw to reuse for the positions in ``fixed``: the
MoE weights, too big to draw per call); ``check(out, inputs, kind, gen)`` -> ``Checked``: the max error, its
tolerance and rule, and for a GEMM the honest-arithmetic counts (``grade/rounding.py``) of the output and of the
vendor's product on a sample of elements drawn with ``gen``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gemmlab import problems
from gemmlab.grade import rounding
from gemmlab.grade.cases import CaseFile
from gemmlab.grade.inputs import FULL_MANTISSA, SECOND_DISTRIBUTION, operands, reference
from gemmlab.sandbox.candidate import logical_out


@dataclass(frozen=True)
class Checked:
    err: float  # max |out - reference|
    tol: float
    rule: str  # how ``tol`` was set
    rounding: tuple[rounding.Rounding, rounding.Rounding] | None = None  # (candidate's, vendor's), GEMM only

    @property
    def within(self) -> bool:
        return self.err <= self.tol

    def dishonest(self) -> str | None:
        """Why the arithmetic is not an honest fp32-accumulated GEMM's (``rounding.judge``), or None."""
        return None if self.rounding is None else rounding.judge(*self.rounding)


@dataclass(frozen=True)
class Op:
    name: str  # "gemm" or "moe"
    signature: str  # how the candidate is called (candidate.SIGNATURES)
    layout: str  # storage of operands and output
    dtype: torch.dtype
    trials: tuple[str, ...]  # the kinds of input of a correctness case's trials, in order
    timed_kind: str  # the kind of input of the timed calls
    fresh: Callable  # (case, kind, seed, device, keep) -> inputs
    out_numel: Callable  # case -> elements of the flat output
    view: Callable  # (flat out, case) -> logical output
    check: Callable  # (logical out, inputs, kind, gen) -> Checked
    baseline: str  # builtin the baseline worker loads (candidate.BUILTINS)
    baseline_signature: str
    baseline_label: str
    fixed: tuple[int, ...] = ()  # input positions shared by all timed calls
    verify_per_batch: int | None = None  # timed calls verified per batch (None: all)
    full_kind: str | None = None  # the secret share of timed calls draws this kind (None: no share)


def gemm_op(cf: CaseFile, signature: str | None = None) -> Op:
    dtype = getattr(torch, cf.dtype)

    def fresh(case, kind, seed, device, keep=None):
        return operands(case.m, case.n, case.k, kind, seed, dtype, device.type, cf.layout)

    def check(out, inputs, kind, gen):
        ref = reference(*inputs, kind, dtype, cf.tol_base, cf.tol_ref_k)
        err = (out.double() - ref["c_ref"].double()).abs().max().item() if out.numel() else 0.0
        return Checked(err, ref["tol"], ref["rule"], rounding.check(out, *inputs, ref["vendor"], gen))

    signature = signature or cf.layout
    # the baseline is called through the candidate's signature, so both pay the same adapter (a row-major
    # result is copied into the grader's output buffer)
    baseline = "builtin:cublas" if signature == "colmajor" else "builtin:cublas_rowmajor"
    return Op(
        name="gemm",
        signature=signature,
        layout=cf.layout,
        dtype=dtype,
        trials=(cf.inputs, cf.inputs, SECOND_DISTRIBUTION[cf.inputs]),
        timed_kind=cf.inputs,
        fresh=fresh,
        out_numel=lambda c: c.m * c.n,
        view=lambda out, c: logical_out(out, c.m, c.n, cf.layout),
        check=check,
        baseline=baseline,
        baseline_signature=signature,
        baseline_label=f"vendor BLAS (torch.mm, {signature} signature)",
        full_kind=FULL_MANTISSA[cf.inputs],
    )


def moe_fresh(case, routing: str, seed: int, dtype: torch.dtype, device: torch.device, keep=None) -> tuple:
    """(x, w1, w2, topk_weights, topk_ids) from ``problems.moe_inputs``: random (never constant), activations
    O(1); with ``keep`` its w1 and w2 and a fresh x and routing (``problems.moe_tokens``)."""
    if keep is None:
        p = problems.moe_inputs(
            problems.MoEModel(hidden=case.h, intermediate=case.i, experts=case.e, top_k=case.k),
            case.t,
            routing,
            dtype,
            seed,
            device,
        )
        return p["x"], p["w1"], p["w2"], p["weights"], p["ids"]
    x, weights, ids = problems.moe_tokens(case.t, case.h, case.e, case.k, routing, dtype, seed, device)
    return x, keep[1], keep[2], weights, ids


def moe_op(cf: CaseFile) -> Op:
    from gemmlab.ref import moe_check

    dtype = getattr(torch, cf.dtype)

    def check(out, inputs, kind, gen=None):  # the layer rounds between its GEMMs: no rounding counts
        chk = moe_check(out, *inputs)
        err = chk["max_abs_err"] if math.isfinite(chk["max_abs_err"]) else math.inf
        return Checked(err, chk["allowed"], "2 x torch same-dtype error + 1 ulp")

    return Op(
        name="moe",
        signature="moe",
        layout="rowmajor",
        dtype=dtype,
        trials=("uniform", "zipf"),
        timed_kind="uniform",
        fresh=lambda case, kind, seed, device, keep=None: moe_fresh(case, kind, seed, dtype, device, keep),
        out_numel=lambda c: c.t * c.h,
        view=lambda out, c: out.view(c.t, c.h),
        check=check,
        baseline="builtin:composite",
        baseline_signature="moe",
        baseline_label="torch composite on torch._grouped_mm",
        fixed=(1, 2),
        verify_per_batch=2,
    )
