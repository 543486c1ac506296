"""Staging: operands TMA cannot describe (odd K or N, odd leading stride, misaligned base, stride 0) copied into
16-byte-aligned buffers and run on the TMA kernels, when the cost rule (data: the "staging" object of the
config file) says the copy is cheap. Small shapes under the CPU interpreter, which enforces TMA's alignment
rules: every staged case would be refused by the descriptor if the copy were not aligned."""

import dataclasses
import json

import pytest
import torch

import gemmlab
from gemmlab.device import Target
from gemmlab.ops import configs
from gemmlab.ops import gemm as gemm_ops
from gemmlab.ops.gemm import launch as gemm_launch
from gemmlab.ops.gemm import staging as plan_mod
from gemmlab.ops.gemm.staging import staged_shape, staging_decision
from gemmlab.ref import gemm_check
from tests.conftest import rand

DTYPES = [torch.float16, torch.bfloat16]

# the planner's own choices, whatever route rules the bundled table holds (route rules: test_gemm_gemv.py)
pytestmark = pytest.mark.usefixtures("no_routes")


def assert_matches(c, a, b):
    chk = gemm_check(c, a, b)
    assert chk["ok"], chk


def _misaligned(rows, cols, dtype):
    """(rows, cols) row-major whose base is 2 bytes past an aligned address (row stride cols + 1)."""
    return rand((rows, cols + 1), dtype)[:, 1:]


def _strided_out(m, n, dtype, major, pad=3, *, device):
    """A NaN-poisoned out with an odd leading stride (row-major: stride n + pad; column-major: m + pad)."""
    if major == "row":
        return torch.full((m, n + pad), float("nan"), dtype=dtype, device=device)[:, :n]
    return torch.full((n, m + pad), float("nan"), dtype=dtype, device=device)[:, :m].t()


# (name, make(dtype) -> (a, b), staged kernel-view operands, kernel path, out major)
CASES = [
    # odd N = 33: B (32, 33) has a 66-byte row stride; C via masked pointers
    ("odd_n", lambda dt: (rand((600, 32), dt), rand((32, 33), dt)), ("b",), "tma_persistent", None),
    # odd K = 33 with small M: A staged, the split-K kernel
    ("odd_k_small_m", lambda dt: (rand((64, 33), dt), rand((33, 600), dt)), ("a",), "tma_splitk", None),
    # M = 1 with a misaligned base (the only way a 1-row A is unaligned)
    ("m1_misaligned", lambda dt: (_misaligned(1, 40, dt), rand((40, 264), dt)), ("a",), "tma_splitk", None),
    # nn.Linear layout: B = W^T, W (N, K) with K = 33 odd, so B is K-major with an odd stride (A stored
    # M-major, aligned, so only the weight is copied; a row-major A with odd K is staged too: test_stage_...)
    (
        "linear_odd_k",
        lambda dt: (rand((600, 33), dt, major="col"), rand((40, 33), dt).t()),
        ("b",),
        "tma_persistent",
        None,
    ),
    # A column-major with M = 601 odd (stored (K, M)): staged keeping its M-major layout
    (
        "a_colmajor_odd_m",
        lambda dt: (rand((601, 8), dt, major="col"), rand((8, 200), dt)),
        ("a",),
        "tma_persistent",
        None,
    ),
    # out= with an odd row stride (C through pointers) and B staged
    ("out_odd_stride", lambda dt: (rand((600, 32), dt), rand((32, 33), dt)), ("b",), "tma_persistent", "row"),
    # column-major C (swap_ab: C^T = B^T A^T) with an odd stride: the kernel's A is the caller's B^T, whose
    # stride is N = 601 (odd), staged; its B is the caller's A^T (K-major, aligned)
    ("swap_ab", lambda dt: (rand((300, 8), dt), rand((8, 601), dt)), ("a",), "tma_persistent", "col"),
]


@pytest.mark.parametrize("name,make,staged,path,out_major", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_staged_paths(name, make, staged, path, out_major, dtype, device):
    a, b = make(dtype)
    m, n = a.shape[0], b.shape[1]
    out = None if out_major is None else _strided_out(m, n, dtype, out_major, device=device)
    p = gemmlab.plan(a, b, out=out)
    assert (p.path, p.staged) == (path, staged), p
    assert "staged into 16-byte-aligned buffers" in p.reason and "staging" in p.reason
    assert p.swap_ab == (out_major == "col")
    for _ in range(2):  # the second call goes through the signature cache's kept launch, fresh inputs
        c = gemmlab.gemm(a, b, out=out)
        if out is not None:
            assert c is out
        assert c.shape == (m, n) and c.dtype == dtype
        assert_matches(c, a, b)
        a.copy_(make(dtype)[0])  # same layout, new values (the inputs are fresh each time)
        if out is not None:
            out.fill_(float("nan"))


@pytest.mark.parametrize("m", [300, 24])  # tma_persistent, tma_splitk
@pytest.mark.parametrize("out_major", [None, "row", "col"])
def test_stage_c_writes_an_aligned_copy_then_c(m, out_major, device):
    """GemmConfig.stage_c: a C TMA cannot store to (N = 37 odd, or an odd out= stride) is written by TMA into
    an aligned scratch C, then copied into C; nothing outside C is touched."""
    dtype = torch.bfloat16 if m == 24 else torch.float16
    a, w = rand((m, 64), dtype), rand((37, 64), dtype)  # nn.Linear layout: B = W^T, K-major, aligned
    b = w.t()
    big = None
    if out_major == "row":
        big = torch.full((m + 2, 37 + 5), float("nan"), dtype=dtype, device=device)
        out = big[1:-1, 2:-3]
    elif out_major == "col":
        big = torch.full((37 + 5, m + 2), float("nan"), dtype=dtype, device=device)
        out = big[2:-3, 1:-1].t()
    else:
        out = None
    base = gemmlab.plan(a, b, out=out)
    assert not base.c_tma and not base.staged and "masked pointers" in base.reason
    cfg = dataclasses.replace(base.config, stage_c=True)
    p = gemmlab.plan(a, b, out=out, config=cfg)
    assert p.c_tma and p.staged == ("c",) and "stage_c" in p.reason and p.path == base.path
    c = gemm_ops.run(p, a, b, out=out)
    assert_matches(c, a, b)
    if big is not None:
        inside = torch.zeros_like(big, dtype=torch.bool)
        (inside[1:-1, 2:-3] if out_major == "row" else inside[2:-3, 1:-1]).fill_(True)
        assert torch.isnan(big[~inside]).all()  # the copy wrote C's elements only


def test_stage_c_from_the_table_on_the_hot_path(user_dir, monkeypatch, device):
    """A table rule with stage_c: gemm() (the signature cache's kept launch on the second call) stages C, with
    poisoned scratch buffers."""
    monkeypatch.setattr(
        gemm_launch,
        "_scratch",
        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device),
    )
    target = "nvidia-h200" if device == "cuda" else "interpreter"
    rule = {"config": {"block_m": 32, "block_n": 32, "block_k": 32, "group_m": 2, "stage_c": True}}
    (user_dir / f"{target}.json").write_text(json.dumps({"gemm": {"tma_persistent": [rule]}}))
    configs.reload()
    a, b = rand((300, 64)), rand((37, 64)).t()  # B = W^T aligned; C (300, 37) not
    assert gemmlab.plan(a, b).staged == ("c",)
    for _ in range(2):
        assert_matches(gemmlab.gemm(a, b), a, b)
        a.copy_(rand((300, 64)))


def test_stage_c_with_staged_a_and_b(device):
    a, b = rand((37, 71)), rand((71, 53))  # everything odd
    cfg = dataclasses.replace(gemmlab.plan(a, b, stage=True).config, stage_c=True)
    p = gemmlab.plan(a, b, stage=True, config=cfg)
    assert p.staged == ("a", "b", "c") and p.c_tma
    out = torch.full((37, 53), float("nan"), dtype=a.dtype, device=device)
    assert_matches(gemm_ops.run(p, a, b, out=out), a, b)


def test_stage_c_is_ignored_where_c_is_aligned():
    a, b = rand((300, 64)), rand((64, 48))
    p = gemmlab.plan(a, b, config=dataclasses.replace(gemmlab.plan(a, b).config, stage_c=True))
    assert p.c_tma and p.staged == ()


def test_the_pad_columns_are_never_read(monkeypatch):
    """Staging buffers are not zeroed: TMA's descriptor has the logical shape and zero-fills past it. Poison
    the buffers with NaN: a read of a pad column would put NaN into C."""

    def poisoned(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(gemm_launch, "_scratch", poisoned)
    for make in (CASES[0][1], CASES[1][1], CASES[3][1]):
        a, b = make(torch.float16)
        p = gemmlab.plan(a, b)
        assert p.staged
        assert_matches(gemm_ops.run(p, a, b), a, b)


def test_staged_copy_keeps_values_and_layout():
    for t, inner in ((rand((5, 33)), 1), (rand((33, 5), major="col"), 0), (_misaligned(3, 16, torch.float16), 1)):
        s = gemm_launch.stage(t, inner, staged_shape(t, inner))
        assert torch.equal(s, t) and s.stride(inner) == 1
        assert s.data_ptr() % 16 == 0 and (s.stride(1 - inner) * s.element_size()) % 16 == 0


def test_stage_can_be_pinned_either_way():
    a, b = rand((37, 71)), rand((71, 53))  # both unaligned; the rule keeps this tiny shape portable
    assert gemmlab.plan(a, b).path == "portable"
    p = gemmlab.plan(a, b, stage=True)
    assert p.path == "tma_splitk" and p.staged == ("a", "b") and "pinned by the caller" in p.reason
    assert_matches(gemm_ops.run(p, a, b), a, b)
    a2, b2 = CASES[0][1](torch.float16)
    assert gemmlab.plan(a2, b2).staged
    q = gemmlab.plan(a2, b2, stage=False)
    assert q.path == "portable" and not q.staged and "refused by the caller" in q.reason
    assert_matches(gemm_ops.run(q, a2, b2), a2, b2)
    with pytest.raises(ValueError, match="does not fit"):  # A aligned now (row stride 72): only B is staged
        gemm_ops.run(p, rand((37, 72))[:, :71], b)
    w = rand((53, 71))  # nn.Linear layout with a row-major A and odd K: both operands staged
    p = gemmlab.plan(a, w.t(), stage=True)
    assert p.staged == ("a", "b") and p.b_kmajor
    assert_matches(gemm_ops.run(p, a, w.t()), a, w.t())


def test_the_broadcast_operand_stages_when_cheap():
    a = rand((1, 32)).expand(600, 32)  # row stride 0: TMA cannot describe it; the copy materializes it
    b = rand((32, 48))
    p = gemmlab.plan(a, b, stage=True)
    assert p.staged == ("a",)
    assert_matches(gemm_ops.run(p, a, b), a, b)


# ------------------------------------------------------------------------------------- the cost rule

H200 = Target("nvidia-h200", (9, 0), 132)


def test_the_rule_reads_its_constants_from_the_table(user_dir):
    # big odd GEMM: two operand copies are a small fraction of a compute-bound GEMM
    go, why = staging_decision(H200, 8191, 8193, 4097, 2, [8191 * 4097, 4097 * 8193])
    assert go and "nvidia-h200.json staging" in why
    # M = 1, odd K, nn.Linear: copying W costs twice reading it; the GEMM is memory-bound: never
    go, why = staging_decision(H200, 1, 14336, 4097, 2, [14336 * 4097])
    assert not go and ">" in why
    # a user file overrides one key: a limit of 0 refuses everything; the bundled rates still apply
    (user_dir / "nvidia-h200.json").write_text(json.dumps({"staging": {"max_copy_fraction": 0}}))
    configs.reload()
    go, why = staging_decision(H200, 8191, 8193, 4097, 2, [8191 * 4097, 4097 * 8193])
    assert not go and str(user_dir) in why
    assert staging_decision(H200, 8191, 8193, 4097, 2, [1], stage=True)[0]  # pinned beats the rule


def test_the_rule_arithmetic(user_dir):
    def rule(**st):
        (user_dir / "nvidia-h200.json").write_text(json.dumps({"staging": st}))
        configs.reload()
        return staging_decision(H200, 10, 10, 10, 2, [100])

    # t_gemm = max(2*10*10*10 / 1e12, (300 elements * 2 B) / 1e9) = 6e-7 s (memory-bound);
    # t_copy = 100 * 2 B * 2 (read + write) / 1e9 = 4e-7 s, plus the fixed cost: 0.667 without it
    base = dict(flops_per_s=1e12, dram_bytes_per_s=1e9, max_copy_fraction=0.7)
    assert rule(**base, copy_fixed_s=0) == (True, rule(**base, copy_fixed_s=0)[1])
    assert "66.7% of the GEMM's estimated time <= 70%" in rule(**base, copy_fixed_s=0)[1]
    assert not rule(**base, copy_fixed_s=1e-7)[0]  # (4e-7 + 1e-7) / 6e-7 = 83%
    assert not rule(**dict(base, max_copy_fraction=0.6), copy_fixed_s=0)[0]
    # compute-bound: 2*10*10*10 / 1e9 flop/s = 2e-6 s, so the same copy is 20%
    assert "20.0%" in rule(**dict(base, flops_per_s=1e9), copy_fixed_s=0)[1]


def test_no_staging_constants_means_no_staging(user_dir, monkeypatch):
    monkeypatch.setattr(configs, "staging", lambda target: ({}, ""))
    plan_mod._staging.cache_clear()
    go, why = staging_decision(H200, 8191, 8193, 4097, 2, [8191 * 4097])
    assert not go and "no staging constants" in why
    monkeypatch.setattr(configs, "staging", lambda target: ({"max_copy_fraction": 1.0}, "x.json"))
    plan_mod._staging.cache_clear()
    with pytest.raises(ValueError, match="lacks"):
        staging_decision(H200, 8191, 8193, 4097, 2, [8191 * 4097])
    # (user_dir's teardown undoes the patches and reloads the tables, which clears plan's staging cache)


def test_a_user_limit_makes_the_interpreter_stage_a_tiny_shape(user_dir, device):
    (user_dir / "interpreter.json").write_text(json.dumps({"staging": {"max_copy_fraction": 1e9}}))
    configs.reload()
    a, b = rand((37, 71)), rand((71, 53))
    if device == "cpu":
        p = gemmlab.plan(a, b)
        assert p.staged == ("a", "b") and str(user_dir) in p.reason
        assert_matches(gemmlab.gemm(a, b), a, b)


@pytest.mark.parametrize(
    "staging,words",
    [
        ({"max_copy_fraction": -1}, "max_copy_fraction must be a number >= 0"),
        ({"flops_per_s": 0}, "flops_per_s must be a number >= 0 (> 0 for rates)"),
        ({"max_copy_frac": 0.1}, "unknown key"),
        ({"max_copy_fraction": "0.1"}, "must be a number"),
        ([0.1], "must be an object"),
    ],
)
def test_a_malformed_staging_object_is_refused_naming_the_file(user_dir, staging, words):
    (user_dir / "interpreter.json").write_text(json.dumps({"staging": staging}))
    (user_dir / "nvidia-h200.json").write_text(json.dumps({"staging": staging}))
    configs.reload()
    with pytest.raises(ValueError, match="staging") as e:
        staging_decision(H200, 600, 33, 32, 2, [32 * 33])
    assert words in str(e.value) and str(user_dir) in str(e.value)


@pytest.mark.gpu
def test_staged_gemm_captures_in_a_cuda_graph():
    """The staging buffers come from the caching allocator per call: a captured staged GEMM replays with the
    inputs' current values."""
    a, b = rand((4096, 4095)), rand((4095, 4096))
    assert gemmlab.plan(a, b).staged == ("a",)
    gemmlab.gemm(a, b)
    from gemmlab.instruments.timing import capture

    graph, c = capture(lambda: gemmlab.gemm(a, b))
    a.copy_(rand((4096, 4095)))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(c, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("stage_c", [False, True])
def test_staged_odd_shape_on_the_gpu(stage_c, device):
    """Issue 14's 8191x8193x4097: A and B staged, C through pointers or (stage_c) an aligned copy."""
    a, b = rand((8191, 4097)), rand((4097, 8193))
    base = gemmlab.plan(a, b)
    assert base.staged == ("a", "b")
    p = gemmlab.plan(a, b, config=dataclasses.replace(base.config, stage_c=stage_c))
    out = torch.full((8191, 8193), float("nan"), dtype=a.dtype, device=device)
    assert_matches(gemm_ops.run(p, a, b, out=out), a, b)
