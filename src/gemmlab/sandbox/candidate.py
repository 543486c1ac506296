"""Loading a candidate kernel and calling it through its signature: the leaf that the grader and ``bench``
both import (it imports nothing of gemmlab at module level).

    fn = load_kernel("FILE.py:FN" | "package.module:FN" | None | "builtin:NAME", signature)
    problem = invoke(fn, signature, layout, inputs, out)   # None, or what was wrong with the result

Signatures (``inputs`` are the logical operands; ``out`` a flat output buffer the caller owns):
    rowmajor  FN(a (M, K), b (K, N)) -> c (M, N)             the result is copied into ``out``
    colmajor  FN(A, B, C, M, N, K)   writes C in place        (the competition's: flat column-major buffers)
    moe       FN(x, w1, w2, topk_weights, topk_ids) -> y      the result is copied into ``out``
``out`` is stored in ``layout`` (rowmajor: (M, N) row-major; colmajor: column-major), so the caller reads
the same logical C whatever the signature. Builtins (trusted, for baselines): ``builtin:cublas`` (torch.mm
into ``out``, colmajor signature), ``builtin:cublas_rowmajor`` (returns torch.mm, rowmajor: it pays the
same copy into ``out`` as a row-major candidate), ``builtin:composite`` (``ref.moe_composite``, moe signature),
``builtin:empty`` (does nothing: the protocol's own overhead).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

SIGNATURES = ("rowmajor", "colmajor", "moe")


def _cublas_colmajor(A, B, C, M, N, K):
    import torch

    torch.mm(B.view(N, K), A.view(K, M), out=C.view(N, M))  # C^T (N, M) = B^T (N, K) @ A^T (K, M)


def _cublas_rowmajor(a, b):
    import torch

    return torch.mm(a, b)


def _composite(x, w1, w2, weights, ids):
    from gemmlab.ref import moe_composite

    return moe_composite(x, w1, w2, weights, ids)


def _empty(*args):
    return None


BUILTINS = {"cublas": _cublas_colmajor, "cublas_rowmajor": _cublas_rowmajor, "composite": _composite,
            "empty": _empty}


def load_kernel(spec: str | None, signature: str):
    """``FILE.py:FN`` or ``package.module:FN``; None means gemmlab's own kernel for the signature;
    ``builtin:NAME`` one of ``BUILTINS``."""
    if spec is None:
        import gemmlab

        return {"colmajor": gemmlab.gemm_colmajor, "moe": gemmlab.moe_forward}.get(signature, gemmlab.gemm)
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ValueError(f"--kernel {spec!r}: expected FILE.py:FN or package.module:FN")
    if target == "builtin":
        if name not in BUILTINS:
            raise ValueError(f"builtin {name!r}: one of {', '.join(BUILTINS)}")
        return BUILTINS[name]
    if target.endswith(".py"):
        path = Path(target).resolve()
        mod_spec = importlib.util.spec_from_file_location(f"gemmlab_candidate_{path.stem}", path)
        if mod_spec is None or not path.is_file():
            raise FileNotFoundError(f"--kernel: no file {path}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"--kernel {spec!r}: {name!r} is not a function of {target}")
    return fn


def logical_out(out, m: int, n: int, layout: str):
    """The (M, N) logical view of a flat output buffer stored in ``layout``."""
    return out.view(n, m).t() if layout == "colmajor" else out.view(m, n)


def _result_problem(res, want) -> str | None:
    import torch

    if not isinstance(res, torch.Tensor):
        return f"returned {type(res).__name__}, expected a torch.Tensor"
    if tuple(res.shape) != tuple(want.shape):
        return f"returned shape {tuple(res.shape)}, expected {tuple(want.shape)}"
    if res.dtype != want.dtype:
        return f"returned dtype {res.dtype}, expected {want.dtype}"
    if res.device != want.device:
        return f"returned a tensor on {res.device}, expected {want.device}"
    return None


def invoke(fn, signature: str, layout: str, inputs: tuple, out) -> str | None:
    """Call ``fn`` on ``inputs`` so that its result lands in the flat buffer ``out`` (stored in
    ``layout``); returns None, or what was wrong with a returned result (then ``out`` is left as it was)."""
    if signature == "moe":
        res = fn(*inputs)
        want = out.view(inputs[0].shape)
    else:
        a, b = inputs
        m, k = a.shape
        n = b.shape[1]
        want = logical_out(out, m, n, layout)
        if signature == "colmajor":
            if layout == "colmajor":  # the buffers are the operands' own memory
                fn(a.t().reshape(-1), b.t().reshape(-1), out, m, n, k)
            else:  # row-major X is column-major X^T, so C^T = B^T A^T
                fn(b.reshape(-1), a.reshape(-1), out, n, m, k)
            return None
        res = fn(a, b)
    if fn is _empty:
        return None
    problem = _result_problem(res, want)
    if problem is None:
        want.copy_(res)
    return problem
