"""Dense GEMM, the public module: ``gemm``, ``pack_b``, ``plan``, ``run`` and ``gemm_colmajor``.

    C (M, N) = A (M, K) @ B (K, N)     fp16 or bf16 in, fp32 accumulation, C in the input dtype

Each entry point (1) checks its operands (``ops.gemm.checks``), (2) plans (``ops.gemm.planner``), (3) allocates,
(4) launches exactly the planned kernel (``ops.gemm.launch``). A column-major C is computed as C^T = B^T A^T,
so the kernels only ever write a row-major C. Calls that trace, need autograd or run under a dispatch mode go
through the ``torch.ops.gemmlab`` custom ops (``ops.gemm.custom``); a plain eager call goes straight to the launcher.

What a user calls is in ``__all__``. The lab's way into the details (plans of kernel-view operands, what a plan's
kernel is compiled with, the kernels, the compiled kernel a path last ran, how a cached signature launches) is
``gemmlab.ops.introspect``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import replace

import torch

from gemmlab.ops import dispatch, launch
from gemmlab.ops.gemm import custom
from gemmlab.ops.gemm import launch as gemm_launch
from gemmlab.ops.gemm.checks import operands
from gemmlab.ops.gemm.launch import execute, launch_gemm
from gemmlab.ops.gemm.planner import GemmConfig, Plan, choose, paths
from gemmlab.ops.packing import PackedB, pack_b

__all__ = ["GemmConfig", "PackedB", "Plan", "gemm", "gemm_colmajor", "pack_b", "paths", "plan", "run"]


def plan(
    a: torch.Tensor,
    b: torch.Tensor | PackedB,
    *,
    out: torch.Tensor | None = None,
    config: GemmConfig | None = None,
    stage: bool | None = None,
    path: str | None = None,
) -> Plan:
    """Which path and config ``gemm(a, b, out=out)`` runs. Pure and cheap: checks, no allocation.
    ``config`` pins a config for the chosen path (the tuner's way in; run the result with ``run``);
    ``stage`` pins whether operands TMA cannot describe are staged (True) or left to the portable kernel
    (False); None: the cost rule (``introspect.staging_decision``). ``path`` pins the kernel path (``paths()`` but
    "empty"; a sweep's way to time every path): None, the config tables' route rules, then the planner's own."""
    a, b, c, swap = operands(a, b.view() if isinstance(b, PackedB) else b, out)
    return choose(a, b, c, swap, config, stage=stage, path=path)


def gemm(a: torch.Tensor, b: torch.Tensor | PackedB, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B with fp32 accumulation, as ``F.linear(a, b.T)``: a (..., K) (any leading dims, or a 1-D (K,)
    vector); b (K, N), a 1-D (K,) vector (then the N dim is dropped, as torch.matmul does) or a PackedB; fp16 or
    bf16 (both the same). Any strides with one unit-stride dim (N-D a is reshaped, a copy only where a view
    cannot be). ``out`` (..., N), if given, is written in place and returned (no autograd through out=).
    Differentiable in a and b (dA = dC B^T, dB = A^T dC on gemmlab's kernels); a ``torch.library`` custom op
    (``torch.ops.gemmlab.gemm``) under torch.compile and autograd, see ``gemmlab.ops.gemm.custom``."""
    if isinstance(b, PackedB):
        b = b.view() if b.data.requires_grad or dispatch.compiling() else b.fixed_view()
    if (
        a is not None
        and b is not None
        and launch.direct(a, b, out)
        and a.dim() == 2
        and b.dim() == 2
        and (out is None or out.dim() == 2)
    ):
        return launch_gemm(a, b, out)  # the eager hot path: no dispatcher, no autograd wrapper
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: {name} must be a torch.Tensor or (for b) a PackedB, got {type(t).__name__}")
    if a.dim() < 1 or b.dim() not in (1, 2):
        raise ValueError(
            f"gemm: a must be (..., K) and b (K, N) (2-D) or (K,), got a {tuple(a.shape)}, b {tuple(b.shape)}"
        )
    k, lead = a.shape[-1], tuple(a.shape[:-1])
    b2 = b if b.dim() == 2 else b.unsqueeze(1)
    n = b2.shape[1]
    a2 = a if a.dim() == 2 else a.reshape(math.prod(lead), k)
    shape = lead + ((n,) if b.dim() == 2 else ())
    if out is None:
        c = launch_gemm(a2, b2, None) if launch.direct(a2, b2) else custom.gemm(a2, b2)
        return c if c.dim() == len(shape) and a.dim() == 2 else c.view(shape)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"gemm: out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(f"gemm: out has shape {tuple(out.shape)}, expected {shape}")
    dispatch.refuse_grad_out("gemm", out, a, b)
    dispatch.refuse_neg_out("gemm", out)
    try:
        out2 = out if out.dim() == 2 and b.dim() == 2 else out.view(a2.shape[0], n)
    except RuntimeError as err:
        raise ValueError(
            f"gemm: out (shape {tuple(out.shape)}, strides {out.stride()}) cannot be viewed as the "
            f"({a2.shape[0]}, {n}) matrix gemm writes; pass a contiguous out"
        ) from err
    if launch.direct(a2, b2, out2):
        launch_gemm(a2, b2, out2)
    else:
        custom.gemm_out(a2, b2, out2)
    return out


def run(p: Plan, a: torch.Tensor, b: torch.Tensor | PackedB, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run a plan made by ``plan(a, b, out=out, config=...)`` for operands laid out like these: the
    tuner's and the config sweep's way to launch a pinned config."""
    dispatch.refuse_neg_out("run", out)
    a, b = (t.resolve_neg() if isinstance(t, torch.Tensor) else t for t in (a, b))  # (the kernels read raw memory)
    ka, kb, kc, swap = operands(a, b.view() if isinstance(b, PackedB) else b, out)
    fresh = choose(ka, kb, kc, swap, p.config, stage=bool(p.staged), path=None if p.path == "empty" else p.path)
    if replace(fresh, reason=p.reason) != p:  # (the reason says where the config came from)
        raise ValueError(f"run: the plan does not fit these operands (plan for them: {fresh})")
    if out is None:
        out = kc = torch.empty((p.m, p.n), dtype=p.dtype, device=ka.device)
    execute(p, ka, kb, kc)
    return out


def launch_mode(a: torch.Tensor, b: torch.Tensor | PackedB, *, out: torch.Tensor | None = None) -> str:
    """How the next eager ``gemm(a, b, out=out)`` of 2-D operands laid out like these launches: "uncached",
    "empty", "jit", "kept" or "direct" (Triton's C launcher, descriptors kept per buffer: the hot path), with
    " staged" where operands are copied first (``ops.gemm.launch.launch_mode``)."""
    return gemm_launch.launch_mode(a, b.fixed_view() if isinstance(b, PackedB) else b, out)


def gemm_colmajor(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, M: int, N: int, K: int) -> None:
    """The competition signature: C (M, N) = A (M, K) @ B (K, N), all column-major. Each buffer is 1-D
    (flat column-major memory), a contiguous tensor read as such, or a 2-D (rows, cols) tensor with
    strides (1, ld >= rows). Writes C and synchronizes the device before returning."""
    M, N, K = (_size(name, v) for name, v in (("M", M), ("N", N), ("K", K)))
    a = _colmajor_view("A", A, M, K)
    b = _colmajor_view("B", B, K, N)
    c = _colmajor_view("C", C, M, N)
    gemm(a, b, out=c)
    if c.is_cuda:
        torch.cuda.synchronize(c.device)


def _size(name: str, value: object) -> int:
    """A non-negative integer (numpy integers included, bools not)."""
    try:
        size = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        size = None
    if size is None or size < 0:
        raise ValueError(f"gemm_colmajor: {name} must be a non-negative integer, got {value!r}")
    return size


def _colmajor_view(name: str, buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(rows, cols) column-major view of a competition buffer."""
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"gemm_colmajor: {name} must be a torch.Tensor, got {type(buf).__name__}")
    if (
        buf.dim() == 2
        and tuple(buf.shape) == (rows, cols)
        and (buf.stride(0) == 1 or rows <= 1)
        and (buf.stride(1) >= rows or cols <= 1)
    ):
        return buf  # already a column-major matrix, leading dimension buf.stride(1)
    if buf.dim() not in (1, 2) or not buf.is_contiguous():
        raise ValueError(
            f"gemm_colmajor: {name} must be a 1-D or contiguous buffer, or a ({rows}, {cols}) "
            f"column-major matrix; got shape {tuple(buf.shape)}, strides {buf.stride()}"
        )
    if buf.numel() < rows * cols:
        raise ValueError(
            f"gemm_colmajor: {name} holds {buf.numel()} elements; a {rows}x{cols} matrix needs {rows * cols}"
        )
    return buf.reshape(-1).as_strided((rows, cols), (1, max(rows, 1)))
