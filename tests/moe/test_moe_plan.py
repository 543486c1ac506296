"""The MoE forward's one plan (``ops.moe.plan``): the plain, gate/up-saving and FP8 bodies are options of one plan
per signature, in one bounded LRU cache. Every option right against ``gemmlab.ref`` with every buffer the launcher
allocates NaN-poisoned (gather variants, T = 0, H = 0, I = 0 bodies included); one full argument check per new
signature and option, a cheap ids re-check on hits; the plans bounded over many token counts; the modules a
repeat call passes through. CPU interpreter at tiny sizes (the same tests run on a GPU). Legend: T tokens,
H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows."""

import os
import sys

import pytest
import torch

import gemmlab
from gemmlab.ops import cache
from gemmlab.ops.fp8 import moe_launch as moe_fp8_launch
from gemmlab.ops.moe import backward as moe_backward
from gemmlab.ops.moe import plan as moe_plan
from gemmlab.ops.moe import routing as moe_routing
from gemmlab.ref import moe_check, moe_fp8_check
from tests.moe.test_moe import _r, _routing, _weights


@pytest.fixture
def plans(monkeypatch):
    monkeypatch.setattr(moe_plan, "PLANS", cache.Bounded("moe_forward (test)"))
    return moe_plan.PLANS


@pytest.fixture
def checks(monkeypatch):
    """How often the full check of a new signature runs."""
    seen = []
    real = moe_plan.check
    monkeypatch.setattr(moe_plan, "check", lambda *a: seen.append(1) or real(*a))
    return seen


def _poison(monkeypatch):
    """Every floating buffer torch.empty hands out starts as NaN (e4m3 aside): a row left unwritten shows in y."""
    real = torch.empty

    def empty(*args, **kw):
        t = real(*args, **kw)
        return t.fill_(float("nan")) if t.dtype.is_floating_point and t.dtype != torch.float8_e4m3fn else t

    monkeypatch.setattr(torch, "empty", empty)


def _bf16_problem(t, h, i, e, k, device):
    x = _r(t, h, dtype=torch.bfloat16, seed=3, device=device)
    w1, w2 = (w / 4 for w in _weights(e, h, i, torch.bfloat16, seed=5, device=device))
    wts, ids = _routing(t, e, k, device=device)
    return x, w1, w2, wts, ids


def test_every_option_is_one_plan_checked_once_and_right(plans, checks, monkeypatch, device):
    """Plain (both gathers), saving and FP8: one plan and one full check each; hits give the same y; each y within
    the reference's bound on poisoned buffers; the saving body's y is the plain one's bit for bit."""
    x, w1, w2, wts, ids = _bf16_problem(7, 32, 16, 4, 2, device)
    packed = gemmlab.pack_moe_fp8(w1, w2)
    calls = {
        "copy": lambda: moe_plan.launch_moe_forward(x, w1, w2, wts, ids, True, "copy", None),
        "fused": lambda: moe_plan.launch_moe_forward(x, w1, w2, wts, ids, True, "fused", None),
        "saving": lambda: moe_plan.launch_forward_saving(x, w1, w2, wts, ids, True, "auto"),
        "fp8": lambda: moe_plan.launch_moe_forward_fp8(
            x, packed.w1, packed.w1_scale, packed.w2, packed.w2_scale, wts, ids, True
        ),
    }
    got = {}
    with monkeypatch.context() as m:
        _poison(m)
        for name, call in calls.items():
            first = call()
            again = call()
            got[name] = first
            for a, b in zip(
                first if isinstance(first, tuple) else (first,),
                again if isinstance(again, tuple) else (again,),
                strict=True,
            ):
                assert torch.equal(a, b), name
    assert len(plans) == 4 and len(checks) == 4
    assert sorted((p.save, any("w1_scale" in st.args for st in p.steps)) for p in plans.values()) == [
        (False, False),
        (False, False),
        (False, True),
        (True, False),
    ]
    for name in ("copy", "fused"):
        assert moe_check(got[name], x, w1, w2, wts, ids)["ok"], name
    y, gate_up = got["saving"]
    assert torch.equal(y, moe_plan.launch_moe_forward(x, w1, w2, wts, ids, True, "auto", None))
    assert gate_up.shape == (14, 32) and bool(torch.isfinite(gate_up).all())
    chk = moe_fp8_check(got["fp8"], x, packed, wts, ids)
    assert chk["ok"], chk


@pytest.mark.parametrize("option", ["plain", "saving", "fp8"])
def test_edge_bodies(option, plans, monkeypatch, device):
    """T = 0 (nothing planned), H = 0 (y holds nothing) and I = 0 (y is zero; the saved gate/up too), each on
    poisoned buffers; H = 0 and I = 0 still check the ids (CPU: at once)."""
    for t, h, i in ((0, 32, 16), (5, 0, 16), (5, 32, 0)):
        if option == "fp8" and h == 0:
            continue  # e4m3 experts need H % 16 == 0 and a TMA row: (E, 2I, 0) packs to nothing to read
        x, w1, w2, wts, ids = _bf16_problem(t, h, i, 4, 2, device)
        if option == "fp8":
            p = gemmlab.pack_moe_fp8(w1, w2)
            run = lambda ids, p=p, x=x, wts=wts: moe_plan.launch_moe_forward_fp8(  # noqa: E731
                x, p.w1, p.w1_scale, p.w2, p.w2_scale, wts, ids, True
            )
        elif option == "saving":
            run = lambda ids, x=x, w1=w1, w2=w2, wts=wts: moe_plan.launch_forward_saving(  # noqa: E731
                x, w1, w2, wts, ids, True
            )
        else:
            run = lambda ids, x=x, w1=w1, w2=w2, wts=wts: moe_plan.launch_moe_forward(  # noqa: E731
                x, w1, w2, wts, ids, True, "auto", None
            )
        with monkeypatch.context() as m:
            _poison(m)
            out = run(ids)
        y, gate_up = out if option == "saving" else (out, None)
        assert y.shape == (t, h) and torch.equal(y, torch.zeros_like(y)), (option, t, h, i)
        if gate_up is not None:
            assert gate_up.shape == (t * 2, 2 * i) and torch.equal(gate_up, torch.zeros_like(gate_up))
        if t and option != "fp8" or t and i == 0:
            bad = ids.clone()
            bad[1, 0] = 4
            if device == "cpu":
                with pytest.raises(ValueError, match=r"topk_ids must (be|lie) in \[0, E=4\)"):
                    run(bad)
    assert len(plans) == (1 if option == "fp8" else 2)  # T = 0 plans nothing


@pytest.mark.cpu_only("on a GPU the ids check is a device-side assert (tests/ops/test_host_gpu.py)")
@pytest.mark.parametrize("option", ["saving", "fp8"])
def test_a_hit_still_validates_the_ids(option, plans, checks, device):
    x, w1, w2, wts, ids = _bf16_problem(6, 32, 16, 4, 2, device)
    if option == "fp8":
        p = gemmlab.pack_moe_fp8(w1, w2)
        run = lambda ids: moe_plan.launch_moe_forward_fp8(  # noqa: E731
            x, p.w1, p.w1_scale, p.w2, p.w2_scale, wts, ids, True
        )
    else:
        run = lambda ids: moe_plan.launch_forward_saving(x, w1, w2, wts, ids, True)  # noqa: E731
    run(ids)
    for bad in (4, -1):
        ids_bad = ids.clone()
        ids_bad[2, 1] = bad
        with pytest.raises(ValueError, match=r"topk_ids must (be|lie) in \[0, E=4\)"):
            run(ids_bad)
    assert len(plans) == 1 and len(checks) == 1  # the key proved the rest


def test_plans_stay_bounded_over_many_token_counts(monkeypatch, device):
    """One plan per distinct T (a server sees every T): at most the bound is kept, least recently used out. The
    kept-kernel caches the MoE launches fill are bounded caches of the same kind."""
    monkeypatch.setattr(moe_plan, "PLANS", cache.Bounded("moe_forward (test)", 4))
    w1, w2 = _weights(2, 16, 0, torch.float16, device=device)  # I = 0: routing and a zero y, quick to run
    for t in range(1, 41):
        wts, ids = _routing(t, 2, 1, device=device)
        y = gemmlab.moe_forward(_r(t, 16, device=device), w1, w2, wts, ids)
        assert y.shape == (t, 16) and len(moe_plan.PLANS) <= 4
    assert len(moe_plan.PLANS) == 4
    known = cache.caches()
    for name, c in (
        ("moe_routing.kept", moe_routing.KEPT),
        ("moe_backward.kept", moe_backward.KEPT),
        ("moe_fp8.kept", moe_fp8_launch.KEPT),
    ):
        assert known[name] is c and len(c) <= c.size
    assert "moe_forward" in known


def test_a_repeat_call_passes_through_four_ops_modules(plans, device):
    """The path of ``moe_forward(x)`` once its signature is planned: ops/moe/api.py (the public call), ops/cache.py
    (the plan's lookup), ops/moe/plan.py (its launches) and ops/launch.py (is the call eager? then the kept
    kernel's launcher), then the kernels: at most four modules; no argument check, no routing or grouped-launch
    module."""
    x, w1, w2, wts, ids = _bf16_problem(5, 32, 16, 4, 2, device)
    gemmlab.moe_forward(x, w1, w2, wts, ids)
    src = os.path.dirname(gemmlab.__file__)
    entered = set()

    def profile(frame, event, arg):
        f = frame.f_code.co_filename
        if event == "call" and f.startswith(src):
            entered.add(os.path.relpath(f, src).replace(os.sep, "/"))

    sys.setprofile(profile)
    try:
        gemmlab.moe_forward(x, w1, w2, wts, ids)
    finally:
        sys.setprofile(None)
    ops = {f for f in entered if not f.startswith("kernels/")}
    assert ops == {"ops/moe/api.py", "ops/cache.py", "ops/moe/plan.py", "ops/launch.py"}, ops
    assert len(ops) <= 4


def test_fp8_scales_alignment_is_part_of_the_signature(plans, device):
    """A kept kernel is specialized on its pointers' 16-byte alignment: weight scales of the same shapes at an
    address off 16 bytes get a plan of their own (and a right y), not the aligned one's."""
    x, w1, w2, wts, ids = _bf16_problem(5, 32, 16, 4, 2, device)
    p = gemmlab.pack_moe_fp8(w1, w2)
    y = moe_plan.launch_moe_forward_fp8(x, p.w1, p.w1_scale, p.w2, p.w2_scale, wts, ids, True)
    off = torch.empty(p.w1_scale.numel() + 1, dtype=torch.float32, device=device)[1:].view(p.w1_scale.shape)
    off.copy_(p.w1_scale)
    assert off.data_ptr() % 16 == 4
    y_off = moe_plan.launch_moe_forward_fp8(x, p.w1, off, p.w2, p.w2_scale, wts, ids, True)
    assert len(plans) == 2 and torch.equal(y, y_off) and moe_fp8_check(y, x, p, wts, ids)["ok"]
