"""The measuring instruments on the CPU: statistics and bootstrap on synthetic timings, verdicts,
efficiency, clock flags, refusal of constant inputs, compare's verify-first rules, the NVML-less
degradation, MoE shape derivation, the GEMM bench and the table end to end (interpreter, host clock). On a GPU
(gpu-marked): event timing with clocks and efficiency, graph replay, the table's tensor-core column from the
inspector, the inspector on the live GPU's plan."""

import csv
import json
import random
import statistics
import sys
import types

import numpy as np
import pytest
import torch

import gemmlab
from gemmlab import output
from gemmlab.device import tensor_peak_tflops
from gemmlab.instruments import stats, timing
from gemmlab.instruments.compare import compare, compare_many, outcome
from gemmlab.problems import MOE_MODELS, moe_gemm_shape, resolve_moe, suite
from gemmlab.ref import gemm_check, gemm_ref
from tests.conftest import rand

# ------------------------------------------------------------------------------------------ statistics


def test_summarize_matches_numpy():
    rng = random.Random(1)
    xs = [rng.lognormvariate(0, 0.3) for _ in range(37)]
    s = stats.summarize(xs)
    assert s["median_ms"] == pytest.approx(np.median(xs))
    assert s["p20_ms"] == pytest.approx(np.quantile(xs, 0.2))
    assert s["p80_ms"] == pytest.approx(np.quantile(xs, 0.8))
    assert (s["min_ms"], s["max_ms"], s["n"]) == (min(xs), max(xs), 37)
    assert s["cv"] == pytest.approx(np.std(xs) / np.mean(xs))
    with pytest.raises(ValueError, match="no timings"):
        stats.summarize([])


def _rounds(ms: float, rng: random.Random, n: int = 12, reps: int = 5, noise: float = 0.01):
    return [[ms * (1 + rng.gauss(0, noise)) for _ in range(reps)] for _ in range(n)]


@pytest.mark.parametrize(("cand_ms", "verdict"), [(0.9, "faster"), (1.1, "slower"), (1.0, "within noise")])
def test_ratio_summary_verdicts(cand_ms, verdict):
    rng = random.Random(7)
    r = stats.ratio_summary(_rounds(cand_ms, rng), _rounds(1.0, rng))
    assert r["verdict"] == verdict
    assert r["ci95"][0] <= r["ratio"] <= r["ci95"][1]
    assert r["ratio"] == pytest.approx(1.0 / cand_ms, rel=0.02)
    assert len(r["per_round"]) == 12


def test_ratio_is_per_round_so_common_drift_cancels():
    # both slow down 30% over the run (a clock falling under the power cap); per-round ratios stay 1.25
    drift = [1 + 0.3 * i / 11 for i in range(12)]
    cand = [[0.8 * d] * 5 for d in drift]
    base = [[1.0 * d] * 5 for d in drift]
    r = stats.ratio_summary(cand, base)
    assert r["ratio"] == pytest.approx(1.25) and r["ci95"] == pytest.approx([1.25, 1.25])
    with pytest.raises(ValueError, match="same number"):
        stats.ratio_summary(cand, base[:-1])


def test_median_interval_is_deterministic_and_covers_the_median():
    rng = random.Random(3)
    xs = [rng.gauss(1.0, 0.05) for _ in range(30)]
    assert stats.median_interval(xs) == stats.median_interval(xs)
    lo, hi = stats.median_interval(xs)
    assert lo < statistics.median(xs) < hi and hi - lo < 0.1


def test_efficiency_at_the_observed_clock():
    # H200: 132 SMs * 4096 FLOP/clock at 1500 MHz = 811 TFLOPS; 8192x8192x16384 in 3.3 ms = 666 TFLOPS
    flops = 2.0 * 8192 * 8192 * 16384
    eff = stats.efficiency(flops, 3.3, 1500, 132, (9, 0), "float16")
    assert eff == pytest.approx(flops / 3.3e-3 / (4096 * 132 * 1.5e9))
    assert tensor_peak_tflops((9, 0), "bfloat16", 132, 1830) == pytest.approx(989.6, abs=0.5)
    assert stats.efficiency(flops, 3.3, None, 132, (9, 0), "float16") is None  # no NVML clock
    assert stats.efficiency(flops, 3.3, 1500, 132, (7, 5), "float16") is None  # unknown architecture
    assert stats.efficiency(flops, 3.3, 1500, None, None, "float16") is None  # CPU


def test_clock_flags_fire_on_oscillation_and_drift_only():
    assert stats.clock_flags([1450, 1460], [1400, 1420], [1500, 1490]) == []
    osc = stats.clock_flags([1500, 1460], [1100, 1420], [1980, 1490])
    assert len(osc) == 1 and "oscillation in run 0" in osc[0]
    drift = stats.clock_flags([1980, 1400, 1700], [1970, 1390, 1690], [1980, 1410, 1710])
    assert len(drift) == 1 and "differs between runs" in drift[0]


# ------------------------------------------------------------------------------------------ timing


def test_constant_inputs_are_refused():
    a = rand((8, 8))
    for bad in (torch.zeros(8, 8), torch.ones(8, 8, dtype=torch.float16), torch.full((3, 5), 0.25)):
        with pytest.raises(ValueError, match="'b' .* is constant"):
            timing.require_random(a=a, b=bad)
    with pytest.raises(ValueError, match="NaN"):
        timing.require_random(a=torch.tensor([1.0, float("nan")]))
    timing.require_random(a=a, b=rand((8, 8)), tiny=torch.zeros(1))
    with pytest.raises(ValueError, match="constant"):
        compare(lambda: a, lambda: a, inputs={"a": torch.zeros(4, 4)})


def test_interleave_alternates_order_and_records_windows():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    windows = {}
    times = timing.interleave(fns, rounds=4, reps=2, warmup_s=0.0, device=torch.device("cpu"), windows=windows)
    assert [len(times[n]) for n in "ab"] == [4, 4] and all(len(r) == 2 for r in times["a"])
    assert "".join(calls[2:]) == "aabb" + "bbaa" + "aabb" + "bbaa"  # after one warm-up round (ab)
    assert len(windows["a"]) == 4 and all(t0 <= t1 for t0, t1 in windows["a"])
    calls.clear()
    timing.back_to_back(fns, rounds=3, reps=2, device=torch.device("cpu"))
    assert "".join(calls) == "a" + "a" * 6 + "b" + "b" * 6  # warm-up then all of a, then all of b


# ------------------------------------------------------------------------------------------ compare


def _matmul_setup():
    a, b = rand((16, 24), torch.float32), rand((24, 8), torch.float32)
    ref = a.double() @ b.double()

    def check(out):
        err = (out.double() - ref).abs().max().item()
        return {"ok": bool(err < 1e-2), "max_abs_err": err}  # loose: cuBLAS may use TF32 for fp32

    return a, b, check


def test_compare_verifies_first_and_never_times_a_wrong_candidate(device):
    a, b, check = _matmul_setup()
    out = torch.empty(16, 8, device=a.device)
    fns = {
        "good": lambda: torch.mm(a, b, out=out),
        "wrong": lambda: torch.mm(a, b) + 0.05,
        "raises": lambda: 1 / 0,
        "base": lambda: a @ b,
    }
    r = compare_many(
        fns,
        "base",
        check=check,
        flops=2 * 16 * 24 * 8,
        dtype="float32",
        rounds=3,
        reps=2,
        warmup_s=0.0,
        inputs={"a": a, "b": b},
    )
    c = r["candidates"]
    assert c["good"]["check"]["ok"] and c["good"]["check_after"] is True
    assert c["good"]["checked_after"] == "last timed output"  # in-place output: poisoned, then checked
    assert c["base"]["checked_after"] == "one more call"
    assert "vs_baseline" in c["good"] and c["good"]["vs_baseline"]["verdict"] == "inconclusive"  # 3 rounds: too few
    assert not c["wrong"]["check"]["ok"] and "median_ms" not in c["wrong"] and "not timed" in c["wrong"]["skipped"]
    assert "ZeroDivisionError" in c["raises"]["check"]["error"] and "median_ms" not in c["raises"]
    assert c["good"]["tflops"] > 0
    if device == "cpu":  # no GPU: no clocks, no efficiency, and the timer says so
        assert c["good"]["efficiency"] is None and "nvml" in c["good"]["clocks"] and "host clock" in r["timer"]


def test_outcome_says_why_each_candidate_failed():
    """``outcome``: right before and after timing, or the reason, for every way of failing."""
    a, b, check = _matmul_setup()
    calls = {"n": 0}

    def turns():  # right when verified, wrong once timed (a fresh tensor each call: checked by one more call)
        calls["n"] += 1
        return a @ b if calls["n"] == 1 else a @ b + 0.05

    fns = {"turns": turns, "wrong": lambda: a @ b + 0.05, "raises": lambda: 1 / 0, "base": lambda: a @ b}
    c = compare_many(fns, "base", check=check, rounds=2, reps=1, warmup_s=0.0)["candidates"]
    assert outcome(c["base"]) == (True, None)
    assert outcome(c["turns"]) == (False, "wrong after the timed calls (one more call)")
    ok, why = outcome(c["wrong"])
    assert not ok and why.startswith("wrong (max abs err")
    assert outcome(c["raises"])[1].startswith("ZeroDivisionError")
    c = compare(lambda: a @ b, lambda: a @ b + 1, check=check, rounds=2, reps=1, warmup_s=0.0)["candidates"]
    assert outcome(c["candidate"]) == (True, "the baseline failed its check: nothing is timed")  # right, not timed


def test_compare_catches_an_output_that_is_not_rewritten():
    a, b, check = _matmul_setup()
    cache = {}

    def lazy():  # computes once, then returns its buffer untouched (a result cached by address)
        if "c" not in cache:
            cache["c"] = a @ b
        return cache["c"]

    r = compare(lazy, lambda: a @ b, check=check, rounds=2, reps=1, warmup_s=0.0)
    c = r["candidates"]["candidate"]
    assert not c["check"]["ok"] and "second call" in c["check"]["error"] and "median_ms" not in c


def test_compare_with_a_wrong_baseline_times_nothing():
    a, b, check = _matmul_setup()
    r = compare(lambda: a @ b, lambda: a @ b + 1, check=check, rounds=2, reps=1, warmup_s=0.0)
    assert r["timed"] is False and "baseline failed" in r["candidates"]["candidate"]["skipped"]
    with pytest.raises(ValueError, match="baseline"):
        compare_many({"x": lambda: a}, "y")


# ------------------------------------------------------------------------------------------ NVML


def test_clock_sampler_without_nvml_degrades(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with timing.ClockSampler() as s:
        pass
    assert s.error.startswith("NVML unavailable") and s.summary() == {"nvml": s.error}


def test_clock_sampler_reads_a_fake_nvml_and_attributes_windows(monkeypatch):
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=0,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: "h",
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4,
        nvmlDeviceGetClockInfo=lambda h, kind: 1500,
        nvmlDeviceGetPowerUsage=lambda h: 690_000,
        nvmlDeviceGetTemperature=lambda h, kind: 61,
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with timing.ClockSampler(period_s=0.001) as s:
        import time

        time.sleep(0.05)
    summ = s.summary()
    assert summ["sm_clock_mhz_mean"] == 1500 and summ["power_w_mean"] == 690 and summ["temp_c_max"] == 61
    assert summ["clock_event_reasons"] == ["sw_power_cap"]
    s.samples = [(float(t), 1000.0 + 10 * t, 500.0, 50.0, 0) for t in range(100)]
    own = s.summary([(0.0, 29.0)])
    assert (
        own["samples"] == 30
        and own["sm_clock_mhz_mean"] == pytest.approx(1145)
        and own["clock_scope"] == ("own timing windows")
    )
    few = s.summary([(0.0, 4.0)])  # 5 samples: too few to attribute, the whole run is reported
    assert few["samples"] == 100 and "only 5 samples" in few["clock_scope"]
    timed = s.summary([(0.0, 4.0)], fallback=[(0.0, 4.0), (50.0, 89.0)])  # ... or all timed batches
    assert timed["samples"] == 45 and timed["clock_scope"].startswith("all timed batches")


# ------------------------------------------------------------------------------------------ shapes


def test_moe_shape_derivation():
    assert moe_gemm_shape(4, 8192, 4, 7168, 2048) == (131072, 2048, 7168)  # the seed's defaults
    assert resolve_moe() == (4, 7168, 2048)
    assert resolve_moe("deepseek-v3") == (8, 7168, 2048)
    assert resolve_moe("mixtral-8x7b") == (2, 4096, 14336)
    assert resolve_moe("qwen3-30b-a3b", top_k=2) == (2, 2048, 768)  # explicit beats the preset
    assert MOE_MODELS["deepseek-v3"].experts == 256
    with pytest.raises(ValueError, match="unknown model"):
        resolve_moe("llama")
    with pytest.raises(ValueError, match="top_k must be a positive"):
        moe_gemm_shape(4, 8192, 0, 7168, 2048)
    assert len(suite("all")) == len(set(suite("all"))) and set(suite("llm")) <= set(suite("all"))


# ------------------------------------------------------------------------------------------ bench gemm, table

BAD_KERNEL = """
import torch
def gemm(a, b):  # wrong by a scaled row
    c = (a.float() @ b.float()).to(a.dtype)
    c[0] *= 1.5
    return c
def ok(a, b):
    return (a.float() @ b.float()).to(a.dtype)
"""


def test_bench_gemm_end_to_end(tmp_path, device):
    from gemmlab.bench import gemm as bg
    from gemmlab.bench import gemm_view

    kern = tmp_path / "k.py"
    kern.write_text(BAD_KERNEL)
    rep = bg.bench_gemm(
        [(48, 40, 64), (1, 8, 16)],
        torch.float16,
        ["gemmlab", "gemmlab-packed", f"{kern}:gemm", f"{kern}:ok"],
        rounds=2,
        reps=1,
        warmup_s=0.0,
    )
    rows = {(r["shape"], r["backend"]): r for r in bg.rows(rep)}
    assert len(rows) == 2 * 5
    for shape in ("48x40x64", "1x8x16"):
        assert rows[(shape, "gemmlab")]["ok"] and rows[(shape, "gemmlab")]["ratio_vs_cublas"] > 0
        assert rows[(shape, "gemmlab-packed")]["pack_ms"] > 0
        assert rows[(shape, "cublas")]["path"] == ("torch.mm (CPU BLAS)" if device == "cpu" else "torch.mm (cuBLAS)")
        assert rows[(shape, f"{kern}:ok")]["ok"]
        bad = rows[(shape, f"{kern}:gemm")]
        assert not bad["ok"] and bad["median_ms"] is None and "not timed" in bad["error"]
        assert (rows[(shape, "gemmlab")]["sm_clock_mhz"] is None) == (device == "cpu")  # no NVML: no clock
    assert rows[("48x40x64", "gemmlab")]["path"] == "tma_splitk"
    paths = gemm_view.write(rep, tmp_path / "out")
    assert [p.name for p in paths][:2] == ["gemm-bench.json", "gemm-bench.csv"]
    data = json.loads(paths[0].read_text())
    assert data["env"]["gemmlab"] and "git_sha" in data["env"]
    assert data["args"]["baseline"] == "cublas" and len(data["results"]) == 2
    assert [p.name for p in paths][2] == "gemm-bench.md" and paths[2].read_text().count("\n| 48x40x64 fp16 row |") == 5
    long = list(csv.DictReader(paths[1].open()))  # long format: one row per (backend, metric, case)
    assert tuple(long[0]) == output.LONG_FIELDS and {r["kind"] for r in long} == {"gemm-bench"}
    times = {(r["provider"], r["x_value"]): r for r in long if r["metric"] == "time"}
    case = "48x40x64 fp16 row"
    assert float(times[("gemmlab", case)]["p50"]) == rows[("48x40x64", "gemmlab")]["median_ms"]
    assert float(times[("gemmlab", case)]["p20"]) <= float(times[("gemmlab", case)]["p80"])
    assert paths[3].name == "gemm-bench-rows.csv"
    if len(paths) == 5:  # matplotlib present
        assert paths[4].read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="backend 'cutlass'"):
        bg.bench_gemm([(8, 8, 8)], torch.float16, ["cutlass"])


def test_table_rows_and_rendering(tmp_path, device):
    from gemmlab.bench import table as bt

    t = bt.moe_table(1, 8, 2, 32, 24, warmup=1, repeat=2, warmup_s=0.0, inspect=False, num_experts=3)
    assert t["shape"] == {"M": 16, "N": 24, "K": 32}
    rows = {r["row"]: r for r in t["rows"]}
    assert list(rows) == list(bt.ROWS)
    base = rows["GEMM baseline (torch.mm, cuBLAS, raw B)"]
    assert base["max_abs_error"] == 0 and base["ok"]
    for label in ("gemmlab GEMM (raw B)", "gemmlab GEMM (prepacked B)"):
        r = rows[label]
        assert r["ok"] and r["median_ms"] > 0 and r["tflops"] > 0 and r["max_abs_error"] is not None
        assert r["ratio_vs_baseline"] > 0 and (r["sm_clock_mhz"] is None) == (device == "cpu")
    assert rows["gemmlab GEMM (prepacked B)"]["pack_ms"] > 0
    fused = rows["Fused MoE GEMM (gemmlab grouped_gemm)"]  # 16 rows in 3 groups, every weight B^T
    assert fused["ok"] and fused["median_ms"] > 0 and fused["path"] == "moe grouped, E=3"
    assert fused["max_abs_error"] <= 2.0**-10 * 32 * 0.25 and fused["max_abs_error_vs_ref"] is not None
    paths = bt.write(t, tmp_path)
    assert [p.name for p in paths] == ["table.json", "table.csv", "table.md"]
    md = paths[2].read_text()
    assert "M = 1*8*2 = 16" in md and md.count("\n|") == 2 + len(bt.ROWS)
    assert "moe grouped, E=3" in md and ("host-clock timing" in md) == (device == "cpu")
    long = list(csv.DictReader(paths[1].open()))  # long format: each row's time, TFLOPS, ratio, error
    assert {r["provider"] for r in long if r["metric"] == "time"} == set(bt.ROWS)
    assert all(r["kind"] == "table" and r["x_value"] == "16x24x32" for r in long)


def test_stable_summary_flags():
    from gemmlab.bench.stable import summarize_processes

    def proc(ms, ratio, mhz=(1450, 1400, 1500), ok=True):
        return {
            "clocks": {"sm_clock_mhz_mean": mhz[0], "sm_clock_mhz_min": mhz[1], "sm_clock_mhz_max": mhz[2]},
            "candidates": {
                "gemmlab": {"ok": ok, "median_ms": ms, "ratio": ratio},
                "cublas": {"ok": True, "median_ms": ms * ratio, "ratio": None},
            },
        }

    calm = summarize_processes([proc(3.30, 1.01), proc(3.31, 1.00), proc(3.29, 1.02)], ["gemmlab"])
    assert calm["flags"] == [] and calm["backends"]["gemmlab"]["ratio"]["median"] == pytest.approx(1.01)
    rough = summarize_processes(
        [proc(3.3, 1.0, (1700, 1200, 1980)), proc(3.9, 0.9, ok=False), {"failed": "exit 1"}], ["gemmlab"]
    )
    text = " ".join(rough["flags"])
    assert "oscillation" in text and "vary by cv" in text
    assert "wrong output in 1" in text and "1 process(es) failed" in text
    none = summarize_processes([{"clocks": {"nvml": "no"}, "candidates": proc(1, 1)["candidates"]}] * 2, ["gemmlab"])
    assert any("no clock data" in f for f in none["flags"])


def test_stable_report_records_one_entry_per_backend(tmp_path):
    """Each process is a round of the entry (its ratio to cuBLAS); a wrong output in any process makes the
    entry incorrect, so the ledger rejects it."""
    from gemmlab.bench.stable import summarize_processes
    from gemmlab.ledger.records import from_stable, record

    def proc(ratio, ok=True):
        return {
            "clocks": {"sm_clock_mhz_mean": 1400, "sm_clock_mhz_min": 1390, "sm_clock_mhz_max": 1410},
            "candidates": {
                "user": {"ok": ok, "median_ms": 3.3, "ratio": ratio},
                "cublas": {"ok": True, "median_ms": 3.3 * ratio, "ratio": None},
            },
        }

    def report(procs):
        return {
            "env": {},
            "args": {"shape": [64, 64, 64], "dtype": "float16", "backends": ["user"]},
            "processes": procs,
            "summary": summarize_processes(procs, ["user"]),
        }

    good = from_stable(report([proc(1.01), proc(1.02), proc(1.00), proc(1.01)]))
    assert len(good) == 1 and good[0].backend == "user" and good[0].correct
    assert good[0].per_round == [1.01, 1.02, 1.00, 1.01] and good[0].ratio == pytest.approx(1.01)
    bad = from_stable(report([proc(1.01), proc(1.2, ok=False), proc(1.0), proc(1.0)]))
    assert not bad[0].correct and "wrong output" in bad[0].error
    done = record(bad, str(tmp_path / "l.db"))
    assert done[0].decision == "rejected" and done[0].reason.startswith("incorrect")


@pytest.mark.cpu_only("the CPU run of the stable bench")
def test_stable_bench_runs_fresh_processes():
    from gemmlab.bench.stable import stable_bench

    r = stable_bench((16, 24, 32), torch.float16, ["gemmlab"], processes=2, rounds=2, reps=1, warmup_s=0.0)
    assert r["summary"]["processes_ok"] == 2, r["processes"]
    assert r["summary"]["backends"]["gemmlab"]["wrong_in"] == 0
    assert r["summary"]["backends"]["gemmlab"]["ratio"]["n"] == 2
    with pytest.raises(ValueError, match="at least 2"):
        stable_bench((8, 8, 8), processes=1)


# ------------------------------------------------------------------------------------------ on the GPU (gpu-marked)


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_compare_on_the_gpu_reports_clocks_and_efficiency(graph):
    m = n = k = 2048
    a, b = rand((m, k), device="cuda"), rand((k, n), device="cuda")
    ref = gemm_ref(a, b)
    outs = [torch.empty(m, n, dtype=a.dtype, device="cuda") for _ in range(2)]
    fns = {"gemmlab": lambda: gemmlab.gemm(a, b, out=outs[0]), "cublas": lambda: torch.mm(a, b, out=outs[1])}
    r = compare_many(
        fns,
        "cublas",
        check=lambda c: gemm_check(c, a, b, ref),
        flops=2.0 * m * n * k,
        rounds=4,
        reps=5,
        warmup_s=0.3,
        graph=graph,
        inputs={"a": a, "b": b},
    )
    assert r["timed"] and "CUDA events" in r["timer"]
    g = r["candidates"]["gemmlab"]
    assert g["check"]["ok"] and g["check_after"] is True and g["checked_after"] == "last timed output"
    assert 0.01 < g["median_ms"] < 5 and g["p20_ms"] <= g["median_ms"] <= g["p80_ms"]
    assert 300 < g["clocks"]["sm_clock_mhz_mean"] <= 2100, g["clocks"]
    assert 0.05 < g["efficiency"] < 1.05 and g["tflops"] > 50
    assert g["vs_baseline"]["verdict"] in ("faster", "slower", "within noise", "inconclusive")
    assert len(g["vs_baseline"]["per_round"]) == 4


@pytest.mark.gpu
def test_table_on_the_gpu_reads_tensor_cores():
    from gemmlab.bench.table import moe_table

    t = moe_table(1, 256, 2, 1024, 768, warmup=2, repeat=10, warmup_s=0.2)
    rows = {r["row"]: r for r in t["rows"]}
    for label in ("gemmlab GEMM (raw B)", "gemmlab GEMM (prepacked B)"):
        assert rows[label]["ok"] and rows[label]["tensor_core"] is True and rows[label]["hgmma"] > 0, rows[label]
        assert rows[label]["sm_clock_mhz"] > 300 and rows[label]["efficiency"] > 0
    base = rows["GEMM baseline (torch.mm, cuBLAS, raw B)"]
    assert base["max_abs_error"] == 0 and base["kernels"], base


@pytest.mark.gpu
def test_inspect_shape_on_the_live_gpu():
    from gemmlab.instruments.sass import inspect_shape

    r = inspect_shape(8192, 8192, 16384)
    p = gemmlab.plan(
        torch.empty(8192, 16384, dtype=torch.float16, device="cuda"),
        torch.empty(16384, 8192, dtype=torch.float16, device="cuda"),
    )
    assert r["path"] == p.path and r["block"] == [p.config.block_m, p.config.block_n, p.config.block_k]
    assert r["tensor_core"] and r["flags"] == []
