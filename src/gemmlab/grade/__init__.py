"""The grader: ``grade(cases, kernel=None, ...)`` -> report dict; `gemmlab grade` is its command line."""

from __future__ import annotations

import torch

from gemmlab.grade import cases as _cases
from gemmlab.grade.grader import Grader


def default_cases() -> str:
    """competition.json with CUDA, cpu.json (small shapes, Triton's interpreter) without."""
    return "competition" if torch.cuda.is_available() else "cpu"


def grade(cases: str | None = None, kernel: str | None = None, signature: str | None = None,
          allow_vendor: bool = False, timeout: float = 60.0, seed: int = 0, rounds: int | None = None,
          progress=None) -> dict:
    """Grade ``kernel`` (None: gemmlab's own; else FILE.py:FN or package.module:FN) on a case file."""
    cf = _cases.load(cases or default_cases())
    if signature not in (None, "rowmajor", "colmajor"):
        raise _cases.CaseError(f"--signature {signature!r}: rowmajor or colmajor")
    return Grader(cf, kernel, signature, allow_vendor, timeout, seed, rounds, progress).run()


__all__ = ["default_cases", "grade"]
