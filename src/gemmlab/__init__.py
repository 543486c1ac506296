"""gemmlab: fast FP16/BF16 GEMM kernels in Triton, and the lab to grade, time, tune and record them.

Public API:
    gemm(a, b, *, out=None)            C = A @ B (fp16/bf16, fp32 accumulation)
    pack_b(b) -> PackedB               prepack a weight B once for the fast path
    gemm_colmajor(A, B, C, M, N, K)    the competition signature (column-major buffers)
    plan(a, b, *, out=None) -> Plan    which path/config gemm runs; paths() lists them all
    gemm_ref(a, b)                     the float64 reference
"""

from gemmlab.ops.gemm import PackedB, gemm, gemm_colmajor, pack_b, plan
from gemmlab.ops.plan import GemmConfig, Plan, paths
from gemmlab.ref import gemm_ref

__all__ = ["GemmConfig", "PackedB", "Plan", "gemm", "gemm_colmajor", "gemm_ref", "pack_b", "paths", "plan"]
__version__ = "0.1.0"
