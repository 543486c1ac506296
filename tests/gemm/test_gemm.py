"""gemm / pack_b / plan on every dispatch path, small shapes (the CPU interpreter without CUDA)."""

import dataclasses

import pytest
import torch

import gemmlab
from gemmlab.ops import gemm as gemm_ops
from gemmlab.ops.gemm import launch as gemm_launch
from gemmlab.ref import gemm_check
from tests.conftest import rand

DTYPES = [torch.float16, torch.bfloat16]
LAYOUTS = ["NN", "NT", "TN", "TT"]  # first letter A, second B; T = stored transposed (column-major view)

# the planner's own choices, whatever route rules the bundled table holds (route rules: test_gemm_gemv.py)
pytestmark = pytest.mark.usefixtures("no_routes")


def operands(m, n, k, layout="NN", dtype=torch.float16, dist="uniform"):
    a = rand((m, k), dtype, major="row" if layout[0] == "N" else "col", dist=dist)
    b = rand((k, n), dtype, major="row" if layout[1] == "N" else "col", dist=dist)
    return a, b


def assert_matches(c, a, b):
    chk = gemm_check(c, a, b)
    assert chk["ok"], chk


# (M, N, K, layout, expected path). Aligned means the leading stride is a multiple of 8 elements.
CASES = [
    (1, 1, 1, "NN", "tma_splitk"),  # size 1 everywhere: leading strides do not matter
    (1, 1, 1, "TT", "tma_splitk"),
    (16, 40, 64, "NN", "tma_splitk"),  # small M, N not a multiple of the tile
    (5, 24, 136, "NT", "tma_splitk"),  # small M, B column-major
    (8, 48, 64, "TN", "tma_splitk"),  # A column-major (its leading stride is M = 8)
    (37, 53, 71, "NN", "portable"),  # primes: K = 71 leaves A's row stride unaligned
    (37, 53, 71, "TT", "portable"),
    (29, 31, 16, "NN", "portable"),  # N = 31: B's row stride unaligned
    (264, 72, 96, "NN", "tma_persistent"),  # M > 256, tiles in several rows/columns, odd tile count
    (264, 72, 96, "TT", "tma_persistent"),
    (257, 40, 40, "NT", "tma_persistent"),  # M just above the small-M cut, K not a multiple of BLOCK_K
    (264, 40, 33, "TN", "tma_persistent"),  # K odd is fine when A and B are stored M- and N-major
    (263, 41, 67, "TT", "portable"),  # odd everything, transposed
]


@pytest.mark.parametrize("m,n,k,layout,path", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_paths(m, n, k, layout, path, dtype):
    a, b = operands(m, n, k, layout, dtype)
    p = gemmlab.plan(a, b)
    assert p.path == path, p
    c = gemmlab.gemm(a, b)
    assert c.shape == (m, n) and c.dtype == dtype and c.is_contiguous()
    assert_matches(c, a, b)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_normal_inputs(layout):
    a, b = operands(96, 64, 48, layout, dist="normal")
    assert_matches(gemmlab.gemm(a, b), a, b)


def test_gemm_runs_exactly_the_plan(monkeypatch, user_dir, device):
    """gemm launches the path and config plan() reports, for each path (the GEMV kernel through a route rule)."""
    import json

    from gemmlab.ops import configs
    from gemmlab.ops.gemm import planner as gemm_plan
    from gemmlab.ops.gemm import route as gemm_route

    monkeypatch.setattr(gemm_plan, "route", gemm_route.route)  # this test's own route rule, over the module's none
    target = "nvidia-h200" if device == "cuda" else "interpreter"
    route = {"m": [0, 4], "tma": [0, 0], "config": {"path": "gemv"}}
    (user_dir / f"{target}.json").write_text(json.dumps({"route": {"gemm": [route]}}))
    configs.reload()
    seen = []
    real = gemm_launch.execute
    monkeypatch.setattr(gemm_launch, "execute", lambda p, a, b, c, L=None: (seen.append(p), real(p, a, b, c, L)))
    gemm_launch.clear_cache()  # every signature's first call plans; later ones run the cached plan
    cases = [operands(*s) for s in ((300, 72, 96), (8, 40, 64), (37, 53, 71), (3, 29, 71))] + [
        (rand((4, 0)), rand((0, 24)))
    ]
    for a, b in cases:
        out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=a.dtype, device=device)
        expected = gemmlab.plan(a, b, out=out)
        gemmlab.gemm(a, b, out=out)
        assert seen[-1] == expected
    assert {p.path for p in seen} == set(gemmlab.paths())


def test_plan_is_pure(monkeypatch):
    def boom(*args):
        raise AssertionError("plan launched a kernel")

    monkeypatch.setattr(gemm_launch, "execute", boom)
    a, b = operands(300, 64, 64)
    p1, p2 = gemmlab.plan(a, b), gemmlab.plan(a, b)
    assert p1 == p2 and p1.path in gemmlab.paths() and p1.reason
    with pytest.raises(dataclasses.FrozenInstanceError):
        p1.path = "portable"


def test_paths_listed():
    assert set(gemmlab.paths()) == {"empty", "tma_persistent", "tma_splitk", "gemv", "portable"}


@pytest.mark.parametrize("split", [2, 3, 4])
def test_split_k_pinned_is_correct_and_deterministic(split):
    a, b = operands(12, 40, 1024)  # enough BLOCK_K steps for 4 splits with any table's BLOCK_K
    cfg = dataclasses.replace(gemmlab.plan(a, b).config, split_k=split)
    p = gemmlab.plan(a, b, config=cfg)
    assert p.path == "tma_splitk" and p.config.split_k == split
    c1 = gemm_ops.run(p, a, b)
    c2 = gemm_ops.run(p, a, b)
    assert_matches(c1, a, b)
    assert torch.equal(c1, c2)  # partials are summed in split order, whoever arrives last
    for counters in gemm_launch.counters():  # the last arrival leaves its counter at zero
        assert int(counters.count_nonzero()) == 0


def test_split_k_auto(device):
    a, b = operands(8, 32, 512)
    p = gemmlab.plan(a, b)
    assert p.path == "tma_splitk"
    if device == "cpu":  # the interpreter pretends to have 3 SMs: 1 tile, split until 2 programs per 2 SMs
        assert p.config.split_k == 2
    assert_matches(gemmlab.gemm(a, b), a, b)


def test_pinned_plan_must_fit_operands():
    a, b = operands(300, 64, 64)
    p = gemmlab.plan(a, b)
    with pytest.raises(ValueError, match="does not fit"):
        gemm_ops.run(p, a, b.t().contiguous().t())


def test_unaligned_base_pointer_goes_portable():
    big = rand((64, 129))
    a = big[:, 1:]  # (64, 128): data pointer 2 bytes past an aligned address
    b = rand((128, 48))
    assert gemmlab.plan(a, b).path == "portable"
    assert_matches(gemmlab.gemm(a, b), a, b)


def test_padded_leading_strides():
    a = rand((300, 80))[:, :72]  # row stride 80: aligned though K = 72 != stride
    b = rand((72, 136))[:, 3:67]  # N = 64 with a 6-byte offset: unaligned base
    assert gemmlab.plan(a, b).path == "portable"
    assert_matches(gemmlab.gemm(a, b), a, b)
    b2 = rand((72, 136))[:, 8:72]
    assert gemmlab.plan(a, b2).path == "tma_persistent"
    assert_matches(gemmlab.gemm(a, b2), a, b2)


def test_broadcast_operand():
    a = rand((1, 64)).expand(40, 64)  # row stride 0
    b = rand((64, 32))
    assert gemmlab.plan(a, b).path == "portable"
    assert_matches(gemmlab.gemm(a, b), a, b)


@pytest.mark.parametrize("out_major", ["row", "col"])
@pytest.mark.parametrize("m", [24, 264])
def test_out_given(out_major, m, device):
    a, b = operands(m, 40, 64)
    out = torch.full((m, 40) if out_major == "row" else (40, m), float("nan"), dtype=a.dtype, device=device)
    out = out if out_major == "row" else out.t()
    p = gemmlab.plan(a, b, out=out)
    assert p.swap_ab == (out_major == "col")
    if out_major == "col":  # the kernel computes C^T = B^T A^T: its M is the caller's N
        assert (p.m, p.n) == (40, m)
    res = gemmlab.gemm(a, b, out=out)
    assert res is out
    assert_matches(out, a, b)


def test_out_slice_of_larger_buffer(device):
    a, b = operands(32, 40, 64)
    big = torch.full((48, 64), float("nan"), dtype=a.dtype, device=device)
    out = big[8:40, 16:56]
    gemmlab.gemm(a, b, out=out)
    assert_matches(out, a, b)
    assert torch.isnan(big[:8]).all() and torch.isnan(big[40:]).all() and torch.isnan(big[:, :16]).all()
    assert torch.isnan(big[:, 56:]).all()  # nothing written outside out


def test_empty_and_k_zero(device):
    a, b = rand((5, 0)), rand((0, 7))
    assert gemmlab.plan(a, b).path == "empty"
    c = gemmlab.gemm(a, b)
    assert c.shape == (5, 7) and torch.count_nonzero(c) == 0
    out = torch.full((5, 7), float("nan"), dtype=a.dtype, device=device)
    gemmlab.gemm(a, b, out=out)
    assert torch.count_nonzero(out) == 0
    for m, n in ((0, 7), (5, 0), (0, 0)):
        c = gemmlab.gemm(rand((m, 3)), rand((3, n)))
        assert c.shape == (m, n)


# ------------------------------------------------------------------------------------------- pack_b


@pytest.mark.parametrize("k,n", [(64, 48), (71, 33), (1, 1), (9, 130)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_b_is_exact(k, n, dtype):
    b = rand((k, n), dtype)
    pk = gemmlab.pack_b(b)
    assert pk.shape == (k, n) and pk.dtype == dtype and pk.device == b.device
    assert pk.data.stride(1) == 1 and pk.data.stride(0) % 8 == 0 and pk.data.data_ptr() % 16 == 0
    assert torch.equal(pk.view(), b)
    a = rand((24, k), dtype)
    assert_matches(gemmlab.gemm(a, pk), a, b)


def test_pack_b_keeps_odd_k_on_tma():
    """With K = 71 a raw B (K, N) row-major is fine but A (M, K) row-major is not; A stored M-major and
    B packed are both aligned whatever K is, so the fast path takes it."""
    a, b = operands(264, 64, 71, "TN")
    assert gemmlab.plan(a, b).path == "tma_persistent"
    pk = gemmlab.pack_b(b)
    p = gemmlab.plan(a, pk)
    assert p.path == "tma_persistent" and p.b_kmajor
    assert_matches(gemmlab.gemm(a, pk), a, b)


def test_packed_b_odd_n_stores_c_with_pointers():
    """N = 37: B row-major is unaligned (portable), but packed it is not; C's row stride (37) is not
    16-byte aligned, so that path writes C with masked pointer stores."""
    a, b = operands(264, 37, 64)
    assert gemmlab.plan(a, b).path == "portable"
    pk = gemmlab.pack_b(b)
    for m in (264, 20):
        am = a[:m]
        p = gemmlab.plan(am, pk)
        assert p.path in ("tma_persistent", "tma_splitk") and not p.c_tma
        assert_matches(gemmlab.gemm(am, pk), am, b)


# --------------------------------------------------------------------------------------------- errors


def test_errors(device):
    a, b = operands(16, 24, 32)
    cases = [
        (lambda: gemmlab.gemm(a, rand((31, 24))), ValueError, "inner dimensions"),
        (lambda: gemmlab.gemm(a[0, 0], b), ValueError, "\\(\\.\\.\\., K\\)"),  # 0-D a
        (lambda: gemmlab.gemm(a, b[None]), ValueError, "2-D"),  # batched b
        (lambda: gemmlab.gemm(a.float(), b.float()), TypeError, "dtype"),
        (lambda: gemmlab.gemm(a, b.to(torch.bfloat16)), TypeError, "same dtype"),
        (lambda: gemmlab.gemm(a.to(torch.int8), b.to(torch.int8)), TypeError, "dtype"),
        (lambda: gemmlab.gemm(a, b.to("meta")), ValueError, "different devices"),
        (lambda: gemmlab.gemm(a.numpy() if device == "cpu" else a.cpu().numpy(), b), TypeError, "torch.Tensor"),
        (lambda: gemmlab.gemm(rand((32, 64))[::2, ::2], b), ValueError, "unit-stride"),
        (lambda: gemmlab.gemm(a, b, out=torch.empty(16, 25, dtype=a.dtype, device=device)), ValueError, "shape"),
        (lambda: gemmlab.gemm(a, b, out=torch.empty(16, 24, dtype=torch.bfloat16, device=device)), TypeError, "dtype"),
        (lambda: gemmlab.gemm(a, b, out=torch.empty(16, 24, dtype=a.dtype, device="meta")), ValueError, "out is on"),
        (
            lambda: gemmlab.gemm(a, b, out=torch.empty(32, 48, dtype=a.dtype, device=device)[::2, ::2]),
            ValueError,
            "unit-stride",
        ),
        (
            lambda: gemmlab.gemm(a, b, out=torch.empty(1, 24, dtype=a.dtype, device=device).expand(16, 24)),
            ValueError,
            "overlap",
        ),
        (lambda: gemmlab.gemm(a, b, out=[0]), TypeError, "out must be"),
        (lambda: gemmlab.pack_b(b[0]), ValueError, "2-D"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


def test_out_overlapping_an_input_is_refused():
    buf = rand((64, 64))
    a = buf[:16, :32]
    b = rand((32, 16))
    with pytest.raises(ValueError, match="overlaps a"):
        gemmlab.gemm(a, b, out=buf[:16, 32:48])  # shares rows with a
    with pytest.raises(ValueError, match="overlaps b"):
        gemmlab.gemm(a, b, out=b[:16, :16])


@pytest.mark.cpu_only("CPU-only message")
def test_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "interpret", False)
    a, b = operands(8, 8, 8)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        gemmlab.gemm(a, b)


# ---------------------------------------------------------------------------------- the check itself


def test_gemm_check_fires_on_bad_results():
    a, b = operands(64, 48, 128)
    c = gemmlab.gemm(a, b)
    assert gemm_check(c, a, b)["ok"]
    bad = c.clone()
    bad[3, 5] += 8 * max(abs(float(bad[3, 5])), 1.0) * 2.0**-10  # eight ulps off
    assert not gemm_check(bad, a, b)["ok"]
    bad = c.clone()
    bad[7, 7] = float("nan")
    assert not gemm_check(bad, a, b)["ok"]
    a2 = a.clone()
    a2[:, 64:] = 0  # half of K missing
    assert not gemm_check(gemmlab.gemm(a2, b), a, b)["ok"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_outputs_below_the_smallest_normal_round_within_the_check(dtype):
    """A tiny B puts C below the output dtype's smallest normal, where its rounding is absolute (fp16: up to 2^-25):
    a correct result passes, and one a subnormal step or more off at a tiny output still fails."""
    tiny = torch.finfo(dtype).smallest_normal
    a = torch.linspace(-1, 1, 97, dtype=torch.float32).to(dtype).reshape(97, 1)  # every output a different rounding
    b = torch.full((1, 1), tiny * 1.37, dtype=dtype)
    c = gemmlab.gemm(a, b)
    assert gemm_check(c, a, b)["ok"], gemm_check(c, a, b)
    bad = c.clone()
    bad[48, 0] += 4 * tiny * 2.0 ** -{torch.float16: 10, torch.bfloat16: 7}[dtype]  # a[48] = 0: four steps off
    assert not gemm_check(bad, a, b)["ok"]


def test_warp_specialization_is_refused_until_it_works(monkeypatch):
    """Hopper WS hung on the H200 with Triton 3.6: pinning it is a clear error, not a hang."""
    a, b = operands(300, 64, 64)
    cfg = dataclasses.replace(gemmlab.plan(a, b).config, warp_specialize=True)
    with pytest.raises(ValueError, match="warp_specialize"):
        gemmlab.plan(a, b, config=cfg)
    monkeypatch.setenv("GEMMLAB_ALLOW_WS", "1")
    p = gemmlab.plan(a, b, config=cfg)
    assert p.config.warp_specialize and not p.c_tma  # WS stores C through pointers


# --------------------------------------------------------------------------------------- gemm_colmajor


def colmajor_buffers(m, n, k, dtype=torch.float16):
    """Flat column-major buffers: A (M x K) stored as A^T row-major, likewise B and C (poisoned)."""
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    A = a.t().contiguous().reshape(-1)
    B = b.t().contiguous().reshape(-1)
    C = torch.full((m * n,), float("nan"), dtype=dtype, device=a.device)
    return a, b, A, B, C


@pytest.mark.parametrize("m,n,k", [(64, 48, 32), (37, 53, 71), (1, 1, 1), (300, 40, 64), (16, 24, 40)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_colmajor_flat(m, n, k, dtype):
    a, b, A, B, C = colmajor_buffers(m, n, k, dtype)
    A0, B0 = A.clone(), B.clone()
    assert gemmlab.gemm_colmajor(A, B, C, m, n, k) is None
    c = C.view(n, m).t()
    assert_matches(c, a, b)
    assert torch.equal(A, A0) and torch.equal(B, B0)  # inputs untouched


def test_gemm_colmajor_2d_with_leading_dimension(device):
    m, n, k = 40, 24, 32
    a, b = rand((m, k)), rand((k, n))
    A = torch.empty((k, m + 8), dtype=a.dtype, device=device).t()[:m]  # (M, K), strides (1, M + 8)
    A.copy_(a)
    B = b.t().contiguous().t()  # (K, N), strides (1, K)
    C = torch.full((n, m), float("nan"), dtype=a.dtype, device=device).t()
    gemmlab.gemm_colmajor(A, B, C, m, n, k)
    assert_matches(C, a, b)
    flat = torch.full((m * n + 5,), float("nan"), dtype=a.dtype, device=device)  # longer than needed
    gemmlab.gemm_colmajor(A, B, flat, m, n, k)
    assert_matches(flat[: m * n].view(n, m).t(), a, b)
    assert torch.isnan(flat[m * n :]).all()


def test_gemm_colmajor_numpy_sizes():
    np = pytest.importorskip("numpy")
    a, b, A, B, C = colmajor_buffers(16, 24, 32)
    gemmlab.gemm_colmajor(A, B, C, np.int64(16), np.int32(24), 32)
    assert_matches(C.view(24, 16).t(), a, b)


def test_gemm_colmajor_errors():
    m, n, k = 16, 24, 32
    _, _, A, B, C = colmajor_buffers(m, n, k)
    cases = [
        (lambda: gemmlab.gemm_colmajor(A[:-1], B, C, m, n, k), "A holds"),
        (lambda: gemmlab.gemm_colmajor(A, B[: k * n - 3], C, m, n, k), "B holds"),
        (lambda: gemmlab.gemm_colmajor(A, B, C[:10], m, n, k), "C holds"),
        (lambda: gemmlab.gemm_colmajor(A, B, C, -1, n, k), "M must be"),
        (lambda: gemmlab.gemm_colmajor(A, B, C, m, 2.5, k), "N must be"),
        (lambda: gemmlab.gemm_colmajor(A, B, C, m, n, True), "K must be"),
        (lambda: gemmlab.gemm_colmajor(A.view(4, -1)[:, ::2], B, C, m, n, k), "contiguous"),
        (lambda: gemmlab.gemm_colmajor(A, B, A, m, n, k), "overlaps a"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()
    with pytest.raises(TypeError, match="torch.Tensor"):
        gemmlab.gemm_colmajor([0.0] * (m * k), B, C, m, n, k)
    with pytest.raises(TypeError, match="dtype"):
        gemmlab.gemm_colmajor(A.float(), B.float(), C.float(), m, n, k)


def test_the_signature_cache_is_bounded(monkeypatch):
    """Shapes that change every call (a per-expert weight gradient's K) cannot grow the launch cache forever."""
    gemm_launch.clear_cache()
    monkeypatch.setattr(gemm_launch.CACHE, "size", 3)
    b = rand((8, 16))
    for m in range(1, 7):
        a = rand((m, 8))
        assert gemm_check(gemmlab.gemm(a, b), a, b)["ok"]
    assert len(gemm_launch.CACHE) == 3
