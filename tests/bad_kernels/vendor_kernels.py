"""Vendor GEMMs passed off as the candidate's own, for the kernel observer (tests/grade/test_observer.py on the
CPU, tests/grade/test_observer_gpu.py on the H200), and one honest Triton kernel beside them. Row-major
signature FN(a, b) -> c."""

import ctypes
import sys

import torch
import triton
import triton.language as tl


def grouped_mm(a, b):
    """torch._grouped_mm with offsets, one group: CUTLASS kernels built into libtorch, no cuBLAS call."""
    offs = torch.tensor([a.shape[0]], device=a.device, dtype=torch.int32)
    return torch._grouped_mm(a, b.unsqueeze(0), offs=offs)


def mm_when_timed(a, b):
    """gemmlab's GEMM in every call that the grader checks one at a time, torch.mm inside timed batches only
    (the worker times a batch in ``instruments.timing.time_calls``; a checked call never passes there)."""
    import gemmlab

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "time_calls":
            return torch.mm(a, b)
        frame = frame.f_back
    return gemmlab.gemm(a, b)


_graphs: dict = {}


def graph_mm(a, b):
    """torch.mm captured into a CUDA graph once per shape, replayed on every call."""
    key = (tuple(a.shape), tuple(b.shape), a.dtype)
    if key not in _graphs:
        sa, sb = a.clone(), b.clone()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.mm(sa, sb)  # cuBLAS's workspace, before the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            sc = torch.mm(sa, sb)
        _graphs[key] = (g, sa, sb, sc)
    g, sa, sb, sc = _graphs[key]
    sa.copy_(a)
    sb.copy_(b)
    g.replay()
    return sc.clone()


_cublas: dict = {}
CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 14, 68, -1


def ctypes_mm(a, b):
    """cublasGemmEx through ctypes, on the libcublas torch loaded (bf16 in, bf16 out, fp32 accumulation)."""
    if not _cublas:
        maps = open("/proc/self/maps").read().split()
        lib = ctypes.CDLL(next(w for w in maps if "/libcublas.so" in w))
        handle = ctypes.c_void_p()
        assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
        _cublas.update(lib=lib, handle=handle)
    lib, handle = _cublas["lib"], _cublas["handle"]
    m, k = a.shape
    n = b.shape[1]
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    lib.cublasSetStream_v2(handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    # column-major C^T (n, m) = B^T (n, k) A^T (k, m)
    status = lib.cublasGemmEx(
        handle,
        0,
        0,
        n,
        m,
        k,
        ctypes.byref(one),
        ptr(b),
        CUDA_R_16BF,
        n,
        ptr(a),
        CUDA_R_16BF,
        k,
        ctypes.byref(zero),
        ptr(c),
        CUDA_R_16BF,
        n,
        CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT,
    )
    if status != 0:
        raise RuntimeError(f"cublasGemmEx: status {status}")
    return c


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,  # a (M, K), b (K, N), c (M, N), row-major
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """One (BM, BN) tile of c per program; grid (cdiv(M, BM), cdiv(N, BN))."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        y = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc)
    tl.store(
        c_ptr + rm[:, None] * N + rn[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


def triton_matmul(a, b):
    """An honest Triton GEMM whose kernel's name says matmul: Triton compiled it, so it passes."""
    a, b = a.contiguous(), b.contiguous()
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    matmul_kernel[(triton.cdiv(m, 32), triton.cdiv(n, 32))](a, b, c, m, n, k, BM=32, BN=32, BK=32)
    return c
