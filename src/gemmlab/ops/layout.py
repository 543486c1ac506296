"""Layout facts of 2-D operands that the checks, the planners and the launchers share (torch only, no kernel):
which dim is unit-stride, whether TMA can describe an operand, the 16-byte row padding, memory spans.

    is_kmajor(t, inner)      True: dim ``inner`` unit-stride; False: the other one; None: neither
    tma_ok(t, inner)         a TMA descriptor can cover t (base, outer stride 16-byte aligned, rows apart)
    rows_tma_ok(t)           the same for rows with unit inner stride (the MoE operands)
    padded_k(k)              a row of k fp16/bf16 elements padded to 16 bytes
    span(t), extent(t)       the bytes a strided tensor may touch
    overlap(x, y)            whether two tensors' spans intersect
"""

from __future__ import annotations

import torch

DTYPES = (torch.float16, torch.bfloat16)


def is_kmajor(t: torch.Tensor, inner_dim: int) -> bool | None:
    """True if ``inner_dim`` is unit-stride (or of size <= 1), False if the other dim is, None if neither."""
    if t.stride(inner_dim) == 1 or t.shape[inner_dim] <= 1:
        return True
    if t.stride(1 - inner_dim) == 1 or t.shape[1 - inner_dim] <= 1:
        return False
    return None


def tma_ok(t: torch.Tensor, inner_dim: int) -> bool:
    """Can a TMA descriptor cover this 2-D operand, with ``inner_dim`` unit-stride? Base 16-byte aligned;
    the outer stride a multiple of 16 bytes that does not overlap rows (irrelevant when that dim is 1)."""
    if t.data_ptr() % 16:
        return False
    outer = 1 - inner_dim
    if t.shape[outer] <= 1:
        return True
    stride = t.stride(outer)
    return (stride * t.element_size()) % 16 == 0 and stride >= max(t.shape[inner_dim], 1)


def rows_tma_ok(t: torch.Tensor) -> bool:
    """Rows (the last dim unit-stride) a TMA descriptor can cover: 16-byte aligned base and row stride, rows
    that do not overlap (an expanded gradient has row stride 0, which a TMA descriptor cannot describe)."""
    return (
        t.stride(-1) == 1
        and t.data_ptr() % 16 == 0
        and (t.stride(-2) * t.element_size()) % 16 == 0
        and t.stride(-2) >= t.shape[-1]
    )


def padded_k(k: int) -> int:
    """Elements a K-major row is padded to for TMA: a multiple of 8 (16 bytes in fp16/bf16), at least 8."""
    return max(8, -(-k // 8) * 8)


def span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses a strided tensor may touch."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


def extent(t: torch.Tensor) -> int:
    """Bytes from the first to past the last address ``t`` may touch."""
    lo, hi = span(t)
    return hi - lo


def descriptor_layout(
    shape, strides, inner: int, block: tuple[int, int], elem_bytes: int = 2
) -> tuple[list, list, list]:
    """(shape, strides, block) of a TMA descriptor over the 2-D view of a buffer shaped and strided like this whose
    unit-stride dim is ``inner``: shape (outer, inner). A size-1 outer dim gets a canonical stride (its row rounded
    up to 16 bytes of ``elem_bytes``-byte elements)."""
    outer = 1 - inner
    rows, cols = shape[outer], shape[inner]
    per_16 = 16 // elem_bytes
    stride = strides[outer] if rows > 1 else -(-max(cols, 1) // per_16) * per_16
    return [rows, cols], [stride, 1], list(block)


def overlap(x: torch.Tensor, y: torch.Tensor) -> bool:
    (x0, x1), (y0, y1) = span(x), span(y)
    return x0 < y1 and y0 < x1


def overlaps_itself(t: torch.Tensor) -> bool:
    """A 2-D tensor whose rows (along its outer dim) overlap each other."""
    inner = 1 if is_kmajor(t, 1) else 0
    outer = 1 - inner
    return t.shape[outer] > 1 and t.stride(outer) < max(t.shape[inner], 1)
