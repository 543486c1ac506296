"""MoE backward kernels. Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed
rows, sorted by expert as in the forward (``kernels.moe``: offsets, tile_offsets, the persistent item walk).

With g = x W_g^T, u = x W_u^T, h = silu(g) * u, y_e = h W2_e^T and y[t] = sum_j w_tj y_e(t, j):

    moe_bwd_dh_kernel       one pass over H per (m-tile, I-tile) with three accumulators:
                             g, u (the recomputed first GEMM, x rows gathered by token; or, without
                             RECOMPUTE, loaded in the epilogue from the forward's saved gate_up) and
                             d = dy[token] @ W2_e (the unweighted gradient of h); epilogue:
                               part[r, n-tile] = sum_cols d * h          (d topk_weights, per I-tile)
                               dgu[r] = [w d h' wrt g, w d silu(g)]      (SiLU backward, scaled by w)
                               wh[r]  = w h                              (operand of dW2)
    moe_bwd_dx_kernel       dxs[r] = dgu[r] @ W1_e, W1_e (2I, H) read as a (K, N) row-major operand
    moe_bwd_combine_kernel  dx[t] = sum_j dxs[inv[t*k + j]] in j order; dtw[t, j] = sum_n part[inv[t*k+j], n]
    moe_weight_grad_kernel  dw[e] (M, N) = P[rows_e]^T @ Q[rows_e], P or Q rows gathered by token:
                             dW2 = dy[token]^T wh, dW1 = dgu^T x[token] (a K loop over the expert's rows)

Nothing is accumulated with atomics: every output element is written by one program, and every sum has a fixed
order, so the backward is deterministic.
"""

import triton
import triton.language as tl

from gemmlab.kernels.gemm import dot, narrow
from gemmlab.kernels.moe import load_a_tile, load_w_tile, store_rows, sum_slots, tile_of_item


@triton.jit
def _load_kn_tile(
    w, w_row0, k_rows_left, off_n, N, stride_wk, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, W_TMA: tl.constexpr
):
    """[BLOCK_K, BLOCK_N] tile of a row-major (K, N) operand stored as rows w_row0 .. of W (E * K, N). Through
    TMA the rows past the expert's K (the next expert's) are read: the launcher pairs them with A columns that
    are zero (A's descriptor ends at K)."""
    if W_TMA:
        tile = w.load([w_row0, off_n])
    else:
        kk = tl.arange(0, BLOCK_K)
        n = off_n + tl.arange(0, BLOCK_N)
        ptr = w + (w_row0 + kk).to(tl.int64)[:, None] * stride_wk + n[None, :]
        tile = tl.load(ptr, mask=(kk[:, None] < k_rows_left) & (n[None, :] < N), other=0.0)
    return tile


@triton.jit
def moe_bwd_dh_kernel(
    x,  # (T, H) pointer, rows gathered by token
    dy,  # (T, H) pointer (any row stride), rows gathered by token
    token,  # (S,) int32: token of routed row r
    scale,  # (S,) fp32: top-k weight of routed row r
    w1,  # W1 (E * 2I, H): descriptor, blocks [BLOCK_N, BLOCK_K] (W_TMA), else pointer
    w2,  # W2 (E * H, I): descriptor, blocks [BLOCK_K, BLOCK_N] (W_TMA), else pointer
    dgu,  # (S, 2I) out: [d gate, d up], x's dtype
    wh,  # (S, I) out: w * silu(gate) * up, x's dtype
    gate_up,  # (S, 2I) [gate, up] saved by the forward (not RECOMPUTE), else unused
    part,  # (S, NUM_N) fp32 out: per I-tile partial sums of d topk_weights
    offsets,  # (E,) int32 cumulative row ends
    tile_offsets,  # (E + 1,) int32 cumulative m-tile counts
    H,
    N_I,
    E,  # N_I = I
    stride_x,
    stride_dy,
    stride_w1,
    stride_w2,
    stride_dgu,
    stride_wh,
    stride_gu,
    RECOMPUTE: tl.constexpr,
    W_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    LOG2_E: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """Grid (NUM_PROGRAMS,), persistent over tile_offsets[E] * cdiv(I, BLOCK_N) items (read on the device)."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N_I, BLOCK_N)
    total = tl.load(tile_offsets + E) * num_n
    for item in tl.range(pid, total, NUM_PROGRAMS, flatten=False):
        e, row0, rows_end, off_n = tile_of_item(
            item, tile_offsets, offsets, num_n, E, GROUP_M, LOG2_E, BLOCK_M, BLOCK_N
        )
        gate_row0 = e * 2 * N_I + off_n  # the up rows follow N_I rows later
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_d = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        rows = row0 + tl.arange(0, BLOCK_M)
        in_rows = rows < rows_end
        src = tl.load(token + rows, mask=in_rows, other=0).to(tl.int64)  # gathered once per tile, not per K step
        x_rows, dy_rows = x + src[:, None] * stride_x, dy + src[:, None] * stride_dy
        for ki in range(tl.cdiv(H, BLOCK_K)):
            off_k = ki * BLOCK_K
            kk = off_k + tl.arange(0, BLOCK_K)
            a_mask = in_rows[:, None] & (kk[None, :] < H)
            if RECOMPUTE:
                xt = tl.load(x_rows + kk[None, :], mask=a_mask, other=0.0)
                gt = load_w_tile(w1, gate_row0, N_I - off_n, off_k, H, stride_w1, BLOCK_N, BLOCK_K, W_TMA)
                acc_g = dot(xt, gt, acc_g, DOT_UPCAST)
                ut = load_w_tile(w1, gate_row0 + N_I, N_I - off_n, off_k, H, stride_w1, BLOCK_N, BLOCK_K, W_TMA)
                acc_u = dot(xt, ut, acc_u, DOT_UPCAST)
            dyt = tl.load(dy_rows + kk[None, :], mask=a_mask, other=0.0)
            w2t = _load_kn_tile(w2, e * H + off_k, H - off_k, off_n, N_I, stride_w2, BLOCK_K, BLOCK_N, W_TMA)
            acc_d = dot(dyt, w2t, acc_d, DOT_UPCAST)
        cols = off_n + tl.arange(0, BLOCK_N)
        if not RECOMPUTE:
            gu = gate_up + rows.to(tl.int64)[:, None] * stride_gu + cols[None, :]
            gu_mask = in_rows[:, None] & (cols[None, :] < N_I)
            acc_g = tl.load(gu, mask=gu_mask, other=0.0).to(tl.float32)
            acc_u = tl.load(gu + N_I, mask=gu_mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(acc_g)
        silu = acc_g * sig
        h = silu * acc_u
        p = tl.sum(tl.where(cols[None, :] < N_I, acc_d * h, 0.0), axis=1)  # (BLOCK_M,) this I-tile's share
        tl.store(part + rows.to(tl.int64) * num_n + off_n // BLOCK_N, p, mask=in_rows)
        w = tl.load(scale + rows, mask=in_rows, other=0.0)[:, None]
        acc_d = acc_d * w
        store_rows(wh, h * w, rows, rows_end, off_n, N_I, stride_wh, BLOCK_N)
        store_rows(
            dgu, acc_d * acc_u * sig * (1.0 + acc_g * (1.0 - sig)), rows, rows_end, off_n, N_I, stride_dgu, BLOCK_N
        )
        store_rows(dgu + N_I, acc_d * silu, rows, rows_end, off_n, N_I, stride_dgu, BLOCK_N)


@triton.jit
def moe_bwd_dx_kernel(
    a,  # A (S, K): descriptor, blocks [BLOCK_M, BLOCK_K] (A_TMA), else pointer
    w,  # W (E * K, N) row-major (K, N) per expert: descriptor, blocks [BLOCK_K, BLOCK_N] (W_TMA), else pointer
    out,  # (S, N) pointer
    offsets,  # (E,) int32 cumulative row ends
    tile_offsets,  # (E + 1,) int32 cumulative m-tile counts
    N,
    K,
    E,
    stride_a,
    stride_w,
    stride_o,
    A_TMA: tl.constexpr,
    W_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    LOG2_E: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """Grid (NUM_PROGRAMS,): out[r] = A[r] @ W_e for the rows r of expert e, persistent over
    tile_offsets[E] * cdiv(N, BLOCK_N) items."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    total = tl.load(tile_offsets + E) * num_n
    for item in tl.range(pid, total, NUM_PROGRAMS, flatten=False):
        e, row0, rows_end, off_n = tile_of_item(
            item, tile_offsets, offsets, num_n, E, GROUP_M, LOG2_E, BLOCK_M, BLOCK_N
        )
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(K, BLOCK_K)):
            off_k = ki * BLOCK_K
            at = load_a_tile(a, offsets, row0, rows_end, off_k, K, stride_a, BLOCK_M, BLOCK_K, A_TMA, False)
            wt = _load_kn_tile(w, e * K + off_k, K - off_k, off_n, N, stride_w, BLOCK_K, BLOCK_N, W_TMA)
            acc = dot(at, wt, acc, DOT_UPCAST)
        store_rows(out, acc, row0 + tl.arange(0, BLOCK_M), rows_end, off_n, N, stride_o, BLOCK_N)


@triton.jit
def moe_bwd_combine_kernel(
    dxs,  # (S, H) routed rows in expert order
    inv,  # (T * k,) int32: the routed row of pair (t, j)
    part,  # (S, NUM_PART) fp32 partial sums of d topk_weights
    dx,  # (T, H) out
    dtw,  # (T * k,) out, topk_weights' dtype
    H,
    NUM_PART,
    stride_dxs,
    stride_dx,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Grid (T, cdiv(H, BLOCK_H)): dx[t, cols] = sum over j of dxs[inv[t*k + j], cols] in j order (fp32);
    the programs of column block 0 also write dtw[t, j] = sum of part[inv[t*k + j], :]."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = sum_slots(dxs, stride_dxs, inv, t, cols, H, TOP_K, BLOCK_H)
    tl.store(dx + t.to(tl.int64) * stride_dx + cols, narrow(acc, dx.dtype.element_ty), mask=cols < H)
    if tl.program_id(1) == 0:
        pp = tl.arange(0, BLOCK_P)
        for j in tl.static_range(TOP_K):
            r = tl.load(inv + t * TOP_K + j).to(tl.int64)
            p = tl.load(part + r * NUM_PART + pp, mask=pp < NUM_PART, other=0.0)
            tl.store(dtw + t * TOP_K + j, narrow(tl.sum(p, 0), dtw.dtype.element_ty))


@triton.jit
def moe_weight_grad_kernel(
    p,  # P (rows, M) pointer, unit column stride
    p_rows,  # (S,) int32: the P row of routed row r (P_GATHER), else unused
    q,  # Q (rows, N) pointer, unit column stride
    q_rows,  # (S,) int32: the Q row of routed row r (Q_GATHER), else unused
    out,  # (E, M, N) out, rows of expert e: out + e * stride_oe
    offsets,  # (E,) int32 cumulative row ends of the groups
    M,
    N,
    stride_p,
    stride_q,
    stride_oe,
    stride_om,
    P_GATHER: tl.constexpr,
    Q_GATHER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), E): out[e] = sum over the expert's routed rows r of
    P[row_p(r)]^T Q[row_q(r)] in fp32, rows in order (an expert with no rows gets zeros)."""
    tile = tl.program_id(0)
    e = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    mm = (tile // num_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    nn = (tile % num_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(offsets + e - 1, mask=e > 0, other=0)
    end = tl.load(offsets + e)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_K):
        r = r0 + tl.arange(0, BLOCK_K)
        live = r < end
        if P_GATHER:
            pr = tl.load(p_rows + r, mask=live, other=0).to(tl.int64)
        else:
            pr = r.to(tl.int64)
        if Q_GATHER:
            qr = tl.load(q_rows + r, mask=live, other=0).to(tl.int64)
        else:
            qr = r.to(tl.int64)
        pt = tl.load(p + pr[:, None] * stride_p + mm[None, :], mask=live[:, None] & (mm[None, :] < M), other=0.0)
        qt = tl.load(q + qr[:, None] * stride_q + nn[None, :], mask=live[:, None] & (nn[None, :] < N), other=0.0)
        acc = dot(tl.trans(pt), qt, acc, DOT_UPCAST)
    o = out + e.to(tl.int64) * stride_oe + mm.to(tl.int64)[:, None] * stride_om + nn[None, :]
    tl.store(o, narrow(acc, out.dtype.element_ty), mask=(mm[:, None] < M) & (nn[None, :] < N))
