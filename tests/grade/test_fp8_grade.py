"""The grader's fp8 mode (grade/fp8.py): gemmlab's FP8 GEMM and torch._scaled_mm pass; each rule fires on a
known-bad FP8 GEMM (tests/bad_kernels/fp8_kernels.py). Small cases (tests/cases/fp8-small*.json, the shipped
fp8-cpu.json) so it runs on the CPU; one GPU test at 4096^3 against torch._scaled_mm."""

import json

import pytest
import torch

from gemmlab.grade import cases, grade, load_any, make_op
from gemmlab.problems import fp8_operands
from tests.grade.test_grade import _cli, failed_rules, passed
from tests.paths import BAD_KERNELS, CASES

BAD = str(BAD_KERNELS / "fp8_kernels.py")
SMALL = str(CASES / "fp8-small.json")  # per-tensor scales, fp16 C, a timed case of its own sizes
SMALL_ROW = str(CASES / "fp8-small-row.json")  # per-row/column scales, correctness only


def _case_file(tmp_path, **over) -> str:
    d = {
        "name": "fp8-t",
        "mode": "fp8",
        "dtype": "float16",
        "scales": "tensor",
        "correctness": [{"name": "odd", "M": 37, "N": 53, "K": 144}],
        **over,
    }
    p = tmp_path / "fp8-t.json"
    p.write_text(json.dumps(d))
    return str(p)


def test_gemmlab_fp8_passes_the_cpu_case_file():
    r = grade("fp8-cpu", kernel="builtin:gemmlab_fp8")
    assert r["verdict"] == "PASS" and not r["failures"], r["failures"]
    assert r["mode"] == "fp8" and r["signature"] == "fp8" and r["score"]["correctness"] == 30
    trials = [t for c in r["correctness"] for t in c["trials"]]
    assert {t["kind"] for t in trials} == {"uniform", "normal"}  # the third trial draws the other kind
    assert all(t["rounding"]["candidate"]["judged"] > 0 for t in trials if t["rounding"])
    assert all("gemm_fp8_bound" in t["rule"] for t in trials)


@pytest.mark.parametrize("case_file", [SMALL_ROW, "fp8-cpu"])
def test_scaled_mm_passes_with_vendor_allowed(case_file):
    assert "vendor" in failed_rules(grade(case_file, kernel="builtin:scaled_mm"))
    r = grade(case_file, kernel="builtin:scaled_mm", allow_vendor=True)
    assert r["verdict"] == "PASS" and not r["failures"], r["failures"]


def test_gemmlab_fp8_timed_against_scaled_mm():
    """The whole protocol on the fp8 op: exact-shape check, the baseline builtin:scaled_mm interleaved, a secret
    share of full-mantissa calls, every timed call verified with its rounding counts."""
    r = grade(SMALL, kernel="builtin:gemmlab_fp8")
    assert passed(r), r["failures"]
    perf = r["performance"]
    assert perf["status"] in ("PASS", "INCONCLUSIVE") and perf["samples_checked"] >= 1 and perf["ratio"] > 0
    assert perf["full_mantissa_kind"] == "full-mantissa" and perf["rounds_full_mantissa"] >= 1
    assert perf["rounding"]["candidate"]["elements"] > 0
    assert "_scaled_mm" in perf["baseline"] or "fallback" in perf["baseline"]
    assert any(c["name"].endswith("(exact-shape check)") for c in r["correctness"])


@pytest.mark.parametrize(
    ("fn", "rule", "words"),
    [
        ("ignores_scales", "correctness", "max |out - ref|"),
        ("bf16_arithmetic", "correctness", "max |out - ref|"),
        ("rounds_toward_zero", "honest-arithmetic", "not correctly rounded"),
        ("writes_part_of_c", "poison-freshness", "NaN"),
    ],
)
@pytest.mark.parametrize("case_file", [SMALL_ROW, "bf16"])
def test_each_rule_fires(fn, rule, words, case_file, tmp_path):
    """Each breaks one rule, with per-row scales (fp16 C) and per-tensor ones (bf16 C); the first failure names it
    (vendor allowed: the bad kernels are torch matmuls)."""
    path = _case_file(tmp_path, dtype="bfloat16") if case_file == "bf16" else case_file
    r = grade(path, kernel=f"{BAD}:{fn}", allow_vendor=True)
    assert r["verdict"] == "FAIL" and r["failures"][0]["rule"] == rule, r["failures"]
    assert words in r["failures"][0]["reason"], r["failures"]


def test_honest_twin_passes_where_the_bad_ones_fail(tmp_path):
    """The bad kernels' honest twin (dequantize, fp32 matmul, round once) passes the same case files."""
    for path in (SMALL_ROW, _case_file(tmp_path, dtype="bfloat16")):
        r = grade(path, kernel=f"{BAD}:dequantized_fp32", allow_vendor=True)
        assert r["verdict"] == "PASS", r["failures"]


def test_wrong_only_at_the_timed_size_fails_exact_shape():
    r = grade(SMALL, kernel=f"{BAD}:wrong_only_at_perf_size")
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"exact-shape"}
    assert r["listed_correctness_passed"]  # every listed case passed, as in the competition


def test_dishonest_only_while_timed_fails_honest_arithmetic():
    """Every timed call is verified: rounding toward zero only while timed fails there, not in the listed cases."""
    r = grade(SMALL, kernel=f"{BAD}:rounds_toward_zero_when_timed", allow_vendor=True)
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL"
    f = r["failures"][0]
    assert f["rule"] == "honest-arithmetic" and "timed in batch" in f["reason"], r["failures"]


def test_a_fast_path_for_quantized_inputs_fails_honest_inputs():
    """Honest arithmetic on every input, fast only on the case's quantized ones: the secret full-mantissa rounds
    show that its speed depends on the values."""
    r = grade(SMALL, kernel=f"{BAD}:slow_on_full_mantissa", allow_vendor=True)
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL", r["failures"]
    f = r["failures"][0]
    assert f["rule"] == "honest-inputs" and "depends on the input values" in f["reason"], r["failures"]


def test_fp8_case_files():
    cf = load_any("fp8")
    assert cf.mode == "fp8" and cf.scales == "tensor" and cf.dtype == "bfloat16"
    assert cf.performance.mnk == (8192, 8192, 8192) and all(c.k % 16 == 0 for c in cf.correctness)
    op = make_op(cf)
    assert op.signature == "fp8" and op.baseline == "builtin:scaled_mm" and op.full_kind == "full-mantissa"
    assert load_any("fp8-cpu").performance is None


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"correctness": [{"M": 8, "N": 8, "K": 24}]}, "correctness[0].K: 24 is not a multiple of 16"),
        ({"performance": {"M": 8, "N": 8, "K": 40}}, "performance.K: 40 is not a multiple of 16"),
        ({"scales": "block"}, "scales: expected one of tensor, row"),
        ({"inputs": "competition"}, "inputs: expected one of uniform, normal"),
        ({"layout": "colmajor"}, "layout: unknown key"),
    ],
)
def test_bad_fp8_case_files_are_one_line(over, words, tmp_path):
    with pytest.raises(cases.CaseError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_any(_case_file(tmp_path, **over))


def test_fp8_case_file_takes_only_its_signature(tmp_path):
    with pytest.raises(cases.CaseError, match="an fp8 case file takes"):
        make_op(load_any(_case_file(tmp_path)), "rowmajor")


@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_operands(per_row):
    """Fresh per seed, reproducible, e4m3 over its range (never zero rows); full-mantissa: every mantissa bit set."""
    a, b, sa, sb = fp8_operands(37, 53, 144, "uniform", per_row, 3, "cpu")
    assert a.dtype == b.dtype == torch.float8_e4m3fn and a.shape == (37, 144) and b.shape == (53, 144)
    assert sa.shape == ((37, 1) if per_row else ()) and sb.shape == ((1, 53) if per_row else ())
    assert a.float().abs().amax().item() == 448.0 and bool((a.float().abs().amax(dim=1) > 0).all())
    again = fp8_operands(37, 53, 144, "uniform", per_row, 3, "cpu")
    other = fp8_operands(37, 53, 144, "uniform", per_row, 4, "cpu")
    assert all(torch.equal(x.float(), y.float()) for x, y in zip((a, b, sa, sb), again, strict=True))
    assert not torch.equal(a.float(), other[0].float())
    fa, fb, fsa, _ = fp8_operands(37, 53, 144, "full-mantissa", per_row, 3, "cpu")
    assert bool(((fa.view(torch.uint8) & 0x7) == 0x7).all()) and bool(torch.isfinite(fa.float()).all())
    assert len(torch.unique(fsa)) == (37 if per_row else 1)
    with pytest.raises(ValueError, match="fp8 inputs 'competition'"):
        fp8_operands(4, 4, 16, "competition", per_row, 0, "cpu")


def test_cli_grades_the_fp8_cpu_case_file():
    p = _cli("--cases", "fp8-cpu", "--kernel", "builtin:gemmlab_fp8", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["mode"] == "fp8"


@pytest.mark.gpu
def test_gemmlab_fp8_against_scaled_mm_on_the_gpu(tmp_path):
    """On the H200 at 4096^3 (bf16 C, per-tensor scales): never FAIL against torch._scaled_mm; row scales pass
    correctness; the truncating kernel fails honest arithmetic there too."""
    path = _case_file(
        tmp_path,
        dtype="bfloat16",
        correctness=[{"name": "odd", "M": 37, "N": 53, "K": 144}],
        performance={"name": "perf_4k", "M": 4096, "N": 4096, "K": 4096},
    )
    r = grade(path, kernel="builtin:gemmlab_fp8", budget_s=60)
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]
    assert "torch._scaled_mm" in r["performance"]["baseline"]
    row = _case_file(
        tmp_path,
        dtype="bfloat16",
        scales="row",
        correctness=[{"name": "odd", "M": 37, "N": 53, "K": 144}, {"name": "big", "M": 1031, "N": 2053, "K": 2064}],
    )
    assert grade(row, kernel="builtin:gemmlab_fp8")["verdict"] == "PASS"
    bad = grade(row, kernel=f"{BAD}:rounds_toward_zero", allow_vendor=True)
    assert bad["verdict"] == "FAIL" and bad["failures"][0]["rule"] == "honest-arithmetic", bad["failures"]


def test_scaled_mm_fallback_is_honest_and_labelled(monkeypatch):
    """Where torch._scaled_mm cannot run, the baseline is dequantize + fp32 matmul: within the contract, correctly
    rounded where torch._scaled_mm is, and the report's label says it is the fallback."""
    from gemmlab.grade import fp8 as grade_fp8
    from gemmlab.grade.rounding import measure
    from gemmlab.ref import gemm_fp8_check, gemm_fp8_ref
    from gemmlab.sandbox import candidate

    inputs = fp8_operands(37, 53, 144, "uniform", True, 5, "cpu")
    real = grade_fp8.vendor_fp8(inputs, torch.bfloat16)
    monkeypatch.setattr(candidate, "scaled_mm_runs", lambda *args: False)
    monkeypatch.setattr(grade_fp8, "scaled_mm_runs", lambda *args: False)
    a, b, sa, sb = inputs
    fallback = grade_fp8.vendor_fp8(inputs, torch.bfloat16)
    assert gemm_fp8_check(fallback, a, b.t(), sa, sb)["ok"]
    exact = gemm_fp8_ref(a, b.t(), sa, sb)
    counts = measure(fallback, exact, torch.bfloat16), measure(real, exact, torch.bfloat16)
    assert counts[0].judged > 1000 and counts[0].not_rounded <= 2 * counts[1].not_rounded + 20, counts
    assert "fallback" in grade_fp8.baseline_label(True, torch.bfloat16, 37, 53)
