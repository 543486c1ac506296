"""FP8 (e4m3) experts: the grouped GEMM with DeepSeek-V3 block scales. Legend: S routed rows, E experts, N output
width, K reduction, Kb = cdiv(K, 128); for the MoE body T tokens, H hidden, I expert intermediate.

    moe_fp8_grouped_kernel   MODE 0: out[r] = (A[r] * sa[r]) @ (W[e] * sw[e])^T                   (grouped GEMM)
                             MODE 1: out[r] = silu(A[r] @ Wg[e]^T) * (A[r] @ Wu[e]^T)   W[e] = [Wg; Wu] (2N rows)
                             MODE 2: out[r] = scale[r] * (A[r] @ W[e]^T)                  (second GEMM, top-k weight)

A (S, K) e4m3 with one fp32 scale per row per 128 columns (sa (S, Kb), 1x128 blocks); W (E, N_w, K) e4m3 read as a
2-D (E * N_w, K) descriptor, with one fp32 scale per 128x128 block of each expert (sw (E, cdiv(N_w, 128), Kb),
contiguous). Each BLOCK_K step (BLOCK_K divides 128, so a step lies in one scale block) multiplies into a fresh fp32
tile and adds it, scaled by sa[row] * sw[n-block], to the fp32 sum; in MODE 1 SiLU(gate) * up is taken in fp32 from
the two sums. The rows, tile schedule and walk are those of ``kernels.moe`` (``tile_of_item``): rows of a tile that
belong to the next group are computed and never stored (masked stores); TMA zero-fills past K and past the last
row; the stores round to nearest even (``kernels.gemm.narrow``, under the CPU interpreter too).
Launchers: ``gemmlab.ops.fp8.moe_launch``.
"""

import triton
import triton.language as tl

from gemmlab.kernels.gemm_fp8 import e4m3_operand
from gemmlab.kernels.moe import store_rows, tile_of_item


@triton.jit
def _scaled_step(a, w_desc, w_row, sa, w_scale_ptr, sw_row0, cols, n_w_rows, off_k, Kb):
    """One BLOCK_K step of one operand of W: dot(A, W^T) scaled per row of A and per 128-row block of W."""
    wt = e4m3_operand(w_desc.load([w_row, off_k]).T)  # [BLOCK_K, BLOCK_N]
    kb = off_k // 128
    sw = tl.load(w_scale_ptr + (sw_row0 + cols // 128).to(tl.int64) * Kb + kb, mask=cols < n_w_rows, other=0.0)
    return tl.dot(a, wt) * sa[:, None] * sw[None, :]


@triton.jit
def moe_fp8_grouped_kernel(
    a_desc,  # A (S, K) e4m3: descriptor, blocks [BLOCK_M, BLOCK_K]
    a_scale,  # (S, Kb) fp32: 1x128 block scales of A, row stride stride_sa
    w_desc,  # W (E * N_w, K) e4m3: descriptor, blocks [BLOCK_N, BLOCK_K]; N_w = N (2N in MODE 1)
    w_scale,  # (E, cdiv(N_w, 128), Kb) fp32 contiguous: 128x128 block scales of each expert's W
    out,  # (S, N) row-major pointer, bf16/fp16
    scale,  # (S,) fp32 per-row factor (MODE 2), else unused
    offsets,  # (E,) int32 cumulative row ends of the groups
    tile_offsets,  # (E + 1,) int32 cumulative BLOCK_M-tile counts
    N,
    K,
    E,
    stride_sa,
    stride_om,
    MODE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    LOG2_E: tl.constexpr,
):
    """Grid (NUM_PROGRAMS,): program p takes work items p, p + NUM_PROGRAMS, ... of the tile_offsets[E] *
    cdiv(N, BLOCK_N) items (read on the device: no host sync), as ``kernels.moe.moe_grouped_kernel`` does."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    total = tl.load(tile_offsets + E) * num_n
    n_w = N * (2 if MODE == 1 else 1)  # rows of W per expert
    nb_w = tl.cdiv(n_w, 128)  # scale blocks of W per expert
    Kb = tl.cdiv(K, 128)
    for item in tl.range(pid, total, NUM_PROGRAMS, flatten=False):
        e, row0, rows_end, off_n = tile_of_item(
            item, tile_offsets, offsets, num_n, E, GROUP_M, LOG2_E, BLOCK_M, BLOCK_N
        )
        rows = row0 + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)  # columns of out; rows of W (gate rows in MODE 1)
        w_row0 = e * n_w + off_n  # int32: TMA coordinates (E * N_w < 2^31)
        sw_row0 = e * nb_w
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if MODE == 1:
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(K, BLOCK_K)):
            off_k = ki * BLOCK_K
            at = e4m3_operand(a_desc.load([row0, off_k]))  # [BLOCK_M, BLOCK_K]
            sa = tl.load(a_scale + rows.to(tl.int64) * stride_sa + off_k // 128, mask=rows < rows_end, other=0.0)
            acc += _scaled_step(at, w_desc, w_row0, sa, w_scale, sw_row0, cols, N, off_k, Kb)
            if MODE == 1:
                acc_up += _scaled_step(at, w_desc, w_row0 + N, sa, w_scale, sw_row0, cols + N, n_w, off_k, Kb)
        if MODE == 1:
            acc = acc / (1.0 + tl.exp(-acc)) * acc_up  # silu(gate) * up, fp32
        if MODE == 2:
            acc = acc * tl.load(scale + rows, mask=rows < rows_end, other=0.0)[:, None]
        store_rows(out, acc, rows, rows_end, off_n, N, stride_om, BLOCK_N)
