"""The grader: ``grade(cases, kernel=None, ...)`` -> report dict; `gemmlab grade` is its command line.
One grader (``grade/grader.py``) over an op description (``grade/op.py``: GEMM, or MoE for case files of
"mode": "moe", FP8 for "mode": "fp8" and FP8 experts for "mode": "moe_fp8": ``grade/fp8.py``), with its rules as
data (``grade/rules.py``)."""

from __future__ import annotations

import torch

from gemmlab.grade import cases as _cases
from gemmlab.grade.fp8 import fp8_op, moe_fp8_op
from gemmlab.grade.grader import Grader
from gemmlab.grade.op import gemm_op, moe_op


def default_cases() -> str:
    """competition.json with CUDA, cpu.json (small shapes, Triton's interpreter) without."""
    return "competition" if torch.cuda.is_available() else "cpu"


def load_any(name_or_path: str) -> _cases.CaseFile:
    """A validated GEMM or MoE case file."""
    return _cases.load(name_or_path)


def make_op(cf: _cases.CaseFile, signature: str | None = None):
    """The op a case file grades, called through ``signature``."""
    if cf.mode == "moe":
        if signature not in (None, "moe"):
            raise _cases.CaseError(f"--signature {signature!r}: an moe case file takes FN(x, w1, w2, weights, ids)")
        return moe_op(cf)
    if cf.mode == "fp8":
        if signature not in (None, "fp8"):
            raise _cases.CaseError(
                f"--signature {signature!r}: an fp8 case file takes FN(a, b, a_scale, b_scale, c, M, N, K)"
            )
        return fp8_op(cf)
    if cf.mode == "moe_fp8":
        if signature not in (None, "moe_fp8"):
            raise _cases.CaseError(
                f"--signature {signature!r}: a moe_fp8 case file takes FN(x, w1, w1_scale, w2, "
                "w2_scale, topk_weights, topk_ids, out)"
            )
        return moe_fp8_op(cf)
    if signature not in (None, "rowmajor", "colmajor"):
        raise _cases.CaseError(f"--signature {signature!r}: rowmajor or colmajor")
    return gemm_op(cf, signature)


def grade(
    cases: str | None = None,
    kernel: str | None = None,
    signature: str | None = None,
    allow_vendor: bool = False,
    timeout: float = 120.0,
    seed: int = 0,
    rounds: int | None = None,
    progress=None,
    keep_logs: bool = False,
    budget_s: float | None = None,
) -> dict:
    """Grade ``kernel`` (None: gemmlab's own; else FILE.py:FN or package.module:FN) on a case file. ``rounds`` and
    ``budget_s`` cap the timed rounds (by count, in seconds; None: the protocol's defaults)."""
    if not (isinstance(timeout, int | float) and timeout > 0 and timeout == timeout):
        raise _cases.CaseError(f"--timeout {timeout!r}: a positive number of seconds")
    if rounds is not None and rounds < 1:
        raise _cases.CaseError(f"--rounds {rounds!r}: a positive integer")
    if budget_s is not None and not (isinstance(budget_s, int | float) and budget_s > 0):
        raise _cases.CaseError(f"budget_s {budget_s!r}: a positive number of seconds")
    if kernel is not None and not all(kernel.rpartition(":")[::2]):
        raise _cases.CaseError(f"--kernel {kernel!r}: expected FILE.py:FN or package.module:FN")
    cf = load_any(cases or default_cases())
    return Grader(
        make_op(cf, signature), cf, kernel, allow_vendor, timeout, seed, rounds, progress, keep_logs, budget_s=budget_s
    ).run()


__all__ = ["default_cases", "grade", "load_any", "make_op"]
