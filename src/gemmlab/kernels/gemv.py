"""GEMV-class kernel: C (M, N) = A (M, K) @ B (K, N) for a few rows of A (decode: M <= 16), at any alignment.

    M rows of A (few), N output columns, K the reduction; B is usually an nn.Linear weight seen as W^T
    (W (N, K) row-major: stride_bk = 1), but any strides work.

Pointer loads, no TMA: an odd K leaves W's rows 2-byte aligned, which no TMA descriptor can describe, and a
staged copy of W costs more than the GEMV itself (every element of W is read once). Where the strides are
multiples of 16 elements the JIT's specialization lets the loads vectorize; where they are not, they are
2-byte loads, and what keeps HBM busy is the number of programs in flight: split-K cuts K into SPLIT_K runs
so that cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) * SPLIT_K programs stream W.

Two inner products, chosen by BLOCK_M:
    BLOCK_M == 1   FFMA: fp32 products a[k] * b[k, n] accumulate elementwise in a [BLOCK_K, BLOCK_N] tile,
                   summed over k once at the end (a single row would leave a 16-row MMA 15/16 padding)
    BLOCK_M >= 16  tl.dot on [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] (mma.sync: HMMA on sm_90; wgmma needs
                   64-row tiles and TMA-fed shared memory)
fp32 accumulation either way. The main K loop has no K mask (so aligned loads stay vectorized); the one
BLOCK_K step that crosses K is masked. 64-bit tile bases, 32-bit offsets inside a tile (the launcher checks
that BLOCK * stride fits).

Split-K is reduced deterministically as in ``gemmlab.kernels.gemm`` (``split_arrive``, ``split_sum``).
"""

import triton
import triton.language as tl

from gemmlab.kernels.gemm import dot, narrow, split_arrive, split_sum


@triton.jit
def gemv_step(a, b, acc, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_UPCAST: tl.constexpr):
    """acc += one BLOCK_K step: a [BLOCK_M, BLOCK_K], b [BLOCK_K, BLOCK_N]; FFMA into acc [BLOCK_K, BLOCK_N]
    when BLOCK_M == 1, else tensor cores into acc [BLOCK_M, BLOCK_N]."""
    if BLOCK_M == 1:  # (a constexpr branch: the compiler builds only the one taken)
        acc = acc + tl.reshape(a, (BLOCK_K, 1)).to(tl.float32) * b.to(tl.float32)
    else:
        acc = dot(a, b, acc, DOT_UPCAST)
    return acc


@triton.jit
def gemv_kernel(
    a_ptr,  # A (M, K), any strides, fp16/bf16
    b_ptr,  # B (K, N), any strides (nn.Linear: B = W^T, stride_bk = 1)
    c_ptr,  # C (M, N), any strides
    ws_ptr,  # (SPLIT_K, tiles, BLOCK_M * BLOCK_N) fp32 partials (SPLIT_K > 1; else unused)
    count_ptr,  # (tiles,) int32 arrival counters, zero between calls (SPLIT_K > 1; else unused)
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    K_TILES_PER_SPLIT,  # BLOCK_K steps per split
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """Grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K); M varies fastest, so the programs that read the same
    columns of B run side by side and share them in L2. Tile t = pid_n * cdiv(M, BLOCK_M) + pid_m."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    mask_m = rows < M - off_m
    mask_n = cols < N - off_n
    a_tile = a_ptr + off_m.to(tl.int64) * stride_am
    b_tile = b_ptr + off_n.to(tl.int64) * stride_bn
    a_offs = rows[:, None] * stride_am + ks[None, :] * stride_ak  # [BLOCK_M, BLOCK_K]
    b_offs = ks[:, None] * stride_bk + cols[None, :] * stride_bn  # [BLOCK_K, BLOCK_N]
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_begin = pid_k * K_TILES_PER_SPLIT
    k_end = min(k_begin + K_TILES_PER_SPLIT, k_tiles)
    k_whole = max(min(k_end, K // BLOCK_K), k_begin)  # steps before k_whole lie inside K: no K mask
    if BLOCK_M == 1:
        acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(k_begin, k_whole):
        off_k = tl.cast(kt, tl.int64) * BLOCK_K
        a = tl.load(a_tile + off_k * stride_ak + a_offs, mask=mask_m[:, None], other=0.0)
        b = tl.load(b_tile + off_k * stride_bk + b_offs, mask=mask_n[None, :], other=0.0)
        acc = gemv_step(a, b, acc, BLOCK_M, BLOCK_K, DOT_UPCAST)
    for kt in range(k_whole, k_end):  # at most one step: the one that crosses K
        off_k = tl.cast(kt, tl.int64) * BLOCK_K
        mask_k = ks < K - off_k
        a = tl.load(a_tile + off_k * stride_ak + a_offs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_tile + off_k * stride_bk + b_offs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = gemv_step(a, b, acc, BLOCK_M, BLOCK_K, DOT_UPCAST)
    if BLOCK_M == 1:
        out = tl.reshape(tl.sum(acc, axis=0), (1, BLOCK_N))  # [1, BLOCK_N]
    else:
        out = acc
    c_tile = c_ptr + off_m.to(tl.int64) * stride_cm + off_n.to(tl.int64) * stride_cn
    c_offs = rows[:, None] * stride_cm + cols[None, :] * stride_cn
    c_mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(c_tile + c_offs, narrow(out, c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tile = pid_n * tl.num_programs(0) + pid_m
        ws_offs = rows[:, None] * BLOCK_N + cols[None, :]
        ws_tile = ws_ptr + tile.to(tl.int64) * (BLOCK_M * BLOCK_N)
        split_stride = (tl.num_programs(0) * tl.num_programs(1)).to(tl.int64) * (BLOCK_M * BLOCK_N)
        if split_arrive(ws_tile + pid_k * split_stride, out, count_ptr + tile, SPLIT_K, ws_offs):
            total = split_sum(ws_tile, split_stride, count_ptr + tile, SPLIT_K, ws_offs, BLOCK_M, BLOCK_N)
            tl.store(c_tile + c_offs, narrow(total, c_ptr.dtype.element_ty), mask=c_mask)
