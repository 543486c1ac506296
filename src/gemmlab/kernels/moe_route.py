"""MoE routing kernels: the table that sorts the S = T*k routed rows by expert, the tiles of each group and the
gather of x in expert order (``kernels.moe`` computes on them; legend there).

    moe_align_kernel     the routing table of S <= BLOCK_S pairs in one program
    moe_tiles_kernel     tile_offsets (E + 1,): the cumulative BLOCK_M-row tiles of each expert's group
    moe_count_kernel, moe_scan_kernel, moe_scatter_kernel   the same table of a large S (counting sort)
    moe_gather_kernel    x[token] in expert order (gather "copy")
"""

import triton
import triton.language as tl


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
