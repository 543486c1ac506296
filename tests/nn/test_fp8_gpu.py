"""FP8 models on the GPU at real layer sizes: Fp8Linear at DeepSeek-V3 projection shapes and Fp8MoEExperts at
Qwen3-30B-A3B's expert sizes against the float64 FP8 references and their bounds, and a two-layer model at
Qwen3-30B-A3B's dimensions, ``patch(model, fp8=True)`` against the dequantized bf16 model (the tolerance of
test_fp8_model.py); that test also prints the FP8 and the bf16-patched model's prefill times (median of 10, CUDA
events), measured, not asserted.
Run on the H200: python -m pytest -q -s tests/nn/test_fp8_gpu.py (a few minutes, most of it Triton compiling)."""

import copy
import statistics
import warnings

import pytest
import torch

import gemmlab
import gemmlab.nn as gnn
from gemmlab.ops.moe_fp8 import PackedMoEFP8
from gemmlab.ref import gemm_fp8_check, moe_fp8_check
from tests.nn.hf_tiny import ROUTER, tf
from tests.nn.test_fp8_model import assert_fp8_close, dequantized, patched_fp8

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


# (M, K, N, bias): DeepSeek-V3's q_a / kv_a projections at a 4096-token prefill, a decode row, a partial N block
@pytest.mark.parametrize("m,k,n,bias", [(4096, 7168, 2112, False), (1, 7168, 1536, False), (777, 2048, 5000, True)])
def test_fp8_linear_at_real_sizes(m, k, n, bias):
    torch.manual_seed(0)
    f = gnn.Fp8Linear.from_linear(torch.nn.Linear(k, n, bias=bias, device="cuda", dtype=BF16))
    plain = gnn.Fp8Linear.from_fp8(f.weight, f.weight_scale_inv)  # the same FP8 weight, no bias
    x = torch.randn(m, k, device="cuda", dtype=BF16)
    with torch.no_grad():
        y, y0 = f(x), plain(x)
    xq, xs = gemmlab.quantize_fp8(x, "block", (1, 128))
    res = gemm_fp8_check(y0, xq, f.weight.t(), xs, f.weight_scale_inv.t())
    assert res["ok"], res
    assert torch.equal(y, y0 + f.bias) if bias else torch.equal(y, y0)  # the bias adds after, in y's dtype


def test_fp8_experts_at_qwen3_30b_a3b_sizes():
    e, h, i, t, k = 128, 2048, 768, 512, 8
    torch.manual_seed(0)
    fe = gnn.Fp8MoEExperts.from_experts(gnn.MoEExperts(e, h, i, device="cuda", dtype=BF16))
    x = torch.randn(t, h, device="cuda", dtype=BF16)
    ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)]).to(torch.int32)
    w = torch.softmax(torch.randn(t, k, device="cuda"), -1)
    with torch.no_grad():
        y = fe(x, ids, w)
    packed = PackedMoEFP8(fe.gate_up_proj, fe.gate_up_proj_scale_inv, fe.down_proj, fe.down_proj_scale_inv)
    res = moe_fp8_check(y, x, packed, w, ids)
    assert res["ok"], res


def _prefill_ms(model, ids) -> float:
    with torch.no_grad():
        model(ids)  # compile, measure per-shape choices
        times = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model(ids)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def test_a_qwen3_30b_a3b_sized_model_in_fp8():
    cfg = tf.Qwen3MoeConfig(
        hidden_size=2048,
        num_hidden_layers=2,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        vocab_size=151936,
    )
    torch.manual_seed(0)
    with torch.device("cuda"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source = tf.Qwen3MoeForCausalLM(cfg).to(BF16).eval()
    with torch.no_grad():  # wide routing margins, as hf_tiny: one rounding must not flip an expert
        for path, p in source.named_parameters():
            if p.dim() == 2 and ROUTER.search(path):
                p.mul_(30)
    fp8, bf16 = copy.deepcopy(source), copy.deepcopy(source)
    summary = patched_fp8(fp8)
    assert any(isinstance(fp8.get_submodule(p), gnn.Fp8MoEExperts) for p in summary["fp8"]), summary
    ids = torch.randint(3, cfg.vocab_size, (1, 1024), device="cuda", generator=None)
    assert_fp8_close(fp8, dequantized(source, fp8.state_dict()), ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gemmlab.patch(bf16)
    ms_fp8, ms_bf16 = _prefill_ms(fp8, ids), _prefill_ms(bf16, ids)
    print(
        f"\nprefill 1 x 1024, 2 layers at Qwen3-30B-A3B dims: fp8 {ms_fp8:.3f} ms, bf16-patched {ms_bf16:.3f} ms, "
        f"{ms_bf16 / ms_fp8:.2f}x"
    )


def test_fp8_modules_compile_fullgraph():
    """Both FP8 modules trace whole (gemmlab's FP8 ops are torch.library custom ops) and compute what eager does."""
    torch.manual_seed(0)
    f = gnn.Fp8Linear.from_linear(torch.nn.Linear(2048, 4096, device="cuda", dtype=BF16))
    fe = gnn.Fp8MoEExperts.from_experts(gnn.MoEExperts(16, 2048, 768, device="cuda", dtype=BF16))
    x = torch.randn(64, 2048, device="cuda", dtype=BF16)
    ids = torch.stack([torch.randperm(16, device="cuda")[:4] for _ in range(64)]).to(torch.int32)
    w = torch.softmax(torch.randn(64, 4, device="cuda"), -1)
    with torch.no_grad():
        assert torch.equal(torch.compile(f, fullgraph=True)(x), f(x))
        assert torch.equal(torch.compile(fe, fullgraph=True)(x, ids, w), fe(x, ids, w))
