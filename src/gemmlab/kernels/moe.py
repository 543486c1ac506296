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
    moe_align_kernel     the routing table of S <= BLOCK_S pairs in one program
    moe_count_kernel, moe_scan_kernel, moe_scatter_kernel   the same table of a large S (counting sort)
    moe_gather_kernel    x[token] in expert order (gather "copy")

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


@triton.jit
def moe_align_kernel(
    ids,  # (S,) int32/int64: expert of pair p = t*k + j (topk_ids flattened)
    weights,  # (S,) topk weights flattened (HAS_SCALE), else unused
    order,  # (S,) int32 out: the pair of routed row r (pairs sorted by expert, stably)
    inv,  # (S,) int32 out: the routed row of pair p
    token,  # (S,) int32 out: order // TOP_K
    offsets,  # (E,) int32 out: cumulative row ends per expert
    tile_offsets,  # (E + 1,) int32 out: cumulative BLOCK_M-tile counts
    scale,  # (S,) fp32 out: weights[order[r]] (HAS_SCALE)
    ok,  # (1,) bool out: every id in [0, E)
    S,
    E,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_E: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    """Grid (1,): the whole routing table of a small S (<= BLOCK_S) in one program, one launch. Pairs sort by
    the key expert * BLOCK_S + pair (so ties keep pair order); an id outside [0, E) sorts after every valid
    pair, into no group, and clears ``ok``."""
    p = tl.arange(0, BLOCK_S)
    live = p < S
    e = tl.load(ids + p, mask=live, other=0)
    valid = live & (e >= 0) & (e < E)
    key = tl.where(valid, e.to(tl.int32), E) * BLOCK_S + p
    pair = tl.sort(key) % BLOCK_S  # routed row r holds pair[r]
    tl.store(order + p, pair, mask=live)
    tl.store(token + p, pair // TOP_K, mask=live)
    tl.store(inv + pair, p, mask=live & (pair < S))
    if HAS_SCALE:
        tl.store(scale + p, tl.load(weights + pair, mask=live & (pair < S), other=0.0).to(tl.float32), mask=live)
    counts = tl.histogram(tl.where(valid, e.to(tl.int32), 0), BLOCK_E, mask=valid)  # (BLOCK_E,)
    x = tl.arange(0, BLOCK_E)
    tl.store(offsets + x, tl.cumsum(counts, 0), mask=x < E)
    tl.store(tile_offsets + 1 + x, tl.cumsum((counts + BLOCK_M - 1) // BLOCK_M, 0), mask=x < E)
    tl.store(tile_offsets + x, 0, mask=x == 0)
    tl.store(ok + x, tl.sum((live & ~valid).to(tl.int32), 0) == 0, mask=x == 0)


@triton.jit
def moe_tiles_kernel(
    offsets,  # (E,) int32 cumulative row ends of the groups
    tile_offsets,  # (E + 1,) int32 out: cumulative BLOCK_M-tile counts
    ok,  # (1,) bool out: offsets non-decreasing, within [0, S]
    E,
    S,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """Grid (1,): the tile schedule of ``grouped_gemm`` and the check of its offsets, in one launch."""
    x = tl.arange(0, BLOCK_E)
    inside = x < E
    end = tl.load(offsets + x, mask=inside, other=0)
    start = tl.load(offsets + x - 1, mask=inside & (x > 0), other=0)
    rows = end - start
    bad = inside & ((rows < 0) | (end > S))
    tiles = tl.where(inside, (tl.maximum(rows, 0) + BLOCK_M - 1) // BLOCK_M, 0)
    tl.store(tile_offsets + 1 + x, tl.cumsum(tiles, 0), mask=inside)
    tl.store(tile_offsets + x, 0, mask=x == 0)
    tl.store(ok + x, tl.sum(bad.to(tl.int32), 0) == 0, mask=x == 0)


# Routing of a large S (more pairs than one program sorts): a stable counting sort in three launches.
# Pairs are cut into NB blocks of BLOCK pairs; bin E holds the ids outside [0, E) (sorted after every valid pair,
# into no group, as in moe_align_kernel). hist and base are (E + 1, NB) int32, expert-major.


@triton.jit
def moe_count_kernel(
    ids,  # (S,) int32/int64: expert of pair p = t*k + j
    hist,  # (E + 1, NB) int32 out: pairs of block b in bin x
    local,  # (E + 1, NB) int32 out: pairs of block b in bins below x (the block's exclusive scan)
    S,
    E,
    NB,
    BLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """Grid (NB,): the bin histogram of block b's pairs."""
    b = tl.program_id(0)
    p = b * BLOCK + tl.arange(0, BLOCK)
    live = p < S
    e = tl.load(ids + p, mask=live, other=0)
    x = tl.where((e >= 0) & (e < E), e.to(tl.int32), E)
    counts = tl.histogram(x, BLOCK_E, mask=live)  # (BLOCK_E,)
    bins = tl.arange(0, BLOCK_E)
    tl.store(hist + bins * NB + b, counts, mask=bins <= E)
    tl.store(local + bins * NB + b, tl.cumsum(counts, 0) - counts, mask=bins <= E)


@triton.jit
def moe_scan_kernel(
    hist,  # (E + 1, NB) int32
    local,  # (E + 1, NB) int32 in: the blocks' exclusive scans; out: base (first row of block b's bin-x pairs
    #         minus their rank in the block's sorted order)
    offsets,  # (E,) int32 out: cumulative row ends per expert
    tile_offsets,  # (E + 1,) int32 out: cumulative BLOCK_M-tile counts
    ok,  # (1,) bool out: every id in [0, E)
    E,
    NB,
    BLOCK_M: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_B: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Grid (1,): per-bin totals (offsets, tile_offsets, ok), then the exclusive scan of hist in its
    expert-major order, in CHUNK pieces: where block b's pairs of bin x start."""
    bins = tl.arange(0, BLOCK_E)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for b0 in range(0, NB, BLOCK_B):
        bb = b0 + tl.arange(0, BLOCK_B)
        m = (bins[:, None] <= E) & (bb[None, :] < NB)
        counts += tl.sum(tl.load(hist + bins[:, None] * NB + bb[None, :], mask=m, other=0), 1)
    valid = tl.where(bins < E, counts, 0)
    tl.store(offsets + bins, tl.cumsum(valid, 0), mask=bins < E)
    tl.store(tile_offsets + 1 + bins, tl.cumsum((valid + BLOCK_M - 1) // BLOCK_M, 0), mask=bins < E)
    tl.store(tile_offsets + bins, 0, mask=bins == 0)
    tl.store(ok + bins, tl.sum(tl.where(bins == E, counts, 0), 0) == 0, mask=bins == 0)
    carry = tl.program_id(0) * 0  # a tensor (NB may be specialized to the constant 1)
    n = (E + 1) * NB
    for c0 in range(0, n, CHUNK):
        idx = c0 + tl.arange(0, CHUNK)
        m = idx < n
        v = tl.load(hist + idx, mask=m, other=0)
        inc = tl.cumsum(v, 0)
        tl.store(local + idx, carry + inc - v - tl.load(local + idx, mask=m, other=0), mask=m)
        carry += tl.sum(v, 0)


@triton.jit
def moe_scatter_kernel(
    ids,  # (S,) int32/int64
    weights,  # (S,) topk weights flattened (HAS_SCALE), else unused
    base,  # (E + 1, NB) int32: from moe_scan_kernel
    order,
    inv,
    token,  # (S,) int32 out, as moe_align_kernel's
    scale,  # (S,) fp32 out: weights[order[r]] (HAS_SCALE)
    S,
    E,
    NB,
    TOP_K: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    """Grid (NB,): block b sorts its pairs by (bin, pair) and writes each to row base[bin, b] + its position
    in that order: token order within an expert across blocks, since blocks are scanned in order."""
    b = tl.program_id(0)
    q = tl.arange(0, BLOCK)
    p = b * BLOCK + q
    live = p < S
    e = tl.load(ids + p, mask=live, other=0)
    x = tl.where(live, tl.where((e >= 0) & (e < E), e.to(tl.int32), E), E + 1)
    key = tl.sort(x * BLOCK + q)  # sorted position q holds key[q]
    xs = key // BLOCK
    pair = b * BLOCK + key % BLOCK
    keep = xs <= E
    dest = tl.load(base + xs * NB + b, mask=keep, other=0) + q
    tl.store(order + dest, pair, mask=keep)
    tl.store(token + dest, pair // TOP_K, mask=keep)
    tl.store(inv + pair, dest, mask=keep)
    if HAS_SCALE:
        tl.store(scale + dest, tl.load(weights + pair, mask=keep, other=0.0).to(tl.float32), mask=keep)


@triton.jit
def moe_gather_kernel(
    x,  # (T, H)
    token,  # (S,) int32: the token of routed row r
    out,  # (S, H) out: x[token[r]]
    H,
    stride_x,
    stride_out,
    BLOCK_H: tl.constexpr,
):
    """Grid (S, cdiv(H, BLOCK_H)): out[r, cols] = x[token[r], cols] (x.index_select(0, token))."""
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    src = tl.load(token + r).to(tl.int64)
    v = tl.load(x + src * stride_x + cols, mask=cols < H)
    tl.store(out + r.to(tl.int64) * stride_out + cols, v, mask=cols < H)
