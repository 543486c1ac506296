"""FP8 (e4m3) decode kernel: C (M, N) = (A * a_scale) @ (B * b_scale) for a few rows of A (M <= 64).

    M rows of A (few), N output columns, K the reduction (a multiple of 16); A (M, K) K-major, B (K, N) any strides
    (usually an nn.Linear weight seen as W^T: W (N, K) row-major, stride_bk = 1); C (M, N) bf16/fp16/fp32

The scales as in ``kernels.gemm_fp8`` (SCALE 0 per tensor, 1 per row of A / column of B, 2 block: a_scale
(M, cdiv(K, 128)) over 1x128 blocks of A, b_scale (cdiv(K, 128), cdiv(N, 128)) over 128x128 blocks of B).

At small M the work is streaming B once: every byte of the weight is read once, so the speed is the loads in flight,
not the tensor cores. Pointer loads (no TMA descriptor per call), and split-K over a 3-D grid, so that
cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) * SPLIT_K programs stream B; the pieces of a tile are summed deterministically
(``kernels.gemm``'s ``split_arrive`` and ``split_sum``: fp32 partials in a workspace, the last to arrive adds them in
split order). Two inner products, chosen by BLOCK_M, as ``kernels.gemv``:

    BLOCK_M == 1   FFMA: e4m3 -> fp32, products a[k] * b[k, n] accumulate elementwise in a [BLOCK_K, BLOCK_N]
                   fp32 tile, summed over k once at the end
    BLOCK_M >= 16  tl.dot on e4m3 operands [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N], fp32 accumulation

Scales: SCALE 2 per BLOCK_K step (BLOCK_K divides 128, so a step lies inside one 1x128 block of A; BLOCK_N divides
128, so a tile lies inside one column block of B and B's scale is a scalar per step): the dot branch scales a fresh
fp32 product per step by sa[row] * sb, the FFMA branch folds sa * sb into the step's [BLOCK_K] slice of A before its
products. SCALE 0 and 1: applied once in the epilogue, after the split reduction (the sum is linear in the scales).
e4m3 NaN codes under the CPU interpreter: ``kernels.gemm_fp8.e4m3_operand``. The K loop has no K mask but for the
one step that crosses K; 64-bit tile bases, 32-bit offsets inside a tile (the planner checks that BLOCK * stride
fits). Launcher: ``gemmlab.ops.gemm_fp8`` (the plan's "decode" path).
"""

import triton
import triton.language as tl

from gemmlab.kernels.gemm import narrow, split_arrive, split_sum
from gemmlab.kernels.gemm_fp8 import e4m3_operand


@triton.jit
def decode_step(a, b, acc, s, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SCALE: tl.constexpr):
    """acc += one BLOCK_K step of e4m3 a [BLOCK_M, BLOCK_K] by b [BLOCK_K, BLOCK_N]; ``s`` [BLOCK_M] the step's
    block scale (SCALE 2; else unused). FFMA into acc [BLOCK_K, BLOCK_N] when BLOCK_M == 1, else tensor cores into
    acc [BLOCK_M, BLOCK_N]."""
    a = e4m3_operand(a)
    b = e4m3_operand(b)
    if BLOCK_M == 1:  # (a constexpr branch: the compiler builds only the one taken)
        a32 = tl.reshape(a, (BLOCK_K, 1)).to(tl.float32)
        if SCALE == 2:
            a32 = a32 * s[None, :]
        acc = acc + a32 * b.to(tl.float32)
    elif SCALE == 2:
        acc += tl.dot(a, b) * s[:, None]  # a fresh fp32 product per step, scaled, added
    else:
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)  # promoted to fp32 every step, as the TMA path
    return acc


@triton.jit
def step_scale(a_scale_ptr, b_scale_ptr, rows, mask_m, off_n, off_k, stride_sam, stride_sak, stride_sbk, stride_sbn):
    """[BLOCK_M] fp32: the block scale of the step at off_k for rows ``rows`` of a tile from column off_n (A's 1x128
    scale times B's 128x128 one, a scalar per tile: BLOCK_N divides 128)."""
    kb = off_k // 128
    sa = tl.load(a_scale_ptr + rows.to(tl.int64) * stride_sam + kb * stride_sak, mask=mask_m, other=0.0)
    return sa * tl.load(b_scale_ptr + kb * stride_sbk + (off_n // 128) * stride_sbn)


@triton.jit
def gemv_fp8_kernel(
    a_ptr,  # A (M, K) e4m3, unit stride along K
    b_ptr,  # B (K, N) e4m3, any strides (nn.Linear: B = W^T, stride_bk = 1)
    c_ptr,  # C (M, N) bf16/fp16/fp32, any strides
    a_scale_ptr,  # fp32: () SCALE 0, (M, 1) SCALE 1, (M, cdiv(K, 128)) SCALE 2
    b_scale_ptr,  # fp32: () SCALE 0, (1, N) SCALE 1, (cdiv(K, 128), cdiv(N, 128)) SCALE 2
    ws_ptr,  # (SPLIT_K, tiles, BLOCK_M * BLOCK_N) fp32 partials (SPLIT_K > 1; else unused)
    count_ptr,  # (tiles,) int32 arrival counters, zero between calls (SPLIT_K > 1; else unused)
    M,
    N,
    K,
    stride_am,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_sam,
    stride_sak,  # a_scale's strides (rows, K blocks)
    stride_sbk,
    stride_sbn,  # b_scale's strides (K blocks, columns or column blocks)
    K_TILES_PER_SPLIT,  # BLOCK_K steps per split
    SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """Grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K); M varies fastest, so the programs that read the same
    columns of B run side by side. Tile t = pid_n * cdiv(M, BLOCK_M) + pid_m."""
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
    a_offs = rows[:, None] * stride_am + ks[None, :]  # [BLOCK_M, BLOCK_K]
    b_offs = ks[:, None] * stride_bk + cols[None, :] * stride_bn  # [BLOCK_K, BLOCK_N]
    sa_ptr = a_scale_ptr + off_m.to(tl.int64) * stride_sam
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_begin = pid_k * K_TILES_PER_SPLIT
    k_end = min(k_begin + K_TILES_PER_SPLIT, k_tiles)
    k_whole = max(min(k_end, K // BLOCK_K), k_begin)  # steps before k_whole lie inside K: no K mask
    if BLOCK_M == 1:
        acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    s = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for kt in range(k_begin, k_whole):
        off_k = tl.cast(kt, tl.int64) * BLOCK_K
        a = tl.load(a_tile + off_k + a_offs, mask=mask_m[:, None], other=0.0)
        b = tl.load(b_tile + off_k * stride_bk + b_offs, mask=mask_n[None, :], other=0.0)
        if SCALE == 2:
            s = step_scale(
                sa_ptr, b_scale_ptr, rows, mask_m, off_n, off_k, stride_sam, stride_sak, stride_sbk, stride_sbn
            )
        acc = decode_step(a, b, acc, s, BLOCK_M, BLOCK_K, SCALE)
    for kt in range(k_whole, k_end):  # at most one step: the one that crosses K
        off_k = tl.cast(kt, tl.int64) * BLOCK_K
        mask_k = ks < K - off_k
        a = tl.load(a_tile + off_k + a_offs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_tile + off_k * stride_bk + b_offs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if SCALE == 2:
            s = step_scale(
                sa_ptr, b_scale_ptr, rows, mask_m, off_n, off_k, stride_sam, stride_sak, stride_sbk, stride_sbn
            )
        acc = decode_step(a, b, acc, s, BLOCK_M, BLOCK_K, SCALE)
    if BLOCK_M == 1:
        out = tl.reshape(tl.sum(acc, axis=0), (1, BLOCK_N))  # [1, BLOCK_N]
    else:
        out = acc
    c_tile = c_ptr + off_m.to(tl.int64) * stride_cm + off_n.to(tl.int64) * stride_cn
    c_offs = rows[:, None] * stride_cm + cols[None, :] * stride_cn
    c_mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        out = epilogue_scale(
            out, a_scale_ptr, b_scale_ptr, off_m + rows, mask_m, off_n + cols, mask_n, stride_sam, stride_sbn, SCALE
        )
        tl.store(c_tile + c_offs, narrow(out, c_ptr.dtype.element_ty), mask=c_mask)
    else:
        tile = pid_n * tl.num_programs(0) + pid_m
        ws_offs = rows[:, None] * BLOCK_N + cols[None, :]
        ws_tile = ws_ptr + tile.to(tl.int64) * (BLOCK_M * BLOCK_N)
        split_stride = (tl.num_programs(0) * tl.num_programs(1)).to(tl.int64) * (BLOCK_M * BLOCK_N)
        if split_arrive(ws_tile + pid_k * split_stride, out, count_ptr + tile, SPLIT_K, ws_offs):
            total = split_sum(ws_tile, split_stride, count_ptr + tile, SPLIT_K, ws_offs, BLOCK_M, BLOCK_N)
            total = epilogue_scale(
                total,
                a_scale_ptr,
                b_scale_ptr,
                off_m + rows,
                mask_m,
                off_n + cols,
                mask_n,
                stride_sam,
                stride_sbn,
                SCALE,
            )
            tl.store(c_tile + c_offs, narrow(total, c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def epilogue_scale(
    acc, a_scale_ptr, b_scale_ptr, rows, mask_m, cols, mask_n, stride_sam, stride_sbn, SCALE: tl.constexpr
):
    """acc [BLOCK_M, BLOCK_N] times the per-tensor (SCALE 0) or row/column (SCALE 1) scales; SCALE 2: acc (its
    steps were scaled in the loop)."""
    if SCALE == 0:
        acc = acc * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr))
    elif SCALE == 1:
        sa = tl.load(a_scale_ptr + rows.to(tl.int64) * stride_sam, mask=mask_m, other=0.0)
        sb = tl.load(b_scale_ptr + cols.to(tl.int64) * stride_sbn, mask=mask_n, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    return acc
