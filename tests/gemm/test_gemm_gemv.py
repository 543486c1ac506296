"""The GEMV-class path (``gemv``, kernels/gemv.py): few rows of A at any alignment, pointer loads, FFMA for one-row
tiles and HMMA for 16-row tiles, split-K reduced in split order. Float64 references, NaN-poisoned outputs, fresh
random inputs; odd, prime and tiny sizes, both B layouts, unaligned rows and bases, strided outputs."""

import dataclasses

import pytest
import torch

import gemmlab
from gemmlab.ops import gemm as gemm_ops
from gemmlab.ops.gemm import GemmConfig
from gemmlab.ops.gemm import launch as gemm_launch
from gemmlab.ops.gemm.route import gemv_split_for
from gemmlab.ref import gemm_check
from tests.conftest import rand

FMA = GemmConfig(block_m=1, block_n=16, block_k=32, num_warps=4, num_stages=1, split_k=0)
DOT = GemmConfig(block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=1, split_k=0)


def operands(m, n, k, dtype, linear, pad=0, offset=0):
    """A (M, K) and B (K, N) (linear: B = W^T, W (N, K)); rows padded by ``pad``, bases ``offset`` elements in."""

    def stored(rows, cols):
        flat = rand((1, offset + rows * (cols + pad)), dtype).reshape(-1)
        return flat.as_strided((rows, cols), (cols + pad, 1), offset)

    a = stored(m, k)
    return a, (stored(n, k).t() if linear else stored(k, n))


def run_twice(p, a, b, out_shape, dtype):
    outs = []
    for _ in range(2):
        out = torch.full(out_shape, float("nan"), dtype=dtype, device=a.device)
        gemm_ops.run(p, a, b, out=out)
        outs.append(out)
    return outs


# (M, N, K, linear, pad, offset): what each exercises
CASES = [
    (1, 37, 71, True, 0, 0),  # the decode GEMV: odd K (no TMA), N not a tile multiple
    (1, 40, 64, False, 0, 0),  # row-major B, aligned: N contiguous
    (3, 29, 97, True, 0, 0),  # a few rows, prime sizes
    (13, 53, 33, True, 3, 1),  # padded rows and a misaligned base (every row 2-byte aligned only)
    (16, 24, 160, False, 1, 0),  # a full 16-row tile, K a multiple of BLOCK_K
    (1, 1, 1, True, 0, 0),  # the smallest
    (2, 7, 5, False, 0, 0),  # K smaller than one BLOCK_K step
]


@pytest.mark.parametrize("m,n,k,linear,pad,offset", CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", [FMA, dataclasses.replace(DOT, split_k=3)], ids=["fma", "dot-split3"])
def test_gemv_is_correct_and_deterministic(m, n, k, linear, pad, offset, dtype, cfg):
    a, b = operands(m, n, k, dtype, linear, pad, offset)
    p = gemmlab.plan(a, b, path="gemv", config=cfg)
    assert p.path == "gemv" and p.config.block_m == cfg.block_m and "GEMV kernel" in p.reason
    out1, out2 = run_twice(p, a, b, (m, n), dtype)
    chk = gemm_check(out1, a, b)
    assert chk["ok"], chk
    assert torch.equal(out1, out2)  # splits summed in split order, whoever arrives last
    for counters in gemm_launch.counters():  # the last arrival leaves its counter at zero
        assert int(counters.count_nonzero()) == 0


@pytest.mark.parametrize("split", [1, 2, 3, 7])
def test_gemv_pinned_split(split):
    a, b = operands(5, 48, 200, torch.float16, True)
    p = gemmlab.plan(a, b, path="gemv", config=dataclasses.replace(DOT, split_k=split))
    assert p.config.split_k == min(split, 7)  # 200 / 32 = 7 steps: never an empty split
    out1, out2 = run_twice(p, a, b, (5, 48), torch.float16)
    assert gemm_check(out1, a, b)["ok"] and torch.equal(out1, out2)


def test_gemv_split_auto():
    cfg = GemmConfig(block_m=1, block_n=32, block_k=256, split_k=0)
    assert gemv_split_for(cfg, 1, 4093, 4099, 132) == 6  # 128 tiles: 17 steps cut 8 ways, trimmed to 6 of 3
    assert gemv_split_for(cfg, 1, 57344, 4096, 132) == 1  # 1792 tiles fill the GPU as they are
    assert gemv_split_for(cfg, 1, 64, 256, 132) == 1  # one step: nothing to split
    assert gemv_split_for(dataclasses.replace(cfg, split_k=4), 1, 64, 2560, 132) == 4


def test_gemv_into_strided_and_column_major_out(device):
    a, b = operands(3, 40, 56, torch.bfloat16, True)
    base = torch.full((3, 48), float("nan"), dtype=torch.bfloat16, device=device)
    out = base[:, 4:44]  # a slice of a wider buffer: row stride 48, base 8 bytes in
    p = gemmlab.plan(a, b, out=out, path="gemv", config=FMA)
    gemm_ops.run(p, a, b, out=out)
    assert gemm_check(out, a, b)["ok"] and torch.isnan(base[:, :4]).all() and torch.isnan(base[:, 44:]).all()
    col = torch.full((40, 3), float("nan"), dtype=torch.bfloat16, device=device).t()  # C (3, 40) column-major
    p = gemmlab.plan(a, b, out=col, path="gemv", config=DOT)
    assert p.swap_ab  # the kernel writes C^T = B^T A^T: 40 rows, fine for the 16-row tile
    gemm_ops.run(p, a, b, out=col)
    assert gemm_check(col, a, b)["ok"]


def test_gemv_route_from_the_table(user_dir, device):
    import json

    target = "nvidia-h200" if device == "cuda" else "interpreter"
    table = {
        "route": {"gemm": [{"m": [0, 16], "tma": [0, 0], "config": {"path": "gemv"}}]},
        "gemm": {"gemv": [{"m": [0, 1], "config": {"block_m": 1, "block_n": 16, "block_k": 32, "split_k": 0}}]},
    }
    (user_dir / f"{target}.json").write_text(json.dumps(table))
    from gemmlab.ops import configs

    configs.reload()
    a, b = operands(1, 37, 71, torch.float16, True)  # odd K: not TMA-aligned, so the route applies
    p = gemmlab.plan(a, b)
    assert p.path == "gemv" and p.config.block_m == 1 and "route" in p.reason, p.reason
    for _ in range(2):  # the second call: the signature cache's kept launch
        c = gemmlab.gemm(a, b)
        assert gemm_check(c, a, b)["ok"]
        a.copy_(rand((1, 71)))
    aligned = operands(1, 32, 64, torch.float16, True)  # TMA-aligned: the route's "tma" range leaves it alone
    assert gemmlab.plan(*aligned).path != "gemv"
    assert gemmlab.plan(a, b, stage=True).path == "tma_splitk"  # staging pinned on: a TMA path, not the route's
    big = operands(20, 37, 71, torch.float16, True)  # M 20: outside the route's M range
    assert gemmlab.plan(*big).path != "gemv"


def test_gemv_refuses_what_it_cannot_do():
    a, b = operands(1, 37, 71, torch.float16, True)
    with pytest.raises(ValueError, match="block_m"):
        gemmlab.plan(a, b, path="gemv", config=dataclasses.replace(FMA, block_m=8))
    with pytest.raises(ValueError, match="path 'warp'"):
        gemmlab.plan(a, b, path="warp")
    with pytest.raises(ValueError, match="tma_persistent.*TMA"):
        gemmlab.plan(a, b, path="tma_persistent", stage=False)  # odd K, not staged: no descriptor possible


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n,k,dtype,linear",
    [
        (1, 4093, 4099, torch.float16, True),
        (16, 12289, 1021, torch.bfloat16, True),
        (1, 14336, 4096, torch.bfloat16, True),
        (4, 4096, 4095, torch.bfloat16, False),
    ],
)
@pytest.mark.parametrize(
    "cfg",
    [
        dataclasses.replace(FMA, block_n=32, block_k=256),
        dataclasses.replace(DOT, block_n=32, block_k=128, num_stages=3),
    ],
    ids=["fma", "dot"],
)
def test_gemv_on_the_gpu(m, n, k, dtype, linear, cfg, device):
    if cfg.block_m == 1 and m > 4:
        pytest.skip("one-row tiles are for a few rows")
    a, b = operands(m, n, k, dtype, linear)
    p = gemmlab.plan(a, b, path="gemv", config=cfg)
    out1, out2 = run_twice(p, a, b, (m, n), dtype)
    assert gemm_check(out1, a, b)["ok"] and torch.equal(out1, out2)
    g = torch.cuda.CUDAGraph()  # capturable: fresh workspace, counters left at zero
    out3 = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    with torch.cuda.graph(g):
        gemm_ops.run(p, a, b, out=out3)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out3, out1)
