"""Bad arguments to the Python API give one clear line (issue 34, item 10): a TypeError or ValueError that names the
op, the argument and the problem, never an AttributeError, IndexError, ZeroDivisionError, NotImplementedError or
the dispatcher's five-line schema error. Each row is a call that once raised one of those (or a sibling of it in
another op), and the words its error must now hold. Small sizes: the CPU interpreter runs them."""

import dataclasses

import pytest
import torch

import gemmlab
from gemmlab.nn import Linear, MoE, MoEExperts
from gemmlab.ops.fp8.moe_launch import MoEFp8Config
from gemmlab.ops.fp8.plan import Fp8Config
from gemmlab.ops.moe import MoEConfig
from gemmlab.ops.moe.config import MoEBackwardConfig
from tests.conftest import DEVICE

F16 = torch.float16


def _t(*shape, dtype=F16):
    return torch.randn(shape).to(dtype).to(DEVICE)


def _meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def _calls():
    a, b = _t(8, 16), _t(16, 8)
    x, w = _t(10, 16), _t(3, 8, 16)
    offsets = torch.tensor([3, 7, 10], dtype=torch.int32, device=DEVICE)
    xm, w1, w2 = _t(6, 16), _t(4, 32, 16), _t(4, 16, 16)
    tw, ti = gemmlab.route(_t(6, 4, dtype=torch.float32), 2)
    qa, sa = gemmlab.quantize_fp8(_t(8, 16, dtype=torch.float32))
    qb, sb = gemmlab.quantize_fp8(_t(16, 16, dtype=torch.float32))
    lin = Linear(16, 8, dtype=F16, device=DEVICE)
    moe = MoE(16, 16, 4, 2, dtype=F16, device=DEVICE)
    return {
        # dense GEMM
        "gemm-a-None": (lambda: gemmlab.gemm(None, b), TypeError, "gemm: a must be a torch.Tensor"),
        "gemm-b-None": (lambda: gemmlab.gemm(a, None), TypeError, "gemm: b must be a torch.Tensor"),
        "gemm-a-list": (lambda: gemmlab.gemm([[1.0]], b), TypeError, "gemm: a must be a torch.Tensor"),
        "plan-config-str": (lambda: gemmlab.plan(a, b, config="fast"), TypeError, "plan: config must be a GemmConfig"),
        "plan-stage-str": (lambda: gemmlab.plan(a, b, stage="yes"), TypeError, "plan: stage must be True, False"),
        "plan-config-small-tiles": (
            lambda: gemmlab.plan(a, b, path="portable", config=gemmlab.GemmConfig(block_m=8, block_n=16, block_k=16)),
            ValueError,
            "portable kernel needs block_m, block_n and block_k >=",
        ),
        # configs
        "GemmConfig-block_m-0": (
            lambda: gemmlab.GemmConfig(block_m=0),
            ValueError,
            "GemmConfig: block_m must be a power of two",
        ),
        "GemmConfig-block_n-48": (
            lambda: gemmlab.GemmConfig(block_n=48),
            ValueError,
            "GemmConfig: block_n must be a power of two >= 1, got 48",
        ),
        "GemmConfig-block_k-str": (
            lambda: gemmlab.GemmConfig(block_k="64"),
            TypeError,
            "GemmConfig: block_k must be an integer",
        ),
        "GemmConfig-num_warps-3": (lambda: gemmlab.GemmConfig(num_warps=3), ValueError, "num_warps must be a power"),
        "GemmConfig-num_stages-0": (lambda: gemmlab.GemmConfig(num_stages=0), ValueError, "num_stages must be >= 1"),
        "GemmConfig-split_k-neg": (lambda: gemmlab.GemmConfig(split_k=-1), ValueError, "split_k must be >= 0"),
        "GemmConfig-stream_k-str": (lambda: gemmlab.GemmConfig(stream_k="yes"), TypeError, "stream_k must be a bool"),
        "GemmConfig-from-table": (
            lambda: gemmlab.GemmConfig.from_dict({"block_m": 96}),
            ValueError,
            "block_m must be a power of two",
        ),
        "MoEConfig-block_k-0": (lambda: MoEConfig(block_k=0), ValueError, "MoEConfig: block_k must be a power"),
        "MoEConfig-clip-int": (lambda: MoEConfig(clip=1), TypeError, "MoEConfig: clip must be a bool"),
        "Fp8Config-block_m-48": (lambda: Fp8Config(block_m=48), ValueError, "Fp8Config: block_m must be a power"),
        "MoEFp8Config-num_warps-0": (lambda: MoEFp8Config(num_warps=0), ValueError, "MoEFp8Config: num_warps"),
        "MoEBackwardConfig-dx_block_n-24": (
            lambda: MoEBackwardConfig(dx_block_n=24),
            ValueError,
            "MoEBackwardConfig: dx_block_n must be a power",
        ),
        # grouped GEMM and MoE
        "grouped-offsets-list": (
            lambda: gemmlab.grouped_gemm(x, w, [3, 7, 10]),
            TypeError,
            "grouped_gemm: offsets must be a torch.Tensor, got list",
        ),
        "grouped-offsets-list-out": (
            lambda: gemmlab.grouped_gemm(x, w, [3, 7, 10], out=torch.empty_like(x[:, :8])),
            TypeError,
            "grouped_gemm: offsets must be a torch.Tensor",
        ),
        "grouped-x-None-grad": (
            lambda: gemmlab.grouped_gemm(None, w.clone().requires_grad_(), offsets),
            TypeError,
            "x must be a",
        ),
        "grouped-config-str": (
            lambda: gemmlab.grouped_gemm(x, w, offsets, config="fast"),
            TypeError,
            "grouped_gemm: config must be a MoEConfig",
        ),
        "moe-configs-str": (
            lambda: gemmlab.moe_forward(xm, w1, w2, tw, ti, configs="fast"),
            TypeError,
            r"moe_forward: configs must be a \(MoEConfig, MoEConfig\) pair",
        ),
        # FP8
        "quantize-meta-row": (lambda: _shapes(gemmlab.quantize_fp8(_meta(4, 256), "row")), None, [(4, 256), (4, 1)]),
        "quantize-meta-block": (
            lambda: _shapes(gemmlab.quantize_fp8(_meta(4, 256), "block")),
            None,
            [(4, 256), (4, 2)],
        ),
        "quantize-list-grad": (
            lambda: gemmlab.quantize_fp8([1.0, 2.0], "tensor"),
            TypeError,
            "quantize_fp8: x must be a torch.Tensor",
        ),
        "gemm_fp8-scale-list": (
            lambda: gemmlab.gemm_fp8(qa, qb, [1.0], sb),
            TypeError,
            "gemm_fp8: a_scale must be a torch.Tensor",
        ),
        # nn
        "patch-None": (lambda: gemmlab.patch(None), TypeError, "patch: model must be a torch.nn.Module, got NoneType"),
        "patch-dict": (lambda: gemmlab.patch({}), TypeError, "patch: model must be a torch.nn.Module, got dict"),
        "Linear-0-D": (
            lambda: lin(torch.tensor(1.0, dtype=F16, device=DEVICE)),
            ValueError,
            r"Linear: input must be \(..., in_features=16\), got shape \(\)",
        ),
        "Linear-wrong-K": (lambda: lin(_t(4, 15)), ValueError, r"in_features=16\), got shape \(4, 15\)"),
        "Linear-None": (lambda: lin(None), TypeError, "Linear: input must be a torch.Tensor"),
        "Linear-fp32-input": (
            lambda: lin(_t(4, 16, dtype=torch.float32)),
            TypeError,
            "Linear: input has dtype torch.float32, the weight torch.float16",
        ),
        "MoE-fp32-input": (lambda: moe(_t(3, 16, dtype=torch.float32)), TypeError, "^MoE: input has dtype"),
        "MoEExperts-fp32-input": (
            lambda: moe.experts(_t(3, 16, dtype=torch.float32), ti[:3], tw[:3]),
            TypeError,
            "MoEExperts: input has dtype torch.float32",
        ),
        "Linear-negative": (lambda: Linear(-1, 8), ValueError, "Linear: in_features must be an integer >= 0"),
        "Linear-str": (lambda: Linear("16", 8), ValueError, "Linear: in_features must be an integer"),
        "Linear-int-dtype": (lambda: Linear(16, 8, dtype=torch.int32), TypeError, "Linear: dtype must be a floating"),
        "MoE-top_k-str": (lambda: MoE(16, 32, 4, top_k="2"), ValueError, "MoE: top_k must be an integer >= 1"),
        "MoE-hidden-0": (lambda: MoE(0, 32, 4, top_k=2), ValueError, "MoE: hidden must be an integer >= 1, got 0"),
        "MoE-experts-0": (lambda: MoE(16, 32, 0, top_k=1), ValueError, "MoE: num_experts must be an integer >= 1"),
        "MoE-top_k-float": (lambda: MoE(16, 32, 4, top_k=2.0), ValueError, "MoE: top_k must be an integer"),
        "MoE-renormalize-str": (lambda: MoE(16, 32, 4, 2, renormalize="no"), TypeError, "renormalize must be a bool"),
        "MoE-int-dtype": (lambda: MoE(16, 32, 4, 2, dtype=torch.int32), TypeError, "MoE: dtype must be a floating"),
        "MoEExperts-intermediate-0": (
            lambda: MoEExperts(4, 16, 0),
            ValueError,
            "MoEExperts: intermediate must be an integer >= 1",
        ),
        "MoE-forward-0-D": (
            lambda: moe(torch.tensor(1.0, dtype=F16, device=DEVICE)),
            ValueError,
            r"MoE: input must be \(..., hidden=16\), got shape \(\)",
        ),
        "MoE-forward-None": (lambda: moe(None), TypeError, "MoE: input must be a torch.Tensor"),
        "MoEExperts-forward-wrong-H": (
            lambda: moe.experts(_t(3, 8), ti[:3], tw[:3]),
            ValueError,
            r"MoEExperts: input must be \(..., hidden=16\)",
        ),
    }


def _shapes(pair):
    q, s = pair
    assert q.device.type == "meta" and q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    return [tuple(q.shape), tuple(s.shape)]


CASES = list(_calls())


@pytest.mark.parametrize("name", CASES)
def test_bad_argument_is_one_clear_line(name):
    call, exc, want = _calls()[name]
    if exc is None:  # accepted: the right answer
        assert call() == want
        return
    with pytest.raises(exc, match=want) as info:
        call()
    assert "\n" not in str(info.value)


def test_mixed_dtypes_under_autocast_still_run():
    """The dtype check of nn.Linear's input steps aside under autocast, where torch casts (as nn.Linear does)."""
    lin = Linear(16, 8, dtype=torch.float32, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        y = lin(_t(4, 16, dtype=torch.float16))
    assert y.shape == (4, 8)


def test_configs_in_range_still_build():
    """The checks refuse what no kernel can run and nothing the tables, the tuner or the GEMV kernel use: block_m 1
    (FFMA GEMV tiles), split_k 0 (auto), a replace() of a valid config."""
    gemv = gemmlab.GemmConfig(block_m=1, block_n=16, block_k=512, num_warps=2, num_stages=1, split_k=0)
    assert dataclasses.replace(gemv, split_k=4).split_k == 4
    assert MoEFp8Config(block_k=64).block_k == 64
    with pytest.raises(ValueError, match="must divide 128"):
        MoEFp8Config(block_k=256)
