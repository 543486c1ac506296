"""gemmlab: fast FP16/BF16 GEMM kernels in Triton, and the lab to grade, time, tune and record them.

Public API:
    gemm(a, b, *, out=None)            C = A @ B (fp16/bf16, fp32 accumulation)
    pack_b(b) -> PackedB               prepack a weight B once for the fast path
    gemm_colmajor(A, B, C, M, N, K)    the competition signature (column-major buffers)
    plan(a, b, *, out=None) -> Plan    which path/config gemm runs; paths() lists them all
    gemm_ref(a, b)                     the float64 reference

Names load on first use: Triton decides at a kernel's import whether it runs compiled or under its CPU
interpreter (TRITON_INTERPRET=1), so ``import gemmlab`` alone imports no kernel and the `gemmlab` command
can still choose the interpreter on machines without CUDA.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "PackedB": "gemmlab.ops.gemm", "gemm": "gemmlab.ops.gemm", "gemm_colmajor": "gemmlab.ops.gemm",
    "pack_b": "gemmlab.ops.gemm", "plan": "gemmlab.ops.gemm", "GemmConfig": "gemmlab.ops.plan",
    "Plan": "gemmlab.ops.plan", "paths": "gemmlab.ops.plan", "gemm_ref": "gemmlab.ref",
}
__all__ = ["GemmConfig", "PackedB", "Plan", "gemm", "gemm_colmajor", "gemm_ref", "pack_b", "paths", "plan"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from gemmlab.ops.gemm import PackedB, gemm, gemm_colmajor, pack_b, plan
    from gemmlab.ops.plan import GemmConfig, Plan, paths
    from gemmlab.ref import gemm_ref


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gemmlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
