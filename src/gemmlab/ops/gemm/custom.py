"""gemmlab's dense GEMM as ``torch.library`` custom ops (``torch.ops.gemmlab.*``): fake (meta) implementations for
``torch.compile`` and the autograd formula.

    gemmlab::gemm(a (M, K), b (K, N)) -> (M, N)              dA = dC B^T, dB = A^T dC (gemmlab's gemm)
    gemmlab::gemm_out(a, b, out!)                            out= variant (no autograd)

Registered on ``import gemmlab`` (this module imports torch and the checks only): the op's body imports its
launcher on first call, so no Triton kernel loads before one runs (Triton decides at a kernel's import whether it
runs compiled or under its CPU interpreter). The op checks its own arguments, in the real implementation (the
launcher's checks) and, on metadata, in the fake one: a direct ``torch.ops.gemmlab.gemm`` call gets the same one
clear error as the Python function.

The public ``gemmlab.gemm`` calls these ops whenever the call is traced (torch.compile), needs autograd, or runs
under a dispatch mode or functorch transform; a plain eager call with no grad goes straight to the same
implementation (``ops.launch.direct``), so it does not pay the dispatcher's and autograd wrapper's host cost. The op
is opaque to the compiler: inside a compiled graph it runs gemmlab's launcher as in eager. The input gradients (dA,
dB) run on gemmlab's gemm on transposed views. The MoE ops are ``ops.moe.custom``, the FP8 ones ``ops.fp8.custom``.
"""

import torch
from torch import Tensor

from gemmlab.ops.dispatch import negative_kernel, unit
from gemmlab.ops.gemm.checks import check_operand, operands


def _launch_gemm(a, b, out):
    from gemmlab.ops.gemm.launch import launch_gemm  # (the first call loads the kernels)

    return launch_gemm(a, b, out)


def _fake_gemm_operands(a, b, out=None):
    check_operand("a", a)
    check_operand("b", b)
    if a.dtype != b.dtype:
        raise TypeError(f"gemm: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    torch._check_with(
        ValueError,
        a.shape[1] == b.shape[0],
        lambda: f"gemm: inner dimensions differ: a is {a.shape[0]}x{a.shape[1]}, b is {b.shape[0]}x{b.shape[1]}",
    )
    if out is not None:
        operands(a, b, out, memory=False)


# ------------------------------------------------------------------------------------------------ gemm


@torch.library.custom_op("gemmlab::gemm", mutates_args=())
def gemm(a: Tensor, b: Tensor) -> Tensor:
    return _launch_gemm(a, b, None)


@gemm.register_fake
def _(a, b):
    _fake_gemm_operands(a, b)
    return a.new_empty((a.shape[0], b.shape[1]))


def _gemm_setup(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)


def _gemm_backward(ctx, dc):
    a, b = ctx.saved_tensors
    dc = unit(dc)
    da = gemm(dc, b.t()) if ctx.needs_input_grad[0] else None  # (M, N) @ (N, K)
    db = gemm(a.t(), dc) if ctx.needs_input_grad[1] else None  # (K, M) @ (M, N)
    return da, db


gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup)


@torch.library.custom_op("gemmlab::gemm_out", mutates_args=("out",))
def gemm_out(a: Tensor, b: Tensor, out: Tensor) -> None:
    _launch_gemm(a, b, out)


@gemm_out.register_fake
def _(a, b, out):
    _fake_gemm_operands(a, b, out)
    return None


negative_kernel("gemm_out", 2)
