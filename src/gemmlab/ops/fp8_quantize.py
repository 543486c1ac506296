"""FP8 quantization, the details behind ``ops.gemm_fp8.quantize_fp8(x, granularity, block)`` -> (q e4m3, scale fp32),
with x ~= q * scale.

    "tensor"  scale ()                        one amax over x (torch ops)
    "row"     scale (M, 1)                    one per row: activations on the fly (Triton kernel)
    "col"     scale (1, N)                    one per column: a weight B (K, N) once (torch ops)
    "block"   scale (cdiv(M, r), cdiv(N, c))  one per r x c block: (1, 128) for activations (Triton kernel), (128, 128)
                                              for weights once (torch ops); any other block through torch ops

Every scale is amax / 448 over its group (448 the largest finite e4m3), 1 for an all-zero group (q is 0 there, never
NaN); q = clamp(x / scale, -448, 448) rounded to e4m3 (saturating: no Inf from rounding). A NaN in x gives its group
the scale 1 (its NaNs stay NaN, the rest saturate at 448); an Inf gives its group an infinite scale (its finite values
become 0, the Inf NaN). The input's values are not checked (that would cost a device sync per call).
The scales ``gemm_fp8`` takes: A (M, K) by "tensor", "row" or "block" (1, 128); B (K, N) by "tensor", "col" or
"block" (128, 128); an nn.Linear weight w (N, K) by "row" or "block" (128, 128), then passed as ``q.t()``,
``scale.t()``.
"""

from __future__ import annotations

import torch
import triton
from triton import knobs

from gemmlab.ops.fp8_checks import FP8, check_quantize_args

FP8_MAX = float(torch.finfo(FP8).max)  # 448
CHUNK = 1024  # the Triton kernel's columns per chunk of a row ("row" granularity)


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448, divided: by a tensor, not a Python number, which CUDA torch multiplies by 1 / 448 instead (one
    rounding more; the Triton kernel divides)."""
    amax = amax.float()
    return torch.where(amax > 0, amax / amax.new_full((), FP8_MAX), torch.ones_like(amax))


def _cast(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_torch(x: torch.Tensor, granularity: str, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch ops: per tensor, per column, and r x c blocks (x padded with zeros to whole blocks for the amax)."""
    if x.numel() == 0:
        shape = {"tensor": (), "row": (x.shape[0], 1), "col": (1, x.shape[-1])}.get(granularity)
        if shape is None:
            shape = (-(-x.shape[0] // block[0]), -(-x.shape[1] // block[1]))
        return x.to(FP8), torch.ones(shape, dtype=torch.float32, device=x.device)
    if granularity == "tensor":
        scale = _scale_of(x.abs().amax())
        return _cast(x, scale), scale
    if granularity == "col":
        scale = _scale_of(x.abs().amax(dim=0, keepdim=True))
        return _cast(x, scale), scale
    if granularity == "row":
        scale = _scale_of(x.abs().amax(dim=1, keepdim=True))
        return _cast(x, scale), scale
    (rows, cols), (r, c) = x.shape, block
    rb, cb = -(-rows // r), -(-cols // c)
    padded = x.new_zeros((rb * r, cb * c))
    padded[:rows, :cols] = x
    scale = _scale_of(padded.abs().view(rb, r, cb, c).amax(dim=(1, 3)))  # (rb, cb)
    full = scale.repeat_interleave(r, 0).repeat_interleave(c, 1)[:rows, :cols]
    return _cast(x, full), scale


def _quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel: one scale per ``group`` columns of each row (group = K: per row)."""
    from gemmlab.kernels.gemm_fp8 import quantize_groups_kernel  # (the first call loads the kernel)

    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    groups = -(-k // group)
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    scale = torch.empty((m, groups), dtype=torch.float32, device=x.device)
    block = min(CHUNK, triton.next_power_of_2(group))
    quantize_groups_kernel[(m, groups)](x, q, scale, k, x.stride(0), q.stride(0), scale.stride(0), group,
                                        BLOCK=block, num_warps=4 if block >= 512 else 1)
    return q, scale


def launch_quantize_fp8(x: torch.Tensor, granularity: str, block) -> tuple[torch.Tensor, torch.Tensor]:
    """The launcher behind ``quantize_fp8`` and its custom op: checks, then the kernel for rows and 1 x c blocks
    of a 2-D x on a device it runs on (CUDA, or the CPU under the interpreter), torch ops otherwise (the same
    values bit for bit: tests/fp8/test_gemm_fp8.py), e.g. on "meta" tensors (shapes only)."""
    block = check_quantize_args(x, granularity, block)
    kernel = x.numel() and (x.is_cuda or (x.device.type == "cpu" and knobs.runtime.interpret))
    if kernel and granularity == "row":
        return _quantize_groups(x, x.shape[1])
    if kernel and granularity == "block" and block[0] == 1:
        return _quantize_groups(x, block[1])
    return quantize_torch(x, granularity, block)
