"""FP8 on the H200 (marked gpu; skipped without CUDA): gemm_fp8 within the derived bound at real sizes for every
granularity and both B layouts, against torch._scaled_mm where it takes the same scales, the quantize kernel exact
against the torch ops, and CUDA-graph capture and replay."""

import pytest
import torch

import gemmlab
from gemmlab.ops.fp8.quantize import quantize_torch
from gemmlab.ref import gemm_fp8_check
from tests.fp8.operands import GRAN, operands

pytestmark = pytest.mark.gpu


SHAPES = [(4096, 4096, 4096), (8192, 2048, 7168), (64, 7168, 2048), (1, 4096, 7168), (300, 1000, 4112)]


@pytest.mark.parametrize("mode", list(GRAN))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_fp8_within_bound_at_real_sizes(shape, mode):
    m, n, k = shape
    qa, qb, sa, sb = operands(m, n, k, mode)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemmlab.gemm_fp8(qa, qb, sa, sb, out=out)
    chk = gemm_fp8_check(out, qa, qb, sa, sb)
    assert chk["ok"], chk
    if mode == "tensor" and n % 16 == 0:  # B row-major too
        qb_rm = qb.contiguous()
        chk = gemm_fp8_check(gemmlab.gemm_fp8(qa, qb_rm, sa, sb), qa, qb_rm, sa, sb)
        assert chk["ok"], chk


def test_matches_scaled_mm_within_the_bound():
    qa, qb, sa, sb = operands(2048, 2048, 4096, "tensor", seed=1)
    theirs = torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    ours = gemmlab.gemm_fp8(qa, qb, sa, sb)
    assert gemm_fp8_check(theirs, qa, qb, sa, sb)["ok"] and gemm_fp8_check(ours, qa, qb, sa, sb)["ok"]


@pytest.mark.parametrize("granularity,block", [("row", (1, 1)), ("block", (1, 128))])
def test_quantize_kernel_exact_on_the_gpu(granularity, block):
    x = torch.randn(4096, 7168, device="cuda") * torch.logspace(-5, 3, 7168, device="cuda")
    q, s = gemmlab.quantize_fp8(x, granularity, block)
    want_q, want_s = quantize_torch(x, granularity, block)
    assert torch.equal(s, want_s) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.parametrize("mode", list(GRAN))
def test_cuda_graph_capture_and_replay(mode):
    qa, qb, sa, sb = operands(1024, 2048, 4096, mode, seed=2)
    x = torch.randn(1024, 4096, device="cuda")
    gemmlab.gemm_fp8(qa, qb, sa, sb)  # compile outside the capture
    gemmlab.quantize_fp8(x, GRAN[mode][0], (1, 128))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qx, sx = gemmlab.quantize_fp8(x, GRAN[mode][0], (1, 128))
        out = gemmlab.gemm_fp8(qx, qb, sx, sb)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    want_q, want_s = gemmlab.quantize_fp8(x, GRAN[mode][0], (1, 128))
    assert torch.equal(sx, want_s)
    chk = gemm_fp8_check(out, qx, qb, sx, sb)
    assert chk["ok"], chk
