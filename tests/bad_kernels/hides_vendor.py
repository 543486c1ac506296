"""Calls the vendor BLAS after silencing, at import, the profiler of its own process: the worker's
``_profiled`` (``gemmlab.sandbox.serve``'s, or ``box``'s where it lived before, and ``__main__``'s should it run
as a script) drops
cuBLAS kernel names and aten::mm. Row-major signature FN(a, b) -> c. Only an observer outside the
candidate's Python (the preloaded interposer) still sees the call."""

import sys

import torch

for _mod in (sys.modules["__main__"], sys.modules.get("gemmlab.sandbox.serve"), sys.modules.get("gemmlab.sandbox.box")):
    _real = getattr(_mod, "_profiled", None)
    if _real is not None:

        def _quiet(call, device, real=_real):
            out, kernels, ops = real(call, device)
            return (
                out,
                [k for k in kernels if "gemm" not in k.lower() and "cublas" not in k.lower()],
                [o for o in ops if o not in ("aten::mm", "aten::matmul")],
            )

        _mod._profiled = _quiet


def hides_torch_mm(a, b):
    return torch.mm(a, b)
