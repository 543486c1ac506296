"""Outputs narrowed to bf16 are rounded to nearest even, as the GPU rounds them (``kernels.gemm.narrow``): on the CPU
too, where Triton 3.6's interpreter truncates its own fp32 -> bf16 casts."""

import json
import math

import pytest
import torch
import triton
import triton.language as tl

import gemmlab
from gemmlab.kernels.gemm import narrow


@triton.jit
def _narrow_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs, mask=offs < n, other=0.0)
    tl.store(dst + offs, narrow(v, dst.dtype.element_ty), mask=offs < n)


def _narrowed(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full_like(v, float("nan"), dtype=dtype)
    _narrow_kernel[(triton.cdiv(v.numel(), 256),)](v, out, v.numel(), BLOCK=256)
    return out


def _specials(device) -> torch.Tensor:
    """Ties (to even, both ways), the halfway carry into the exponent, overflow to inf, zero, -0, subnormals, inf,
    NaN, then random values over a wide exponent range."""
    one = 1.0
    ties = [one + 2.0**-8, one + 3 * 2.0**-8, -(one + 2.0**-8), 2.0**-8 * (2 - 2.0**-8), 255.5 * 2.0**-7]
    edges = [
        float(torch.finfo(torch.bfloat16).max) * (1 + 2.0**-9),
        3.4e38,
        0.0,
        -0.0,
        1e-40,
        -3e-41,
        2.0**-126,
        math.inf,
        -math.inf,
        math.nan,
    ]
    g = torch.Generator(device="cpu").manual_seed(7)
    rand = (torch.rand(4000, generator=g) - 0.5) * torch.exp2(torch.randint(-130, 127, (4000,), generator=g).float())
    return torch.cat([torch.tensor(ties + edges), rand]).float().to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_rounds_as_torch_does(dtype, device):
    v = _specials(device)
    got, want = _narrowed(v, dtype), v.to(dtype)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def _integers(shape, device, lo=-8, hi=9, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g).to(torch.bfloat16).to(device)


def test_gemm_bf16_outputs_are_correctly_rounded_on_every_path(user_dir, device):
    """Integer operands make every fp32 sum exact, so each path's C must equal the float64 product rounded to bf16
    bit for bit (more than a tenth of C is over 256 and needs 9 or more bits). Under truncation about half of those
    would differ. (3, 29, 263) has K steps enough for the GEMV kernel to split K."""
    from gemmlab.device import target_for
    from gemmlab.ops import configs
    from gemmlab.ops.gemm import launch as gemm_launch

    rule = {"m": [0, 4], "tma": [0, 0], "config": {"path": "gemv"}}  # the GEMV path through this test's own rule
    (user_dir / f"{target_for(torch.device(device)).name}.json").write_text(json.dumps({"route": {"gemm": [rule]}}))
    configs.reload()
    gemm_launch.clear_cache()
    seen = set()
    for i, (m, n, k) in enumerate(((300, 72, 96), (8, 40, 512), (37, 53, 71), (3, 29, 71), (3, 29, 263))):
        a, b = _integers((m, k), device, seed=2 * i), _integers((k, n), device, seed=2 * i + 1)
        want = (a.double() @ b.double()).to(torch.bfloat16)
        assert (want.double().abs() > 256).float().mean() > 0.1  # enough of C is rounded for the test to mean much
        seen.add(gemmlab.plan(a, b).path)
        assert torch.equal(gemmlab.gemm(a, b), want), gemmlab.plan(a, b).path
    assert seen == set(gemmlab.paths()) - {"empty"}


def test_grouped_gemm_bf16_outputs_are_correctly_rounded(device):
    x, w = _integers((40, 96), device, seed=1), _integers((3, 48, 96), device, seed=2)
    offsets = torch.tensor([7, 7, 40], dtype=torch.int32, device=device)  # an empty expert in the middle
    want = torch.cat([x[:7].double() @ w[0].double().t(), x[7:].double() @ w[2].double().t()]).to(torch.bfloat16)
    assert torch.equal(gemmlab.grouped_gemm(x, w, offsets), want)


def test_moe_forward_bf16_rounds_each_stored_step_to_nearest(device):
    """The layer against a float64 emulation of its own steps (silu(gate) * up rounded to bf16, the down GEMM times
    the top-k weight rounded to bf16, the slots summed and rounded): its fp32 arithmetic may flip a rare rounding,
    truncation would flip most (the failure this guards: 2-3x the error of torch's own bf16 layer)."""
    torch.manual_seed(3)
    t, h, i, e, k = 48, 64, 32, 4, 2
    x = (torch.rand(t, h, device=device) * 2 - 1).to(torch.bfloat16)
    w1 = ((torch.rand(e, 2 * i, h, device=device) * 2 - 1) * 0.4).to(torch.bfloat16)
    w2 = ((torch.rand(e, h, i, device=device) * 2 - 1) * 0.5).to(torch.bfloat16)
    weights, ids = gemmlab.route(torch.randn(t, e, device=device), k)
    y = gemmlab.moe_forward(x, w1, w2, weights, ids).double()
    emu = torch.zeros(t, h, dtype=torch.float64, device=device)
    for ex in range(e):
        tok, slot = torch.nonzero(ids == ex, as_tuple=True)
        a = x[tok].double()
        act = torch.nn.functional.silu(a @ w1[ex, :i].double().t()) * (a @ w1[ex, i:].double().t())
        o = act.to(torch.bfloat16).double() @ w2[ex].double().t() * weights[tok, slot].double()[:, None]
        emu.index_add_(0, tok, o.to(torch.bfloat16).double())
    emu = emu.to(torch.bfloat16).double()
    ulp = torch.exp2(torch.floor(torch.log2(emu.abs().clamp_min(2.0**-100))) - 7)
    assert bool(((y - emu).abs() <= ulp).all())
    assert ((y != emu).double().mean().item()) < 0.02
