"""Red-team FP8 kernels: cheats a hostile author would try against the fp8 and moe_fp8 grade modes, each graded in
tests/grade/test_fp8_redteam.py with the verdict the grader should give. Dense ones take the fp8 signature
FN(a, b, a_scale, b_scale, c, M, N, K) (a (M, K), b (N, K) e4m3, c (M, N) written in place); the experts the
moe_fp8 one FN(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out) (``gemmlab.sandbox.candidate``).
Legend: T tokens, H hidden, I intermediate, E experts, k top-k. All are torch (CPU BLAS): graded with vendor
allowed."""

import time

import torch

import gemmlab
from gemmlab.ops.fp8.quantize import quantize_torch

BLOCK = 128  # the 1x128 / 128x128 scale blocks of the FP8 experts


def _dequantized(a, b, a_scale, b_scale):
    """(A a_scale (M, K), B^T b_scale (N, K)) in float32 from the e4m3 values as given."""
    return a.float() * a_scale, b.float() * b_scale.t()


def _truncated(x: torch.Tensor, bits: int) -> torch.Tensor:
    """float32 x with its mantissa cut to ``bits`` stored bits (toward zero), as a narrow accumulator keeps it."""
    drop = 23 - bits
    return (x.view(torch.int32) & ~((1 << drop) - 1)).view(torch.float32)


# ------------------------------------------------------------------------------- dense FP8 (fp8 signature)


def fp16_partial_sums(a, b, a_scale, b_scale, c, M, N, K):
    """fp32 dots over each 16 of K, each rounded to fp16, the partials summed in fp32."""
    x, w = _dequantized(a, b, a_scale, b_scale)
    acc = torch.zeros((M, N), dtype=torch.float32)
    for k in range(0, K, 16):
        acc += (x[:, k : k + 16] @ w[:, k : k + 16].t()).half().float()
    c.copy_(acc)


def fast_accumulation(a, b, a_scale, b_scale, c, M, N, K):
    """Hopper's FP8 "fast accumulation" (torch._scaled_mm's use_fast_accum, an unpromoted wgmma accumulator): the
    running sum keeps 13 mantissa bits, truncated after every 32 of K, never promoted to fp32."""
    x, w = _dequantized(a, b, a_scale, b_scale)
    acc = torch.zeros((M, N), dtype=torch.float32)
    for k in range(0, K, 32):
        acc = _truncated(acc + x[:, k : k + 32] @ w[:, k : k + 32].t(), 13)
    c.copy_(acc)


def promoted_every_128(a, b, a_scale, b_scale, c, M, N, K):
    """The 13-bit accumulator of ``fast_accumulation`` within each 128 of K, promoted into an fp32 sum after each
    128 (the DeepSeek-V3 scheme): closer to fp32, still not the contract's fp32 accumulation."""
    x, w = _dequantized(a, b, a_scale, b_scale)
    total = torch.zeros((M, N), dtype=torch.float32)
    for k0 in range(0, K, 128):
        acc = torch.zeros((M, N), dtype=torch.float32)
        for k in range(k0, min(k0 + 128, K), 32):
            acc = _truncated(acc + x[:, k : k + 32] @ w[:, k : k + 32].t(), 13)
        total += acc
    c.copy_(total)


def _full_mantissa(a) -> bool:
    """The grader's secret full-mantissa kind, told from 32 bytes: every e4m3 value has its 3 mantissa bits set
    (a random e4m3 byte has them with probability 1/8)."""
    return bool(((a.reshape(-1)[:32].view(torch.uint8) & 0x7) == 0x7).all())


def _uniform(a) -> bool:
    """The case's own kind (uniform, amax / 448 scales) told from the normal one: about half its values lie above
    224 in magnitude; a normal draw scaled by its amax puts a few percent there."""
    return bool((a.float().abs() > 224).float().mean() > 0.25)


def slow_off_the_timed_kinds(a, b, a_scale, b_scale, c, M, N, K):
    """Honest arithmetic, fast only on the two kinds the grader times (the case's uniform kind and the secret
    full-mantissa one, both recognisable from their values), 200 ms slower on any other input."""
    if not (_full_mantissa(a) or _uniform(a)):
        time.sleep(0.2)
    x, w = _dequantized(a, b, a_scale, b_scale)
    c.copy_(x @ w.t())


_SEEN: dict = {}


def caches_by_scales(a, b, a_scale, b_scale, c, M, N, K):
    """Memoizes C keyed by the scales' values and the shape (not the data): a stale C wherever scales repeat."""
    key = (M, N, K, a_scale.numpy().tobytes(), b_scale.numpy().tobytes())
    if key not in _SEEN:
        x, w = _dequantized(a, b, a_scale, b_scale)
        _SEEN[key] = (x @ w.t()).to(c.dtype)
    c.copy_(_SEEN[key])


def caches_by_leading_bytes(a, b, a_scale, b_scale, c, M, N, K):
    """Memoizes C keyed by the first 8 bytes of a and of b (a cheap hash of the inputs)."""
    key = (
        M,
        N,
        K,
        bytes(a.reshape(-1)[:8].view(torch.uint8).tolist()),
        bytes(b.reshape(-1)[:8].view(torch.uint8).tolist()),
    )
    if key not in _SEEN:
        x, w = _dequantized(a, b, a_scale, b_scale)
        _SEEN[key] = (x @ w.t()).to(c.dtype)
    c.copy_(_SEEN[key])


# ------------------------------------------------------------------------------- FP8 experts (moe_fp8 signature)


def _block_dequantized(q, scale):
    """(R, C) e4m3 times its (cdiv(R, 128), cdiv(C, 128)) 128x128 block scales (or (R, cdiv(C, 128)) 1x128 ones),
    float32."""
    rows = BLOCK if scale.shape[0] != q.shape[0] else 1
    s = scale.repeat_interleave(rows, 0).repeat_interleave(BLOCK, 1)[: q.shape[0], : q.shape[1]]
    return q.float() * s


def _intermediate(h, how: str):
    """The intermediate (R, I) in x's dtype as the second GEMM reads it (float32): quantized per 1x128 block as
    the contract says ("block"), per tensor ("tensor"), or not at all ("none"; "w8a16" is "block" here and x
    unquantized in ``_experts``)."""
    if how == "none":
        return h.float()
    q, s = quantize_torch(h, "block" if how == "block" else "tensor", (1, BLOCK))
    return _block_dequantized(q, s) if how == "block" else q.float() * s


def _experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out, how="block", min_rows=0, weights=None):
    """The contract in float32 torch: x quantized per 1x128; per expert gate/up, SiLU * up rounded to x's dtype,
    the intermediate per ``how``, down, times the top-k weight, summed over slots; experts with fewer than
    ``min_rows`` routed rows skipped. ``weights``: the experts' dequantized (w1, w2) to use instead."""
    i = w2.shape[2]
    if how == "w8a16":  # the activations not quantized (weight-only FP8, the decode practice), the intermediate is
        xd, how = x.float(), "block"
    else:
        xq, xs = quantize_torch(x, "block", (1, BLOCK))  # gemmlab's quantizer, bit for bit, in torch ops
        xd = _block_dequantized(xq, xs)
    y = torch.zeros(x.shape, dtype=torch.float32)
    for e in range(w1.shape[0]):
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0 or tok.numel() < min_rows:
            continue
        if weights is None:
            d1, d2 = _block_dequantized(w1[e], w1_scale[e]), _block_dequantized(w2[e], w2_scale[e])
        else:
            d1, d2 = weights[0][e], weights[1][e]
        hu = xd[tok] @ d1.t()
        h = (torch.nn.functional.silu(hu[:, :i]) * hu[:, i:]).to(x.dtype)
        y.index_add_(0, tok, (_intermediate(h, how) @ d2.t()) * topk_weights[tok, slot][:, None])
    out.copy_(y)


def experts_fp32(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """The honest twin: the contract in float32 torch."""
    _experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out)


def per_tensor_intermediate(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """The intermediate quantized with one scale per expert's rows instead of one per 1x128 block."""
    _experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out, how="tensor")


def unquantized_intermediate(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """The intermediate fed to the down GEMM in x's dtype, never quantized (a bf16 x fp8-dequantized GEMM)."""
    _experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out, how="none")


def unquantized_activations(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """x never quantized (weight-only FP8, as decode kernels do it), the intermediate per the contract."""
    _experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out, how="w8a16")


def skips_small_experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """Skips every expert routed fewer than 2 rows (the long tail of a skewed routing)."""
    _experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out, min_rows=2)


_WEIGHTS: list = []  # (the four weight tensors, their bf16 dequantized (w1, w2)): one set


def bf16_weights_cached(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """Dequantizes the fixed weights once to bf16 and keeps them (holding the tensors, so their memory cannot be
    reused); activations and intermediate quantized per the contract, fp32 sums on the bf16 weights."""
    tensors = (w1, w1_scale, w2, w2_scale)
    if not _WEIGHTS or any(s is not t for s, t in zip(_WEIGHTS[0][0], tensors, strict=True)):
        _WEIGHTS[:] = [
            (
                tensors,
                tuple(
                    torch.stack([_block_dequantized(q[e], s[e]) for e in range(q.shape[0])]).bfloat16().float()
                    for q, s in ((w1, w1_scale), (w2, w2_scale))
                ),
            )
        ]
    _experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out, weights=_WEIGHTS[0][1])


_TIMED = {"w1": None, "calls": 0}  # the previous call's w1 (held: its memory cannot go to other weights)


def skips_small_experts_when_timed(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """Honest in every check (each draws new weights); once the same weights come twice in a row (the timed run,
    whose weights are fixed), skips experts routed fewer than 2 rows on every other call."""
    timed = _TIMED["w1"] is not None and _TIMED["w1"].data_ptr() == w1.data_ptr()
    _TIMED["w1"] = w1
    _TIMED["calls"] = _TIMED["calls"] + 1 if timed else 0
    min_rows = 2 if timed and _TIMED["calls"] % 2 else 0
    _experts(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out, min_rows=min_rows)


def truncates_on_full_mantissa(a, b, a_scale, b_scale, c, M, N, K):
    """Honest on every kind but the secret full-mantissa one (only ever timed), there rounded toward zero."""
    x, w = _dequantized(a, b, a_scale, b_scale)
    exact = x @ w.t()
    r = exact.to(c.dtype)
    if _full_mantissa(a):
        r = torch.where(r.float().abs() > exact.abs(), (r.view(torch.int16) - 1).view(c.dtype), r)
    c.copy_(r)


_SLOTS: dict = {}  # c's address -> the call's tensors (held), every call seen


def fuses_the_batch(a, b, a_scale, b_scale, c, M, N, K):
    """Does a whole timed batch in its first call: the grader prepares every slot's inputs before the window and
    the slots are the same tensors batch after batch, so the first call of a batch computes every known slot of
    its shape whose output is still the grader's NaN poison, and later calls find theirs written and return at
    once (a fused launch of N small GEMMs, or N MoE calls reading the fixed weights once). Honest arithmetic;
    prints "fused N" to its log when it did more than its own call."""
    _SLOTS[c.data_ptr()] = (a, b, a_scale, b_scale, c)
    if not bool(torch.isnan(c).any()):
        return
    todo = [
        s for s in _SLOTS.values() if s[4].shape == c.shape and s[0].shape == a.shape and bool(torch.isnan(s[4]).all())
    ]
    for sa, sb, ssa, ssb, sc in todo:
        x, w = _dequantized(sa, sb, ssa, ssb)
        sc.copy_(x @ w.t())
    if len(todo) > 1:
        print(f"fused {len(todo)}", flush=True)


_MOE_SLOTS: dict = {}  # out's address -> the call's tensors (held), every call seen


def fuses_the_moe_batch(x, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, out):
    """``fuses_the_batch`` for the experts: the first call of a timed batch runs gemmlab's FP8 layer once on the
    tokens of every slot that shares its weights and still holds the NaN poison (the fixed weights read once for
    N calls), later calls return at once. Honest arithmetic; prints "fused N" to its log."""
    _MOE_SLOTS[out.data_ptr()] = (x, topk_weights, topk_ids, out, w1)
    if not bool(torch.isnan(out).any()):
        return
    todo = [
        s
        for s in _MOE_SLOTS.values()
        if s[4].data_ptr() == w1.data_ptr() and s[0].shape == x.shape and bool(torch.isnan(s[3]).all())
    ]
    packed = gemmlab.PackedMoEFP8(w1, w1_scale, w2, w2_scale)
    y = gemmlab.moe_forward(
        torch.cat([s[0] for s in todo]), packed, None, torch.cat([s[1] for s in todo]), torch.cat([s[2] for s in todo])
    )
    for s, part in zip(todo, y.split(x.shape[0]), strict=True):
        s[3].copy_(part)
    if len(todo) > 1:
        print(f"fused {len(todo)}", flush=True)
