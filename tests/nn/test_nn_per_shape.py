"""gemmlab.nn.Linear's per-shape choice between gemmlab's GEMM and torch's (gemmlab.nn.per_shape), on the CPU with an
injected timer so that every choice is deterministic: which wins, once per key, the cache file (atomic, per device
and versions, a malformed one left alone), the output check, and no measuring while tracing or capturing.
Legend: M rows, N out_features, K in_features. Real timings on the H200: tests/nn/test_nn_gpu.py."""

import json
import os

import pytest
import torch

import gemmlab
import gemmlab.nn as gnn
from gemmlab.nn import linear as nn_linear
from gemmlab.nn import per_shape
from gemmlab.ops import gemm as ops_gemm

BF16 = torch.bfloat16


class FakeTimer:
    """Seconds per call as a function of the output's shape (read off one run of each candidate), and a log of
    the (M, N) each measurement saw."""

    def __init__(self, seconds):
        self.seconds, self.seen = seconds, []

    def __call__(self, run):
        shapes = {name: tuple(fn().shape) for name, fn in run.items()}
        assert set(shapes) == {"gemmlab", "torch"} and len(set(shapes.values())) == 1
        self.seen.append(shapes["torch"])
        return {name: self.seconds(name, *shapes[name]) for name in run}


@pytest.fixture
def timer(user_dir):
    """A fake timer on which gemmlab is faster when N is a multiple of 16, slower otherwise."""
    t = FakeTimer(lambda name, m, n: 1e-6 * (1 if (name == "gemmlab") == (n % 16 == 0) else 2))
    per_shape.set_timer(t)
    yield t
    per_shape.set_timer(None)


@pytest.fixture
def gemm_calls(monkeypatch):
    """Calls that reach gemmlab.gemm from a forward (the measurement's own calls are counted too)."""
    calls = []
    real = gemmlab.gemm
    monkeypatch.setattr(ops_gemm, "gemm", lambda a, b, **kw: calls.append(tuple(a.shape)) or real(a, b, **kw))
    return calls


def _linear(k, n, bias=True, dtype=BF16, *, device):
    torch.manual_seed(k * n)
    return gnn.Linear(k, n, bias=bias, device=device, dtype=dtype)


def _x(m, k, dtype=BF16, *, device):
    return torch.randn(m, k, device=device, dtype=dtype)


def _is_linear(y, mod, x):
    """y is mod(x) within 2x torch's own error against float64, plus one ulp (either path may have run)."""
    ref = x.double() @ mod.weight.double().t() + mod.bias.double()
    theirs = torch.nn.functional.linear(x, mod.weight, mod.bias)
    err, torch_err = (y.double() - ref).abs().max().item(), (theirs.double() - ref).abs().max().item()
    assert err <= 2 * torch_err + 2.0**-8 * ref.abs().max().item(), (err, torch_err)


def test_picks_torch_where_gemmlab_is_slower_and_gemmlab_where_faster(timer, gemm_calls, device):
    # N = 32: gemmlab faster; N = 40: slower (the fake timer)
    fast, slow = _linear(24, 32, device=device), _linear(24, 40, device=device)
    x = _x(5, 24, device=device)
    for mod in (fast, slow):
        _is_linear(mod(x), mod, x)
    assert [c["impl"] for c in fast.choices()] == ["gemmlab"] and [c["impl"] for c in slow.choices()] == ["torch"]
    c = fast.choices()[0]
    assert (c["m_bucket"], c["n"], c["k"], c["dtype"], c["layout"], c["bias"], c["source"]) == (
        8,
        32,
        24,
        "bfloat16",
        "x:row w:row",
        True,
        "measured",
    )
    assert (c["gemmlab_us"], c["torch_us"]) == (1.0, 2.0)
    gemm_calls.clear()
    fast(x)
    slow(x)
    assert gemm_calls == [(5, 24)]  # after the choice: the fast shape on gemmlab, the slow one on torch


def test_measures_once_per_key(timer, device):
    mod = _linear(24, 32, device=device)
    for m in (5, 7, 8):  # one M bucket (<= 8)
        mod(_x(m, 24, device=device))
    assert timer.seen == [(5, 32)]
    mod(_x(9, 24, device=device))  # the next bucket
    mod(_x(3, 24, device=device).t().contiguous().t())  # x's rows strided: another layout
    mod.float()(_x(5, 24, torch.float32, device=device))  # fp32 runs F.linear: nothing to choose
    _linear(24, 32, bias=False, device=device)(_x(5, 24, device=device))  # no bias: another key
    assert timer.seen == [(5, 32), (9, 32), (3, 32), (5, 32)]
    assert {(c["m_bucket"], c["layout"], c["bias"]) for c in gnn.choices()} == {
        (8, "x:row w:row", True),
        (16, "x:row w:row", True),
        (4, "x:col w:row", True),
        (8, "x:row w:row", False),
    }


def test_choices_persist_atomically_and_load_back(timer, user_dir, monkeypatch, device):
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: replaced.append((src, dst)) or real_replace(src, dst))
    _linear(24, 32, device=device)(_x(5, 24, device=device))
    _linear(24, 40, device=device)(_x(5, 24, device=device))
    path = per_shape.choices_file()
    assert path.parent == user_dir and path.is_file()
    assert [(os.path.dirname(s), str(d)) for s, d in replaced] == [(str(user_dir), str(path))] * 2  # temp file beside
    assert sorted(p.name for p in user_dir.iterdir()) == [path.name]  # no temp file left
    stored = json.loads(path.read_text())["choices"]
    ((env, entries),) = stored.items()
    assert "torch " in env and "gemmlab " in env
    assert sorted(e["impl"] for e in entries.values()) == ["gemmlab", "torch"]
    per_shape.forget()  # a new process: the file is read back, nothing measured again
    timer.seen.clear()
    _linear(24, 32, device=device)(_x(6, 24, device=device))
    _linear(24, 40, device=device)(_x(6, 24, device=device))
    assert timer.seen == [] and {c["source"] for c in gnn.choices()} == {"cached"}
    assert {(c["n"], c["impl"]) for c in gnn.choices()} == {(32, "gemmlab"), (40, "torch")}


def test_choices_of_another_device_or_version_are_not_used(timer, monkeypatch, device):
    _linear(24, 32, device=device)(_x(5, 24, device=device))
    per_shape.forget()
    monkeypatch.setattr(per_shape, "_env", lambda device: "another GPU | torch 9 | triton 9 | gemmlab 9")
    timer.seen.clear()
    _linear(24, 32, device=device)(_x(5, 24, device=device))
    assert timer.seen == [(5, 32)]
    assert len(json.loads(per_shape.choices_file().read_text())["choices"]) == 2  # both kept, apart


def test_a_malformed_choices_file_warns_and_is_left_alone(timer, device):
    path = per_shape.choices_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="ignoring .*linear-choices.json"):
        _linear(24, 32, device=device)(_x(5, 24, device=device))
    assert timer.seen == [(5, 32)] and path.read_text() == "{not json"
    assert gnn.choices()[0]["source"] == "measured"  # the choice holds in memory


@pytest.mark.parametrize("wrong", ["off", "nan"])
def test_gemmlab_output_checked_before_timing(timer, monkeypatch, wrong, device):
    """A gemmlab result that differs from torch's (or is NaN where torch's is finite) in one element of the last
    block the check reads chooses torch, loudly, without timing."""
    monkeypatch.setattr(per_shape, "CHECK_BLOCK", 48)  # blocks of 2 rows of x and of w (K = 24)
    real = nn_linear.CANDIDATES["gemmlab"]

    def broken(x2, w, b):
        y = real(x2, w, b).clone()
        y[-1, -1] = y[-1, -1] + 1.0 if wrong == "off" else float("nan")
        return y

    monkeypatch.setitem(nn_linear.CANDIDATES, "gemmlab", broken)
    mod = _linear(24, 32, device=device)
    x = _x(5, 24, device=device)
    with pytest.warns(RuntimeWarning, match="gemmlab's output differs from torch's .* torch runs it"):
        y = mod(x)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, mod.weight, mod.bias), rtol=0, atol=0)  # torch's
    (c,) = mod.choices()
    assert (c["impl"], c["source"], timer.seen) == ("torch", "mismatch", [])


def test_gemmlab_failure_chooses_torch(timer, monkeypatch, device):
    def fails(x2, w, b):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setitem(nn_linear.CANDIDATES, "gemmlab", fails)
    mod = _linear(24, 32, device=device)
    with pytest.warns(RuntimeWarning, match="gemmlab failed .*no kernel for this shape"):
        mod(_x(5, 24, device=device))
    assert mod.choices()[0]["source"] == "error" and mod.choices()[0]["impl"] == "torch"
    assert not per_shape.choices_file().exists()  # kept in memory only: the next process measures again


def test_nothing_measured_during_cuda_graph_capture(timer, monkeypatch, gemm_calls, device):
    monkeypatch.setattr(per_shape, "_capturing", lambda device: True)
    _linear(24, 40, device=device)(_x(5, 24, device=device))
    assert timer.seen == [] and gnn.choices() == []
    assert gemm_calls == [(5, 24)]  # the documented default on the CPU: gemmlab


def test_the_cpu_without_a_timer_runs_gemmlab_unmeasured(user_dir, gemm_calls, device):
    per_shape.set_timer(None)
    _linear(24, 40, device=device)(_x(5, 24, device=device))
    assert gemm_calls == [(5, 24)] and gnn.choices() == []
    assert not per_shape.choices_file().exists()


def _compiled_runs_gemmlab(mod, x) -> bool:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    _is_linear(torch.compile(mod, fullgraph=True, backend=backend)(x), mod, x)
    (gm,) = graphs
    return any("gemmlab" in str(node.target) for node in gm.graph.nodes)


def test_tracing_uses_the_cached_choice_and_never_measures(user_dir, monkeypatch, device):
    """Under torch.compile: no timer call; the choice of (N, K, dtype, layout, bias) baked into the graph, gemmlab
    only where every measured M bucket chose it; the default (gemmlab on the CPU) where none was measured."""
    per_shape.set_timer(lambda run: pytest.fail("measured while tracing"))
    try:
        mod, x = _linear(24, 40, device=device), _x(5, 24, device=device)
        assert _compiled_runs_gemmlab(mod, x)  # nothing cached: the CPU default
        key = per_shape.key_of(x, mod.weight, True)
        per_shape._CHOICES[key] = per_shape.Choice("torch", "measured")
        assert not _compiled_runs_gemmlab(mod, x)
        per_shape._CHOICES[key] = per_shape.Choice("gemmlab", "measured")
        per_shape._CHOICES[(1, *key[1:])] = per_shape.Choice("torch", "measured")  # M = 1 loses
        assert not _compiled_runs_gemmlab(mod, x)
        per_shape._CHOICES[(1, *key[1:])] = per_shape.Choice("gemmlab", "measured")
        assert _compiled_runs_gemmlab(mod, x)
    finally:
        per_shape.set_timer(None)


def test_patch_summary_lists_the_choices_of_its_linears(timer, device):
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.Linear(32, 40)).to(device, BF16)
    other = _linear(8, 16, device=device)
    _, summary = gemmlab.patch(model, return_summary=True)
    assert summary.choices() == []  # made on each shape's first call
    model(_x(5, 24, device=device))
    other(_x(5, 8, device=device))
    assert [(c["n"], c["k"], c["impl"]) for c in summary.choices()] == [(32, 24, "gemmlab"), (40, 32, "torch")]


def test_bucket_is_the_next_power_of_two():
    assert [per_shape.bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 4096, 4097)] == [1, 2, 4, 4, 8, 8, 16, 4096, 8192]
