"""moe_forward's eager hot path (CPU interpreter; the same tests run on a GPU): the per-signature plan cache, its
scratch layout, and the eager autograd path that skips the dispatcher. Legend: T tokens, H hidden, I expert
intermediate, E experts, k top-k."""

import pytest
import torch

from gemmlab.ops import cache, launch
from gemmlab.ops import configs as config_tables
from gemmlab.ops.moe import moe_forward
from gemmlab.ops.moe import plan as moe_plan
from gemmlab.ops.moe import steps as moe_steps
from gemmlab.ref import moe_check
from tests.moe.test_moe import _r, _routing, _weights


@pytest.fixture
def plans(monkeypatch):
    monkeypatch.setattr(moe_plan, "PLANS", cache.Bounded("moe_forward (test)"))
    return moe_plan.PLANS


def test_a_hit_skips_the_checks_and_gives_the_same_y(plans, monkeypatch, device):
    x = _r(9, 48, device=device)
    w1, w2 = _weights(4, 48, 40, torch.float16, device=device)
    wts, ids = _routing(9, 4, 2, device=device)
    checks = []
    real = moe_steps.check_moe_args
    monkeypatch.setattr(moe_steps, "check_moe_args", lambda *a: checks.append(1) or real(*a))
    first = moe_forward(x, w1, w2, wts, ids)
    assert moe_check(first, x, w1, w2, wts, ids)["ok"] and len(plans) == 1 and len(checks) == 1
    for _ in range(2):
        assert torch.equal(moe_forward(x, w1, w2, wts, ids), first)
    assert len(checks) == 1  # the key proved them
    x2 = _r(9, 48, seed=5, device=device)  # same signature, new values: the plan serves it
    assert moe_check(moe_forward(x2, w1, w2, wts, ids), x2, w1, w2, wts, ids)["ok"] and len(plans) == 1
    moe_forward(x, w1, w2, wts, ids, gather="fused")  # another decision: another plan
    moe_forward(x, w1, w2, wts, ids, validate=False)
    assert len(plans) == 3 and len(checks) == 3


@pytest.mark.cpu_only("on a GPU the check is a device-side assert (tests/ops/test_host_gpu.py)")
def test_a_hit_still_validates_the_ids(plans, device):
    x = _r(9, 32, device=device)
    w1, w2 = _weights(4, 32, 16, torch.float16, device=device)
    wts, ids = _routing(9, 4, 2, device=device)
    moe_forward(x, w1, w2, wts, ids)
    for bad in (4, -1):
        ids_bad = ids.clone()
        ids_bad[2, 1] = bad
        with pytest.raises(ValueError, match=r"topk_ids must be in \[0, E=4\)"):
            moe_forward(x, w1, w2, wts, ids_bad)
    assert len(plans) == 1
    moe_forward(x, w1, w2, wts, ids_bad, validate=False)  # no check asked for: none fires


def test_the_cache_is_bounded_and_cleared_by_a_config_reload(plans, monkeypatch, device):
    """One plan per signature and option in one LRU cache of ``cache.bounded``'s kind: at its bound the least
    recently used plan goes (a hit counts as a use); a config reload empties it."""
    monkeypatch.setattr(moe_plan, "PLANS", cache.Bounded("moe_forward (test)", 2))
    plans = moe_plan.PLANS
    w1, w2 = _weights(4, 32, 16, torch.float16, device=device)
    calls = {t: (_r(t, 32, device=device), w1, w2, *_routing(t, 4, 2, device=device)) for t in (3, 4, 5)}
    made = []
    for t in (3, 4):
        moe_forward(*calls[t])
        made.append(next(p for p in plans.values() if not any(p is q for q in made)))
    moe_forward(*calls[3])  # a hit: T=3 is now the most recently used
    moe_forward(*calls[5])
    assert len(plans) == 2 and not any(p is made[1] for p in plans.values())  # T=4 went, not T=3
    assert any(p is made[0] for p in plans.values())
    assert moe_check(moe_forward(*calls[4]), *calls[4])["ok"] and len(plans) == 2  # evicted: planned again, right
    moe_forward(*calls[4], save_gate_up=True)  # no gradient needed: the plain body, one plan
    y, gate_up = moe_plan.launch_forward_saving(*calls[4], True)  # the saving option: a plan of its own
    assert len(plans) == 2 and any(p.save for p in plans.values()) and torch.equal(y, moe_forward(*calls[4]))
    config_tables.reload()
    assert not plans
    assert moe_plan.PLANS is plans and "moe_forward" in cache.caches()


@pytest.mark.parametrize("layout", ["x strided", "x unaligned", "ids strided", "w1 strided", "odd"])
def test_plans_of_unusual_layouts(layout, plans, device):
    """Layouts the plan copies or passes differently (x rows not unit-stride, x off 16-byte alignment, strided
    routing tensors, weights not in the (E * N_w, K) layout, odd H and I): right on the first call and on hits."""
    t, h, i, e, k = 7, 48, 40, 4, 2
    if layout == "odd":
        h, i = 37, 21
    x, (w1, w2) = _r(t, h, device=device), _weights(e, h, i, torch.float16, device=device)
    wts, ids = _routing(t, e, k, device=device)
    if layout == "x strided":
        x = x.t().contiguous().t()
    elif layout == "x unaligned":
        x = _r(t * h + 1, device=device)[1:].view(t, h)
    elif layout == "ids strided":
        wts, ids = torch.cat([wts, wts], 1)[:, ::2], torch.cat([ids, ids], 1)[:, ::2]
    elif layout == "w1 strided":
        w1 = torch.cat([w1, w1], 0)[::2]
    for _ in range(2):
        assert moe_check(moe_forward(x, w1, w2, wts, ids), x, w1, w2, wts, ids)["ok"], layout
    assert len(plans) == 1


def test_scratch_regions_are_aligned_and_disjoint(plans, device):
    x = _r(9, 37, device=device)
    w1, w2 = _weights(4, 37, 21, torch.float16, device=device)
    wts, ids = _routing(9, 4, 2, device=device)
    moe_forward(x, w1, w2, wts, ids, gather="copy")
    p = next(iter(plans.values()))
    ends = []
    for r in p.regions:
        size = (r.shape[0] * r.strides[0] if r.shape[0] else 0) * torch.empty((), dtype=r.dtype).element_size()
        assert r.offset % moe_steps.ALIGN == 0, r
        ends.append((r.offset, r.offset + size))
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False)) and ends[-1][1] <= p.nbytes
    act = next(r for r in p.regions if r.name == "act")
    assert act.strides[0] * 2 % 16 == 0 and act.shape == (18, 21)  # rows padded to 16 bytes (TMA)


@pytest.mark.parametrize("save", [True, False])
def test_eager_autograd_path_matches_the_custom_op(plans, save, device):
    """A plain eager call that needs a gradient goes through custom.MoEForwardSaving (gate/up kept) or
    custom.MoEForward (recomputed), no dispatcher: y and every gradient bit for bit those of
    torch.ops.gemmlab.moe_forward_saving / moe_forward."""
    t, h, i, e, k = 6, 32, 16, 4, 2
    x0, (w10, w20) = _r(t, h, device=device), _weights(e, h, i, torch.float16, device=device)
    wts0, ids = _routing(t, e, k, device=device)
    dy = _r(t, h, seed=9, device=device)
    got = []
    for path in ("eager", "op"):
        x, w1, w2, wts = (v.clone().requires_grad_(True) for v in (x0, w10, w20, wts0))
        if path == "eager":
            y = moe_forward(x, w1, w2, wts, ids, save_gate_up=save)
            assert type(y.grad_fn).__name__ == ("MoEForwardSavingBackward" if save else "MoEForwardBackward")
        elif save:
            y = torch.ops.gemmlab.moe_forward_saving(x, w1, w2, wts, ids, True, "auto")[0]
        else:
            y = torch.ops.gemmlab.moe_forward(x, w1, w2, wts, ids, True, "auto")
        y.backward(dy)
        got.append((y.detach(), x.grad, w1.grad, w2.grad, wts.grad))
    for a, b in zip(*got, strict=True):
        assert torch.equal(a, b)
    assert launch.eager(x0) and not launch.eager(torch.nn.Parameter(x0).as_subclass(_Sub))


class _Sub(torch.Tensor):
    pass
