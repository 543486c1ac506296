"""NaN in e4m3 data (codes 0x7F and 0xFF) reaches the output as NaN in every FP8 op (issue 34, item 6): Triton 3.6's
CPU interpreter decodes those codes as +-480 in its dot, so the kernels decode e4m3 operands themselves there
(``kernels.gemm_fp8.e4m3_operand``); the GPU's tensor cores decode them right. A NaN in A's row i poisons row i of C
and nothing else; one in B's column n poisons column n. Legend: T tokens, H hidden, I intermediate, E experts,
k top-k, S routed rows."""

import pytest
import torch

import gemmlab
from gemmlab.ref import gemm_fp8_check
from tests.conftest import DEVICE

FP8 = torch.float8_e4m3fn
NAN_CODES = (0x7F, 0xFF)  # +NaN and -NaN: e4m3fn's only non-finite codes


def _poison(q: torch.Tensor, index: tuple, code: int) -> torch.Tensor:
    q = q.clone()
    q.view(torch.uint8)[index] = code
    assert q[index].float().isnan()  # torch's own decoding: NaN
    return q


def _quantized(shape, granularity, block, seed):
    g = torch.Generator().manual_seed(seed)
    return gemmlab.quantize_fp8(torch.randn(shape, generator=g).to(DEVICE), granularity, block)


@pytest.mark.parametrize("code", NAN_CODES, ids=hex)
@pytest.mark.parametrize("mode", ["tensor", "row", "block"])
@pytest.mark.parametrize("b_kmajor", [True, False], ids=["b-kmajor", "b-rowmajor"])
def test_gemm_fp8_nan_in_a_or_b_gives_nan_row_or_column(code, mode, b_kmajor):
    m, n, k = 8, 16, 48
    qa, sa = _quantized((m, k), mode, (1, 128), seed=1)
    if b_kmajor:  # an nn.Linear weight (N, K), passed as q.t()
        qw, sw = _quantized((n, k), mode, (128, 128), seed=2)
        qb, sb = qw.t(), sw.t()
    else:
        qb, sb = _quantized((k, n), {"row": "col"}.get(mode, mode), (128, 128), seed=2)
    bad_a = _poison(qa, (3, 17), code)
    c = gemmlab.gemm_fp8(bad_a, qb, sa, sb, out_dtype=torch.float32)
    assert c[3].isnan().all()
    rest = torch.cat([c[:3], c[4:]])
    assert not rest.isnan().any()
    assert gemm_fp8_check(
        c[[0, 1, 2, 4, 5, 6, 7]],
        qa[[0, 1, 2, 4, 5, 6, 7]],
        qb,
        sa if sa.dim() == 0 or sa.shape[0] == 1 else sa[[0, 1, 2, 4, 5, 6, 7]],
        sb,
    )["ok"]
    bad_b = _poison(qb.t(), (5, 30), code).t() if b_kmajor else _poison(qb, (30, 5), code)
    c = gemmlab.gemm_fp8(qa, bad_b, sa, sb)
    assert c[:, 5].isnan().all()
    assert not torch.cat([c[:, :5], c[:, 6:]], dim=1).isnan().any()


def _experts(e, h, i, seed):
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(torch.bfloat16).to(DEVICE)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(torch.bfloat16).to(DEVICE)
    return gemmlab.pack_moe_fp8(w1, w2)


@pytest.mark.parametrize("code", NAN_CODES, ids=hex)
def test_grouped_gemm_fp8_nan_in_x_or_w_reaches_its_rows(code):
    packed = _experts(3, 32, 16, seed=3)
    offsets = torch.tensor([4, 4, 10], dtype=torch.int32, device=DEVICE)  # expert 1 empty
    qx, sx = _quantized((10, 32), "block", (1, 128), seed=4)
    y = gemmlab.grouped_gemm_fp8(_poison(qx, (6, 9), code), packed.w1, offsets, sx, packed.w1_scale)
    assert y[6].isnan().all() and not torch.cat([y[:6], y[7:]]).isnan().any()
    # w1[2] row 20: column 20 of expert 2's rows (4..9) only
    w = _poison(packed.w1, (2, 20, 5), code)
    y = gemmlab.grouped_gemm_fp8(qx, w, offsets, sx, packed.w1_scale)
    assert y[4:, 20].isnan().all()
    y[4:, 20] = 0
    assert not y.isnan().any()


def test_moe_forward_fp8_nan_in_x_or_weights_reaches_the_output():
    e, t, h, i, k = 3, 5, 32, 16, 2
    packed = _experts(e, h, i, seed=5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16).to(DEVICE)
    weights, ids = gemmlab.route(torch.randn(t, e, generator=g).to(DEVICE), k)
    x[2, 7] = float("nan")  # quantized on the fly: its 1x128 block gets scale 1 and the code 0x7F
    y = gemmlab.moe_forward(x, packed, None, weights, ids)
    assert y[2].isnan().all() and not torch.cat([y[:2], y[3:]]).isnan().any()
    expert = int(ids[0, 0])  # a NaN weight of an expert token 0 uses: token 0's whole row is NaN
    bad = gemmlab.PackedMoEFP8(packed.w1, packed.w1_scale, _poison(packed.w2, (expert, 3, 4), 0x7F), packed.w2_scale)
    y = gemmlab.moe_forward(x.nan_to_num(), bad, None, weights, ids)
    uses = (ids == expert).any(dim=1)
    assert y[uses, 3].isnan().all() and not y[~uses].isnan().any()
