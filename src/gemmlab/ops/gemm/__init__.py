"""Dense GEMM, the public module: what a user calls is its ``__all__`` (``gemm``, ``pack_b``, ``plan``, ``run``,
``gemm_colmajor``, ``paths``; ``Plan``, ``GemmConfig``, ``PackedB``).

    C (M, N) = A (M, K) @ B (K, N)     fp16 or bf16 in, fp32 accumulation, C in the input dtype

The names load on first use from ``api`` (signatures, checks, docstrings), so importing a detail beside it (the
argument checks ``ops.gemm.custom`` registers at ``import gemmlab``) loads no kernel. The details, imported by ``api``
only (and by ``ops.introspect`` for the lab):

    checks     one clear error per bad operand (torch only, no kernel)
    planner    the Plan: every decision of a call, its launch included (route rules in ``route``, the staging cost
               rule in ``staging``)
    launch     runs a Plan exactly as planned, reading it only; the signature cache of the eager hot path
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gemmlab.ops import lazy

if TYPE_CHECKING:
    from gemmlab.ops.gemm.api import (
        GemmConfig,
        PackedB,
        Plan,
        gemm,
        gemm_colmajor,
        pack_b,
        paths,
        plan,
        run,
    )

__all__ = [
    "GemmConfig",
    "PackedB",
    "Plan",
    "gemm",
    "gemm_colmajor",
    "pack_b",
    "paths",
    "plan",
    "run",
]


__getattr__, __dir__ = lazy.names(__name__, "gemmlab.ops.gemm.api", __all__)
