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

from dataclasses import dataclass

import torch
import triton
from triton import knobs

from gemmlab.ops import cache
from gemmlab.ops import launch as kept_launch
from gemmlab.ops.fp8.checks import FP8, check_quantize_args

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


@dataclass(frozen=True, slots=True)
class QuantPlan:
    """A signature's decision: the Triton kernel (``slot``: grid, BLOCK, warps; ``group`` columns per scale) or torch
    ops (``slot`` None), and whether x is copied to a unit column stride first."""

    slot: kept_launch.Planned | None
    group: int
    granularity: str
    block: tuple[int, int]
    contiguous: bool


# Per signature (x's shape, strides, dtype, device and 16-byte alignment, granularity, block): the checked plan, its
# kept kernel once compiled. Least recently used out first (``ops.cache``).
PLANS = cache.bounded("quantize_fp8.plans")


def _plan(x: torch.Tensor, granularity: str, block) -> QuantPlan:
    """Every check, then the route: the kernel for rows and 1 x c blocks of a 2-D x on a device it runs on (CUDA, or
    the CPU under the interpreter), torch ops otherwise."""
    block = check_quantize_args(x, granularity, block)
    kernel = x.numel() and (x.is_cuda or (x.device.type == "cpu" and knobs.runtime.interpret))
    if not kernel or not (granularity == "row" or (granularity == "block" and block[0] == 1)):
        return QuantPlan(None, 0, granularity, block, False)
    from gemmlab.kernels.gemm_fp8 import quantize_groups_kernel  # (the first call loads the kernel)

    m, k = x.shape
    group = k if granularity == "row" else block[1]
    width = min(CHUNK, triton.next_power_of_2(group))
    slot = kept_launch.Planned(
        quantize_groups_kernel, (m, -(-k // group), 1), {"BLOCK": width}, {"num_warps": 4 if width >= 512 else 1}
    )
    return QuantPlan(slot, group, granularity, block, x.stride(-1) != 1)


def _quantize_groups(x: torch.Tensor, p: QuantPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel: one scale per ``group`` columns of each row (group = K: per row); fresh q and scale (their
    16-byte alignment is the allocator's, so a kept kernel's specialization holds)."""
    x = x.contiguous() if p.contiguous else x
    m, k = x.shape
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    scale = torch.empty((m, p.slot.grid[1]), dtype=torch.float32, device=x.device)
    slot = p.slot
    kept_launch.fire(
        slot, [x, q, scale, k, x.stride(0), q.stride(0), scale.stride(0), p.group], kept_launch.usable(slot.kept)
    )
    return q, scale


def launch_quantize_fp8(x: torch.Tensor, granularity: str, block) -> tuple[torch.Tensor, torch.Tensor]:
    """The launcher behind ``quantize_fp8`` and its custom op: checks and plans once per signature (``PLANS``; the
    key proves every check), then the kernel (rows, 1 x c blocks) or torch ops (the same values bit for bit:
    tests/fp8/test_gemm_fp8.py), e.g. on "meta" tensors (shapes only)."""
    try:
        key = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16, granularity, tuple(block))
        hash(key)
    except (AttributeError, TypeError, RuntimeError):  # not a tensor, an odd block: the checks say what is wrong
        key = None
    p = PLANS.get(key) if key is not None else None
    if p is None:
        p = _plan(x, granularity, block)
        if key is not None:
            PLANS[key] = p
    if p.slot is None:
        return quantize_torch(x, p.granularity, p.block)
    return _quantize_groups(x, p)
