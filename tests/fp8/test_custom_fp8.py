"""The FP8 custom ops (torch.ops.gemmlab.gemm_fp8, gemm_fp8_out, quantize_fp8): schemas and fakes checked by
torch.library.opcheck, the checks fired through the fake implementation, and a quantize + gemm_fp8 function traced
whole by torch.compile(fullgraph=True) (backend aot_eager on the CPU: the ops are opaque, the graph around them is
what is tested) matching eager exactly."""

import pytest
import torch

import gemmlab
from tests.conftest import DEVICE


def _weight(n=48, k=64, granularity="block"):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    q, s = gemmlab.quantize_fp8(w, granularity, (128, 128))
    return q.t(), s.t()  # B (K, N) K-major, its scale transposed with it


def test_ops_registered_on_import():
    for name in ("gemm_fp8", "gemm_fp8_out", "quantize_fp8"):
        assert hasattr(torch.ops.gemmlab, name)
    schema = str(torch.ops.gemmlab.gemm_fp8.default._schema)
    assert "ScalarType out_dtype=15" in schema or "out_dtype=" in schema, schema


@pytest.mark.parametrize("granularity", ["tensor", "row", "block"])
def test_opcheck(granularity):
    x = torch.randn(17, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    torch.library.opcheck(torch.ops.gemmlab.quantize_fp8.default, (x, granularity, [1, 128]))
    qa, sa = gemmlab.quantize_fp8(x, granularity, (1, 128))
    qb, sb = _weight(granularity={"tensor": "tensor", "row": "row", "block": "block"}[granularity])
    # opcheck's schema test compares inputs before and after with arithmetic torch lacks for fp8 on the CPU
    # ("mul_cpu_reduced_float" for Float8_e4m3fn): the fake, the dispatch and the AOT tests run
    utils = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.gemmlab.gemm_fp8.default, (qa, qb, sa, sb, torch.float16), test_utils=utils)
    out = torch.empty((17, 48), dtype=torch.bfloat16, device=DEVICE)
    torch.library.opcheck(torch.ops.gemmlab.gemm_fp8_out.default, (qa, qb, sa, sb, out), test_utils=utils)


def test_fake_implementations_check_too():
    from torch._subclasses.fake_tensor import FakeTensorMode

    qb, sb = _weight()
    qa = torch.zeros((4, 64), dtype=torch.float8_e4m3fn, device=DEVICE)
    bad_scale = torch.ones((4, 3), device=DEVICE)
    for mode in (None, FakeTensorMode(allow_non_fake_inputs=True)):
        with mode or torch.no_grad(), pytest.raises(ValueError, match="fit no granularity"):
            torch.ops.gemmlab.gemm_fp8(qa, qb, bad_scale, sb)
        with mode or torch.no_grad(), pytest.raises(ValueError, match="granularity"):
            torch.ops.gemmlab.quantize_fp8(qa.float(), "rows")


class Fp8Linear(torch.nn.Module):
    """y = x W^T with W quantized once (128x128 blocks) and x on the fly (1x128 blocks)."""

    def __init__(self):
        super().__init__()
        self.qw, self.sw = _weight()

    def forward(self, x):
        qx, sx = gemmlab.quantize_fp8(x, "block", (1, 128))
        y = gemmlab.gemm_fp8(qx, self.qw, sx, self.sw, out_dtype=torch.bfloat16)
        return y.float().relu()


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    model = Fp8Linear()
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    want = model(x)
    got = torch.compile(model, fullgraph=True, backend="aot_eager" if DEVICE == "cpu" else "inductor")(x)
    assert torch.equal(got, want)
