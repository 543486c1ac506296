"""The FP8 decode path (small M) on the H200 (marked gpu; skipped without CUDA): at real decode shapes, every scale
granularity, within the derived bound against the float64 reference, into a NaN-poisoned out; the same bits on a
second call (the split-K reduction is deterministic) and launched directly from then on; both inner-product branches
at M = 1; a row-major B; CUDA-graph capture and replay of a split-K launch, with eager calls right before and after.
Legend: M rows of A (tokens), N output features, K input features."""

import pytest
import torch

import gemmlab
from gemmlab.ops.gemm_fp8 import Fp8DecodeConfig, execute_fp8, plan_fp8
from gemmlab.ops.introspect import counters, fp8_launch_mode
from gemmlab.ref import gemm_fp8_check
from tests.fp8.operands import GRAN, operands

pytestmark = pytest.mark.gpu
SHAPES = [(1, 4096, 7168), (64, 7168, 2048), (8, 2112, 7168)]


@pytest.mark.parametrize("mode", list(GRAN))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_within_bound_same_bits_and_direct(shape, mode):
    m, n, k = shape
    qa, qb, sa, sb = operands(m, n, k, mode)
    p = plan_fp8(qa, qb, sa, sb)
    assert p.path == "decode", p.reason
    outs = []
    for _ in range(3):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemmlab.gemm_fp8(qa, qb, sa, sb, out=out)
        outs.append(out)
    torch.cuda.synchronize()
    chk = gemm_fp8_check(outs[0], qa, qb, sa, sb)
    assert chk["ok"], (p.reason, chk)
    assert all(torch.equal(o.view(torch.int16), outs[0].view(torch.int16)) for o in outs[1:])
    assert fp8_launch_mode(qa, qb, sa, sb, torch.bfloat16, outs[-1]) == "direct"
    assert all(int(c.abs().sum()) == 0 for c in counters())  # each launch leaves its arrival counters zero


@pytest.mark.parametrize("block_m", [1, 16])
@pytest.mark.parametrize("mode", list(GRAN))
def test_both_branches_at_one_row(block_m, mode):
    qa, qb, sa, sb = operands(1, 4096, 7168, mode, seed=3)
    p = plan_fp8(qa, qb, sa, sb, out_dtype=torch.float32, config=Fp8DecodeConfig(block_m=block_m))
    c = torch.full((1, 4096), float("nan"), dtype=torch.float32, device="cuda")
    execute_fp8(p, qa, qb, sa, sb, c)
    chk = gemm_fp8_check(c, qa, qb, sa, sb)
    assert chk["ok"], (p.reason, chk)


def test_row_major_b():
    qa, qb, sa, sb = operands(16, 4096, 7168, "tensor", seed=4)
    qb = qb.contiguous()  # B (K, N) row-major
    assert plan_fp8(qa, qb, sa, sb).path == "decode"
    chk = gemm_fp8_check(gemmlab.gemm_fp8(qa, qb, sa, sb), qa, qb, sa, sb)
    assert chk["ok"], chk


@pytest.mark.parametrize("mode", list(GRAN))
def test_decode_in_a_cuda_graph(mode):
    """A split-K decode launch captured with the activation's quantizer, replayed on new activations; eager calls
    of the same signature before and after stay right (the capture's workspace and counters are its own)."""
    qa, qb, sa, sb = operands(4, 4096, 7168, mode, seed=2)
    p = plan_fp8(qa, qb, sa, sb)
    assert p.path == "decode" and p.config.split_k > 1, p.reason
    x = torch.randn(4, 7168, device="cuda")
    gemmlab.gemm_fp8(qa, qb, sa, sb)  # compile outside the capture
    gemmlab.quantize_fp8(x, GRAN[mode][0], (1, 128))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qx, sx = gemmlab.quantize_fp8(x, GRAN[mode][0], (1, 128))
        out = gemmlab.gemm_fp8(qx, qb, sx, sb)
    for seed in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda"))
        graph.replay()
        eager = gemmlab.gemm_fp8(qa, qb, sa, sb)
        torch.cuda.synchronize()
        chk = gemm_fp8_check(out, qx, qb, sx, sb)
        assert chk["ok"], (seed, chk)
        assert gemm_fp8_check(eager, qa, qb, sa, sb)["ok"], seed
