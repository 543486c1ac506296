"""The grader: ``grade(cases, kernel=None, ...)`` -> report dict; `gemmlab grade` is its command line.
Case files of "mode": "moe" grade an MoE layer (``grade/moe.py``); the others a GEMM (``grade/grader.py``)."""

from __future__ import annotations

import json

import torch

from gemmlab.grade import cases as _cases
from gemmlab.grade.grader import Grader


def default_cases() -> str:
    """competition.json with CUDA, cpu.json (small shapes, Triton's interpreter) without."""
    return "competition" if torch.cuda.is_available() else "cpu"


def load_any(name_or_path: str):
    """A GEMM ``CaseFile`` or, for "mode": "moe", an ``MoECaseFile``."""
    path = _cases.resolve(name_or_path)
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise _cases.CaseError(f"{path}: not JSON ({e})") from e
    if d.get("mode", "gemm") == "moe":
        from gemmlab.grade import moe

        return moe.load(path, d)
    if d.get("mode", "gemm") != "gemm":
        raise _cases.CaseError(f"{path}: mode {d['mode']!r}: gemm or moe")
    return _cases.load(str(path))


def grade(cases: str | None = None, kernel: str | None = None, signature: str | None = None,
          allow_vendor: bool = False, timeout: float = 60.0, seed: int = 0, rounds: int | None = None,
          progress=None) -> dict:
    """Grade ``kernel`` (None: gemmlab's own; else FILE.py:FN or package.module:FN) on a case file."""
    cf = load_any(cases or default_cases())
    if getattr(cf, "mode", "gemm") == "moe":
        from gemmlab.grade.moe import MoEGrader

        if signature not in (None, "moe"):
            raise _cases.CaseError(f"--signature {signature!r}: an moe case file takes FN(x, w1, w2, weights, ids)")
        return MoEGrader(cf, kernel, allow_vendor, max(timeout, 120.0), seed, rounds, progress).run()
    if signature not in (None, "rowmajor", "colmajor"):
        raise _cases.CaseError(f"--signature {signature!r}: rowmajor or colmajor")
    return Grader(cf, kernel, signature, allow_vendor, timeout, seed, rounds, progress).run()


__all__ = ["default_cases", "grade", "load_any"]
