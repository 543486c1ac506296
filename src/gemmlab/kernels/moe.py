"""MoE kernels. Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows.

Rows are grouped by expert: group e holds rows [offsets[e-1], offsets[e]) (offsets are cumulative ends,
offsets[-1] = S), and is cut into BLOCK_M-row tiles; ``tile_offsets`` (E + 1,) holds the cumulative tile
counts, so an expert with no rows has no tiles and a small group wastes at most one partial tile (the
decode regime never pads every expert to a full tile). One persistent launch walks all
(m-tile, n-tile) work items of all experts; each finds its expert by binary search in ``tile_offsets``,
and the items of one expert are ordered in groups of GROUP_M m-tiles (W tiles reused from L2).

    moe_grouped_kernel   MODE 0: out[r] = A[r] @ W[e]^T                      (grouped GEMM)
                          MODE 1: out[r] = silu(A[r] @ Wg[e]^T) * (A[r] @ Wu[e]^T)   W[e] = [Wg; Wu] (2N rows)
                                  (SAVE_PRE: pre[r] = [A[r] @ Wg[e]^T, A[r] @ Wu[e]^T] stored too, for the backward)
                          MODE 2: out[r] = scale[r] * (A[r] @ W[e]^T)          (second GEMM, top-k weight)
    moe_combine_kernel   y[t] = sum_j o[inv[t*k + j]]   in fixed j order (deterministic)
    (the routing table, the tiles and the gather: ``kernels.moe_route``)

A rows come through a TMA descriptor (A_TMA; with CLIP one made per tile whose rows end at the group's
end, so rows of the next group read as zeros, and the output is TMA-stored through another) or pointers;
with A_GATHER a pointer load reads row ``a_rows[r]`` of A (the token of routed row r), so the first GEMM
reads x in token order without a gathered copy. W (E, N_w, K) is read as a 2-D (E * N_w, K) descriptor
(W_TMA) or through pointers. TMA zero-fills past the tensor's end; rows or columns of a tile that belong
to another group or expert are computed and never stored (masked or clipped stores). With OUT_TMA a tile
whose rows all belong to its group is TMA-stored through a host descriptor, a group's partial last tile
by a masked store.
"""

import triton
import triton.language as tl

from gemmlab.kernels.gemm import dot, narrow


@triton.jit
def _find_expert(tile_offsets, m_tile, E, LOG2_E: tl.constexpr):
    """The e with tile_offsets[e] <= m_tile < tile_offsets[e + 1] (binary search; empty experts skipped)."""
    lo = m_tile * 0
    hi = lo + E  # invariant: tile_offsets[lo] <= m_tile < tile_offsets[hi] (the largest such lo is e)
    for _ in range(LOG2_E):
        mid = (lo + hi) // 2
        go_right = tl.load(tile_offsets + mid) <= m_tile
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    return lo


@triton.jit
def load_a_tile(
    a,
    a_rows,
    row0,
    rows_end,
    off_k,
    K,
    stride_am,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    A_TMA: tl.constexpr,
    A_GATHER: tl.constexpr,
):
    if A_TMA:
        tile = a.load([row0, off_k])  # [BLOCK_M, BLOCK_K]
    else:
        r = row0 + tl.arange(0, BLOCK_M)
        kk = off_k + tl.arange(0, BLOCK_K)
        in_rows = r < rows_end
        if A_GATHER:
            src = tl.load(a_rows + r, mask=in_rows, other=0).to(tl.int64)
        else:
            src = r.to(tl.int64)
        tile = tl.load(a + src[:, None] * stride_am + kk[None, :], mask=in_rows[:, None] & (kk[None, :] < K), other=0.0)
    return tile


@triton.jit
def load_w_tile(
    w, w_row0, n_rows_left, off_k, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_TMA: tl.constexpr
):
    """[BLOCK_K, BLOCK_N] tile of W^T from W rows w_row0 .. w_row0 + BLOCK_N (K-major)."""
    if W_TMA:
        tile = w.load([w_row0, off_k]).T
    else:
        n = tl.arange(0, BLOCK_N)
        kk = off_k + tl.arange(0, BLOCK_K)
        ptr = w + (w_row0 + n).to(tl.int64)[None, :] * stride_wn + kk[:, None]
        tile = tl.load(ptr, mask=(n[None, :] < n_rows_left) & (kk[:, None] < K), other=0.0)
    return tile


@triton.jit
def store_rows(out, acc, rows, rows_end, off_n, N, stride_om, BLOCK_N: tl.constexpr):
    """Masked pointer store of an fp32 tile into rows ``rows`` (those below ``rows_end``) of out. Not
    ``kernels.gemm.store_c``: inside this kernel that one (and its TMA halves) spills at 128 rows (sm_90
    SASS: 255 registers, 34-50 local-memory ops, against 157-175 and none)."""
    cols = off_n + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < rows_end) & (cols[None, :] < N)
    tl.store(out + rows.to(tl.int64)[:, None] * stride_om + cols[None, :], narrow(acc, out.dtype.element_ty), mask=mask)


@triton.jit
def _store_halves(o, acc, row0, off_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """TMA store of an fp32 tile in two [BLOCK_M, BLOCK_N / 2] halves (half the staging buffer)."""
    acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
    o.store([row0, off_n], narrow(acc0, o.dtype))
    o.store([row0, off_n + BLOCK_N // 2], narrow(acc1, o.dtype))


@triton.jit
def _moe_tile(
    a,
    a_rows,
    w,
    out,
    out_desc,
    scale,
    pre,
    row0,
    rows_end,
    off_n,
    w_row0,
    N,
    K,
    stride_am,
    stride_wn,
    stride_om,
    stride_pre,
    MODE: tl.constexpr,
    A_TMA: tl.constexpr,
    A_GATHER: tl.constexpr,
    W_TMA: tl.constexpr,
    CLIP: tl.constexpr,
    OUT_TMA: tl.constexpr,
    SAVE_PRE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] output tile: the K loop (software-pipelined) and the epilogue.
    CLIP: A and out are pointers, and this tile reads and writes them through descriptors made here whose
    row count ends at the group's end: rows of the next group load as zeros and the TMA store clips them.
    OUT_TMA: a tile whose rows all belong to its group is TMA-stored through ``out_desc`` (made on the
    host); a group's last, partial tile takes the masked store."""
    if CLIP:
        a = tl.make_tensor_descriptor(a, shape=[rows_end, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if MODE == 1:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BLOCK_K)):
        off_k = ki * BLOCK_K
        at = load_a_tile(a, a_rows, row0, rows_end, off_k, K, stride_am, BLOCK_M, BLOCK_K, A_TMA, A_GATHER)
        wt = load_w_tile(w, w_row0, N - off_n, off_k, K, stride_wn, BLOCK_N, BLOCK_K, W_TMA)
        acc = dot(at, wt, acc, DOT_UPCAST)
        if MODE == 1:
            ut = load_w_tile(w, w_row0 + N, N - off_n, off_k, K, stride_wn, BLOCK_N, BLOCK_K, W_TMA)
            acc_up = dot(at, ut, acc_up, DOT_UPCAST)
    rows = row0 + tl.arange(0, BLOCK_M)
    if MODE == 1:
        if SAVE_PRE:  # the pre-activations [gate, up], in pre's dtype, for the backward
            store_rows(pre, acc, rows, rows_end, off_n, N, stride_pre, BLOCK_N)
            store_rows(pre + N, acc_up, rows, rows_end, off_n, N, stride_pre, BLOCK_N)
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up  # silu(gate) * up, fp32
    if MODE == 2:
        acc = acc * tl.load(scale + rows, mask=rows < rows_end, other=0.0)[:, None]
    if CLIP:
        o = tl.make_tensor_descriptor(
            out, shape=[rows_end, N], strides=[stride_om, 1], block_shape=[BLOCK_M, BLOCK_N // 2]
        )
        _store_halves(o, acc, row0, off_n, BLOCK_M, BLOCK_N)
    elif OUT_TMA:
        if row0 + BLOCK_M <= rows_end:
            _store_halves(out_desc, acc, row0, off_n, BLOCK_M, BLOCK_N)
        else:
            store_rows(out, acc, rows, rows_end, off_n, N, stride_om, BLOCK_N)
    else:
        store_rows(out, acc, rows, rows_end, off_n, N, stride_om, BLOCK_N)


@triton.jit
def tile_of_item(
    item,
    tile_offsets,
    offsets,
    num_n,
    E,
    GROUP_M: tl.constexpr,
    LOG2_E: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """(expert, first row, the expert's row end, first column) of work item ``item``: the walk of the persistent
    grouped kernels (forward and backward), GROUP_M m-tiles of one expert sweeping the n-tiles together."""
    e = _find_expert(tile_offsets, item // num_n, E, LOG2_E)
    first_tile = tl.load(tile_offsets + e)
    m_tiles = tl.load(tile_offsets + e + 1) - first_tile
    local = item - first_tile * num_n
    in_group = GROUP_M * num_n
    first_m = (local // in_group) * GROUP_M
    group_m = tl.minimum(m_tiles - first_m, GROUP_M)
    m_tile = first_m + (local % in_group) % group_m
    off_n = ((local % in_group) // group_m) * BLOCK_N
    row_start = tl.load(offsets + e - 1, mask=e > 0, other=0)
    rows_end = tl.load(offsets + e)
    return e, row_start + m_tile * BLOCK_M, rows_end, off_n


@triton.jit
def moe_grouped_kernel(
    a,  # A (rows, K) fp16/bf16: descriptor, blocks [BLOCK_M, BLOCK_K] (A_TMA and not CLIP), else pointer
    a_rows,  # (S,) int32: source row of A for routed row r (A_GATHER), else unused
    w,  # W (E * N_w, K): descriptor, blocks [BLOCK_N, BLOCK_K] (W_TMA), else pointer; N_w = N (2N in MODE 1)
    out,  # (S, N) row-major pointer, A's dtype (16-byte aligned rows with CLIP)
    out_desc,  # out again: descriptor, blocks [BLOCK_M, BLOCK_N // 2] (OUT_TMA), else unused
    scale,  # (S,) fp32 per-row factor (MODE 2), else unused
    pre,  # (S, 2N) out: [gate, up] pre-activations (MODE 1 with SAVE_PRE), A's dtype, else unused
    offsets,  # (E,) int32 cumulative row ends of the groups
    tile_offsets,  # (E + 1,) int32 cumulative m-tile counts
    N,
    K,
    E,
    stride_am,
    stride_wn,
    stride_om,
    stride_pre,
    MODE: tl.constexpr,
    A_TMA: tl.constexpr,
    A_GATHER: tl.constexpr,
    W_TMA: tl.constexpr,
    CLIP: tl.constexpr,
    OUT_TMA: tl.constexpr,
    SAVE_PRE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    LOG2_E: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """Grid (NUM_PROGRAMS,): program p takes work items p, p + NUM_PROGRAMS, ... of the
    tile_offsets[E] * cdiv(N, BLOCK_N) items (read on the device: no host sync). Expert e owns the items
    [tile_offsets[e] * num_n, tile_offsets[e + 1] * num_n), ordered in groups of GROUP_M m-tiles that walk
    the n-tiles together (the W tile a group reads is shared in L2)."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    total = tl.load(tile_offsets + E) * num_n
    n_w = N * (2 if MODE == 1 else 1)  # rows of W per expert
    for item in tl.range(pid, total, NUM_PROGRAMS, flatten=False):
        e, row0, rows_end, off_n = tile_of_item(
            item, tile_offsets, offsets, num_n, E, GROUP_M, LOG2_E, BLOCK_M, BLOCK_N
        )
        w_row0 = e * n_w + off_n  # int32: TMA coordinates (E * N_w < 2^31)
        _moe_tile(
            a,
            a_rows,
            w,
            out,
            out_desc,
            scale,
            pre,
            row0,
            rows_end,
            off_n,
            w_row0,
            N,
            K,
            stride_am,
            stride_wn,
            stride_om,
            stride_pre,
            MODE,
            A_TMA,
            A_GATHER,
            W_TMA,
            CLIP,
            OUT_TMA,
            SAVE_PRE,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            DOT_UPCAST,
        )


@triton.jit
def sum_slots(rows, stride_rows, inv, t, cols, H, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    """fp32 sum over j = 0..TOP_K-1, in j order, of rows[inv[t*k + j], cols]: token t's k routed rows."""
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        r = tl.load(inv + t * TOP_K + j).to(tl.int64)
        acc += tl.load(rows + r * stride_rows + cols, mask=cols < H, other=0.0).to(tl.float32)
    return acc


@triton.jit
def moe_combine_kernel(
    o,  # (S, H) routed rows in expert order, already scaled by their top-k weight
    inv,  # (T * k,) int32: the routed row of pair (t, j) is inv[t * k + j]
    y,  # (T, H) output
    H,
    stride_o,
    stride_y,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Grid (T, cdiv(H, BLOCK_H)): y[t, cols] = sum over j of o[inv[t*k + j], cols], summed in fp32 in
    j order, so the result does not depend on scheduling."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = sum_slots(o, stride_o, inv, t, cols, H, TOP_K, BLOCK_H)
    tl.store(y + t.to(tl.int64) * stride_y + cols, narrow(acc, y.dtype.element_ty), mask=cols < H)
