"""GemmConfig.stream_k: the persistent kernel's data-parallel + stream-K hybrid (against wave quantization).
Under the interpreter the target has 3 "SMs", so small tile counts give every case: whole waves (no stream-K),
a partial wave over whole waves, fewer tiles than SMs (each tile shared by two programs), tiles split mid-run
and tiles a program covers whole. Deterministic: the pieces of a tile are summed in program order."""

import dataclasses

import pytest
import torch

import gemmlab
from gemmlab.ops import gemm as gemm_ops
from gemmlab.ops.gemm import launch as gemm_launch
from gemmlab.ops.introspect import stream_k_tiles
from gemmlab.ref import gemm_check
from tests.conftest import rand

# the planner's own choices, whatever route rules the bundled table holds (route rules: test_gemm_gemv.py)
pytestmark = pytest.mark.usefixtures("no_routes")


def assert_matches(c, a, b):
    chk = gemm_check(c, a, b)
    assert chk["ok"], chk


def test_stream_k_tiles():
    assert stream_k_tiles(264, 132) == 0  # whole waves: nothing to balance
    assert stream_k_tiles(480, 132) == 84 + 132  # 3000x5000 in 128x256 tiles: the last partial wave and one more
    assert stream_k_tiles(100, 132) == 100  # less than a wave: every tile
    assert stream_k_tiles(133, 132) == 1 + 132


# (M, N, K, block_m, block_n, layout): tiles on 3 programs, and what they exercise
CASES = [
    (300, 40, 200, 32, 32, "NN"),  # 20 tiles: 5 stream-K tiles of 7 steps over 3 runs of 12 (whole and split)
    (300, 40, 512, 256, 64, "NN"),  # 2 tiles < 3 programs: each tile split across two runs
    (304, 40, 200, 256, 64, "TT"),  # the same with A and B stored transposed (M = 304: aligned A^T)
    (264, 37, 96, 32, 32, "NT"),  # odd N: C through masked pointers; B K-major (nn.Linear layout)
    (264, 72, 96, 32, 32, "NN"),  # 27 tiles = 9 waves: no stream-K tiles at all
]


@pytest.mark.parametrize("m,n,k,bm,bn,layout", CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stream_k_is_correct_and_deterministic(m, n, k, bm, bn, layout, dtype, device):
    a = rand((m, k), dtype, major="row" if layout[0] == "N" else "col")
    b = rand((k, n), dtype, major="row" if layout[1] == "N" else "col")
    base = gemmlab.plan(a, b)
    assert base.path == "tma_persistent", base
    p = gemmlab.plan(a, b, config=dataclasses.replace(base.config, block_m=bm, block_n=bn, stream_k=True))
    out1 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    out2 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    gemm_ops.run(p, a, b, out=out1)
    gemm_ops.run(p, a, b, out=out2)
    assert_matches(out1, a, b)
    assert torch.equal(out1, out2)  # pieces summed in program order, whoever arrives last
    for counters in gemm_launch.counters():  # the last arrival leaves its counter at zero
        assert int(counters.count_nonzero()) == 0


def test_stream_k_with_staging_and_stage_c():
    a, b = rand((300, 33)), rand((33, 37))  # odd K and N: A and B staged, C staged
    base = gemmlab.plan(a, b, stage=True)
    cfg = dataclasses.replace(base.config, block_m=32, block_n=32, stream_k=True, stage_c=True)
    p = gemmlab.plan(a, b, stage=True, config=cfg)
    assert p.staged == ("a", "b", "c")
    assert_matches(gemm_ops.run(p, a, b), a, b)


def test_stream_k_from_the_table_on_the_hot_path(tmp_path, monkeypatch, device):
    import json

    from gemmlab.ops import configs

    monkeypatch.setenv("GEMMLAB_CONFIGS", str(tmp_path))
    target = "nvidia-h200" if device == "cuda" else "interpreter"
    rule = {"config": {"block_m": 32, "block_n": 32, "block_k": 32, "group_m": 2, "stream_k": True}}
    (tmp_path / f"{target}.json").write_text(json.dumps({"gemm": {"tma_persistent": [rule]}}))
    configs.reload()
    try:
        a, b = rand((300, 200)), rand((200, 40))
        assert gemmlab.plan(a, b).config.stream_k
        for _ in range(2):  # the second call: the signature cache's kept launch
            assert_matches(gemmlab.gemm(a, b), a, b)
            a.copy_(rand((300, 200)))
    finally:
        monkeypatch.undo()
        configs.reload()


def test_stream_k_with_warp_specialization_is_refused(monkeypatch):
    monkeypatch.setenv("GEMMLAB_ALLOW_WS", "1")
    a, b = rand((300, 64)), rand((64, 48))
    cfg = dataclasses.replace(gemmlab.plan(a, b).config, stream_k=True, warp_specialize=True)
    with pytest.raises(ValueError, match="stream_k or tail_split with warp_specialize"):
        gemmlab.plan(a, b, config=cfg)
    with pytest.raises(ValueError, match="stream_k or tail_split with warp_specialize"):
        gemmlab.plan(a, b, config=dataclasses.replace(cfg, stream_k=False, tail_split=4))
    with pytest.raises(ValueError, match="stream_k and tail_split: one of them"):
        gemmlab.plan(a, b, config=dataclasses.replace(cfg, warp_specialize=False, tail_split=4))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,dtype,linear",
    [
        (3000, 5000, 7000, torch.float16, False),
        (2048, 5120, 5120, torch.bfloat16, True),
        (777, 3333, 1024, torch.float16, False),
    ],
)
def test_stream_k_on_the_gpu(m, n, k, dtype, linear, device):
    """Issue 14's mid-size shapes on the H200 with stream-K (the last is staged: odd N)."""
    a = rand((m, k), dtype)
    b = rand((n, k), dtype).t() if linear else rand((k, n), dtype)
    base = gemmlab.plan(a, b, stage=True)
    p = gemmlab.plan(a, b, stage=True, config=dataclasses.replace(base.config, stream_k=True))
    assert p.path == "tma_persistent" and p.config.stream_k
    out1 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    out2 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    gemm_ops.run(p, a, b, out=out1)
    gemm_ops.run(p, a, b, out=out2)
    assert_matches(out1, a, b)
    assert torch.equal(out1, out2)


def test_tail_split_arithmetic():
    from gemmlab.ops.gemm.route import tail_split_for

    assert tail_split_for(264, 132, 64, 8) == (0, 0)  # whole waves: no tail
    assert tail_split_for(320, 132, 80, 8) == (56, 2)  # 2048x5120 in 128x256: 56 tiles, 2 pieces in one round
    assert tail_split_for(480, 132, 112, 8) == (84, 3)  # 3000x5000: 84 tiles, 3 pieces in two rounds
    assert tail_split_for(80, 132, 112, 8) == (80, 3)  # fewer tiles than SMs: all of them are the tail
    assert tail_split_for(320, 132, 80, 1) == (0, 0)  # tail_split < 2: off
    assert tail_split_for(320, 132, 6, 8) == (0, 0)  # six K steps: pieces would be all reduction
    assert tail_split_for(1000, 132, 224, 8)[1] <= 8


# (M, N, K, block_m, block_n, tail_split): tiles on the interpreter's 3 programs, K in 32-wide steps (split pieces
# must be worth their reduction: ``tail_split_for``)
TAIL_CASES = [
    (224, 32, 1024, 32, 32, 4),  # 7 tiles: two whole waves, then 1 tail tile in 3 pieces, one round
    (32, 32, 1024, 32, 32, 8),  # 1 tile < 3 programs: all tail, no data-parallel part
    (64, 37, 1000, 32, 32, 8),  # 4 tiles, odd N (C through pointers), a last K step cut short
    (264, 72, 96, 32, 32, 4),  # 27 tiles = 9 waves: no tail at all
]


@pytest.mark.parametrize("m,n,k,bm,bn,split", TAIL_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tail_split_is_correct_and_deterministic(m, n, k, bm, bn, split, dtype, device):
    from gemmlab.ops.gemm.route import tail_split_for

    a, b = rand((m, k), dtype), rand((n, k), dtype).t()  # nn.Linear layout
    base = gemmlab.plan(a, b, path="tma_persistent")
    p = gemmlab.plan(
        a,
        b,
        path="tma_persistent",
        config=dataclasses.replace(base.config, block_m=bm, block_n=bn, block_k=32, tail_split=split),
    )
    tiles = -(-m // bm) * -(-n // bn)
    expect = tail_split_for(tiles, p.num_sms, -(-k // 32), split)
    assert p.config.tail_split == expect[1] and (expect != (0, 0)) == (m != 264)
    out1 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    out2 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    gemm_ops.run(p, a, b, out=out1)
    gemm_ops.run(p, a, b, out=out2)
    assert_matches(out1, a, b)
    assert torch.equal(out1, out2)
    for counters in gemm_launch.counters():
        assert int(counters.count_nonzero()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,dtype",
    [(3000, 5000, 7000, torch.float16), (2048, 5120, 5120, torch.bfloat16), (2048, 576, 7168, torch.float16)],
)
def test_tail_split_on_the_gpu(m, n, k, dtype, device):
    a, b = rand((m, k), dtype), rand((n, k), dtype).t()
    base = gemmlab.plan(a, b, path="tma_persistent")
    p = gemmlab.plan(a, b, path="tma_persistent", config=dataclasses.replace(base.config, tail_split=8))
    assert p.config.tail_split > 1, p  # each of these has a partial last wave
    out1 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    out2 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    gemm_ops.run(p, a, b, out=out1)
    gemm_ops.run(p, a, b, out=out2)
    assert_matches(out1, a, b)
    assert torch.equal(out1, out2)
