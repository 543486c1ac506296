"""The competition reference on TF32 tensor cores (``inputs.reference``): the operands are exact
(test_grade_inputs.py), but a tensor core does not sum as FP32 cores do (its adders align and truncate within each
MMA step), so the reference's sums may move. On a GPU: how far, against the tolerance, at the competition's K; on the
CPU: the grader's TF32 flag is given back even where the product raises."""

import math

import pytest
import torch

from gemmlab.grade import inputs


def test_the_tf32_flag_is_given_back_when_the_product_raises(monkeypatch):
    monkeypatch.setattr(inputs, "vendor_product", lambda a, b: None)  # straight to the reference's own product
    before = torch.backends.cuda.matmul.allow_tf32
    a, b = torch.ones(4, 8, dtype=torch.float16), torch.ones(5, 4, dtype=torch.float16)  # K 8 against 5: raises
    with pytest.raises(RuntimeError):
        inputs.reference(a, b, "competition", torch.float16, 0.01, 512)
    assert torch.backends.cuda.matmul.allow_tf32 == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 tensor cores: a GPU")
@pytest.mark.parametrize("dist", ["competition", "uniform"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_tf32_reference_stays_far_within_the_tolerance(dist, dtype):
    """At K = 16384 (the timed shape's), the TF32 reference is no farther from the exact (float64) product than a
    tenth of the competition's tolerance, nor much farther than the FP32 cores' sum is."""
    m = n = 1024
    k = 16384
    a, b = inputs.operands(m, n, k, dist, 7, dtype, "cuda", "colmajor")
    r = inputs.reference(a, b, "competition", dtype, 0.01, 512)
    exact = a.double() @ b.double()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        fp32 = (a.float() @ b.float()).double()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    tf32_err = (r["c_ref"].double() - exact).abs().max().item()
    fp32_err = (fp32 - exact).abs().max().item()
    assert r["tol"] == pytest.approx(0.01 * math.sqrt(k / 512))
    assert tf32_err <= 0.1 * r["tol"], (tf32_err, fp32_err, r["tol"])
    assert tf32_err <= 4 * fp32_err + 1e-6, (tf32_err, fp32_err)
