"""Dense GEMM kernels: C (M, N) = A (M, K) @ B (K, N), fp16/bf16 in, fp32 accumulate, C in the input dtype.

The TMA kernels and the portable one, one per dispatch path (``gemmlab.paths()``; the GEMV-class kernel is
in ``gemmlab.kernels.gemv``); launchers and the dispatcher live in ``gemmlab.ops``. C is always row-major
here (the launcher swaps operands for a column-major C: C^T = B^T A^T). A and B may each be stored either way:

    A_KMAJOR = True : a_desc covers A   (M, K), K contiguous, blocks [BLOCK_M, BLOCK_K]
    A_KMAJOR = False: a_desc covers A^T (K, M), M contiguous, blocks [BLOCK_K, BLOCK_M]
    B_KMAJOR = True : b_desc covers B^T (N, K), K contiguous, blocks [BLOCK_N, BLOCK_K]  (pack_b layout)
    B_KMAJOR = False: b_desc covers B   (K, N), N contiguous, blocks [BLOCK_K, BLOCK_N]

TMA clips out-of-bounds stores and zero-fills out-of-bounds loads, so the TMA kernels need no masks;
their coordinates are int32 per dimension (fine up to 2^31 rows/cols), addresses are 64-bit in hardware.

Split reductions (split-K, the persistent kernel's split tail) share one deterministic scheme: every piece of a
tile writes its fp32 partial to its own workspace slot, then bumps the tile's arrival counter; the last piece
to arrive sums the slots in piece order (whoever arrives last, the same sum) and stores the tile
(``split_arrive``, ``split_sum``).
"""

import triton
import triton.language as tl
from triton import knobs

# Triton 3.6's CPU interpreter casts fp32 to bf16 by dropping the low 16 bits (toward zero), where the GPU rounds to
# nearest even; set at import, as the interpreter itself is chosen (``narrow``)
INTERPRETED = tl.constexpr(bool(knobs.runtime.interpret))


@triton.jit
def narrow(v, dtype: tl.constexpr):
    """fp32 v in ``dtype``, rounded to nearest even as the GPU's cvt.rn rounds. Under the interpreter a bf16 result
    is made from v's bits: + 0x7FFF + the last kept bit, the high half kept (NaN stays NaN)."""
    if INTERPRETED:
        if dtype == tl.bfloat16:
            bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = tl.where(v == v, (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16, 0x7FC0)
            return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return v.to(dtype)


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ("super-tile") order: GROUP_M tile rows are walked column by column, so the B columns
    a group needs stay in L2 while its A rows are reused."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % num_pid_in_group) % group_size_m
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def dot(a, b, acc, DOT_UPCAST: tl.constexpr):
    """acc += a @ b on tensor cores. DOT_UPCAST is set only under Triton 3.6's CPU interpreter, whose dot
    multiplies bf16 as raw uint16 bits: there the operands go to fp32 first (exact for bf16 products)."""
    if DOT_UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def load_a(a_desc, off_m, off_k, A_KMAJOR: tl.constexpr):
    if A_KMAJOR:
        a = a_desc.load([off_m, off_k])  # [BLOCK_M, BLOCK_K]
    else:
        a = a_desc.load([off_k, off_m]).T  # [BLOCK_K, BLOCK_M] -> [BLOCK_M, BLOCK_K]
    return a


@triton.jit
def load_b(b_desc, off_k, off_n, B_KMAJOR: tl.constexpr):
    if B_KMAJOR:
        b = b_desc.load([off_n, off_k]).T  # [BLOCK_N, BLOCK_K] -> [BLOCK_K, BLOCK_N]
    else:
        b = b_desc.load([off_k, off_n])  # [BLOCK_K, BLOCK_N]
    return b


@triton.jit
def _store_part(c, part, off_m, off_n, M, N, stride_cm, C_TMA: tl.constexpr):
    if C_TMA:
        c.store([off_m, off_n], narrow(part, c.dtype))
    else:  # masked pointer store: 64-bit tile base, 32-bit offsets inside the tile
        # (converted to C's dtype first and masked against scalar bounds: half the registers of the fp32 tile
        # and no per-element add; with the subtile split this keeps a 128x256 tile from spilling)
        val = narrow(part, c.dtype.element_ty)
        rows = tl.arange(0, part.shape[0])
        cols = tl.arange(0, part.shape[1])
        c_tile = c + off_m.to(tl.int64) * stride_cm + off_n
        mask = (rows[:, None] < M - off_m) & (cols[None, :] < N - off_n)
        tl.store(c_tile + (rows[:, None] * stride_cm + cols[None, :]), val, mask=mask)


@triton.jit
def store_c(
    c, acc, off_m, off_n, M, N, stride_cm, BLOCK_N: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, C_TMA: tl.constexpr
):
    """Write an fp32 [BLOCK_M, BLOCK_N] tile into C (M, N) row-major, in C's dtype. ``c`` is a descriptor
    (C_TMA; its blocks match the parts written) or a pointer with row stride ``stride_cm`` (any alignment).
    EPILOGUE_SUBTILE writes two [BLOCK_M, BLOCK_N // 2] halves: for TMA half the staging buffer; for the
    pointer store half the live pointers and masks (sm_90, 128x256x64, 8 warps: 2 LDL/STL, against 102 when
    the whole tile was stored at once; tests/instruments/test_inspect.py checks)."""
    if EPILOGUE_SUBTILE:
        acc = tl.reshape(acc, (acc.shape[0], 2, BLOCK_N // 2))
        acc0, acc1 = tl.split(tl.permute(acc, (0, 2, 1)))
        _store_part(c, acc0, off_m, off_n, M, N, stride_cm, C_TMA)
        _store_part(c, acc1, off_m, off_n + BLOCK_N // 2, M, N, stride_cm, C_TMA)
    else:
        _store_part(c, acc, off_m, off_n, M, N, stride_cm, C_TMA)


@triton.jit
def _tile_dot(
    a_desc,
    b_desc,
    off_m,
    off_n,
    k_begin,
    k_end,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    A_KMAJOR: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """fp32 [BLOCK_M, BLOCK_N] = sum over BLOCK_K steps k_begin..k_end-1 of A tile @ B tile."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_begin, k_end):
        off_k = ki * BLOCK_K
        a = load_a(a_desc, off_m, off_k, A_KMAJOR)
        b = load_b(b_desc, off_k, off_n, B_KMAJOR)
        acc = dot(a, b, acc, DOT_UPCAST)
    return acc


@triton.jit
def split_arrive(ws_part, acc, counter, SPLITS: tl.constexpr, offs):
    """Write this piece's fp32 partial tile to its slot ``ws_part`` and arrive at the tile's ``counter``; True
    for the last of the tile's SPLITS pieces to arrive (it then sums them: ``split_sum``)."""
    tl.store(ws_part + offs, acc, cache_modifier=".cg")
    tl.debug_barrier()  # every thread's partial is issued before the release below
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    return arrived == SPLITS - 1


@triton.jit
def split_sum(ws_tile, split_stride, counter, SPLITS: tl.constexpr, offs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The fp32 sum of a tile's SPLITS partials, slots ws_tile + s * split_stride in order s = 0..SPLITS-1
    (deterministic); leaves the counter at zero for the next launch."""
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLITS):
        total += tl.load(ws_tile + s * split_stride + offs, cache_modifier=".cg")
    tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    return total


@triton.jit
def gemm_tma_persistent_kernel(
    a_desc,  # A (M, K) or A^T (K, M), fp16/bf16, see A_KMAJOR
    b_desc,  # B^T (N, K) or B (K, N), see B_KMAJOR
    c,  # C (M, N) row-major: descriptor, blocks [BLOCK_M, BLOCK_N or BLOCK_N // 2] (C_TMA), else pointer
    ws_ptr,  # STREAM_K: (NUM_SMS, 2, BLOCK_M * BLOCK_N) fp32, each program's first and last partial tile;
    # TAIL_SPLIT: (SK_TILES, TAIL_SPLIT, BLOCK_M * BLOCK_N) fp32, one slot per piece of a tail tile
    count_ptr,  # STREAM_K: (SK_TILES,) int32 arrival counters, zero between calls
    M,
    N,
    K,
    stride_cm,  # C's row stride (pointer epilogue only)
    SK_TILES,  # STREAM_K: the last SK_TILES tiles (grouped order) are shared out by BLOCK_K steps; else 0
    A_KMAJOR: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    C_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    STREAM_K: tl.constexpr,
    TAIL_SPLIT: tl.constexpr = 0,
):
    """Hopper fast path. Grid: (min(NUM_SMS, tiles),), or (NUM_SMS,) with STREAM_K; each program walks tiles
    start, start+NUM_SMS, ... in grouped order, loading A/B through TMA into a multi-stage ring that feeds
    wgmma. STREAM_K (data-parallel + stream-K hybrid, against wave quantization): the first tiles - SK_TILES
    tiles go as above; the SK_TILES * k_tiles BLOCK_K steps of the rest are cut into NUM_SMS equal runs, one
    per program. A tile a program covers whole is stored; a partial tile goes to one of the program's two ws
    slots and the last of the tile's programs to arrive (atomic counter) sums the
    pieces in program order (deterministic, whoever arrives last) and stores the tile.
    STREAM_K with TAIL_SPLIT = s > 0 (data-parallel + split tail): the SK_TILES tail tiles (the partial last
    wave) are each cut into s pieces of K, the SK_TILES * s pieces dealt round-robin to the programs after their
    whole waves. Unlike stream-K's runs, the pieces that run together start together and walk K in step, so the
    tail keeps the data-parallel waves' L2 reuse (stream-K's runs sit at unrelated K offsets); a tile's pieces
    are summed in piece order by the last to arrive."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    dp_tiles = num_tiles - SK_TILES
    for tile_id in tl.range(start_pid, dp_tiles, NUM_SMS, flatten=False, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tile_dot(
            a_desc, b_desc, off_m, off_n, 0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K, A_KMAJOR, B_KMAJOR, DOT_UPCAST
        )
        store_c(c, acc, off_m, off_n, M, N, stride_cm, BLOCK_N, EPILOGUE_SUBTILE, C_TMA)
    if STREAM_K and TAIL_SPLIT > 0:
        per_piece = tl.cdiv(k_tiles, TAIL_SPLIT)  # BLOCK_K steps per piece
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        for piece in range(start_pid, SK_TILES * TAIL_SPLIT, NUM_SMS):
            sk_tile = piece // TAIL_SPLIT
            part = piece % TAIL_SPLIT
            k_begin = part * per_piece
            pid_m, pid_n = tile_coords(dp_tiles + sk_tile, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = _tile_dot(
                a_desc,
                b_desc,
                off_m,
                off_n,
                k_begin,
                min(k_begin + per_piece, k_tiles),
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                A_KMAJOR,
                B_KMAJOR,
                DOT_UPCAST,
            )
            ws_tile = ws_ptr + sk_tile.to(tl.int64) * (TAIL_SPLIT * BLOCK_M * BLOCK_N)
            if split_arrive(ws_tile + part * (BLOCK_M * BLOCK_N), acc, count_ptr + sk_tile, TAIL_SPLIT, offs):
                total = split_sum(ws_tile, BLOCK_M * BLOCK_N, count_ptr + sk_tile, TAIL_SPLIT, offs, BLOCK_M, BLOCK_N)
                store_c(c, total, off_m, off_n, M, N, stride_cm, BLOCK_N, EPILOGUE_SUBTILE, C_TMA)
    elif STREAM_K:
        per_run = tl.cdiv(SK_TILES * k_tiles, NUM_SMS)  # BLOCK_K steps per program
        it = start_pid * per_run
        run_end = min(it + per_run, SK_TILES * k_tiles)
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        while it < run_end:
            sk_tile = it // k_tiles
            tile_begin = sk_tile * k_tiles
            k_begin = it - tile_begin
            k_end = min(k_tiles, run_end - tile_begin)
            pid_m, pid_n = tile_coords(dp_tiles + sk_tile, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = _tile_dot(
                a_desc, b_desc, off_m, off_n, k_begin, k_end, BLOCK_M, BLOCK_N, BLOCK_K, A_KMAJOR, B_KMAJOR, DOT_UPCAST
            )
            if k_begin == 0 and k_end == k_tiles:
                store_c(c, acc, off_m, off_n, M, N, stride_cm, BLOCK_N, EPILOGUE_SUBTILE, C_TMA)
            else:
                # slot 1: the piece starts mid-tile (so it is the run's first); slot 0: it starts at the tile's
                # start and, being partial, ends mid-tile (the run's last). A run has at most one of each.
                slot = (k_begin != 0).to(tl.int64)
                tl.store(ws_ptr + (start_pid * 2 + slot) * (BLOCK_M * BLOCK_N) + offs, acc, cache_modifier=".cg")
                tl.debug_barrier()  # every thread's partial is issued before the release below
                first = tile_begin // per_run  # the programs whose runs meet this tile
                last = (tile_begin + k_tiles - 1) // per_run
                arrived = tl.atomic_add(count_ptr + sk_tile, 1, sem="acq_rel", scope="gpu")
                if arrived == last - first:
                    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                    for p in range(first, last + 1):
                        p_slot = (p * per_run > tile_begin).to(tl.int64)  # p's run starts inside the tile
                        total += tl.load(ws_ptr + (p * 2 + p_slot) * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
                    store_c(c, total, off_m, off_n, M, N, stride_cm, BLOCK_N, EPILOGUE_SUBTILE, C_TMA)
                    tl.atomic_xchg(count_ptr + sk_tile, 0, sem="relaxed", scope="gpu")
            it = tile_begin + k_end


@triton.jit
def gemm_tma_splitk_kernel(
    a_desc,
    b_desc,
    c,  # as in gemm_tma_persistent_kernel
    ws_ptr,  # (SPLIT_K, tiles, BLOCK_M * BLOCK_N) fp32 partial sums (unused when SPLIT_K == 1)
    count_ptr,  # (tiles,) int32 arrival counters, zero between calls (the last arrival resets its own)
    M,
    N,
    K,
    stride_cm,
    K_TILES_PER_SPLIT,  # BLOCK_K steps per split
    A_KMAJOR: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    C_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """Small-M path: small tiles, K split over SPLIT_K programs so the grid fills the GPU while streaming B.
    Grid: (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), SPLIT_K); N varies fastest so neighbours share A in L2.
    Each split writes its fp32 partial to ws; the last split to arrive at a tile (atomic counter) sums the
    partials in split order 0..SPLIT_K-1, so the result is deterministic, and writes C."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_begin = pid_k * K_TILES_PER_SPLIT
    k_end = min(k_begin + K_TILES_PER_SPLIT, k_tiles)
    acc = _tile_dot(
        a_desc, b_desc, off_m, off_n, k_begin, k_end, BLOCK_M, BLOCK_N, BLOCK_K, A_KMAJOR, B_KMAJOR, DOT_UPCAST
    )
    if SPLIT_K == 1:
        store_c(c, acc, off_m, off_n, M, N, stride_cm, BLOCK_N, EPILOGUE_SUBTILE, C_TMA)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        num_tiles = tl.num_programs(0) * tl.num_programs(1)
        offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        ws_tile = ws_ptr + tile.to(tl.int64) * (BLOCK_M * BLOCK_N)
        split_stride = num_tiles.to(tl.int64) * (BLOCK_M * BLOCK_N)
        if split_arrive(ws_tile + pid_k * split_stride, acc, count_ptr + tile, SPLIT_K, offs):
            total = split_sum(ws_tile, split_stride, count_ptr + tile, SPLIT_K, offs, BLOCK_M, BLOCK_N)
            store_c(c, total, off_m, off_n, M, N, stride_cm, BLOCK_N, EPILOGUE_SUBTILE, C_TMA)


@triton.jit
def gemm_portable_kernel(
    a_ptr,
    b_ptr,
    c_ptr,  # A (M, K), B (K, N), C (M, N), any strides, fp16/bf16
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
):
    """Portable path: pointer loads with masks, 64-bit offsets, any alignment, any GPU Triton supports and
    the CPU interpreter. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),) in grouped order."""
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :].to(tl.int64) * stride_ak
    b_ptrs = b_ptr + offs_k[:, None].to(tl.int64) * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = dot(a, b, acc, DOT_UPCAST)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, narrow(acc, c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
