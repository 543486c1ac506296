"""The dense GEMM's argument checks (torch only, no kernel): one clear error per bad operand, and the kernel
view of good ones.

    check_operand(name, t)       a 2-D fp16/bf16 tensor
    operands(a, b, out, memory)  every check of gemm(a, b, out=out); -> (a', b', c', swap_ab), c' row-major
    check_out(op, out, **inputs) out shares memory neither with itself nor with an input (every public op's)
"""

from __future__ import annotations

import torch

from gemmlab.ops.layout import DTYPES, is_kmajor, overlap, overlaps_itself


def check_operand(name: str, t: object) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gemm: {name} must be a torch.Tensor or (for b) a PackedB, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"gemm: {name} must be 2-D, got {t.dim()}-D with shape {tuple(t.shape)}")
    if t.dtype not in DTYPES:
        raise TypeError(f"gemm: {name} has dtype {t.dtype}; supported: float16, bfloat16")


def operands(a, b, out, memory: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
    """Check the caller's 2-D operands (a PackedB already unpacked to its view); return the kernel view
    (a', b', c', swap_ab) with c' row-major. ``memory`` False: not whether out overlaps a or b (fake tensors
    have no memory)."""
    check_operand("a", a)
    check_operand("b", b)
    if a.dtype != b.dtype:
        raise TypeError(f"gemm: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"gemm: a and b are on different devices ({a.device} and {b.device})")
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"gemm: inner dimensions differ: a is {m}x{k}, b is {k2}x{n}")
    for name, t, inner in (("a", a, 1), ("b", b, 0)):
        if is_kmajor(t, inner) is None:
            raise ValueError(
                f"gemm: {name} has strides {t.stride()}: neither dimension is unit-stride; pass {name}.contiguous()"
            )
    swap = False
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"gemm: out must be a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (m, n):
            raise ValueError(f"gemm: out has shape {tuple(out.shape)}, expected ({m}, {n})")
        if out.dtype != a.dtype:
            raise TypeError(f"gemm: out has dtype {out.dtype}, expected {a.dtype}")
        if out.device != a.device:
            raise ValueError(f"gemm: out is on {out.device}, operands on {a.device}")
        row = is_kmajor(out, 1)
        if row is None:
            raise ValueError(f"gemm: out (strides {out.stride()}) needs one unit-stride dimension")
        if memory:
            check_out("gemm", out, a=a, b=b)
        if not row:  # column-major C: compute C^T (N, M) = B^T (N, K) @ A^T (K, M)
            a, b, out, swap = b.t(), a.t(), out.t(), True
    return a, b, out, swap


def check_out(op: str, out: torch.Tensor, **inputs: torch.Tensor) -> None:
    """Every public op's ``out`` check (one place): out's own elements must not share memory (a stride 0 or
    overlapping rows of a 2-D out), and out must not overlap any input."""
    if out.numel() > 1 and (
        any(st == 0 and sz > 1 for sz, st in zip(out.shape, out.stride(), strict=True))
        or (out.dim() == 2 and is_kmajor(out, 1) is not None and overlaps_itself(out))
    ):
        raise ValueError(
            f"{op}: out (shape {tuple(out.shape)}, strides {out.stride()}) has elements that share "
            "memory (a stride 0 or overlapping rows); pass a fresh tensor"
        )
    for name, t in inputs.items():
        if overlap(out, t):
            raise ValueError(f"{op}: out overlaps {name} in memory; results would be corrupted")
