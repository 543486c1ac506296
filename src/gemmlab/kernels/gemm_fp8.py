"""FP8 (e4m3) dense GEMM and the quantizer of activations: C (M, N) = (A * a_scale) @ (B * b_scale).

A (M, K) and B (K, N) hold float8_e4m3fn values; the scales are fp32; the products accumulate in fp32 and C is
written in its own dtype (bf16, fp16 or fp32). SCALE says how the scales are laid out:

    SCALE = 0  per tensor     a_scale (),            b_scale ()                     applied in the epilogue
    SCALE = 1  per row / col  a_scale (M, 1),        b_scale (1, N)                 applied in the epilogue
    SCALE = 2  block          a_scale (M, cdiv(K, 128)) over 1x128 blocks of A,
                              b_scale (cdiv(K, 128), cdiv(N, 128)) over 128x128 blocks of B
                              applied per BLOCK_K step inside the main loop: each step's product goes into a fresh
                              fp32 accumulator, is scaled and added to the tile's fp32 sum (BLOCK_K divides 128)

Layouts as in ``kernels.gemm`` (whose helpers this module uses): A is K-major (a_desc over A (M, K)); B_KMAJOR: b_desc
over B^T (N, K) (the nn.Linear weight layout), else over B (K, N). TMA zero-fills loads past M, N and K, so a partial
K step adds zeros. Launchers: ``gemmlab.ops.gemm_fp8``.
"""

import triton
import triton.language as tl

from gemmlab.kernels.gemm import INTERPRETED, load_a, load_b, store_c, tile_coords

FP8_MAX = tl.constexpr(448.0)  # the largest finite float8_e4m3fn


@triton.jit
def block_step_scale(a_scale_ptr, b_scale_ptr, rows, M, off_n, off_k, stride_sam, stride_sak, stride_sbk, stride_sbn):
    """[BLOCK_M] fp32, the block scale of one K step's partial product at rows ``rows`` of a tile from column off_n:
    A's 1x128 scale times B's 128x128 one, a scalar per tile (BLOCK_N divides 128)."""
    kb = off_k // 128
    sa = tl.load(a_scale_ptr + rows.to(tl.int64) * stride_sam + kb * stride_sak, mask=rows < M, other=0.0)
    return sa * tl.load(b_scale_ptr + kb * stride_sbk + (off_n // 128) * stride_sbn)


@triton.jit
def e4m3_operand(x):
    """An e4m3 tile as a dot operand. On the GPU: x itself (the tensor cores decode NaN). Under Triton 3.6's CPU
    interpreter, whose dot widens e4m3 with a generic cast that reads the NaN codes 0x7F / 0xFF as +-480: x decoded
    to fp32 (exact for every e4m3 value), NaN where the low 7 bits are all set (both operands of a dot then come here,
    so their types agree)."""
    if INTERPRETED:
        bits = x.to(tl.uint8, bitcast=True)
        return tl.where((bits & 0x7F) == 0x7F, float("nan"), x.to(tl.float32))
    return x


@triton.jit
def gemm_fp8_tma_kernel(
    a_desc,  # A (M, K) e4m3, K contiguous, blocks [BLOCK_M, BLOCK_K]
    b_desc,  # B^T (N, K) e4m3 (B_KMAJOR, blocks [BLOCK_N, BLOCK_K]) or B (K, N) (blocks [BLOCK_K, BLOCK_N])
    c,  # C (M, N) row-major bf16/fp16/fp32: descriptor (C_TMA, blocks [BLOCK_M, BLOCK_N or BLOCK_N // 2]) or pointer
    a_scale_ptr,  # fp32: () SCALE 0, (M, 1) SCALE 1, (M, cdiv(K, 128)) SCALE 2
    b_scale_ptr,  # fp32: () SCALE 0, (1, N) SCALE 1, (cdiv(K, 128), cdiv(N, 128)) SCALE 2
    M,
    N,
    K,
    stride_cm,  # C's row stride (pointer epilogue only)
    stride_sam,
    stride_sak,  # a_scale's strides (rows, K blocks)
    stride_sbk,
    stride_sbn,  # b_scale's strides (K blocks, columns or column blocks)
    SCALE: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    C_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    PROMOTE: tl.constexpr,
    SB_SCALAR: tl.constexpr,
    WARP_SPEC: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    """Persistent TMA kernel, wgmma with e4m3 operands. Grid: (min(NUM_PROGRAMS, tiles),); each program walks tiles
    start, start + NUM_PROGRAMS, ... in grouped order. PROMOTE (SCALE 0 and 1): the tensor cores' running sum is moved
    into the fp32 accumulator every BLOCK_K (``max_num_imprecise_acc``), as the block-scaled path does by
    construction; off, the hardware accumulates the whole K in place. Variants (the same sums, other code):
    SB_SCALAR (SCALE 2, BLOCK_N divides 128): B's scale is one scalar per tile and step, not a gathered [BLOCK_N]
    vector; WARP_SPEC: Triton's Hopper warp specialization of the K loop (a producer warp group issuing the TMA
    loads, two consumer warp groups of BLOCK_M // 2 rows each; applied at num_warps=4 with a pointer epilogue);
    FLATTEN: the tile and K loops flattened into one software-pipelined loop (the next tile's loads start during
    this tile's epilogue)."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(start_pid, num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in tl.range(k_tiles, warp_specialize=WARP_SPEC):
            off_k = ki * BLOCK_K
            a = e4m3_operand(load_a(a_desc, off_m, off_k, True))
            b = e4m3_operand(load_b(b_desc, off_k, off_n, B_KMAJOR))
            if SCALE == 2 and SB_SCALAR:  # BLOCK_N divides 128: one column block of B's scales per tile
                acc += (
                    tl.dot(a, b)
                    * block_step_scale(
                        a_scale_ptr, b_scale_ptr, rows, M, off_n, off_k, stride_sam, stride_sak, stride_sbk, stride_sbn
                    )[:, None]
                )
            elif SCALE == 2:
                kb = off_k // 128
                sa = tl.load(
                    a_scale_ptr + rows.to(tl.int64) * stride_sam + kb * stride_sak, mask=rows < M, other=0.0
                )  # [BLOCK_M]
                sb = tl.load(
                    b_scale_ptr + kb * stride_sbk + (cols // 128) * stride_sbn, mask=cols < N, other=0.0
                )  # [BLOCK_N]
                acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
            elif PROMOTE:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
            else:
                acc = tl.dot(a, b, acc)
        if SCALE == 0:
            acc = acc * (tl.load(a_scale_ptr) * tl.load(b_scale_ptr))
        elif SCALE == 1:
            sa = tl.load(a_scale_ptr + rows.to(tl.int64) * stride_sam, mask=rows < M, other=0.0)
            sb = tl.load(b_scale_ptr + cols.to(tl.int64) * stride_sbn, mask=cols < N, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        store_c(c, acc, off_m, off_n, M, N, stride_cm, BLOCK_N, EPILOGUE_SUBTILE, C_TMA)


@triton.jit
def e4m3_of(v):
    """fp32 ``v`` (|v| <= 448, or NaN) as the nearest e4m3 value, ties to even, NaN as 0x7F, the sign kept (the rule of
    torch's cast). Built from v's bits with integer arithmetic, so it is the same under the CPU interpreter (whose own
    cast loses the carry of a rounding across a power of two) as on the GPU. Normal range (|v| >= 2^-6): the fp32
    mantissa rounded to 3 bits on the bit pattern, the carry running into the exponent (re-biased 127 -> 7).
    Below (e4m3's subnormals, spacing 2^-9): the 24-bit significand shifted down to units of 2^-9, rounded to nearest
    even; 8 units is 2^-6, whose code 0x08 it is too."""
    bits = v.to(tl.uint32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    sign = (bits >> 24) & 0x80
    up = (mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20  # [exponent | 3 mantissa bits], rounded
    normal = up - (120 << 3)  # re-bias the exponent: 127 -> 7
    # units of 2^-9: v = sig 2^(E - 23), so shift by 14 - E = 141 - exp (in [1, 31]: the normal range's lanes unused)
    shift = tl.maximum(tl.minimum(141 - (mag >> 23).to(tl.int32), 31), 1).to(tl.uint32)
    sig = (mag & 0x7FFFFF) | 0x800000
    units = sig >> shift
    rest = sig & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    sub = units + ((rest > half) | ((rest == half) & ((units & 1) == 1))).to(tl.uint32)
    code = tl.where(mag >= 0x3C800000, normal, sub)  # 0x3C800000 = 2^-6
    code = tl.where(v == v, code, 0x7F) | sign
    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def quantize_groups_kernel(
    x_ptr,  # X (M, K) fp32/fp16/bf16, unit column stride
    q_ptr,  # Q (M, K) e4m3, unit column stride
    s_ptr,  # S (M, cdiv(K, GROUP)) fp32
    K,
    stride_xm,
    stride_qm,
    stride_sm,
    GROUP,  # columns per scale: K for one scale per row, 128 for 1x128 blocks
    BLOCK: tl.constexpr,  # columns per chunk of a group
):
    """Per-group amax quantization of rows: S[m, g] = amax(|X[m, g*GROUP : (g+1)*GROUP]|) / 448 (1 for an all-zero
    group, so Q is 0 there, not NaN; 1 for a group holding a NaN, as torch.where(amax > 0, ...) gives), Q = clamp(X /
    S, -448, 448) in e4m3 (saturating; NaN stays NaN). Grid: (M, cdiv(K, GROUP)); each program reads its group twice,
    in BLOCK chunks (amax, then the quantized values)."""
    m = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    begin = g * GROUP
    end = min(begin + GROUP, K)
    x_row = x_ptr + m * stride_xm
    q_row = q_ptr + m * stride_qm
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    nans = tl.zeros((BLOCK,), dtype=tl.int32)  # max.f32 on the GPU drops a NaN: counted apart
    for start in range(begin, end, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < end, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
        nans += (x != x).to(tl.int32)
    group_max = tl.max(amax, axis=0)
    ok = (group_max > 0) & (tl.sum(nans, axis=0) == 0)
    scale = tl.where(ok, tl.div_rn(group_max, FP8_MAX), 1.0)  # IEEE division, as torch divides
    tl.store(s_ptr + m * stride_sm + g, scale)
    for start in range(begin, end, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < end, other=0.0).to(tl.float32)
        q = tl.div_rn(x, scale)
        q = tl.minimum(
            tl.maximum(q, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL), FP8_MAX, propagate_nan=tl.PropagateNan.ALL
        )  # saturating; NaN stays NaN
        tl.store(q_row + cols, e4m3_of(q), mask=cols < end)
