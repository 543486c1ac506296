"""The FP8 experts' custom ops (torch.ops.gemmlab.grouped_gemm_fp8, grouped_gemm_fp8_out, moe_forward_fp8): fakes
and schemas by torch.library.opcheck, the checks fired through the fake implementations, and moe_forward on a
PackedMoEFP8 traced whole by torch.compile(fullgraph=True) matching eager exactly (aot_eager on the CPU)."""

import pytest
import torch

import gemmlab
from tests.conftest import DEVICE

# opcheck's schema test compares inputs with arithmetic torch lacks for fp8 on the CPU (as tests/fp8/test_custom_fp8)
UTILS = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def _setup(t=5, h=128, i=128, e=3, k=2):
    g = torch.Generator().manual_seed(7)
    w1 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(DEVICE)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(DEVICE)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16).to(DEVICE)
    weights, ids = gemmlab.route(torch.randn(t, e, generator=g).to(DEVICE), k)
    return x, gemmlab.pack_moe_fp8(w1, w2), weights, ids


def test_ops_registered_on_import():
    for name in ("grouped_gemm_fp8", "grouped_gemm_fp8_out", "moe_forward_fp8"):
        assert hasattr(torch.ops.gemmlab, name)


def test_opcheck():
    x, p, weights, ids = _setup()
    offs = torch.tensor([2, 2, 5], dtype=torch.int32, device=DEVICE)
    qx, sx = gemmlab.quantize_fp8(x, "block", (1, 128))
    torch.library.opcheck(
        torch.ops.gemmlab.grouped_gemm_fp8.default,
        (qx, p.w2, offs, sx, p.w2_scale, torch.bfloat16, True),
        test_utils=UTILS,
    )
    torch.library.opcheck(
        torch.ops.gemmlab.grouped_gemm_fp8.default,
        (x, p.w2, offs, None, p.w2_scale, torch.float16, True),
        test_utils=UTILS,
    )
    out = torch.zeros((5, 128), dtype=torch.bfloat16, device=DEVICE)
    torch.library.opcheck(
        torch.ops.gemmlab.grouped_gemm_fp8_out.default, (qx, p.w2, offs, sx, p.w2_scale, out, True), test_utils=UTILS
    )
    torch.library.opcheck(
        torch.ops.gemmlab.moe_forward_fp8.default,
        (x, p.w1, p.w1_scale, p.w2, p.w2_scale, weights, ids, True),
        test_utils=UTILS,
    )


def test_fake_implementations_check_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, p, weights, ids = _setup()
    offs = torch.tensor([2, 2, 5], dtype=torch.int32, device=DEVICE)
    for mode in (None, FakeTensorMode(allow_non_fake_inputs=True)):
        with mode or torch.no_grad(), pytest.raises(ValueError, match="w_scale must be fp32"):
            torch.ops.gemmlab.grouped_gemm_fp8(x, p.w2, offs, None, p.w2_scale[:1], torch.bfloat16, True)
        with mode or torch.no_grad(), pytest.raises(ValueError, match="needs w1"):
            torch.ops.gemmlab.moe_forward_fp8(x, p.w2, p.w2_scale, p.w2, p.w2_scale, weights, ids, True)


class Fp8Experts(torch.nn.Module):
    def __init__(self, packed):
        super().__init__()
        self.packed = packed

    def forward(self, x, weights, ids):
        return gemmlab.moe_forward(x, self.packed, None, weights, ids).float().relu()


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    x, p, weights, ids = _setup()
    model = Fp8Experts(p)
    want = model(x, weights, ids)
    got = torch.compile(model, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")(x, weights, ids)
    assert torch.equal(got, want)
