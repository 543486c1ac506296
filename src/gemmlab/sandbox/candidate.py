"""Loading a candidate kernel and calling it through its signature: the leaf that the grader and ``bench``
both import (it imports nothing of gemmlab at module level).

    fn = load_kernel("FILE.py:FN" | "package.module:FN" | None | "builtin:NAME", signature)
    problem = invoke(fn, signature, layout, inputs, out)   # None, or what was wrong with the result

Signatures (``inputs`` are the logical operands; ``out`` a flat output buffer the caller owns):
    rowmajor  FN(a (M, K), b (K, N)) -> c (M, N)             the result is copied into ``out``
    colmajor  FN(A, B, C, M, N, K)   writes C in place        (the competition's: flat column-major buffers)
    moe       FN(x, w1, w2, topk_weights, topk_ids) -> y      the result is copied into ``out``
    fp8       FN(a, b, a_scale, b_scale, c, M, N, K)         writes c in place: a (M, K) and b (N, K) e4m3,
              both K-major (b in the nn.Linear layout, B = b^T); a_scale () or (M, 1), b_scale () or (1, N) fp32
              (per tensor, or per row of A and column of B); c (M, N) row-major in the case's dtype. No copy in
              the call: ``torch._scaled_mm(a, b.t(), a_scale, b_scale, out=c)`` and ``gemmlab.gemm_fp8(a, b.t(),
              a_scale, b_scale, out=c)`` take exactly these tensors.
    moe_fp8   FN(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out)   writes out (T, H) in place: x (T, H)
              bf16/fp16; w1 (E, 2I, H) and w2 (E, H, I) e4m3, both K-major (gate rows [0, I) then up rows [I, 2I)
              in w1), their fp32 scales (E, cdiv(2I, 128), cdiv(H, 128)) and (E, cdiv(H, 128), cdiv(I, 128)), one
              per 128x128 block of each expert (``gemmlab.PackedMoEFP8``'s fields, ``pack_moe_fp8``'s layout);
              topk_weights (T, k) fp32, topk_ids (T, k) int; out (T, H) in x's dtype.
``out`` is stored in ``layout`` (rowmajor: (M, N) row-major; colmajor: column-major), so the caller reads
the same logical C whatever the signature. Builtins (trusted, for baselines): ``builtin:cublas`` (torch.mm
into ``out``, colmajor signature), ``builtin:cublas_rowmajor`` (returns torch.mm, rowmajor: it pays the
same copy into ``out`` as a row-major candidate), ``builtin:composite`` (``ref.moe_composite``, moe signature),
``builtin:empty`` (does nothing: the protocol's own overhead); fp8 signature: ``builtin:scaled_mm``
(``scaled_mm_fp8``: torch._scaled_mm, or where torch cannot run it for these scales on this device, a dequantize +
fp32 matmul fallback, ``SCALED_MM_FALLBACK``: on a GPU for N % 16 != 0), ``builtin:gemmlab_fp8`` (gemmlab.gemm_fp8);
moe_fp8 signature: ``builtin:gemmlab_moe_fp8`` (``moe_forward`` on a ``PackedMoEFP8`` of the given tensors, no
copy), ``builtin:composite_fp8`` (``ref.moe_composite`` on the weights dequantized to x's dtype, once per set of
weights: ``dequantized_experts``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

SIGNATURES = ("rowmajor", "colmajor", "moe", "fp8", "moe_fp8")
SCALED_MM_FALLBACK = "dequantize to fp32 + fp32 matmul (torch._scaled_mm cannot run these scales here)"


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


_SCALED_MM_RUNS: dict = {}  # (device, per row, out dtype, M % 16 == 0, N % 16 == 0) -> whether it runs


def scaled_mm_runs(device, per_row: bool, dtype, m: int, n: int) -> bool:
    """Whether torch._scaled_mm multiplies e4m3 with these scales (per tensor, or per row and column) into ``dtype``
    on ``device`` for an M and N like ``m`` and ``n`` (cuBLASLt wants N % 16 == 0; torch may lack the op, or the
    device's BLAS these scales): tried once on a (16 or 17) x 16 x (16 or 17) product."""
    import torch

    key = (str(device), per_row, dtype, m % 16 == 0, n % 16 == 0)
    if key not in _SCALED_MM_RUNS:
        rows, cols = (16 if x % 16 == 0 else 17 for x in (m, n))
        a, b = (torch.ones(r, 16, device=device).to(torch.float8_e4m3fn) for r in (rows, cols))
        sa, sb = (
            (torch.ones((rows, 1), device=device), torch.ones((1, cols), device=device))
            if per_row
            else (torch.ones((), device=device), torch.ones((), device=device))
        )
        try:
            torch._scaled_mm(a, b.t(), sa, sb, out_dtype=dtype)
            _SCALED_MM_RUNS[key] = True
        except (AttributeError, RuntimeError, NotImplementedError, ValueError):
            _SCALED_MM_RUNS[key] = False
    return _SCALED_MM_RUNS[key]


def scaled_mm_fp8(a, b, a_scale, b_scale, c, M, N, K):
    """The fp8 baseline: c (M, N) = (a * a_scale) @ (b * b_scale)^T by torch._scaled_mm, written into c; where
    it cannot run (``scaled_mm_runs``), ``SCALED_MM_FALLBACK``: dequantized to fp32, one fp32 matmul, rounded once."""
    import torch

    if scaled_mm_runs(a.device, a_scale.dim() == 2, c.dtype, M, N):
        torch._scaled_mm(a, b.t(), a_scale, b_scale, out_dtype=c.dtype, out=c)
    else:
        c.copy_(torch.mm(a.float() * a_scale, (b.float() * b_scale.t()).t()))


def _gemmlab_fp8(a, b, a_scale, b_scale, c, M, N, K):
    import gemmlab

    gemmlab.gemm_fp8(a, b.t(), a_scale, b_scale, out_dtype=c.dtype, out=c)


def _gemmlab_moe_fp8(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    import gemmlab

    packed = gemmlab.PackedMoEFP8(w1, w1_scale, w2, w2_scale)  # the given tensors themselves (moe_forward checks)
    out.copy_(gemmlab.moe_forward(x, packed, None, topk_weights, topk_ids))


_DEQUANTIZED: list = []  # at most one (key, the four tensors, (w1, w2) dequantized)


def dequantized_experts(w1, w1_scale, w2, w2_scale, dtype):
    """(w1 (E, 2I, H), w2 (E, H, I)) in ``dtype``: each expert's e4m3 times its 128x128 block scales
    (``ref.dequantize_fp8``), made once per set of weights (the MoE weights are fixed for a run) and kept. The
    key is the tensors' addresses, shapes and dtypes; the kept entry holds the four tensors, so their memory
    cannot be reused by other weights while the entry stands."""
    import torch

    from gemmlab.ref import FP8_SCALE_BLOCK, dequantize_fp8

    tensors = (w1, w1_scale, w2, w2_scale)
    key = (dtype, *((t.data_ptr(), tuple(t.shape), t.dtype, str(t.device)) for t in tensors))
    if not _DEQUANTIZED or _DEQUANTIZED[0][0] != key:
        _DEQUANTIZED.clear()  # the old entry's memory goes before the new one is made
        block = (FP8_SCALE_BLOCK, FP8_SCALE_BLOCK)
        pair = []
        for q, s in ((w1, w1_scale), (w2, w2_scale)):
            w = torch.empty(q.shape, dtype=dtype, device=q.device)
            for e in range(q.shape[0]):
                w[e] = dequantize_fp8(q[e], s[e], block).to(dtype)
            pair.append(w)
        _DEQUANTIZED.append((key, tensors, tuple(pair)))
    return _DEQUANTIZED[0][2]


def _composite_fp8(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    from gemmlab.ref import moe_composite

    dw1, dw2 = dequantized_experts(w1, w1_scale, w2, w2_scale, x.dtype)
    out.copy_(moe_composite(x, dw1, dw2, topk_weights, topk_ids))


BUILTINS = {
    "cublas": _cublas_colmajor,
    "cublas_rowmajor": _cublas_rowmajor,
    "composite": _composite,
    "empty": _empty,
    "scaled_mm": scaled_mm_fp8,
    "gemmlab_fp8": _gemmlab_fp8,
    "gemmlab_moe_fp8": _gemmlab_moe_fp8,
    "composite_fp8": _composite_fp8,
}


def load_kernel(spec: str | None, signature: str):
    """``FILE.py:FN`` or ``package.module:FN``; None means gemmlab's own kernel for the signature;
    ``builtin:NAME`` one of ``BUILTINS``."""
    if spec is None:
        import gemmlab

        return {
            "colmajor": gemmlab.gemm_colmajor,
            "moe": gemmlab.moe_forward,
            "fp8": _gemmlab_fp8,
            "moe_fp8": _gemmlab_moe_fp8,
        }.get(signature, gemmlab.gemm)
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
    if signature == "fp8":
        a, b, a_scale, b_scale = inputs
        fn(a, b, a_scale, b_scale, out.view(a.shape[0], b.shape[0]), a.shape[0], b.shape[0], a.shape[1])
        return None
    if signature == "moe_fp8":
        fn(*inputs, out.view(inputs[0].shape))
        return None
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
