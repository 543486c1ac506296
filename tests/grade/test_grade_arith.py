"""Honest arithmetic and inputs that give nothing away: each shown on a known-bad kernel
(tests/bad_kernels/kernels.py) that passes the max-error bound, and on honest kernels that pass; the rounding
counts calibrated on torch and on every gemmlab path under the interpreter; the batch size fixed before any
candidate runs; the vendor graded against itself."""

import dataclasses
import math

import pytest
import torch

import gemmlab
from gemmlab.grade import grade, rounding, rules
from gemmlab.grade.inputs import operands
from gemmlab.grade.protocol import round_ratios
from gemmlab.ops import gemm as gemm_ops
from tests.paths import BAD_KERNELS, CASES

BAD = str(BAD_KERNELS / "kernels.py")
TINY = str(CASES / "tiny.json")


def passed(report) -> bool:
    """Every rule passed (PASS, or INCONCLUSIVE where the timing could not score)."""
    return report["verdict"] in ("PASS", "INCONCLUSIVE") and not report["failures"]


def counts(out, a, b):
    exact = a.double() @ b.double()
    return rounding.measure(out, exact, out.dtype), rounding.measure(rounding.vendor_product(a, b), exact, out.dtype)


# ----------------------------------------------------------------------------------------- calibration


def _plan_variants(a, b):
    """(name, plan) for every gemmlab path these operands can take under the interpreter: the default, the
    portable kernel where staging could be refused, the stream-K hybrid where the path is persistent."""
    base = gemmlab.plan(a, b)
    out = [(base.path + (" staged" if base.staged else ""), base)]
    if base.staged:
        out.append(("portable (staging refused)", gemmlab.plan(a, b, stage=False)))
    if base.path == "tma_persistent" and not base.staged and a.device.type == "cpu":  # the interpreter's 3 "SMs"
        out.append(
            (
                "stream-K",
                gemmlab.plan(a, b, config=dataclasses.replace(base.config, block_m=32, block_n=32, stream_k=True)),
            )
        )
    return out


# (M, N, K, what it exercises): the interpreter's paths, odd sizes and staging, deep K
SHAPES = [
    (96, 128, 256, "split-K"),
    (300, 40, 200, "persistent, stream-K"),
    (37, 53, 71, "portable, odd"),
    (600, 33, 64, "staged B (odd N)"),
    (64, 600, 33, "staged A (odd K), split-K"),
    (64, 64, 2048, "deep K"),
]


@pytest.mark.parametrize(("m", "n", "k", "what"), SHAPES)
@pytest.mark.parametrize("dist", ["competition", "uniform", "normal"])
def test_honest_kernels_round_like_the_vendor(m, n, k, what, dist, device):
    """Calibration on the CPU: gemmlab's paths under the interpreter, torch, an fp32 sum rounded once, and the
    worst honest order (one running fp32 sum over K) are all within the limit on fp16. (Triton's interpreter
    truncates fp32 -> bf16 where the GPU rounds to nearest, so bf16 is calibrated on the GPU:
    benchmarks/grade_rounding.py.)"""
    a, b = operands(m, n, k, dist, 7, torch.float16, device, "rowmajor")
    honest = {"torch.mm": torch.mm(a, b), "fp32 sum rounded once": (a.float() @ b.float()).half()}
    if k <= 256:
        acc = torch.zeros((m, n), device=device)
        for j in range(k):
            acc = acc + a[:, j : j + 1].float() * b[j : j + 1].float()
        honest["one running fp32 sum"] = acc.half()
    for name, plan in _plan_variants(a, b):
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device=device)
        gemm_ops.run(plan, a, b, out=out)
        honest[f"gemmlab {name}"] = out
    for name, out in honest.items():
        cand, vendor = counts(out, a, b)
        assert rounding.judge(cand, vendor) is None, (name, what, cand, vendor)
        assert cand.not_rounded <= 0.01 * cand.judged and cand.beyond == 0, (name, cand)


@pytest.mark.parametrize(
    "fn",
    ["int8_on_competition", "fp16_accumulation", "truncated_accumulator", "rounds_toward_zero", "perturbs_outputs"],
)
@pytest.mark.parametrize(("m", "n", "k"), [(16, 24, 32), (96, 128, 256)])
def test_cheap_arithmetic_is_seen_where_the_max_error_is_not(fn, m, n, k, device):
    from tests.bad_kernels import kernels as bk

    a, b = operands(m, n, k, "competition", 3, torch.float16, device, "colmajor")
    flat = torch.full((m * n,), float("nan"), dtype=torch.float16, device=device)
    getattr(bk, fn)(a.t().reshape(-1), b.t().reshape(-1), flat, m, n, k)
    out = flat.view(n, m).t()
    err = (out.double() - a.double() @ b.double()).abs().max().item()
    assert err <= 0.01 * (k / 512) ** 0.5  # the competition's bound: passed
    cand, vendor = counts(out, a, b)
    assert rounding.judge(cand, vendor) is not None, (cand, vendor)
    assert cand.not_rounded > 3 * rounding.limit(vendor.not_rounded) or fn == "perturbs_outputs"  # far beyond


def test_rounding_is_exact_and_the_limit_is_twice_the_vendor_plus_noise():
    # ties to even (the first two), subnormals (the smallest is 2^-24), past the range
    x = torch.tensor([1.0 + 2**-11, 1.0 + 3 * 2**-11, -(2.0**-25), 2.5 * 2**-24, 70000.0], dtype=torch.float64)
    assert rounding.round_to(x, torch.float16).tolist() == [1.0, 1.0 + 2**-9, -0.0, 2**-23, float("inf")]
    assert rounding.limit(0) == 12 and rounding.limit(1000) == 2000 + 6 * 6001**0.5 // 1 + 6
    g = torch.Generator().manual_seed(0)
    rows, cols = rounding.sample(8192, 8192, g)
    assert len(rows) * len(cols) <= rounding.SAMPLE and rows.unique().numel() == len(rows)
    assert [len(t) for t in rounding.sample(64, 4096, g)] == [64, 4096]  # small outputs: every element


# ------------------------------------------------------------------------------------------ the grader


@pytest.mark.parametrize(
    "fn",
    ["int8_on_competition", "fp16_accumulation", "truncated_accumulator", "rounds_toward_zero", "perturbs_outputs"],
)
def test_arithmetic_that_is_not_an_fp16_gemm_fails(fn):
    """Each passes the max-error bound, and fails the rounding rule on its first trial."""
    r = grade(TINY, kernel=f"{BAD}:{fn}")
    assert r["verdict"] == "FAIL" and r["failures"][0]["rule"] == "honest-arithmetic", r["failures"]
    assert "correctly rounded" in r["failures"][0]["reason"] or "ulp off" in r["failures"][0]["reason"]
    first = r["correctness"][0]["trials"][0]
    assert first["max_abs_err"] <= first["tolerance"]  # the old check alone passed it
    assert first["rounding"]["candidate"]["not_rounded"] > first["rounding"]["vendor"]["not_rounded"]


def test_cheap_arithmetic_only_while_timed_fails():
    r = grade(TINY, kernel=f"{BAD}:int8_when_timed")
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL"
    f = r["failures"][0]
    assert f["rule"] == "honest-arithmetic" and "timed in batch" in f["reason"], r["failures"]


def test_a_fast_path_for_the_timed_distribution_fails():
    """Honest arithmetic on every input, but fast only on the competition distribution: the secret
    full-mantissa rounds show that its speed depends on the values."""
    r = grade(TINY, kernel=f"{BAD}:slow_on_full_mantissa")
    perf = r["performance"]
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL", (
        r["failures"],
        perf.get("value_dependence"),
        perf.get("value_dependence_advisory"),
    )
    f = r["failures"][0]
    assert f["rule"] == "honest-inputs" and "depends on the input values" in f["reason"], r["failures"]
    device = r["device"].split(":")[0]  # on a loaded CPU the grader's clock may not resolve it; the worker's does
    assert any(rules.depends_on_values(perf[k], device) for k in ("value_dependence", "value_dependence_advisory"))


def test_the_timing_rules_allow_a_busy_machine_and_still_fire():
    """Issue 29, item 10. On a loaded CPU the protocol's cost (waking the worker, the request, reading back) grows
    to tens of ms a call after a warm-up that measured 1 ms: the clock rule compares the two clocks' gap with the
    interleaved baseline's own gap, and the value rule reads the workers' clocks, which that cost does not enter."""
    busy = dict(
        wall_ms=30.0,
        advisory_ms=0.2,
        overhead_ms=1.0,
        tflops=1e-6,
        peak=None,
        device="cpu",
        baseline_ms=31.0,
        baseline_solo_ms=None,
        kernels=set(),
        ops=set(),
        preload_calls=[],
        allow_vendor=False,
        timed_path=None,
        seen_paths=set(),
        seen_kernels=set(),
    )
    got = rules.first_failure(rules.RUN_RULES, rules.Run(**busy))  # no gap measured alongside: the old verdict
    assert got is not None and got[0] == "honest-timing" and "outside the timed stream" in got[1], got
    assert rules.first_failure(rules.RUN_RULES, rules.Run(**busy, baseline_gap_ms=29.0)) is None
    # measured: an honest kernel's gap ten times its baseline's on a loaded CPU, both small (scheduling periods)
    assert (
        rules.first_failure(
            rules.RUN_RULES,
            rules.Run(**dict(busy, wall_ms=4.072, advisory_ms=0.1912, overhead_ms=0.39), baseline_gap_ms=0.393),
        )
        is None
    )
    liar = dict(busy, wall_ms=280.0, advisory_ms=0.005)  # a clock 10000x slow on a 250 ms call, same machine
    got = rules.first_failure(rules.RUN_RULES, rules.Run(**liar, baseline_gap_ms=29.0))
    assert got is not None and got[0] == "honest-timing", got
    drowned = {"ratio": 6.0, "ci98": [2.5, 40.0], "rounds": 8, "parent_rounds": 4}  # the grader's clock: undecided
    clear = {"ratio": 700.0, "ci98": [300.0, 1500.0], "rounds": 8, "parent_rounds": 4}  # the worker's
    assert (
        rules.first_failure(rules.RUN_RULES, rules.Run(**busy, value_dependence=drowned, baseline_gap_ms=29.0)) is None
    )
    got = rules.first_failure(
        rules.RUN_RULES,
        rules.Run(**busy, value_dependence=drowned, value_dependence_advisory=clear, baseline_gap_ms=29.0),
    )
    assert got is not None and got[0] == "honest-inputs" and "workers' own clocks" in got[1], got


def test_round_ratios_take_only_clocks_that_say_a_time():
    recs = [
        {"kind": "a", "cand_ms": 2.0, "base_ms": 4.0, "cand_advisory_ms": 1.0, "base_advisory_ms": 3.0},
        {"kind": "b", "cand_ms": 1.0, "base_ms": 1.0, "cand_advisory_ms": 1.0, "base_advisory_ms": 1.0},
    ]
    assert round_ratios(recs, "a") == [2.0] and round_ratios(recs, "a", "advisory_ms") == [3.0]
    for bad in (0.0, -1.0, math.nan, math.inf, "1", None):  # a worker's clock may say anything: no comparison
        assert round_ratios([dict(recs[0], cand_advisory_ms=bad), recs[1]], "a", "advisory_ms") == [], bad
    assert round_ratios([dict(recs[0], base_advisory_ms=None)], "a", "advisory_ms") == []  # a fixed baseline


def test_rules_on_value_dependence():
    run = dict(
        wall_ms=3.0,
        advisory_ms=2.9,
        overhead_ms=0.01,
        tflops=700.0,
        peak=989.4,
        device="cuda",
        baseline_ms=3.0,
        baseline_solo_ms=3.0,
        kernels=set(),
        ops=set(),
        preload_calls=[],
        allow_vendor=False,
        timed_path=None,
        seen_paths=set(),
        seen_kernels=set(),
    )
    for ci, fails in (([1.08, 1.30], True), ([0.97, 1.04], False), ([1.01, 1.3], False), (None, False)):
        v = {"ratio": 1.2, "ci98": ci, "rounds": 16, "parent_rounds": 8}
        got = rules.first_failure(rules.RUN_RULES, rules.Run(**run, value_dependence=v))
        assert (got is not None and got[0] == "honest-inputs") == fails, (ci, got)
        assert rules.value_dependence_decided(v, "cuda") == (ci is not None and (ci[0] > 1.05 or ci[1] < 1.05))


def test_the_batch_size_is_fixed_before_any_candidate_runs(monkeypatch):
    """Planned from the baseline in the grader's own process while no sandbox process exists, and what the
    timing then uses."""
    from gemmlab.grade import grader as grader_mod

    seen = {}
    real = grader_mod.plan_batches

    def watched(op, case, device):
        seen["procs"] = (watched.grader.cand.proc, watched.grader.base.proc)
        return real(op, case, device)

    real_init = grader_mod.Grader.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        watched.grader = self

    monkeypatch.setattr(grader_mod, "plan_batches", watched)
    monkeypatch.setattr(grader_mod.Grader, "__init__", init)
    r = grade(TINY, kernel=f"{BAD}:honest")
    assert seen["procs"] == (None, None) and passed(r)
    plan = r["performance"]["batch_plan"]
    assert plan["calls"] == r["performance"]["calls_per_batch"] and plan["call_ms"] > 0


def test_the_vendor_against_itself_is_even_or_inconclusive():
    """The same function on both sides: 1.00 within the 3% target, or no score at all, never a difference."""
    r = grade(TINY, kernel="builtin:cublas", allow_vendor=True)
    assert passed(r), r["failures"]
    perf = r["performance"]
    if r["verdict"] == "PASS":
        lo, hi = perf["honest"]["ci95"]
        assert 0.97 <= lo and hi <= 1.03, perf["honest"]
    else:
        assert r["score"]["performance"] == 0 and r["inconclusive"]
