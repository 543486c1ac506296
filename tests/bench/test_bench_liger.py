"""bench.moe_liger: the suite against Liger-Kernel's fused MoE, its bars, rows and summaries.

CPU tests run gemmlab's kernels in Triton's interpreter at tiny sizes; Liger is replaced by a fake provider
(gemmlab.ref's same-dtype loop) to prove the plumbing, or hidden to prove the skip. The gpu-marked test runs the
real Liger (skipped when liger-kernel is not installed)."""

import csv
import json
import math
import sys

import pytest
import torch

from gemmlab.bench import moe_liger as ml
from gemmlab.bench import moe_liger_view as mlv
from gemmlab.problems import MOE_MODELS, MoEModel
from gemmlab.ref import moe_grad_check, moe_same_dtype

TINY = MoEModel(hidden=32, intermediate=16, experts=4, top_k=2)
FAST = dict(rounds=1, reps=1, warmup_s=0.0, liger_tune_tokens=4)


def test_suite_is_five_models_by_seven_token_counts():
    assert ml.SUITE_TOKENS == (1, 16, 64, 256, 1024, 4096, 16384)
    assert set(ml.SUITE_MODELS) <= set(MOE_MODELS) and len(ml.SUITE_MODELS) == 5
    assert MOE_MODELS["olmoe-1b-7b"] == MoEModel(hidden=2048, intermediate=1024, experts=64, top_k=8)
    assert MOE_MODELS["gpt-oss-120b-like"] == MoEModel(hidden=2880, intermediate=2880, experts=128, top_k=4)
    fwd = ml.suite_cases(modes=ml.MODES, parts=("fwd",))
    assert len(fwd) == 5 * 7 * 2 * 2  # models x T x routing x mode
    assert {(c["model"], c["tokens"]) for c in fwd} == {(m, t) for m in ml.SUITE_MODELS for t in ml.SUITE_TOKENS}
    both = ml.suite_cases(modes=("eager",), parts=ml.PARTS, min_bwd_tokens=1024)
    bwd = [c for c in both if c["part"] == "fwd+bwd"]
    assert len(bwd) == 5 * 3 * 2 and min(c["tokens"] for c in bwd) == 1024  # T in {1024, 4096, 16384}
    for bad in (dict(routings=("skewed",)), dict(modes=("compile",)), dict(parts=("bwd",)), dict(tokens=(0,))):
        with pytest.raises(ValueError):
            ml.suite_cases(**bad)


def test_bar_arithmetic_on_a_known_case():
    m = MoEModel(hidden=4, intermediate=2, experts=4, top_k=2)
    ids = torch.tensor([[0, 1], [1, 3]], dtype=torch.int32)
    wts = torch.full((2, 2), 0.5)
    b = ml.hbm_bound(m, ids, wts, elt=2, gbps=1.0)
    # experts 0, 1, 3 hit: 3 * (2I*H + H*I) * 2 bytes = 3 * 24 * 2; x and y: 2 * T*H * 2; ids + weights: 4*4 + 4*4
    assert (b["experts_hit"], b["weight_bytes"], b["activation_bytes"], b["routing_bytes"]) == (3, 144, 32, 32)
    assert b["bytes"] == 208 and b["hbm_bound_ms"] == pytest.approx(208e-9 * 1e3)
    assert ml.forward_flops(m, 2) == 2 * 4 * 4 * 4 + 2 * 4 * 2 * 4  # 2*S*H*2I + 2*S*I*H, S = 4


def test_dense_bar_computes_and_its_check_fires():
    w1, w2 = torch.randn(4, 32, 32).half(), torch.randn(4, 32, 16).half()
    call, check = ml.dense_call(TINY, 8, torch.float16, w1, w2, seed=0)
    out = call()
    assert out.c1.shape == (16, 32) and out.c2.shape == (16, 32) and check(out)["ok"]
    out.c2[8, 3] += 4.0  # row S/2 is one of the checked rows
    assert not check(out)["ok"]


def _grads(x, w1, w2, wts, ids, dy):
    leaves = [t.detach().requires_grad_() for t in (x, w1, w2, wts)]
    y = moe_same_dtype(*leaves, ids)
    return torch.autograd.grad(y, leaves, dy)


def test_grad_check_passes_torch_and_fires_on_a_wrong_gradient():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(5, 32, generator=g) - 0.5).half()
    w1 = ((torch.rand(4, 32, 32, generator=g) - 0.5) * 0.5).half()
    w2 = ((torch.rand(4, 32, 16, generator=g) - 0.5) * 0.5).half()
    ids = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0], [0, 1]], dtype=torch.int32)  # experts 2, 3: no rows
    wts = torch.rand(5, 2, generator=g)
    dy = (torch.rand(5, 32, generator=g) - 0.5).half()
    grads = _grads(x, w1, w2, wts, ids, dy)
    assert moe_grad_check(grads, dy, x, w1, w2, wts, ids)["ok"]
    for j, name in ((1, "dw1"), (3, "dweights")):
        bad = list(grads)
        bad[j] = bad[j].clone()
        bad[j].view(-1)[0] += 1.0
        c = moe_grad_check(tuple(bad), dy, x, w1, w2, wts, ids)
        assert not c["ok"] and name in c["error"]
    bad = list(grads)
    bad[2] = bad[2].clone()
    bad[2][3] += 0.5  # an expert with no rows must get a zero gradient
    assert "dw2" in moe_grad_check(tuple(bad), dy, x, w1, w2, wts, ids)["error"]
    assert "shape" in moe_grad_check((grads[0], grads[1][:2], grads[2], grads[3]), dy, x, w1, w2, wts, ids)["error"]
    c = moe_grad_check(grads, dy, x, w1, w2, wts, ids)
    assert c["worst"] <= 1 and set(c["grads"]) == {"dx", "dw1", "dw2", "dweights"}


def _hide_liger(monkeypatch):
    for name in ("liger_kernel", "liger_kernel.ops", "liger_kernel.ops.fused_moe"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError


def test_liger_baseline_skips_cleanly_when_not_importable(monkeypatch):
    _hide_liger(monkeypatch)
    fn, info = ml.load_liger()
    assert fn is None and not info["available"] and "skipped" in info["reason"]
    said = []
    rep = ml.bench_suite(
        ["custom"], [3], ["uniform"], custom=TINY, dtype=torch.float16, composite=False, progress=said.append, **FAST
    )
    assert any("liger-kernel is not importable" in s for s in said)
    (row,) = ml.rows(rep)
    assert row["ok"] and row["gemmlab_ms"] > 0 and row["ratio_vs_liger"] is None and "liger_ms" not in row
    assert rep["results"][0]["baseline"] == ml.GEMMLAB and rep["env"]["liger_kernel"] is None


def _fake_liger(x, w1, w2, topk_weights, topk_ids):
    assert topk_ids.dtype == torch.int32  # what the real one wants
    return moe_same_dtype(x, w1, w2, topk_weights, topk_ids)


def test_fake_liger_end_to_end_fwd_and_fwd_bwd(monkeypatch, tmp_path):
    monkeypatch.setattr(ml, "load_liger", lambda: (_fake_liger, {"available": True, "version": "fake"}))
    written = []
    rep = ml.bench_suite(
        ["custom"],
        [3],
        ["zipf"],
        parts=ml.PARTS,
        custom=TINY,
        dtype=torch.float16,
        composite=False,
        on_result=lambda r: written.append(mlv.write(r, str(tmp_path))),
        **FAST,
    )
    rows = ml.rows(rep)
    assert [r["part"] for r in rows] == ["fwd", "fwd+bwd"] and all(r["ok"] for r in rows)
    assert all(r["ratio_vs_liger"] > 0 and r["liger_ms"] > 0 and r["mode"] == "eager" for r in rows)
    bwd = rep["results"][1]["candidates"]
    assert bwd["gemmlab"]["check"]["strict"] and bwd["liger"]["check"]["strict"]  # within 1x the tolerance
    assert bwd["gemmlab"]["check"]["grads"]["dw1"]["max_abs_err"] > 0
    assert [t["part"] for t in rep["liger_tuning"]] == ["fwd", "fwd+bwd"]
    assert {s["part"] for s in rep["summary"]} == {"fwd", "fwd+bwd"}
    assert written and json.loads((tmp_path / "moe-liger_fwd-fwd-bwd_eager.json").read_text())["results"]
    assert [p.name for p in written[-1]] == [f"moe-liger_fwd-fwd-bwd_eager.{x}" for x in ("json", "csv", "md")]
    long = list(csv.DictReader(written[-1][1].open()))  # long format, as gemmlab.output writes for every command
    assert {r["kind"] for r in long} == {"moe-liger-bench"}
    assert {(r["kernel"], r["provider"], r["metric"]) for r in long} >= {
        ("moe-fwd", "gemmlab", "time"),
        ("moe-fwd", "liger", "time"),
        ("moe-fwd+bwd", "gemmlab", "ratio_vs_liger"),
    }
    assert not list(tmp_path.glob("*.tmp"))  # the JSON is replaced whole


def test_a_wrong_peer_is_flagged_not_timed(monkeypatch):
    def wrong(x, w1, w2, topk_weights, topk_ids):
        if topk_weights.requires_grad:  # fwd+bwd: y right, d(topk_weights) three times too large
            topk_weights = topk_weights * 1.0
            topk_weights.register_hook(lambda g: g * 3)
            return moe_same_dtype(x, w1, w2, topk_weights, topk_ids)
        return moe_same_dtype(x, w1, w2, topk_weights, topk_ids) * 1.1

    monkeypatch.setattr(ml, "load_liger", lambda: (wrong, {"available": True, "version": "wrong"}))
    rep = ml.bench_suite(
        ["custom"], [3], ["uniform"], parts=ml.PARTS, custom=TINY, dtype=torch.float16, composite=False, **FAST
    )
    fwd, bwd = ml.rows(rep)
    for row in (fwd, bwd):
        assert not row["ok"] and "liger" in row["error"] and row["liger_ms"] is None and row["gemmlab_ok"]
    assert "dweights" in bwd["error"] and [s["wrong"] for s in rep["summary"]] == [1, 1]


def test_a_provider_that_cannot_be_captured_stays_eager(monkeypatch):
    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1

    def capture(fn):
        out = fn()
        if out == "liger":
            raise RuntimeError("operation not permitted when stream is capturing")
        return Graph(), out

    streams = []
    monkeypatch.setattr(ml.timing, "capture", capture)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: "default stream")
    monkeypatch.setattr(torch.cuda, "set_stream", streams.append)
    monkeypatch.setattr(ml, "_device_alive", lambda: None)
    calls, modes = ml.capture_all({"gemmlab": lambda: "gemmlab", "liger": lambda: "liger"})
    assert modes["gemmlab"] == "graph" and calls["gemmlab"]() == "gemmlab" and Graph.replays == 1
    assert modes["liger"].startswith("eager: CUDA-graph capture failed (RuntimeError: operation not permitted")
    assert calls["liger"]() == "liger" and streams == ["default stream"]  # the stream before it, restored


def test_both_bars_in_one_case(monkeypatch):
    monkeypatch.setattr(ml, "DENSE_MIN_TOKENS", 2)  # the dense bar at a size the interpreter runs
    providers = {ml.GEMMLAB: ml.gemmlab_forward, ml.LIGER: _fake_liger}
    r = ml.bench_case(
        "custom",
        TINY,
        3,
        "uniform",
        "eager",
        "fwd",
        torch.float16,
        providers,
        hbm_gbps=100.0,
        rounds=1,
        reps=1,
        warmup_s=0.0,
    )
    dense, hbm, cands = r["bars"]["dense"], r["bars"]["hbm"], r["candidates"]
    assert cands[ml.DENSE]["check"]["ok"] and dense["dense_ms"] == cands[ml.DENSE]["median_ms"]
    assert dense["frac_of_dense"] == pytest.approx(cands[ml.GEMMLAB]["tflops"] / cands[ml.DENSE]["tflops"])
    assert hbm["hbm_bound_ms"] == pytest.approx(hbm["bytes"] / 100e9 * 1e3) and hbm["hbm_gbps"] == 100.0
    assert hbm["gemmlab_ratio_to_hbm_bound"] == pytest.approx(cands[ml.GEMMLAB]["median_ms"] / hbm["hbm_bound_ms"])
    (row,) = ml.rows({"results": [r]})
    assert row["ok"] and row["frac_of_dense"] == dense["frac_of_dense"] and row["dense_ms"] > 0
    assert row["ratio_to_hbm_bound"] == hbm["gemmlab_ratio_to_hbm_bound"] and row["liger_ratio_to_hbm_bound"] > 0


def _case(model, t, mode, part, ratio, ok=True, frac=None, hbm=None):
    cand = {
        "check": {"ok": ok},
        "check_after": True,
        "median_ms": 1.0,
        "tflops": 10.0,
        "vs_baseline": {"ratio": ratio, "ci95": [ratio * 0.9, ratio * 1.1]},
    }
    bars = {}
    if frac is not None:
        bars["dense"] = {"dense_ms": 1.0, "dense_tflops": 10.0 / frac, "frac_of_dense": frac}
    if hbm is not None:
        bars["hbm"] = {"hbm_bound_ms": 1.0 / hbm, "gemmlab_ratio_to_hbm_bound": hbm}
    return {
        "model": model,
        "tokens": t,
        "routing": "uniform",
        "mode": mode,
        "part": part,
        "baseline": ml.LIGER,
        "candidates": {ml.GEMMLAB: cand, ml.LIGER: {"check": {"ok": True}, "median_ms": ratio, "tflops": 10 / ratio}},
        "provider_modes": {ml.GEMMLAB: "graph", ml.LIGER: "eager: CUDA-graph capture failed (x)"},
        "memory": {ml.GEMMLAB: {"peak_bytes": 2**30}, ml.LIGER: None},
        "bars": bars,
    }


def test_rows_and_summary_of_a_synthetic_report():
    rep = {
        "results": [
            _case("a", 16, "eager", "fwd", 2.0, hbm=1.5),
            _case("a", 4096, "eager", "fwd", 0.5, frac=0.8),
            _case("b", 4096, "eager", "fwd", 0.5, ok=False),
            _case("a", 16, "graph", "fwd", 1.25),
            {"model": "c", "tokens": 1, "routing": "zipf", "mode": "eager", "part": "fwd", "error": "out of memory"},
        ]
    }
    rep["results"][3]["candidates"][ml.LIGER]["check"] = {  # timed (within GRAD_SLACK), but outside 1x
        "ok": True,
        "strict": False,
        "grads": {"dx": {"worst": 0.5}, "dweights": {"worst": 2.5}},
    }
    rows = ml.rows(rep)
    assert rows[3]["liger_grads_outside_tolerance"] == {"dweights": 2.5} and rows[3]["ok"]
    assert "liger_grads_outside_tolerance" not in rows[0]
    assert rows[0]["ratio_vs_liger"] == 2.0 and rows[0]["ratio_to_hbm_bound"] == 1.5
    assert rows[0]["gemmlab_peak_gib"] == 1.0 and rows[0]["liger_peak_gib"] is None
    assert rows[0]["liger_mode"].startswith("eager:") and rows[1]["frac_of_dense"] == 0.8
    assert not rows[2]["ok"] and not rows[4]["ok"] and rows[4]["error"] == "out of memory"
    eager, graph = ml.summarize(rows)
    assert (eager["part"], eager["mode"], eager["cases"], eager["wrong"]) == ("fwd", "eager", 4, 2)
    assert eager["geomean_ratio_vs_liger"] == pytest.approx(1.0)  # sqrt(2 * 0.5); the wrong case left out
    assert eager["min_ratio_vs_liger"] == 0.5 and eager["min_case"] == "a T=4096 uniform eager fwd"
    assert eager["below_1"] == ["a T=4096 uniform eager fwd: 0.500"]
    assert eager["min_frac_of_dense"] == 0.8 and eager["max_ratio_to_hbm_bound"] == 1.5
    assert graph["geomean_ratio_vs_liger"] == 1.25 and graph["below_1"] == [] and graph["liger_eager_in_graph"] == 1
    assert eager["liger_eager_in_graph"] == 0
    assert graph["grads_outside_tolerance"] == ["a T=16 uniform graph fwd: liger {'dweights': 2.5}"]
    assert eager["grads_outside_tolerance"] == []
    assert mlv.report_name(["fwd", "fwd+bwd"], ["eager", "graph"]) == "moe-liger_fwd-fwd-bwd_eager-graph.json"
    from rich.console import Console

    rep.update(
        args={"dtype": "bfloat16"},
        env={"gpu": "test"},
        liger={"available": True},
        not_run=["x"],
        summary=[eager, graph],
    )
    console = Console(record=True, width=250)
    assert mlv.render(rep, console) == 2  # the wrong case and the out-of-memory one
    text = console.export_text()
    assert "2.000" in text and "(eager)" in text and "1 cases not run" in text and "WRONG" in text


def test_gemmlab_report_draws_the_liger_report_as_written(tmp_path):
    """A synthetic report in bench_suite's layout (placeholder numbers: a rendering test), written by ml.write,
    found by gemmlab report under its kind and drawn in the MoE peer section with every row."""
    from gemmlab.report import html

    results = [
        _case("a", 16, "eager", "fwd", 2.0, hbm=1.5),
        _case("a", 4096, "graph", "fwd", 0.5, frac=0.8),
        {"model": "c", "tokens": 1, "routing": "zipf", "mode": "eager", "part": "fwd", "error": "out of memory"},
    ]
    results[0]["provider_modes"] = {ml.GEMMLAB: "eager", ml.LIGER: "eager"}  # like with like: charted; the graph
    # row, whose Liger ran eager, stays in the table only
    rep = {
        "kind": "moe-liger-bench",
        "env": {"gpu": "test GPU"},
        "args": {"dtype": "bfloat16", "parts": ["fwd"], "modes": ["eager", "graph"]},
        "liger": {"available": True, "version": "fake"},
        "results": results,
        "not_run": ["x"],
    }
    rep["rows"] = ml.rows(rep)
    rep["summary"] = ml.summarize(rep["rows"])
    mlv.write(rep, str(tmp_path))
    page, found = html.build([tmp_path])
    assert sorted((f.kind, f.path.rsplit("/", 1)[-1]) for f in found) == [  # the table files listed beside it
        ("csv", "moe-liger_fwd_eager-graph.csv"),
        ("markdown", "moe-liger_fwd_eager-graph.md"),
        ("moe-liger-bench", "moe-liger_fwd_eager-graph.json"),
    ]
    section = page.split(">MoE against its peers</h2>")[1]
    assert "could not draw" not in page and "MoE vs Liger, bfloat16, on test GPU" in section
    assert 'data-rows="3"' in section and 'data-rows="2"' in section  # three cases; two (part, mode) groups
    assert "2.000" in section and "WRONG out of memory" in section and "1 cases not run" in section
    assert "Liger time / gemmlab time, both sides in the same mode (&gt; 1: gemmlab faster)" in section
    assert "1 case(s) left out" in section


def test_cli_baseline_liger_without_liger_is_a_usage_error(monkeypatch, tmp_path, device):
    """A baseline the user asked for that cannot run: exit 2 and one line naming the install, before any work
    (no report written); other bad input to --baseline liger is exit 2 as well."""
    from typer.testing import CliRunner

    from gemmlab.cli import app

    _hide_liger(monkeypatch)
    for extra in (["--output-dir", str(tmp_path / "out")], ["--json"]):
        res = CliRunner().invoke(
            app,
            [
                "bench",
                "moe",
                "--baseline",
                "liger",
                "--custom",
                "32,16,4,2",
                "--tokens",
                "2",
                "--routing",
                "uniform",
                "--dtype",
                "float16",
                "--no-composite",
                "--rounds",
                "1",
                "--reps",
                "1",
                "--warmup-s",
                "0",
                *extra,
            ],
        )
        assert res.exit_code == 2, res.output
        assert "pip install liger-kernel" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stdout == "" and not (tmp_path / "out" / "moe-liger_fwd_eager.json").exists()
    for bad in (
        ["--baseline", "cudnn"],
        ["--baseline", "liger", "--part", "grouped"],
        ["--baseline", "liger", "--record", "x", "--ledger", str(tmp_path / "l.db")],
        ["--baseline", "liger", "--mode", "graph"] if device == "cpu" else ["--routing", "x"],
    ):
        res = CliRunner().invoke(app, ["bench", "moe", "--custom", "32,16,4,2", "--tokens", "2", *bad])
        assert res.exit_code == 2, (bad, res.output)


@pytest.fixture
def pinned_liger(monkeypatch):
    """The real Liger with each of its autotuners cut to its first config: no benchmarking (the CPU interpreter
    has no benchmarker) and a few compilations instead of hundreds (a plumbing test, not a measurement)."""
    pytest.importorskip("liger_kernel.ops.fused_moe")
    from liger_kernel.ops import fused_moe_kernels
    from triton.runtime.autotuner import Autotuner

    for obj in vars(fused_moe_kernels).values():
        if isinstance(obj, Autotuner):
            monkeypatch.setattr(obj, "configs", obj.configs[:1])


def test_real_liger_provider_matches_the_reference(pinned_liger, device):
    """Liger's argument order, id dtype and output, through ml.load_liger; on the CPU its kernels run in the
    interpreter (fp16: the interpreter has no bf16)."""
    from gemmlab.problems import moe_inputs as problem
    from gemmlab.ref import moe_check

    liger, info = ml.load_liger()
    assert info["available"] and info["version"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    p = problem(TINY, 5, "zipf", dtype)
    y = liger(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    assert y.shape == (5, 32) and y.dtype == dtype
    assert moe_check(y, p["x"], p["w1"], p["w2"], p["weights"], p["ids"])["ok"]


@pytest.mark.gpu
def test_real_liger_on_the_gpu_eager_and_graph_with_bars(pinned_liger):
    small = MoEModel(hidden=256, intermediate=128, experts=8, top_k=2)
    rep = ml.bench_suite(
        ["custom"],
        [16, 4096],
        ["uniform", "zipf"],
        modes=ml.MODES,
        parts=ml.PARTS,
        custom=small,
        rounds=2,
        reps=2,
        warmup_s=0.05,
        liger_tune_tokens=256,
    )
    rows = ml.rows(rep)
    assert rows and all(r["ok"] for r in rows), [r["error"] for r in rows if not r["ok"]]
    assert all(r["ratio_vs_liger"] > 0 for r in rows) and rep["liger"]["available"]
    assert all(r["hbm_bound_ms"] > 0 for r in rows if r["tokens"] == 16 and r["part"] == "fwd")
    assert all(0 < r["frac_of_dense"] for r in rows if r["tokens"] == 4096 and r["part"] == "fwd")
    assert all(r["gemmlab_peak_gib"] > 0 and r["liger_peak_gib"] > 0 for r in rows)
    graph = [r for r in rows if r["mode"] == "graph"]
    assert graph and all(r["gemmlab_mode"] == "graph" or r["part"] == "fwd+bwd" for r in graph)
    assert not math.isnan(rep["hbm_copy"]["gbps"])
