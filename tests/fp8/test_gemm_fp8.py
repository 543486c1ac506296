"""FP8 GEMM and quantization (gemmlab.gemm_fp8, gemmlab.quantize_fp8) against the float64 reference under the
error bound of ``ref.gemm_fp8_bound``: every scale granularity, both B layouts, every output dtype, odd, prime and
tiny sizes, NaN-poisoned outputs, and each argument check fed a bad case. Small sizes: the CPU interpreter runs them."""

import itertools

import pytest
import torch
import triton
import triton.language as tl

import gemmlab
from gemmlab.kernels.gemm_fp8 import e4m3_of
from gemmlab.ops.fp8.quantize import quantize_torch
from gemmlab.ref import dequantize_fp8, gemm_fp8_bound, gemm_fp8_check, gemm_fp8_ref
from tests.conftest import DEVICE

FP8 = torch.float8_e4m3fn
GRANULARITY = {"tensor": ("tensor", "tensor"), "rowcol": ("row", "row"), "block": ("block", "block")}


def _operands(m, n, k, mode, seed, spread=1.0):
    """Fresh random A (M, K) and nn.Linear weight W (N, K), quantized: (qa, qw^T, sa, sw^T), B K-major."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * spread).to(DEVICE)
    w = torch.randn(n, k, generator=g).to(DEVICE)
    ga, gw = GRANULARITY[mode]
    qa, sa = gemmlab.quantize_fp8(x, ga, (1, 128))
    qw, sw = gemmlab.quantize_fp8(w, gw, (128, 128))
    return qa, qw.t(), sa, sw.t()


def _run(qa, qb, sa, sb, dtype):
    out = torch.full((qa.shape[0], qb.shape[1]), float("nan"), dtype=dtype, device=DEVICE)
    got = gemmlab.gemm_fp8(qa, qb, sa, sb, out_dtype=dtype, out=out)
    assert got is out
    chk = gemm_fp8_check(out, qa, qb, sa, sb)
    assert chk["ok"], chk
    return chk


def _interpreter_cost(m, n, k):  # 32x32x32 steps of the interpreter's tiles
    return -(-m // 32) * -(-n // 32) * -(-k // 32)


# odd, prime and tiny sizes, each K a multiple of 16 (TMA); the largest left to the GPU tests (tests/fp8/*_gpu.py)
SIZES = [
    (m, n, k)
    for m, n, k in itertools.product((1, 7, 61, 128, 257), (1, 7, 61, 128, 257), (16, 128, 272, 1024))
    if _interpreter_cost(m, n, k) <= 24
]


@pytest.mark.parametrize("mode", list(GRANULARITY))
@pytest.mark.parametrize("shape", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_fp8_within_bound(shape, mode):
    m, n, k = shape
    _run(*_operands(m, n, k, mode, seed=m * 7 + n * 3 + k), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mode", list(GRANULARITY))
def test_gemm_fp8_out_dtypes_and_row_major_b(dtype, mode):
    """A row-major B (K, N) (N % 16 == 0) and each output dtype, allocated (no out=) and NaN-poisoned."""
    m, n, k = 37, 48, 272
    qa, _, sa, _ = _operands(m, n, k, mode, seed=5)
    w = torch.randn(k, n, generator=torch.Generator().manual_seed(6)).to(DEVICE)  # B (K, N) row-major
    qb, sb = gemmlab.quantize_fp8(w, {"tensor": "tensor", "rowcol": "col", "block": "block"}[mode], (128, 128))
    assert qb.stride(1) == 1
    c = gemmlab.gemm_fp8(qa, qb, sa, sb, out_dtype=dtype)
    assert c.dtype == dtype and c.shape == (m, n)
    assert gemm_fp8_check(c, qa, qb, sa, sb)["ok"]
    _run(qa, qb, sa, sb, dtype)


def test_gemm_fp8_pinned_block_k_128_and_wide_scales():
    """BLOCK_K = 128 (one scale block per step, as on the GPU) and scales spread over decades per block."""
    from gemmlab.ops.gemm_fp8 import Fp8Config, execute_fp8, plan_fp8

    qa, qb, sa, sb = _operands(40, 200, 400, "block", seed=9, spread=1.0)
    sa = sa * torch.logspace(-3, 3, sa.shape[1], device=DEVICE)  # each K block of A in its own decade
    p = plan_fp8(qa, qb, sa, sb, config=Fp8Config(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=1))
    c = torch.full((40, 200), float("nan"), dtype=torch.float32, device=DEVICE)
    execute_fp8(p, qa, qb, sa, sb, c)
    assert gemm_fp8_check(c, qa, qb, sa, sb)["ok"]


def test_bound_catches_a_dropped_k_step_and_a_wrong_scale():
    """The bound is tight enough to see the mistakes a kernel makes: one K step missing, a scale block shifted."""
    qa, qb, sa, sb = _operands(16, 32, 256, "block", seed=3)
    ref = gemm_fp8_ref(qa, qb, sa, sb)
    bound = gemm_fp8_bound(qa, qb, sa, sb, torch.bfloat16, ref)
    dropped = dequantize_fp8(qa[:, 32:], sa.repeat_interleave(128, 1)[:, 32:]) @ dequantize_fp8(qb, sb, (128, 128))[32:]
    assert ((dropped - ref).abs() > bound).any()
    shifted = gemm_fp8_ref(qa, qb, sa.flip(1), sb)
    assert ((shifted - ref).abs() > bound).any()
    assert not gemm_fp8_check(ref.to(torch.bfloat16) + bound.max().to(torch.bfloat16) * 4, qa, qb, sa, sb)["ok"]
    poisoned = ref.to(torch.bfloat16)
    poisoned[3, 5] = float("nan")
    assert not gemm_fp8_check(poisoned, qa, qb, sa, sb)["ok"]


def test_gemm_fp8_empty_and_zero_k():
    qa = torch.zeros((0, 16), dtype=FP8, device=DEVICE)
    qb = torch.zeros((16, 8), dtype=FP8, device=DEVICE)
    one = torch.ones((), device=DEVICE)
    assert gemmlab.gemm_fp8(qa, qb, one, one).shape == (0, 8)
    c = torch.full((4, 8), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    k0 = gemmlab.gemm_fp8(torch.zeros((4, 0), dtype=FP8, device=DEVICE), qb[:0], one, one, out=c)
    assert k0 is c and (c == 0).all()  # a sum over nothing


def _bad_calls():
    qa, qb, sa, sb = _operands(8, 16, 32, "tensor", seed=1)
    one = torch.ones((), device=DEVICE)
    odd_a = torch.zeros((8, 24), dtype=FP8, device=DEVICE)[:, :20]  # K = 20: rows not 16-byte multiples
    odd_b = torch.zeros((32, 20), dtype=FP8, device=DEVICE)  # row-major B with N = 20
    return [
        (lambda: gemmlab.gemm_fp8(qa.float(), qb, sa, sb), TypeError, "float8_e4m3fn"),
        (lambda: gemmlab.gemm_fp8(qa, qb, sa.double(), sb), TypeError, "a_scale has dtype"),
        (lambda: gemmlab.gemm_fp8(qa, qb[:16], sa, sb), ValueError, "inner dimensions"),
        (lambda: gemmlab.gemm_fp8(qa, qb, torch.ones((8, 1), device=DEVICE), one), ValueError, "fit no granularity"),
        (
            lambda: gemmlab.gemm_fp8(qa, qb, torch.ones((8, 2), device=DEVICE), torch.ones((2, 1), device=DEVICE)),
            ValueError,
            "fit no granularity",
        ),
        (lambda: gemmlab.gemm_fp8(qa, qb, sa, sb, out_dtype=torch.int8), TypeError, "out_dtype"),
        (lambda: gemmlab.gemm_fp8(odd_a, qb[:20], one, one), ValueError, "a .* not TMA-aligned.*K % 16"),
        (lambda: gemmlab.gemm_fp8(qa, odd_b, one, one), ValueError, "b .* not TMA-aligned.*N % 16"),
        (lambda: gemmlab.gemm_fp8(qa.t().contiguous().t(), qb, sa, sb), ValueError, "a must be K-major"),
        (lambda: gemmlab.gemm_fp8(qa, qb, sa, sb, out=torch.empty((8, 8), device=DEVICE)), ValueError, "out must be"),
        (lambda: gemmlab.quantize_fp8(qa, "row"), TypeError, "quantize_fp8: x has dtype"),
        (lambda: gemmlab.quantize_fp8(torch.ones(4, 4, device=DEVICE), "rows"), ValueError, "granularity"),
        (lambda: gemmlab.quantize_fp8(torch.ones(4, 4, device=DEVICE), "block", (0, 128)), ValueError, "block"),
        (lambda: gemmlab.quantize_fp8(torch.ones(4, device=DEVICE), "row"), ValueError, "2-D"),
    ]


@pytest.mark.parametrize("case", range(14))
def test_every_check_fires(case):
    cases = _bad_calls()
    assert len(cases) == 14
    call, exc, match = cases[case]
    with pytest.raises(exc, match=match):
        call()


def test_out_overlapping_an_input_is_refused():
    """An out that shares memory with an input (here a_scale) is refused, the first call of a signature and later."""
    qa, qb, sa, sb = _operands(16, 16, 16, "rowcol", seed=2)
    buf = torch.ones(16 * 16, dtype=torch.float32, device=DEVICE)
    fresh = torch.empty((16, 16), dtype=torch.float32, device=DEVICE)
    gemmlab.gemm_fp8(qa, qb, buf[:16].view(16, 1), sb, out_dtype=torch.float32, out=fresh)  # the signature cached
    for _ in range(2):
        with pytest.raises(ValueError, match="overlaps"):
            gemmlab.gemm_fp8(qa, qb, buf[:16].view(16, 1), sb, out_dtype=torch.float32, out=buf.view(16, 16))


def test_out_whose_elements_share_memory_is_refused():
    """A stride-0 out (an expanded row) or one whose rows overlap would get several results in one place: refused
    as gemm refuses it, not written (issue 34, item 5)."""
    qa, qb, sa, sb = _operands(8, 16, 16, "tensor", seed=3)
    expanded = torch.zeros((1, 16), dtype=torch.bfloat16, device=DEVICE).expand(8, 16)
    rows_overlap = torch.zeros(32, dtype=torch.bfloat16, device=DEVICE).as_strided((8, 16), (2, 1))
    for out in (expanded, rows_overlap):
        with pytest.raises(ValueError, match="gemm_fp8: out .* share memory"):
            gemmlab.gemm_fp8(qa, qb, sa, sb, out=out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_out_dtype_defaults_to_outs(dtype):
    """With ``out`` and no ``out_dtype``, C takes out's dtype (the sandbox's fp8 call: ``gemm_fp8(a, b.t(), sa, sb,
    out=c)`` with an fp16 c); an out_dtype that differs from out's is one clear error (issue 34, item 7)."""
    qa, qb, sa, sb = _operands(8, 16, 32, "rowcol", seed=4)
    out = torch.full((8, 16), float("nan"), dtype=dtype, device=DEVICE)
    assert gemmlab.gemm_fp8(qa, qb, sa, sb, out=out) is out
    assert gemm_fp8_check(out, qa, qb, sa, sb)["ok"]
    other = torch.float32 if dtype != torch.float32 else torch.float16
    with pytest.raises(ValueError, match=f"gemm_fp8: out has dtype {dtype} but out_dtype is {other}"):
        gemmlab.gemm_fp8(qa, qb, sa, sb, out_dtype=other, out=out)
    assert gemmlab.gemm_fp8(qa, qb, sa, sb).dtype == torch.bfloat16  # no out: bf16, as before


@pytest.mark.parametrize(
    "granularity,block",
    [
        ("tensor", (1, 128)),
        ("row", (1, 128)),
        ("col", (1, 128)),
        ("block", (1, 128)),
        ("block", (128, 128)),
        ("block", (4, 16)),
    ],
)
def test_quantize_amax_scales_saturating_zero_groups(granularity, block):
    """Scales are amax / 448 per group (1 for an all-zero group: no NaN or Inf), q within e4m3's rounding of
    x / scale; the Triton kernel (row, 1x128) gives exactly what the torch ops give."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(61, 300, generator=g) * torch.logspace(-4, 3, 300)).to(DEVICE)
    x[5] = 0  # a zero row: zero groups in every granularity but "tensor" and "col"
    x[:, 130:260] = 0  # a zero 1x128 block
    q, s = gemmlab.quantize_fp8(x, granularity, block)
    want_q, want_s = quantize_torch(x, granularity, block if granularity == "block" else (1, 1))
    assert q.dtype == FP8 and s.dtype == torch.float32 and s.shape == want_s.shape
    assert torch.isfinite(s).all() and (s > 0).all() and torch.isfinite(q.float()).all()
    assert torch.equal(s, want_s) and torch.equal(q.float(), want_q.float())
    deq = dequantize_fp8(q, s, block)
    assert (q.float().abs() <= 448).all()
    # half an e4m3 ulp (3 mantissa bits) relative, or half a subnormal step (2^-9) of the group's scale
    step = dequantize_fp8(torch.full(q.shape, 2.0**-10, dtype=torch.float64, device=DEVICE), s, block)
    assert ((deq - x.double()).abs() <= 2.0**-4 * x.double().abs() + step).all()
    assert (deq[5] == 0).all() if granularity not in ("tensor", "col") else True


def test_quantize_saturates_instead_of_overflowing():
    x = torch.tensor([[1.0, -1.0, 3.0]], device=DEVICE)
    q = (x.float() / torch.tensor(3.0 / 448 * 0.999)).clamp(-448, 448)  # what a slightly small scale makes
    assert torch.isfinite(q.to(FP8).float()).all()
    q8, s = gemmlab.quantize_fp8(x, "row")
    assert q8.float().abs().max().item() == 448.0 and torch.isfinite(q8.float()).all()


@pytest.mark.parametrize("target", ["nvidia-h200", "default", "interpreter"])
def test_bundled_fp8_configs_load_and_gpu_rules_say_untuned(target):
    from gemmlab.ops import configs
    from gemmlab.ops.gemm_fp8 import Fp8Config

    rules = configs.rules(target, "gemm_fp8", "tma", Fp8Config.from_dict)
    assert rules and all(128 % r.config.block_k == 0 for r in rules)
    if target != "interpreter":
        data = configs.read(configs.bundled_file(target))
        assert all("not yet tuned" in r.get("note", "") for r in data["gemm_fp8"]["tma"])


@pytest.mark.parametrize("target", ["nvidia-h200", "default", "interpreter"])
def test_bundled_moe_fp8_configs_load_and_share_block_m(target):
    """Every mode has a rule for every size; the two MoE GEMMs of one call (gate/up, down) get one block_m (one
    tile schedule), and block_k divides the 128-wide scale block; the GPU rules say they are untuned."""
    from gemmlab.ops import configs
    from gemmlab.ops.fp8.moe_launch import MoEFp8Config

    for rpe in (0, 1, 127, 128, 4096):
        picked = {
            m: configs.pick(
                target,
                "moe_fp8",
                m,
                MoEFp8Config.from_dict,
                "float8_e4m3fn",
                rows_per_expert=rpe,
                rows=rpe * 8,
                experts=8,
                n=256,
                k=256,
            ).config
            for m in ("grouped", "gate_up", "down")
        }
        assert picked["gate_up"].block_m == picked["down"].block_m, (target, rpe, picked)
        assert all(128 % c.block_k == 0 for c in picked.values())
    if target != "interpreter":
        data = configs.read(configs.bundled_file(target))
        assert all("not yet tuned" in r.get("note", "") for rules in data["moe_fp8"].values() for r in rules)
    with pytest.raises(ValueError, match="unknown MoEFp8Config keys"):
        MoEFp8Config.from_dict({"blok_m": 64})


def test_config_checks_fire():
    from gemmlab.ops.gemm_fp8 import Fp8Config, plan_fp8

    with pytest.raises(ValueError, match="unknown Fp8Config keys"):
        Fp8Config.from_dict({"block_m": 64, "blok_n": 64})
    qa, qb, sa, sb = _operands(8, 16, 256, "block", seed=4)
    with pytest.raises(ValueError, match="block_k dividing 128"):
        plan_fp8(qa, qb, sa, sb, config=Fp8Config(block_k=256))
    with pytest.raises(ValueError, match="Fp8Config: block_k must be a power of two"):
        Fp8Config(block_k=96)


@triton.jit
def _e4m3_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs, mask=offs < n, other=0.0)
    tl.store(dst + offs, e4m3_of(v), mask=offs < n)


def test_the_kernels_e4m3_rounding_is_torchs_cast_bit_for_bit(device):
    """kernels.gemm_fp8.e4m3_of against torch's cast on the same device: every finite e4m3 value, every midpoint
    between neighbours (ties to even) and the fp32 values either side of it, both signs, zero, an fp32 subnormal,
    then random values over the normal and subnormal ranges."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = torch.sort(codes[torch.isfinite(codes) & (codes >= 0)]).values
    mids = (grid[1:] + grid[:-1]) / 2
    g = torch.Generator().manual_seed(5)
    v = torch.cat(
        [
            grid,
            mids,
            torch.nextafter(mids, torch.zeros(())),
            torch.nextafter(mids, torch.full((), 1e9)),
            torch.rand(20000, generator=g) * 448,
            torch.rand(20000, generator=g) * 2.0**-5,
            torch.tensor([1e-40, 2.0**-10, 2.0**-11, 3 * 2.0**-11]),
        ]
    )
    v = torch.cat([v, -v]).to(device)
    out = torch.full(v.shape, float("nan"), dtype=FP8, device=device)
    _e4m3_kernel[(triton.cdiv(v.numel(), 1024),)](v, out, v.numel(), BLOCK=1024)
    assert torch.equal(out.view(torch.uint8), v.to(FP8).view(torch.uint8))


@pytest.mark.parametrize("granularity,block", [("row", (1, 1)), ("block", (1, 128))])
def test_nan_and_inf_quantize_as_the_torch_ops_do(granularity, block, device):
    """A NaN gives its group the scale 1 and stays NaN; an Inf gives its group an infinite scale (the GPU's max.f32
    drops a NaN: the kernel counts them apart). Kernel and torch ops agree bit for bit."""
    x = torch.randn(3, 384, generator=torch.Generator().manual_seed(9))
    x[0, 5], x[1, 7], x[2, 300] = float("nan"), float("inf"), -float("inf")
    x = x.to(device)
    q, s = gemmlab.quantize_fp8(x, granularity, block)
    want_q, want_s = quantize_torch(x, granularity, block)
    assert torch.equal(s, want_s) and s.flatten()[0].item() == 1.0 and torch.isinf(s).any()
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.isnan(q[0, 5].float())
