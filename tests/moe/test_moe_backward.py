"""The fused MoE backward (gemmlab.ops.moe.backward) against torch.autograd on the float32 loop of gemmlab.ref,
with the tolerance rule of the MoE tests (twice what torch's same-dtype loop misses, plus a few ulps of the
largest reference value). CPU interpreter at tiny sizes (the same tests run on a GPU). Legend: T tokens,
H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows."""

import functools

import pytest
import torch

import gemmlab
from gemmlab.ops.moe import backward as bwd
from gemmlab.ops.moe import config as moe_cfg
from gemmlab.ops.moe import moe_forward_saving, pack_moe_weights, route, sort_routes
from gemmlab.ops.moe import plan as moe_plan
from gemmlab.ref import grouped_gemm_ref, mantissa_bits, moe_check, moe_ref, moe_same_dtype
from tests.conftest import rand

DT = [torch.float16, torch.bfloat16]


def _leaf(t):
    return t.detach().clone().requires_grad_(True)


def _within(ours, ref, same, dtype, ulps=4, what=""):
    """|ours - ref| <= 2 |torch same dtype - ref| + ``ulps`` ulps of max |ref|. 4 ulps as in test_autograd.py:
    each gradient sums products of values rounded once more than in torch's composite (h, dgu, the expert rows
    of dx)."""
    ref = ref.float()
    torch_err = (same.float() - ref).abs().max().item()
    allowed = 2 * torch_err + ulps * 2.0 ** -mantissa_bits(dtype) * ref.abs().max().item()
    err = (ours.float() - ref).abs().max().item()
    assert torch.isfinite(ours).all() and err <= allowed, (what, err, allowed, torch_err)


def _problem(t, h, i, e, k, dtype, ids=None, seed=0, *, device):
    g = torch.Generator(device=device).manual_seed(seed)
    x = rand((t, h), dtype, seed=seed + 1)
    w1 = rand((e * 2 * i, h), dtype, seed=seed + 2).view(e, 2 * i, h)
    w2 = rand((e * h, i), dtype, seed=seed + 3).view(e, h, i)
    if ids is None:
        tw, ids = route(torch.randn((t, e), generator=g, device=device), k)
    else:
        tw = torch.rand(ids.shape, generator=g, device=device)
    return x, w1, w2, tw, ids, rand((t, h), dtype, seed=seed + 4)


def _check_grads(x, w1, w2, tw, ids, dy, forward=gemmlab.moe_forward):
    dtype = x.dtype
    ours = [_leaf(v) for v in (x, w1, w2, tw)]
    y = forward(*ours, ids)
    assert moe_check(y, x, w1, w2, tw, ids)["ok"]
    y.backward(dy)
    refs = [_leaf(v.float()) for v in (x, w1, w2, tw)]
    moe_ref(*refs, ids).backward(dy.float())
    same = [_leaf(v) for v in (x, w1, w2, tw)]
    moe_same_dtype(*same, ids).backward(dy)
    for name, o, r, sd in zip(("dx", "dw1", "dw2", "dtw"), ours, refs, same, strict=True):
        assert o.grad.dtype == o.dtype and o.grad.shape == o.shape, name
        _within(o.grad, r.grad, sd.grad, dtype, what=name)
    return [o.grad for o in ours]


CASES = [  # (T, H, I, E, k)
    (9, 48, 40, 4, 2),
    (11, 37, 21, 3, 2),  # odd H and I: pointer loads of the weights, masked tails
    (10, 32, 16, 4, 1),  # k = 1
    (6, 32, 16, 4, 4),  # k = E: every token on every expert
]


@pytest.mark.parametrize("save", [True, False])  # gate/up kept from the forward (the default), or recomputed
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize(("t", "h", "i", "e", "k"), CASES)
def test_moe_backward_matches_float32_autograd(dtype, t, h, i, e, k, save, device):
    _check_grads(
        *_problem(t, h, i, e, k, dtype, device=device),
        forward=functools.partial(gemmlab.moe_forward, save_gate_up=save),
    )


@pytest.mark.parametrize("dtype", DT)
def test_saving_forward_is_the_forward_and_keeps_gate_up(dtype, device):
    """The saving forward runs the forward's launches (y bit for bit) and stores gate/up (S, 2I) in routed
    order: x[token] W1_e^T in float32, rounded once."""
    x, w1, w2, tw, ids, _ = _problem(11, 37, 21, 3, 2, dtype, device=device)
    y, gate_up = moe_plan.launch_forward_saving(x, w1, w2, tw, ids, True)
    assert torch.equal(y, gemmlab.moe_forward(x, w1, w2, tw, ids))
    r = sort_routes(ids, 3, 16)
    want = torch.stack(
        [
            x[tok].float() @ w1[ids.view(-1)[p]].float().t()
            for p, tok in zip(r.order.tolist(), r.token.tolist(), strict=True)
        ]
    )
    assert gate_up.shape == (22, 42) and gate_up.stride(1) == 1
    torch.testing.assert_close(gate_up.float(), want, rtol=2.0 ** -mantissa_bits(dtype), atol=1e-6)
    assert torch.equal(moe_forward_saving(x, w1, w2, tw, ids), y)  # the public option


def test_saving_backward_refuses_a_wrong_gate_up(device):
    x, w1, w2, tw, ids, dy = _problem(4, 16, 16, 3, 2, torch.float16, device=device)
    with pytest.raises(ValueError, match="gate_up must be"):
        bwd.moe_backward(dy, x, w1, w2, tw, ids, gate_up=torch.zeros(8, 16, dtype=x.dtype, device=device))


@pytest.mark.parametrize("dtype", DT)
def test_moe_backward_uneven_load_and_empty_experts(dtype, device):
    t, h, i, e = 20, 32, 24, 5
    # expert 0 takes every token's first slot, experts 1 and 3 share the second unevenly; 2 and 4 get none
    ids = torch.stack([torch.zeros(t), torch.where(torch.arange(t) % 5 == 0, 3, 1)], 1).int().to(device)
    grads = _check_grads(*_problem(t, h, i, e, 2, dtype, ids=ids, device=device))
    for empty in (2, 4):  # an expert with no rows gets exactly zero weight gradients
        assert torch.equal(grads[1][empty], torch.zeros_like(grads[1][empty]))
        assert torch.equal(grads[2][empty], torch.zeros_like(grads[2][empty]))


def test_moe_backward_is_deterministic_and_reads_packed_weights(device):
    # odd: packing pads the weights' rows
    x, w1, w2, tw, ids, dy = _problem(13, 37, 21, 4, 2, torch.float16, device=device)
    first = bwd.moe_backward(dy, x, w1, w2, tw, ids)
    again = bwd.moe_backward(dy, x, w1, w2, tw, ids)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # fixed sum orders, no atomics
    p = pack_moe_weights(w1, w2)  # views with padded rows
    assert p.w1.stride(1) != w1.stride(1) and p.w2.stride(1) != w2.stride(1)
    packed = bwd.moe_backward(dy, x, p.w1, p.w2, tw, ids)  # weights through TMA now, not pointer loads
    for a, b in zip(first, packed, strict=True):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)
    assert all(g.is_contiguous() for g in packed)


def test_moe_backward_degenerate_and_bad_dy(device):
    x, w1, w2, tw, ids, dy = _problem(4, 16, 8, 3, 2, torch.float16, device=device)
    dx, dw1, dw2, dtw = bwd.moe_backward(dy[:0], x[:0], w1, w2, tw[:0], ids[:0])  # T = 0
    assert dx.shape == (0, 16) and dtw.shape == (0, 2) and not dw1.any() and not dw2.any()
    with pytest.raises(ValueError, match="dy must be a"):
        bwd.moe_backward(dy[:, :8], x, w1, w2, tw, ids)
    with pytest.raises(ValueError, match="dy must be a"):
        bwd.moe_backward(dy.float(), x, w1, w2, tw, ids)


@pytest.mark.parametrize(("p_gather", "q_gather"), [(True, False), (False, True), (False, False)])
def test_weight_grad_with_gathered_rows(p_gather, q_gather, device):
    t, m, n, e, k = 7, 24, 20, 4, 2
    ids = torch.tensor([[0, 2], [2, 0], [0, 2], [3, 0], [0, 2], [2, 3], [0, 0]], dtype=torch.int32, device=device)
    r = sort_routes(ids, e, 16)  # expert 1 has no rows
    s = t * k
    p = rand((t if p_gather else s, m), seed=5)
    q = rand((t if q_gather else s, n), seed=6)
    out = torch.full((e, m, n), float("nan"), dtype=torch.float16, device=device)  # poisoned
    bwd.weight_grad(
        p,
        r.token if p_gather else None,
        q,
        r.token if q_gather else None,
        r.offsets,
        out,
        moe_cfg.MoEBackwardConfig(wg_block_m=16, wg_block_n=16, wg_block_k=16),
    )
    ps = p[r.token.long()] if p_gather else p
    qs = q[r.token.long()] if q_gather else q
    ends = [0] + r.offsets.tolist()
    for ex in range(e):
        want = ps[ends[ex] : ends[ex + 1]].float().t() @ qs[ends[ex] : ends[ex + 1]].float()
        torch.testing.assert_close(out[ex].float(), want, atol=2e-3, rtol=2e-3)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize(("n", "k"), [(24, 32), (21, 19)])  # odd: pointer loads of w and dy
def test_grouped_gemm_grads_on_the_backward_kernels(n, k, device):
    s = 20
    offsets = torch.tensor([5, 5, 17], dtype=torch.int32, device=device)  # an empty group; rows 17.. in none
    x, w = _leaf(rand((s, k))), _leaf(rand((3 * n, k)).view(3, n, k))
    dy = rand((s, n))
    gemmlab.grouped_gemm(x, w, offsets).backward(dy)
    x32, w32 = _leaf(x.detach().float()), _leaf(w.detach().float())
    grouped_gemm_ref(x32, w32, offsets).backward(dy.float())
    torch.testing.assert_close(w.grad.float(), w32.grad, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(x.grad.float(), x32.grad, atol=2e-3, rtol=2e-3)
    assert torch.equal(x.grad[17:], torch.zeros_like(x.grad[17:]))


def test_frozen_experts_skip_the_weight_gradients(device):
    x, w1, w2, tw, ids, dy = _problem(5, 16, 16, 3, 2, torch.float16, device=device)
    full = bwd.moe_backward(dy, x, w1, w2, tw, ids)
    dx, dw1, dw2, dtw = bwd.moe_backward(dy, x, w1, w2, tw, ids, need_w1=False, need_w2=False)
    assert dw1.shape == (0,) and dw2.shape == (0,)
    assert torch.equal(dx, full[0]) and torch.equal(dtw, full[3])
    lx, ltw = _leaf(x), _leaf(tw)  # through autograd: weights that do not require grad get none
    gx, gtw = torch.autograd.grad(gemmlab.moe_forward(lx, w1, w2, ltw, ids, save_gate_up=False), (lx, ltw), dy)
    assert torch.equal(gx, full[0]) and torch.equal(gtw, full[3])
    gate_up = moe_plan.launch_forward_saving(x, w1, w2, tw, ids, False)[1]  # and after the saving forward
    saved = bwd.moe_backward(dy, x, w1, w2, tw, ids, need_w1=False, need_w2=False, gate_up=gate_up)
    gx, gtw = torch.autograd.grad(gemmlab.moe_forward(lx, w1, w2, ltw, ids, save_gate_up=True), (lx, ltw), dy)
    assert torch.equal(gx, saved[0]) and torch.equal(gtw, saved[3])
    torch.library.opcheck(
        torch.ops.gemmlab.moe_backward,
        (dy, x, w1, w2, tw, ids, True, False, None),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_launches_drop_pipeline_stages_that_do_not_fit(monkeypatch, device):
    """A config whose stages overflow shared memory (OutOfResources when compiling) runs with fewer stages."""
    from triton.runtime.errors import OutOfResources

    real = bwd.kept_launch.start
    asked = []

    def start(cache, kernel, grid, args, consts, opts):
        asked.append(opts.get("num_stages"))
        if opts.get("num_stages", 0) > 2:
            raise OutOfResources(300000, 232448, "shared memory")
        return real(cache, kernel, grid, args, consts, opts)

    monkeypatch.setattr(bwd.kept_launch, "start", start)
    monkeypatch.setattr(bwd, "STAGES", {})
    x, w1, w2, tw, ids, dy = _problem(5, 16, 16, 3, 2, torch.float16, device=device)
    got = bwd.moe_backward(dy, x, w1, w2, tw, ids)
    monkeypatch.setattr(bwd.kept_launch, "start", real)
    assert all(torch.equal(a, b) for a, b in zip(got, bwd.moe_backward(dy, x, w1, w2, tw, ids), strict=True))
    assert 3 in asked and 2 in asked and set(bwd.STAGES.values()) == {2}
    never = moe_cfg.MoEBackwardConfig(wg_stages=1)
    monkeypatch.setattr(bwd.kept_launch, "start", lambda *a: (_ for _ in ()).throw(OutOfResources(1, 0, "smem")))
    with pytest.raises(OutOfResources):
        bwd.weight_grad(
            x,
            None,
            x,
            None,
            torch.tensor([5], dtype=torch.int32, device=device),
            torch.empty((1, 16, 16), dtype=x.dtype, device=device),
            never,
        )


def test_saving_forward_drops_pipeline_stages_that_do_not_fit(monkeypatch, device):
    """Storing gate/up beside the first GEMM's epilogue needs shared memory for the stores: a config whose stages
    then overflow it (OutOfResources when compiling) runs with fewer, remembered in the saving plan."""
    from dataclasses import replace

    from triton.runtime.errors import OutOfResources

    from gemmlab.ops import cache, launch

    real = launch.fire
    asked = []

    def fire(p, args, direct):
        if p.consts.get("SAVE_PRE"):
            asked.append(p.opts["num_stages"])
            if p.opts["num_stages"] > 2:
                raise OutOfResources(300000, 232448, "shared memory")
        return real(p, args, direct)

    x, w1, w2, tw, ids, _ = _problem(5, 16, 16, 3, 2, torch.float16, device=device)
    monkeypatch.setattr(moe_plan, "PLANS", cache.Bounded("moe_forward (test)"))
    real_config = moe_plan.moe_config
    monkeypatch.setattr(moe_plan, "moe_config", lambda *a, **kw: replace(real_config(*a, **kw), num_stages=4))
    monkeypatch.setattr(launch, "fire", fire)
    y, gate_up = moe_plan.launch_forward_saving(x, w1, w2, tw, ids, True)
    assert asked == [4, 3, 2]
    moe_plan.launch_forward_saving(x, w1, w2, tw, ids, True)
    assert asked == [4, 3, 2, 2]  # remembered
    monkeypatch.undo()
    assert torch.equal(y, gemmlab.moe_forward(x, w1, w2, tw, ids))
