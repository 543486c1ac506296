"""The FP8 ops' argument checks, on metadata only (shapes, dtypes, devices), so the custom ops' fake implementations
run them too. Torch only. Legend: M rows of A and C, N columns of B and C, K the reduction, Kb = cdiv(K, 128) and
Nb = cdiv(N, 128) the 128-blocks.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GRANULARITIES = ("tensor", "row", "col", "block")
SCALE_BLOCK = 128  # the block edge of block scales (1x128 for A, 128x128 for B)


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def fp8_out_dtype(op: str, out_dtype, out, default: torch.dtype) -> torch.dtype:
    """The output dtype of an FP8 op: ``out_dtype`` if given, else out's dtype if ``out`` is given, else
    ``default``. Both given and different: a ValueError (which one the caller meant is not ours to guess)."""
    out_type = out.dtype if isinstance(out, torch.Tensor) else None
    if out_dtype is None:
        return out_type or default
    if out_type is not None and out_dtype != out_type:
        raise ValueError(f"{op}: out has dtype {out_type} but out_dtype is {out_dtype}; pass one, or both the same")
    return out_dtype


def check_gemm_fp8_args(a, b, a_scale, b_scale, out_dtype, out=None) -> int:
    """Check ``gemm_fp8``'s arguments and return the scale mode the scale shapes name: 0 per tensor, 1 per row of A
    and column of B, 2 block (``kernels.gemm_fp8``). One ValueError or TypeError naming the problem otherwise."""
    for name, t in (("a", a), ("b", b), ("a_scale", a_scale), ("b_scale", b_scale)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm_fp8: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2:
            raise ValueError(f"gemm_fp8: {name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype != FP8:
            raise TypeError(
                f"gemm_fp8: {name} has dtype {t.dtype}; expected torch.float8_e4m3fn (gemmlab.quantize_fp8 makes it)"
            )
    for name, t in (("a_scale", a_scale), ("b_scale", b_scale)):
        if t.dtype != torch.float32:
            raise TypeError(f"gemm_fp8: {name} has dtype {t.dtype}; expected torch.float32")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"gemm_fp8: out_dtype {out_dtype}; supported: bfloat16, float16, float32")
    devices = {t.device for t in (a, b, a_scale, b_scale)}
    if len(devices) > 1:
        raise ValueError(f"gemm_fp8: a, b and the scales must be on one device, got {sorted(map(str, devices))}")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"gemm_fp8: inner dimensions differ: a is {m}x{k}, b is {k2}x{n}")
    for name, t in (("a", a), ("b", b)):
        if t.stride(0) != 1 and t.stride(1) != 1 and t.shape[0] > 1 and t.shape[1] > 1:
            raise ValueError(f"gemm_fp8: {name} has strides {t.stride()}: neither dimension is unit-stride")
    if a.shape[1] > 1 and a.stride(1) != 1:
        raise ValueError(
            f"gemm_fp8: a must be K-major (row-major (M, K), unit stride along K), got strides {a.stride()}"
        )
    mode = scale_mode(tuple(a_scale.shape), tuple(b_scale.shape), m, n, k)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"gemm_fp8: out must be a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (m, n) or out.dtype != out_dtype or out.device != a.device:
            raise ValueError(
                f"gemm_fp8: out must be ({m}, {n}) {out_dtype} on {a.device}, got "
                f"{tuple(out.shape)} {out.dtype} on {out.device}"
            )
        if n > 1 and m > 1 and out.stride(1) != 1:
            raise ValueError(f"gemm_fp8: out must be row-major (unit stride along N), got strides {out.stride()}")
    return mode


def scale_mode(sa: tuple, sb: tuple, m: int, n: int, k: int) -> int:
    """The scale mode of scale shapes ``sa`` (of a_scale) and ``sb`` (of b_scale) for an (M, K) @ (K, N) product."""
    kb, nb = _cdiv(k, SCALE_BLOCK), _cdiv(n, SCALE_BLOCK)
    for mode, (want_a, want_b) in enumerate((((), ()), ((m, 1), (1, n)), ((m, kb), (kb, nb)))):
        if (
            len(sa) == len(want_a)
            and len(sb) == len(want_b)
            and all(x == y for x, y in zip(sa + sb, want_a + want_b, strict=True))
        ):  # (== holds for symbolic sizes)
            return mode
    raise ValueError(
        f"gemm_fp8: scale shapes a_scale {sa}, b_scale {sb} fit no granularity for M={m} N={n} K={k}; "
        f"expected per tensor () and (), per row/column ({m}, 1) and (1, {n}), or block "
        f"({m}, {kb}) and ({kb}, {nb}) (1x128 blocks of A, 128x128 blocks of B)"
    )


def check_quantize_args(x, granularity: str, block) -> tuple[int, int]:
    """Check ``quantize_fp8``'s arguments; returns the block (rows, cols) for "block" ((1, 1) otherwise)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize_fp8: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in OUT_DTYPES:
        raise TypeError(f"quantize_fp8: x has dtype {x.dtype}; supported: bfloat16, float16, float32")
    if granularity not in GRANULARITIES:
        raise ValueError(f"quantize_fp8: granularity {granularity!r}; one of {list(GRANULARITIES)}")
    if granularity != "tensor" and x.dim() != 2:
        raise ValueError(f"quantize_fp8: granularity {granularity!r} needs a 2-D x, got shape {tuple(x.shape)}")
    if granularity != "block":
        return (1, 1)
    if not isinstance(block, (tuple, list)) or len(block) != 2 or not all(type(v) is int and v > 0 for v in block):
        raise ValueError(f"quantize_fp8: block must be two positive integers (rows, cols), got {block!r}")
    return (block[0], block[1])


def quantize_scale_shape(shape: tuple, granularity: str, block: tuple[int, int]) -> tuple:
    """The shape of the scale ``quantize_fp8`` returns for an x of ``shape``."""
    if granularity == "tensor":
        return ()
    rows, cols = shape
    if granularity == "row":
        return (rows, 1)
    if granularity == "col":
        return (1, cols)
    return (_cdiv(rows, block[0]), _cdiv(cols, block[1]))
