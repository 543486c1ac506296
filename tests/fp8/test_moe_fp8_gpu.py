"""FP8 experts on the H200 (marked gpu; skipped without CUDA), at DeepSeek-V3's expert sizes (H 7168, I 2048, E 256,
top_k 8): moe_forward on a PackedMoEFP8 within ``ref.moe_fp8_check``'s bound for T 1, 128 and 4096; grouped_gemm_fp8
within ``ref.grouped_gemm_fp8_check``'s, for an e4m3 and a bf16 x; CUDA-graph capture and replay matching eager
exactly. Legend: T tokens, H hidden, I intermediate, E experts, k top-k."""

import pytest
import torch

import gemmlab
from gemmlab.ref import grouped_gemm_fp8_check, moe_fp8_check

pytestmark = pytest.mark.gpu
H, INTER, E, K = 7168, 2048, 256, 8  # DeepSeek-V3's routed experts


@pytest.fixture(scope="module")
def packed():
    g = torch.Generator(device="cuda").manual_seed(0)
    w1 = torch.randn(E, 2 * INTER, H, generator=g, device="cuda", dtype=torch.bfloat16) / H**0.5
    w2 = torch.randn(E, H, INTER, generator=g, device="cuda", dtype=torch.bfloat16) / INTER**0.5
    p = gemmlab.pack_moe_fp8(w1, w2)
    del w1, w2
    torch.cuda.empty_cache()
    return p


def _tokens(t, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, H, generator=g, device="cuda", dtype=torch.bfloat16)
    weights, ids = gemmlab.route(torch.randn(t, E, generator=g, device="cuda"), K, scoring="sigmoid")
    return x, weights, ids


@pytest.mark.parametrize("t", [1, 128, 4096])
def test_moe_forward_fp8_within_bound_at_deepseek_sizes(packed, t):
    x, weights, ids = _tokens(t, seed=t)
    y = gemmlab.moe_forward(x, packed, None, weights, ids)
    chk = moe_fp8_check(y, x, packed, weights, ids)
    assert chk["ok"], chk


@pytest.mark.parametrize("given", [True, False], ids=["e4m3-x", "bf16-x"])
def test_grouped_gemm_fp8_within_bound_at_deepseek_sizes(packed, given):
    x, _, ids = _tokens(128, seed=5)
    counts = torch.bincount(ids.reshape(-1).long(), minlength=E)
    offsets = counts.cumsum(0).to(torch.int32)
    xr = x.repeat_interleave(K, 0)  # S = 1024 rows, grouped by the counts
    xq, xs = gemmlab.quantize_fp8(xr, "block", (1, 128)) if given else (xr, None)
    out = gemmlab.grouped_gemm_fp8(xq, packed.w1, offsets, xs, packed.w1_scale)
    chk = grouped_gemm_fp8_check(out, xq, packed.w1, offsets, xs, packed.w1_scale)
    assert chk["ok"], chk


@pytest.mark.parametrize("t", [1, 128])
def test_moe_forward_fp8_cuda_graph(packed, t):
    x, weights, ids = _tokens(t, seed=11)
    static_x = x.clone()
    gemmlab.moe_forward(static_x, packed, None, weights, ids)  # compile and keep the kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = gemmlab.moe_forward(static_x, packed, None, weights, ids)
    fresh, _, _ = _tokens(t, seed=12)
    static_x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, gemmlab.moe_forward(fresh, packed, None, weights, ids))
