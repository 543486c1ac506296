"""The broad suite (issue 14) as data, and `bench gemm` over cases: layouts, unaligned storage, timing modes,
the inductor baseline (skipped without CUDA), per-row fields and the summary's arithmetic."""

import csv
import math

import pytest
import torch

from gemmlab.bench import gemm as bg
from gemmlab.bench import gemm_view, inductor, targets
from gemmlab.problems import (
    BROAD,
    BROAD_CPU,
    BROAD_QUICK,
    CASE_SUITES,
    DENSE,
    MODEL_LINEARS,
    MODEL_M,
    SEEDS,
    Case,
    case_operands,
    cases,
    gemm_operands,
    model_cases,
    suite,
)
from tests.child import no_interpreter_env


def _is_prime(v: int) -> bool:
    return v > 1 and all(v % d for d in range(2, math.isqrt(v) + 1))


def test_broad_suite_covers_what_issue_14_asks():
    assert 40 <= len(BROAD) <= 60 and len({c.label for c in BROAD}) == len(BROAD)
    assert {c.dtype for c in BROAD} == {"float16", "bfloat16"} and {c.layout for c in BROAD} == {"row", "linear"}
    assert sum(c.layout == "linear" for c in BROAD) > len(BROAD) / 2  # nn.Linear layout mostly
    ms = {c.m for c in BROAD}
    assert min(ms) == 1 and 16384 in ms and {1, 16, 64} <= ms and any(2048 <= m <= 16384 for m in ms)
    assert any(c.pad % 2 for c in BROAD) and any(c.offset for c in BROAD) and sum(not c.aligned for c in BROAD) >= 5
    assert {c.shape for c in BROAD if c.note == "seed"} == set(SEEDS)
    assert sum(all(_is_prime(v) for v in c.shape) for c in BROAD) >= 3
    assert {(8191, 8193, 4097), (777, 3333, 1024), (3000, 5000, 7000)} <= {c.shape for c in BROAD}
    nk = {(c.n, c.k) for c in BROAD if c.layout == "linear"}
    projections = {
        "llama3-8b": [(6144, 4096), (28672, 4096), (4096, 14336)],
        "llama3-70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)],
        "qwen3-32b": [(10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600)],
        "deepseek-v3": [(1536, 7168), (576, 7168), (7168, 16384), (36864, 7168), (7168, 18432)],
    }
    for model, pairs in projections.items():
        assert set(pairs) <= nk, model
        mine = [c.m for c in BROAD if c.note.startswith(model)]
        assert min(mine) <= 64 and max(mine) >= 2048, model  # decode and prefill
    assert any(c.note.startswith("mixtral") for c in BROAD)
    for c in BROAD:  # each case a sane amount of GPU work: < ~30 ms at ~700 TFLOPS
        assert 2 * c.m * c.n * c.k < 2.1e13, c.label


def test_dense_suite_is_broad_plus_ten_models_at_every_m():
    assert 80 <= len(DENSE) <= 120 and len({c.label for c in DENSE}) == len(DENSE)  # one H200 call
    assert DENSE[: len(BROAD)] == BROAD and cases("dense") is DENSE
    assert len(MODEL_LINEARS) == 10 and MODEL_M == (1, 16, 64, 256, 2048, 8192)
    for model, projs in MODEL_LINEARS.items():
        mine = [c for c in DENSE if c.layout == "linear" and (c.n, c.k) in projs.values() and not c.pad]
        assert {c.m for c in mine} >= set(MODEL_M), model  # decode to prefill, each model
        assert {c.dtype for c in mine} == {"float16", "bfloat16"}, model
    rotated = model_cases()
    assert len(rotated) == 10 * len(MODEL_M) and {c.m for c in rotated} == set(MODEL_M)
    left_out = [c for c in rotated if c not in DENSE]  # only where the broad suite has the shape already
    assert all(any(b.shape == c.shape and b.layout == c.layout for b in BROAD) for c in left_out)
    assert any(c.n <= 32 for c in DENSE) and any(c.k <= 512 for c in DENSE)  # routers (small N), kv_b (small K)
    assert sum(2 * c.m * c.n * c.k for c in DENSE) < 6e13  # ~0.1 s of tensor-core time in all


def _row(case: str, ratio, eager, m: int = 128, backend: str = "gemmlab", ok: bool = True) -> dict:
    return {"case": case, "backend": backend, "ok": ok, "ratio": ratio, "eager_ratio": eager, "m": m}


def test_targets_fire_on_known_bad_reports():
    good = [_row(f"c{i}", 1.05, 1.04) for i in range(20)] + [
        _row(f"b{i}", None, None, backend="cublas") for i in range(20)
    ]
    t = targets.check(good, "gemmlab")
    assert t["met"] and t["device"]["n"] == 20 and t["eager_vs_graph"]["n"] == 20
    one_low = good + [_row("low", 0.94, 1.0)]  # one case below 0.95 in device time
    t = targets.check(one_low, "gemmlab")
    assert not t["met"] and t["device"]["below_floor"] == ["low"] and not t["device"]["met"]["floor"]
    assert t["eager"]["met"]["floor"]
    near = [_row(f"c{i}", 1.05 if i < 17 else 0.97, 1.05) for i in range(20)]  # 85% at >= 0.98
    t = targets.check(near, "gemmlab")
    assert t["device"]["near_share"] == pytest.approx(0.85) and not t["device"]["met"]["near"]
    assert t["device"]["met"]["floor"] and not t["met"]
    carried = [_row(f"c{i}", 0.99, 0.99) for i in range(19)] + [_row("vendor-pathology", 4.0, 4.0)]
    t = targets.check(carried, "gemmlab")  # uncapped geomean 1.06: the cap leaves 1.002
    assert t["device"]["capped_geomean"] == pytest.approx(math.exp((19 * math.log(0.99) + math.log(1.25)) / 20))
    assert not t["device"]["met"]["geomean"] and t["device"]["met"]["near"]
    host = good + [_row("host-bound", 1.05, 0.99), _row("decode", 1.05, 0.5, m=16)]  # eager 6% behind at M 128
    t = targets.check(host, "gemmlab")
    assert t["eager_vs_graph"]["apart"] == ["host-bound"] and not t["eager_vs_graph"]["met"]  # M 16: not judged
    assert targets.check(good + [_row("big-win", 3.0, 2.0)], "gemmlab")["eager_vs_graph"]["met"]  # both capped
    skipped = good + [
        _row("vendor-wrong", None, None),
        _row("vendor-wrong", None, None, backend="cublas", ok=False),
        _row("mine-wrong", None, None, ok=False),
    ]
    t = targets.check(skipped, "gemmlab")
    assert t["baseline_wrong"] == ["vendor-wrong"] and t["wrong"] == ["mine-wrong"] and t["device"]["n"] == 20
    text = "\n".join(targets.lines("gemmlab", t))
    assert "cuBLAS failed its own check (not timed): vendor-wrong" in text and "WRONG results: mine" in text
    assert "none below 0.95 met" in text and "NOT all met" in text  # a wrong case fails the whole
    only_graph = targets.check([_row("x", 1.1, None)], "gemmlab")
    assert not only_graph["met"] and "not judged without wall timing" in "\n".join(targets.lines("g", only_graph))


def test_quick_and_cpu_suites():
    assert len(BROAD_QUICK) == 8 and set(BROAD_QUICK) <= set(BROAD)
    assert {c.dtype for c in BROAD_QUICK} == {"float16", "bfloat16"} and {c.layout for c in BROAD_QUICK} == {
        "row",
        "linear",
    }
    assert any(not c.aligned for c in BROAD_QUICK)
    assert {c.layout for c in BROAD_CPU} == {"row", "linear"} and any(not c.aligned for c in BROAD_CPU)
    assert max(c.m * c.n * c.k for c in BROAD_CPU) < 1e6
    assert cases("broad") is CASE_SUITES["broad"]
    assert cases("seeds", "bfloat16") == [Case(*s, "bfloat16") for s in SEEDS]
    assert suite("broad") == list(dict.fromkeys(c.shape for c in BROAD))


@pytest.mark.parametrize(
    "kw, match",
    [({"dtype": "float32"}, "dtype"), ({"layout": "col"}, "layout"), ({"pad": -1}, "pad"), ({"m": -1}, "m must")],
)
def test_case_refuses_bad_fields(kw, match):
    with pytest.raises(ValueError, match=match):
        Case(**{"m": 4, "n": 4, "k": 4, **kw})


def test_case_inputs_are_laid_out_as_the_case_says(device):
    dev = torch.device(device)
    a, b = case_operands(Case(5, 7, 9, "bfloat16", "linear", pad=3, offset=1), dev)
    assert a.shape == (5, 9) and a.stride() == (12, 1) and a.storage_offset() == 1 and a.dtype == torch.bfloat16
    assert b.shape == (9, 7) and b.stride() == (1, 12) and b.storage_offset() == 1  # B = W^T, W (7, 9+3)
    assert a.data_ptr() % 16 and b.data_ptr() % 16
    a, b = case_operands(Case(5, 7, 9, pad=1), dev)
    assert a.stride() == (10, 1) and b.stride() == (8, 1)
    a0, b0 = gemm_operands(6, 10, 8, torch.float16, dev)  # a plain case: the very inputs of the shape benches
    a1, b1 = case_operands(Case(6, 10, 8), dev)
    assert torch.equal(a0, a1) and torch.equal(b0, b1) and a1.is_contiguous() and b1.is_contiguous()
    assert Case(4, 8, 8).aligned and not Case(4, 8, 9).aligned and not Case(4, 8, 8, offset=1).aligned
    assert not Case(4, 8, 8, "float16", "linear", pad=1).aligned and Case(4, 7, 8, "float16", "linear").aligned


def test_bench_cases_end_to_end_on_this_device(tmp_path, device):
    todo = [
        Case(8, 16, 32, "bfloat16", "linear"),
        Case(5, 8, 12, pad=1, note="seed"),
        Case(3, 8, 24, "float16", "linear", pad=3, offset=1),
    ]
    modes = ("graph", "wall") if device == "cuda" else ("eager", "wall")
    rep = bg.bench_gemm(todo, backends=["gemmlab", "inductor"], modes=modes, rounds=1, reps=1, warmup_s=0.0)
    table = bg.rows(rep)
    assert [r["case"] for r in table if r["backend"] == "cublas"] == [c.label for c in todo]
    for r in table:
        assert set(bg.CSV_FIELDS) <= set(r), set(bg.CSV_FIELDS) - set(r)
        assert r["ok"], r
        assert r["layout"] in ("row", "linear") and r["dtype"] in ("float16", "bfloat16")
        assert r["eager_ms"] > 0 and (r["device_ms"] is None) == (device == "cpu")
        if r["backend"] == "gemmlab":
            assert r["eager_ratio"] > 0 and r["path"] in ("portable", "tma_splitk", "tma_persistent")
    assert {(r["case"], r["aligned"]) for r in table} >= {("5x8x12 fp16 row pad1", False)}
    res = rep["results"][2]
    assert res["timing"] == modes[0] and list(res["other_modes"]) == ["wall"]
    assert res["other_modes"]["wall"]["clock"] == "wall" and res["clock"] == "events"
    assert (
        res["candidates"]["gemmlab"]["check"]["ok"]
        and res["other_modes"]["wall"]["candidates"]["gemmlab"]["check_after"] is True
    )
    s = rep["summary"]["backends"]["gemmlab"]
    assert s["cases"] == 3 and not s["wrong"] and s["eager"]["n"] == 3 and list(s["seeds"]) == [todo[1].label]
    assert rep["args"]["modes"] == list(modes) and rep["args"]["dtypes"] == ["bfloat16", "float16"]
    if device == "cpu":
        assert "no CUDA" in rep["skipped_backends"]["inductor"] and "inductor" not in res["candidates"]
        assert any("no CUDA" in line for line in gemm_view.summary_lines(rep))
    paths = gemm_view.write(rep, tmp_path)
    assert [p.name for p in paths[:4]] == ["gemm-bench.json", "gemm-bench.csv", "gemm-bench.md", "gemm-bench-rows.csv"]
    head = paths[3].read_text().splitlines()[0].split(",")
    assert head[:2] == ["shape", "m"] and {"case", "ratio", "eager_ratio", "inductor_ratio", "layout"} <= set(head)
    long = list(csv.DictReader(paths[1].open()))
    assert {(r["x_value"], r["mode"]) for r in long if r["provider"] == "gemmlab" and r["metric"] == "time"} == {
        (c.label, m) for c in todo for m in modes
    }  # the primary mode and the wall clock, per case
    assert "gemmlab: 0 wrong of 3" in paths[2].read_text()


def test_bench_refuses_bad_modes_and_budget_skips_the_rest(device):
    with pytest.raises(ValueError, match="timing mode 'fast'"):
        bg.bench_gemm([(8, 8, 8)], modes=("fast",))
    with pytest.raises(ValueError, match="at most once"):
        bg.bench_gemm([(8, 8, 8)], modes=("wall", "wall"))
    with pytest.raises(ValueError, match="wall-clock timing needs the backend in this process"):
        bg.bench_gemm([(8, 8, 8)], backends=["x.py:f"], modes=("wall",))
    with pytest.raises(ValueError, match="budget"):
        bg.bench_gemm([(8, 8, 8)], budget_s=0)
    with pytest.raises(ValueError, match="search space 'HUGE'"):
        bg.bench_gemm([(8, 8, 8)], backends=["inductor"], inductor_opts={"search_space": "HUGE"})
    if device == "cpu":
        with pytest.raises(ValueError, match="--graph needs CUDA"):
            bg.bench_gemm([(8, 8, 8)], modes=("graph", "wall"))
    rep = bg.bench_gemm(
        [(8, 8, 8), (4, 8, 8), (2, 8, 8)], modes=("wall",), rounds=1, reps=1, warmup_s=0.0, budget_s=1e-9
    )
    assert len(rep["results"]) == 1 and rep["not_run"] == ["4x8x8 fp16 row", "2x8x8 fp16 row"]
    assert rep["summary"]["not_run"] == 2 and any("2 cases not run" in x for x in gemm_view.summary_lines(rep))


def test_timing_refuses_an_unknown_clock():
    from gemmlab.instruments import timing
    from gemmlab.instruments.compare import compare_many

    with pytest.raises(ValueError, match="clock 'sundial'"):
        timing.interleave({"a": lambda: None}, 1, 1, 0.0, clock="sundial")
    with pytest.raises(ValueError, match="wall with mode interleaved"):
        compare_many({"a": lambda: None}, "a", clock="wall", mode="back-to-back")
    assert len(timing.time_calls_wall(lambda: None, 3)) == 3


def _cand(ms: float, rounds: int = 3, ok: bool = True) -> dict:
    return {"check": {"ok": ok}, "check_after": True, "median_ms": ms, "per_round_ms": [[ms]] * rounds}


def _result(label: str, note: str, graph_ms: dict, wall_ms: dict) -> dict:
    def mode(ms: dict) -> dict:
        cands = {name: _cand(v) for name, v in ms.items()}
        for name, c in cands.items():
            if name != "cublas":
                c["vs_baseline"] = {"ratio": ms["cublas"] / c["median_ms"]}
        bg._vs_inductor({"candidates": cands})
        return {"candidates": cands}

    m, n, k = (int(x) for x in label.split()[0].split("x"))
    return {
        "case": {"layout": "linear", "pad": 0, "offset": 0, "note": note},
        "label": label,
        "shape": [m, n, k],
        "dtype": "float16",
        "timing": "graph",
        **mode(graph_ms),
        "other_modes": {"wall": mode(wall_ms)},
    }


def test_summary_math_on_a_synthetic_report():
    results = [
        _result(
            "1x2x3 fp16 linear",
            "seed",
            {"gemmlab": 1.0, "cublas": 2.0, "inductor": 1.5},
            {"gemmlab": 1.0, "cublas": 1.0, "inductor": 1.0},
        ),
        _result(
            "4x5x6 fp16 linear",
            "",
            {"gemmlab": 2.0, "cublas": 1.0, "inductor": 1.0},
            {"gemmlab": 2.0, "cublas": 1.0, "inductor": 3.0},
        ),
        _result(
            "7x8x9 fp16 linear",
            "",
            {"gemmlab": 1.0, "cublas": 0.96, "inductor": 4.0},
            {"gemmlab": 1.0, "cublas": 1.0, "inductor": 1.0},
        ),
    ]
    results[2]["other_modes"]["wall"]["candidates"]["gemmlab"]["check_after"] = False  # wrong in one mode: wrong
    rep = {
        "args": {"baseline": "cublas", "modes": ["graph", "wall"], "budget_s": None},
        "results": results,
        "not_run": [],
    }
    s = bg.summary(rep)["backends"]
    g = s["gemmlab"]
    assert g["cases"] == 3 and g["wrong"] == ["7x8x9 fp16 linear"]
    assert g["device"]["n"] == 2 and g["device"]["geomean"] == pytest.approx(math.sqrt(2.0 * 0.5))
    assert g["device"]["min"] == 0.5 and g["device"]["min_case"] == "4x5x6 fp16 linear"
    assert g["device"]["below"] == 1 and g["device"]["below_cases"] == ["4x5x6 fp16 linear"]
    assert g["eager"]["geomean"] == pytest.approx(math.sqrt(1.0 * 0.5)) and g["eager"]["below"] == 1
    assert g["vs_inductor"]["geomean"] == pytest.approx(math.sqrt(1.5 * 0.5))  # device time, not wall
    assert g["vs_inductor"]["below"] == 1 and g["vs_inductor"]["floor"] == 1.0
    assert g["seeds"] == {"1x2x3 fp16 linear": 2.0}
    wrong = [r for r in bg.rows(rep) if not r["ok"]]  # a row that is not ok says why
    assert [(r["case"], r["backend"]) for r in wrong] == [("7x8x9 fp16 linear", "gemmlab")]
    assert wrong[0]["error"].startswith("wrong after the timed calls"), wrong[0]
    i = s["inductor"]
    assert i["vs_inductor"] is None and i["device"]["geomean"] == pytest.approx((4 / 3 * 1.0 * 0.24) ** (1 / 3))
    row = next(r for r in bg.rows(rep) if r["backend"] == "gemmlab" and r["case"] == "1x2x3 fp16 linear")
    assert (row["ratio"], row["eager_ratio"], row["inductor_ratio"]) == (2.0, 1.0, 1.5)


def test_inductor_options_and_what_its_code_says():
    opts = inductor.options("EXHAUSTIVE", 20)
    assert opts["max_autotune_gemm_backends"] == "TRITON" and opts["max_autotune_gemm_search_space"] == "EXHAUSTIVE"
    assert opts["inductor_default_autotune_rep"] == 20 and opts["inductor_default_autotune_warmup"] == 5
    with pytest.raises(ValueError, match="autotune rep"):
        inductor.options("DEFAULT", 0)
    code = (
        "triton_tem_fused_mm_0 = async_compile.triton('triton_tem_fused_mm_0', '''\n"
        "@triton_heuristics.template(num_stages=3, num_warps=8)\ndef triton_tem_fused_mm_0(A, B):\n"
        "    BLOCK_M : tl.constexpr = 128\n    BLOCK_N : tl.constexpr = 256\n    BLOCK_K : tl.constexpr = 64\n"
        "''')\ntriton_poi_fused_0 = async_compile.triton('triton_poi_fused_0', '''...''')\n"
    )
    assert inductor.describe([code]) == "inductor triton template 128x256x64 w8 s3 +1 other triton kernel"
    assert inductor.describe(["buf0 = extern_kernels.mm(a, b)"]) == "inductor aten mm"
    assert inductor.describe([]) == "inductor (generated code not seen)"


def test_an_inductor_that_cannot_compile_is_reported_not_fatal(monkeypatch):
    import torch._inductor.utils as iu

    def broken(fn, *args):
        raise RuntimeError("NoValidChoicesError: No choices to select\nmore")

    monkeypatch.setattr(iu, "run_and_get_code", broken)
    fn, facts = inductor.make(torch.ones(2, 2, dtype=torch.float16), torch.ones(2, 2, dtype=torch.float16))
    assert facts["path"] == "inductor (compile failed)" and facts["compile_s"] >= 0
    with pytest.raises(RuntimeError, match="inductor failed to compile: RuntimeError: NoValidChoicesError: No ch"):
        fn()


@pytest.mark.cpu_only("the CPU's answer")
def test_inductor_is_skipped_without_cuda():
    assert "no CUDA" in inductor.unavailable()
    rep = bg.bench_gemm([(4, 8, 8)], backends=["inductor"], modes=("wall",), rounds=1, reps=1, warmup_s=0.0)
    assert "no CUDA" in rep["skipped_backends"]["inductor"] and rep["args"]["backends"] == []
    assert rep["args"]["inductor"] is None and any("no CUDA" in line for line in gemm_view.summary_lines(rep))
    assert [r["backend"] for r in bg.rows(rep)] == ["cublas"]


@pytest.mark.gpu
def test_inductor_baseline_on_the_gpu():
    todo = [Case(64, 256, 128, "bfloat16", "linear"), Case(100, 136, 72, pad=1)]
    rep = bg.bench_gemm(
        todo,
        backends=["gemmlab", "inductor"],
        modes=("graph", "wall"),
        rounds=2,
        reps=2,
        warmup_s=0.0,
        inductor_opts={"autotune_rep_ms": 4},
    )
    table = {(r["case"], r["backend"]): r for r in bg.rows(rep)}
    for c in todo:
        ind, mine = table[(c.label, "inductor")], table[(c.label, "gemmlab")]
        assert ind["ok"] and ind["compile_s"] > 0 and ind["path"].startswith("inductor"), ind
        assert "triton" in ind["path"] and "aten mm" not in ind["path"], ind["path"]  # Triton templates only
        assert mine["ok"] and mine["inductor_ratio"] > 0 and mine["ratio"] > 0 and mine["eager_ratio"] > 0
        assert ind["device_ms"] > 0 and ind["eager_ms"] > 0 and mine["sm_clock_mhz"] is not None


def test_bench_gemm_command_runs_a_case_suite(tmp_path, device):
    import json
    import subprocess
    import sys

    env = no_interpreter_env()

    def gemmlab(*args):
        return subprocess.run(
            [sys.executable, "-m", "gemmlab", "bench", "gemm", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )

    fast = ["--rounds", "1", "--reps", "1", "--warmup-s", "0"]
    res = gemmlab(
        "--suite",
        "broad-cpu",
        "--backend",
        "gemmlab",
        "--backend",
        "inductor",
        *fast,
        "--output-dir",
        str(tmp_path),
        "--json",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "pad3" in res.stderr and "linear" in res.stderr  # under --json the tables go to stderr
    assert "gemmlab: 0 wrong of 5" in res.stderr
    if device == "cpu":
        assert "inductor skipped: no CUDA" in res.stderr
    rep = json.loads((tmp_path / "gemm-bench.json").read_text())
    assert json.loads(res.stdout) == rep and rep["kind"] == "gemm-bench"
    assert [r["label"] for r in rep["results"]] == [c.label for c in BROAD_CPU] and rep["summary"]["backends"]
