"""The FP8 GEMM's decode path (small M, ``kernels.gemv_fp8`` planned by ``ops.fp8.decode``) against the float64
reference under ``ref.gemm_fp8_bound``: M in {1, 2, 7, 16, 33, 64}, odd N, K a multiple of 16 but not always of 128,
every scale granularity, both B layouts, every output dtype, split-K 1 and > 1 (pinned, and from the table), the FFMA
(one row) and tensor-core (16 rows) branches, NaN-poisoned outputs, the deterministic split reduction (a second call
gives the same bits and leaves the arrival counters zero), NaN and inf reaching C as on the TMA path, the planner's
choice between the two paths from the bundled tables, and each new check fed a bad case. Legend: M rows of A and C,
N columns, K the reduction. Small sizes: the CPU interpreter runs them."""

import dataclasses
import json

import pytest
import torch

import gemmlab
from gemmlab.device import H200, INTERPRETER
from gemmlab.ops import configs
from gemmlab.ops.gemm_fp8 import Fp8Config, Fp8DecodeConfig, execute_fp8, plan_fp8
from gemmlab.ops.introspect import counters, fp8_launch_mode
from gemmlab.ref import gemm_fp8_check
from tests.conftest import DEVICE

FP8 = torch.float8_e4m3fn
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KS = (16, 144, 272, 1040)  # multiples of 16; 144, 272 and 1040 end inside a 128-wide scale block


def _operands(m, n, k, mode, kmajor, seed):
    """Fresh random A (M, K) and B (K, N), quantized per ``mode``: B K-major (an nn.Linear weight (N, K) passed as
    q.t(), its scales transposed with it) or row-major (K, N)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(DEVICE)
    qa, sa = gemmlab.quantize_fp8(x, {"rowcol": "row"}.get(mode, mode), (1, 128))
    if kmajor:
        w = torch.randn(n, k, generator=g).to(DEVICE)
        qw, sw = gemmlab.quantize_fp8(w, {"rowcol": "row"}.get(mode, mode), (128, 128))
        return qa, qw.t(), sa, sw.t()
    w = torch.randn(k, n, generator=g).to(DEVICE)
    qb, sb = gemmlab.quantize_fp8(w, {"rowcol": "col"}.get(mode, mode), (128, 128))
    return qa, qb, sa, sb


def _poisoned(m, n, dtype, row_stride=None):
    """C (M, N) full of NaN; with ``row_stride`` a view of a wider buffer (its pad columns NaN too)."""
    full = torch.full((m, row_stride or n), float("nan"), dtype=dtype, device=DEVICE)
    return full[:, :n]


# (M, mode): N, K, B layout and output dtype cycle over the cases. A row-major B needs N % 16 == 0 (the op's
# alignment rule), so those cases take N = 80.
CASES = [
    (m, mode, i)
    for i, (m, mode) in enumerate((m, mode) for m in (1, 2, 7, 16, 33, 64) for mode in ("tensor", "rowcol", "block"))
]


@pytest.mark.parametrize("m, mode, i", CASES, ids=lambda v: str(v))
def test_decode_through_gemm_fp8_within_bound(m, mode, i):
    kmajor = i % 3 != 2
    n, k, dtype = ((97, 129)[i % 2] if kmajor else 80), KS[i % 4], DTYPES[i % 3]
    qa, qb, sa, sb = _operands(m, n, k, mode, kmajor, seed=i)
    p = plan_fp8(qa, qb, sa, sb, out_dtype=dtype)
    assert p.path == "decode" and p.reason.startswith("decode kernel"), p.reason
    out = _poisoned(m, n, dtype, row_stride=n + 5 if i % 5 == 0 else None)  # sometimes a strided C
    got = gemmlab.gemm_fp8(qa, qb, sa, sb, out=out)
    assert got is out
    chk = gemm_fp8_check(out, qa, qb, sa, sb)
    assert chk["ok"], (p.reason, chk)
    assert fp8_launch_mode(qa, qb, sa, sb, dtype, out) == "jit"  # the interpreter: every launch through the JIT
    c = gemmlab.gemm_fp8(qa, qb, sa, sb, out_dtype=dtype)  # allocated C, its own signature
    assert c.dtype == dtype and gemm_fp8_check(c, qa, qb, sa, sb)["ok"]


def test_the_table_gives_split_k_one_and_more():
    """The interpreter's table (3 "SMs", 4 programs each) splits the narrow cases of the test above and not the
    wide ones: both reductions go through the launcher."""
    splits = set()
    for m, mode, i in CASES:
        kmajor = i % 3 != 2
        n, k = ((97, 129)[i % 2] if kmajor else 80), KS[i % 4]
        a = torch.empty((m, k), dtype=FP8, device="meta")
        b = torch.empty((n, k) if kmajor else (k, n), dtype=FP8, device="meta")
        b = b.t() if kmajor else b
        kb, nb = -(-k // 128), -(-n // 128)
        sa, sb = {"tensor": ((), ()), "rowcol": ((m, 1), (1, n)), "block": ((m, kb), (kb, nb))}[mode]
        sa, sb = torch.empty(sa, device="meta"), torch.empty(sb, device="meta")
        splits.add(plan_fp8(a, b, sa, sb, target=INTERPRETER).config.split_k)
    assert 1 in splits and max(splits) > 1, splits


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("mode", ["tensor", "rowcol", "block"])
@pytest.mark.parametrize("m, block_m", [(1, 1), (7, 1), (1, 16), (33, 16)])
def test_decode_pinned_split_and_branch(m, block_m, mode, split):
    """A pinned config: the FFMA branch (block_m 1, one program per row) and the tensor-core one (16 rows), split-K
    1 and 3 over K = 272 (9 steps of 32, the last crossing K), N odd; fp32 C poisoned with NaN."""
    n, k = 61, 272
    qa, qb, sa, sb = _operands(m, n, k, mode, True, seed=m + split)
    cfg = Fp8DecodeConfig(block_m=block_m, block_n=16, block_k=32, split_k=split, num_stages=1)
    p = plan_fp8(qa, qb, sa, sb, out_dtype=torch.float32, config=cfg)
    assert p.path == "decode" and p.config.split_k == split and "config given by the caller" in p.reason
    c = _poisoned(m, n, torch.float32)
    execute_fp8(p, qa, qb, sa, sb, c)
    chk = gemm_fp8_check(c, qa, qb, sa, sb)
    assert chk["ok"], chk


def test_second_call_reuses_the_plan_and_gives_the_same_bits():
    """The split reduction adds the partials in split order whoever arrives last: two calls, the same bits; the
    plan is cached once; every arrival counter is left at zero."""
    from gemmlab.ops.fp8 import launch as fp8_launch

    qa, qb, sa, sb = _operands(3, 129, 1040, "block", True, seed=11)
    p = plan_fp8(qa, qb, sa, sb, out_dtype=torch.float32)
    assert p.path == "decode" and p.config.split_k > 1, p.reason
    fp8_launch.clear_plans()
    first = gemmlab.gemm_fp8(qa, qb, sa, sb, out_dtype=torch.float32)
    assert len(fp8_launch.PLANS) == 1
    second = gemmlab.gemm_fp8(qa, qb, sa, sb, out_dtype=torch.float32)
    assert len(fp8_launch.PLANS) == 1
    assert torch.equal(first.view(torch.int32), second.view(torch.int32))
    assert gemm_fp8_check(first, qa, qb, sa, sb)["ok"]
    assert counters() and all(int(cnt.abs().sum()) == 0 for cnt in counters())


@pytest.mark.parametrize("block_m", [1, 16])
def test_nan_and_inf_reach_c_as_on_the_tma_path(block_m):
    """NaN codes in A (row 1) and B (column 40) give NaN rows and columns; an inf scale (row 0 of A's K block 1, B's
    block (0, 1)) makes the elements it reaches non-finite. e4m3fn has no inf code, so inf comes only from a scale;
    where it meets a zero or both signs the sum is NaN on one path and may be +-inf on the other (the TMA path
    scales a step's sum, the one-row FFMA branch each product, as the reference does), so the two paths agree on
    which elements are finite, and on the finite ones."""
    m, n, k = 3, 160, 144
    qa, qb, sa, sb = _operands(m, n, k, "block", True, seed=5)
    qa, qw = qa.clone(), qb.t().contiguous()
    qa.view(torch.uint8)[1, 20] = 0x7F
    qw.view(torch.uint8)[40, 100] = 0xFF
    qb = qw.t()
    sa, sb = sa.clone(), sb.clone()
    sa[0, 1] = float("inf")
    sb[0, 1] = float("inf")
    dec = plan_fp8(qa, qb, sa, sb, out_dtype=torch.float32, config=Fp8DecodeConfig(block_m=block_m, block_n=32))
    tma = plan_fp8(qa, qb, sa, sb, out_dtype=torch.float32, config=Fp8Config(block_m=32, block_n=32, block_k=32))
    assert (dec.path, tma.path) == ("decode", "tma")
    got, want = _poisoned(m, n, torch.float32), _poisoned(m, n, torch.float32)
    execute_fp8(dec, qa, qb, sa, sb, got)
    execute_fp8(tma, qa, qb, sa, sb, want)
    assert got[1].isnan().all() and got[:, 40].isnan().all() and want[1].isnan().all()
    assert not torch.isfinite(got[0]).any() and not torch.isfinite(got[:, 128:]).any()
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    ok = torch.isfinite(want)
    assert ok.any() and torch.allclose(got[ok], want[ok], rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("m, path", [(1, "decode"), (8, "decode"), (16, "decode"), (64, "decode"), (65, "tma")])
@pytest.mark.parametrize("mode", [0, 2])
def test_h200_table_plans_decode_at_small_m(m, path, mode):
    """From the bundled H200 table ("meta" operands): the decode path at M <= 64 with a program on every one of the
    132 SMs, every split keeping a BLOCK_K step and its partials' traffic within the config's share of B's bytes;
    the TMA path above."""
    n, k = 4096, 7168
    a = torch.empty((m, k), dtype=FP8, device="meta")
    b = torch.empty((n, k), dtype=FP8, device="meta").t()
    kb, nb = -(-k // 128), -(-n // 128)
    sa, sb = (
        (torch.empty((), device="meta"), torch.empty((), device="meta"))
        if mode == 0
        else (torch.empty((m, kb), device="meta"), torch.empty((kb, nb), device="meta"))
    )
    p = plan_fp8(a, b, sa, sb, target=H200)
    assert p.path == path, p.reason
    if path == "decode":
        cfg = p.config
        programs = -(-m // cfg.block_m) * -(-n // cfg.block_n) * cfg.split_k
        assert programs >= H200.num_sms and "nvidia-h200.json gemm_fp8.decode" in p.reason, p.reason
        assert -(-k // cfg.block_k) >= cfg.split_k
        assert 8 * cfg.split_k * -(-m // cfg.block_m) * cfg.block_m <= cfg.scratch_share * k
        assert f"split-K {cfg.split_k}, {programs} programs" in p.reason
    else:
        assert p.reason.startswith("persistent TMA kernel"), p.reason


def test_decode_split_stops_at_each_of_its_limits():
    """``decode_split``: doubles until ``waves`` programs per SM, unless a split would have fewer than ``min_steps``
    steps or its partials' traffic would pass ``scratch_share`` of B's bytes; trimmed so no split is empty; a
    pinned split is only trimmed."""
    from gemmlab.ops.fp8.decode import decode_split

    cfg = Fp8DecodeConfig(block_m=1, block_n=64, block_k=128)
    assert decode_split(cfg, 1, 4096, 8192, 132) == 16  # 64 tiles: 8 x 64 = 512 < 4 x 132, 16 x 64 >= it
    assert decode_split(cfg, 1, 4096 * 16, 8192, 132) == 1  # 1024 tiles: already 4 waves
    assert decode_split(cfg, 1, 4096, 512, 132) == 4  # 4 steps: 4 splits of 1 (min_steps 1)
    assert decode_split(Fp8DecodeConfig(block_m=1, min_steps=2), 1, 4096, 512, 132) == 2  # 2 splits of 2
    assert decode_split(cfg, 1, 4096, 7168, 132) == 14  # 56 steps: 16 splits of 3.5 -> 14 of 4
    big = Fp8DecodeConfig(block_m=64, block_n=64, block_k=128)
    assert decode_split(big, 64, 4096, 7168, 132) == 4  # 8 * 8 * 64 = 4096 > 0.5 * 7168
    assert decode_split(dataclasses.replace(big, scratch_share=0.0), 64, 4096, 7168, 132) == 1
    assert decode_split(dataclasses.replace(big, split_k=5), 64, 4096, 7168, 132) == 5  # 56 steps: 12 each -> 5
    assert decode_split(dataclasses.replace(big, split_k=100), 64, 4096, 7168, 132) == 56  # no empty split


@pytest.mark.parametrize("target", ["nvidia-h200", "default", "interpreter"])
def test_bundled_decode_rules_load_and_gpu_rules_say_untuned(target):
    """Every table's decode rules load, take block scales (block_k and block_n divide 128) and hold M = 1..64 and
    no M above; the GPU tables' rules say they are not tuned yet."""
    rules = configs.rules(target, "gemm_fp8", "decode", Fp8DecodeConfig.from_dict)
    assert rules and all(128 % r.config.block_k == 0 and 128 % r.config.block_n == 0 for r in rules)
    for m in range(1, 66):
        shapes = [{"m": m, "n": 4096, "k": 7168, "scale": s} for s in (0, 1, 2)]
        held = any(r.matches("float8_e4m3fn", v) for r in rules for v in shapes)
        assert held == (m <= 64), m
    if target != "interpreter":
        data = configs.read(configs.bundled_file(target))
        assert all("not yet tuned" in r.get("note", "") for r in data["gemm_fp8"]["decode"])


def test_decode_config_checks_fire():
    with pytest.raises(ValueError, match="Fp8DecodeConfig: block_m 8: 1 \\(FFMA\\) or a power of two >= 16"):
        Fp8DecodeConfig(block_m=8)
    with pytest.raises(ValueError, match="Fp8DecodeConfig: block_n 8, block_k 128: at least 16"):
        Fp8DecodeConfig(block_n=8)
    with pytest.raises(ValueError, match="Fp8DecodeConfig: waves must be >= 1"):
        Fp8DecodeConfig(waves=0)
    with pytest.raises(ValueError, match="Fp8DecodeConfig: split_k must be >= 0"):
        Fp8DecodeConfig(split_k=-1)
    with pytest.raises(ValueError, match="Fp8DecodeConfig: scratch_share must be >= 0"):
        Fp8DecodeConfig(scratch_share=float("nan"))
    with pytest.raises(TypeError, match="Fp8DecodeConfig: scratch_share must be a number"):
        Fp8DecodeConfig(scratch_share="0.5")
    with pytest.raises(ValueError, match="unknown Fp8DecodeConfig keys \\['blok_n'\\]"):
        Fp8DecodeConfig.from_dict({"blok_n": 64})
    qa, qb, sa, sb = _operands(2, 48, 272, "block", True, seed=2)
    with pytest.raises(ValueError, match="gemm_fp8: decode config: block scales need block_k and block_n dividing"):
        plan_fp8(qa, qb, sa, sb, config=Fp8DecodeConfig(block_k=256))
    with pytest.raises(ValueError, match="gemm_fp8: decode config: block scales need block_k and block_n dividing"):
        plan_fp8(qa, qb, sa, sb, config=Fp8DecodeConfig(block_n=256))
    ta, tb, tsa, tsb = _operands(2, 48, 272, "tensor", True, seed=2)
    assert plan_fp8(ta, tb, tsa, tsb, config=Fp8DecodeConfig(block_n=256)).path == "decode"  # fine per tensor
    with pytest.raises(ValueError, match="not TMA-aligned"):  # the op's alignment rule holds on this path too
        plan_fp8(qa[:, :264].contiguous(), qb[:264], sa, sb, config=Fp8DecodeConfig())  # rows of 264 bytes


def test_a_decode_rule_the_kernel_cannot_take_falls_back_to_tma(tmp_path, monkeypatch):
    """A user's decode rule with 256-wide tiles under block scales: the plan says why and takes the TMA path."""
    (tmp_path / "interpreter.json").write_text(
        json.dumps({"gemm_fp8": {"decode": [{"config": {"block_m": 16, "block_n": 256, "block_k": 32}}]}})
    )
    monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path))
    configs.reload()
    try:
        qa, qb, sa, sb = _operands(2, 48, 272, "block", True, seed=3)
        p = plan_fp8(qa, qb, sa, sb)
        assert p.path == "tma" and "not the decode path" in p.reason and "dividing 128" in p.reason, p.reason
        c = gemmlab.gemm_fp8(qa, qb, sa, sb)
        assert gemm_fp8_check(c, qa, qb, sa, sb)["ok"]
        ta, tb, tsa, tsb = _operands(2, 48, 272, "tensor", True, seed=3)
        assert plan_fp8(ta, tb, tsa, tsb).path == "decode"  # per tensor the rule holds
    finally:
        monkeypatch.undo()
        configs.reload()
