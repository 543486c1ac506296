"""problems' input generator: every distribution, layout and MoE draw gives the values its callers drew by hand
before it existed (the same seed -> the same values), so results measured before and after stay comparable."""

import math

import pytest
import torch

from gemmlab import problems
from gemmlab.ops.moe import route
from gemmlab.problems import Case, MoEModel

CPU = torch.device("cpu")


def _gen(seed):
    return torch.Generator(device=CPU).manual_seed(seed)


# the draws as they were written out at their call sites (grade/inputs, bench/gemm, bench/moe, grade/op)
FORMS = {
    "competition": lambda s, g: (torch.randint(0, 1 << 30, s, generator=g) % 100 - 50).to(torch.float32) / 100,
    "uniform": lambda s, g: torch.rand(s, generator=g) * 2 - 1,
    "normal": lambda s, g: torch.randn(s, generator=g),
    "centered": lambda s, g: torch.rand(s, generator=g) - 0.5,
}


@pytest.mark.parametrize("dist", sorted(FORMS))
@pytest.mark.parametrize("colmajor", [False, True])
def test_matrix_is_the_closed_form_in_storage_order(dist, colmajor):
    got = problems.matrix(5, 7, dist, _gen(3), torch.float16, colmajor=colmajor)
    want = FORMS[dist]((7, 5) if colmajor else (5, 7), _gen(3)).to(torch.float16)
    assert torch.equal(got, want.t() if colmajor else want)
    assert got.stride() == ((1, 5) if colmajor else (7, 1))
    assert got.unique().numel() > 1


def test_gemm_operands_are_the_benches_draw():
    """One generator seeded by the shape, A then B, flat storage when padded or offset."""
    m, n, k, pad, off = 5, 7, 9, 3, 1
    g = _gen(2 * 1_000_003 + 1009 * m + 17 * n + k)
    flat_a = (torch.rand(off + m * (k + pad), generator=g) - 0.5).to(torch.bfloat16)
    flat_w = (torch.rand(off + n * (k + pad), generator=g) - 0.5).to(torch.bfloat16)
    a, b = problems.case_operands(Case(m, n, k, "bfloat16", "linear", pad=pad, offset=off), CPU, 2)
    assert torch.equal(a, flat_a.as_strided((m, k), (k + pad, 1), off))
    assert torch.equal(b, flat_w.as_strided((n, k), (k + pad, 1), off).t())
    assert b.stride() == (1, k + pad) and a.storage_offset() == off
    a0, b0 = problems.gemm_operands(6, 10, 8, torch.float16, CPU)
    g = _gen(1009 * 6 + 17 * 10 + 8)
    assert torch.equal(a0, (torch.rand((6, 8), generator=g) - 0.5).half())
    assert torch.equal(b0, (torch.rand((8, 10), generator=g) - 0.5).half())
    with pytest.raises(ValueError, match="layout"):
        problems.gemm_operands(2, 2, 2, torch.float16, CPU, layout="col")


def test_grader_operands_keep_their_two_seeds():
    from gemmlab.grade.inputs import operands

    a, b = operands(4, 6, 5, "competition", 11, torch.float16, "cpu", "colmajor")
    assert torch.equal(a, FORMS["competition"]((5, 4), _gen(23)).half().t())
    assert torch.equal(b, FORMS["competition"]((6, 5), _gen(24)).half().t())


@pytest.mark.parametrize("routing", ["uniform", "zipf"])
def test_moe_inputs_and_tokens_are_the_former_draws(routing):
    model = MoEModel(hidden=16, intermediate=8, experts=4, top_k=2)
    t, h, i, e = 5, 16, 8, 4
    p = problems.moe_inputs(model, t, routing, torch.bfloat16, 3, CPU)
    g = _gen(3)
    x = (torch.rand((t, h), generator=g).sub_(0.5).mul_(2.0)).to(torch.bfloat16)
    w1 = (torch.rand((e, 2 * i, h), generator=g).sub_(0.5).mul_(2.0 * math.sqrt(3.0 / h))).to(torch.bfloat16)
    w2 = (torch.rand((e, h, i), generator=g).sub_(0.5).mul_(2.0 * math.sqrt(3.0 / i))).to(torch.bfloat16)
    logits = torch.randn((t, e), generator=g)
    if routing == "zipf":
        logits = logits - 1.5 * torch.log(torch.arange(1, e + 1, dtype=torch.float32))[None, :]
    weights, ids = route(logits, 2)
    for name, want in {"x": x, "w1": w1, "w2": w2, "weights": weights, "ids": ids}.items():
        assert torch.equal(p[name], want), name
    g = _gen(9)
    x2 = (torch.rand((t, h), generator=g) - 0.5).mul_(2.0).to(torch.bfloat16)
    logits = torch.randn((t, e), generator=g)
    if routing == "zipf":
        logits -= 1.5 * torch.log(torch.arange(1, e + 1, dtype=torch.float32))[None, :]
    got = problems.moe_tokens(t, h, e, 2, routing, torch.bfloat16, 9, CPU)
    for a, b in zip(got, (x2, *route(logits, 2)), strict=True):
        assert torch.equal(a, b)


def test_bad_distribution_and_routing_are_refused():
    with pytest.raises(ValueError, match="distribution 'gauss'"):
        problems.draw((2, 2), "gauss", _gen(0), torch.float16)
    with pytest.raises(ValueError, match="routing 'hot'"):
        problems.moe_inputs(MoEModel(hidden=8, intermediate=8, experts=2, top_k=1), 3, "hot", device=CPU)
