"""The grader's moe_fp8 mode (FP8 experts, grade/fp8.py's ``moe_fp8_op``): gemmlab's FP8 experts pass the shipped
fp8-moe-cpu.json; known-bad layers (tests/bad_kernels/fp8_kernels.py) fail; the baseline dequantizes once. One GPU
test at a mid size against the bf16 composite on dequantized weights."""

import json

import pytest
import torch

from gemmlab.grade import cases, grade, load_any, make_op
from gemmlab.sandbox import candidate
from tests.paths import BAD_KERNELS

BAD = str(BAD_KERNELS / "fp8_kernels.py")
CPU = "fp8-moe-cpu"


def _case_file(tmp_path, **over) -> str:
    d = {
        "name": "fp8-moe-t",
        "mode": "moe_fp8",
        "dtype": "bfloat16",
        "correctness": [{"name": "t5", "T": 5, "H": 256, "I": 128, "E": 4, "k": 2}],
        **over,
    }
    p = tmp_path / "fp8-moe-t.json"
    p.write_text(json.dumps(d))
    return str(p)


def test_gemmlab_moe_fp8_passes_the_cpu_case_file():
    r = grade(CPU, kernel="builtin:gemmlab_moe_fp8")
    assert r["verdict"] == "PASS" and not r["failures"], r["failures"]
    assert r["mode"] == "moe_fp8" and r["signature"] == "moe_fp8" and r["dims"] == "T x H x I x E x k"
    assert [c["status"] for c in r["correctness"]] == ["PASS"] * 3 and r["score"]["correctness"] == 30
    trials = [t for c in r["correctness"] for t in c["trials"]]
    assert {t["kind"] for t in trials} == {"uniform", "zipf"} and all("moe_fp8_check" in t["rule"] for t in trials)
    assert all(0 < t["max_abs_err"] <= t["tolerance"] for t in trials)  # at the element nearest its bound


@pytest.mark.parametrize(
    ("fn", "rule", "words"),
    [
        ("bf16_on_dequantized_weights", "correctness", "max |out - ref|"),
        ("ignores_topk_weights", "correctness", "max |out - ref|"),
        ("writes_part_of_out", "poison-freshness", "NaN"),
    ],
)
def test_each_bad_layer_fails(fn, rule, words, tmp_path):
    r = grade(_case_file(tmp_path), kernel=f"{BAD}:{fn}")
    assert r["verdict"] == "FAIL" and rule in {f["rule"] for f in r["failures"]}, r["failures"]
    assert any(words in f["reason"] for f in r["failures"]), r["failures"]


def test_fp8_moe_case_files():
    cf = load_any("fp8-moe")
    assert cf.mode == "moe_fp8" and cf.dtype == "bfloat16" and cf.performance.dims == (4096, 7168, 2048, 256, 8)
    assert [c.t for c in cf.correctness] == [1, 5, 128]
    op = make_op(cf)
    assert op.signature == op.baseline_signature == "moe_fp8" and op.baseline == "builtin:composite_fp8"
    assert op.fixed == (1, 2, 3, 4) and "dequantized" in op.baseline_label
    assert load_any(CPU).performance is None and [c.t for c in load_any(CPU).correctness] == [1, 5, 17]


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"correctness": [{"T": 3, "H": 200, "I": 128, "E": 4, "k": 2}]}, r"correctness\[0\].H: 200 is not a multiple"),
        ({"performance": {"T": 3, "H": 256, "I": 72, "E": 4, "k": 2}}, "performance.I: 72 is not a multiple of 16"),
        ({"correctness": [{"T": 3, "H": 256, "I": 128, "E": 2, "k": 3}]}, "top-k 3 must be <= E = 2"),
        ({"scales": "row"}, "scales: unknown key"),
        ({"mode": "fp8_moe"}, "mode: expected one of gemm, moe, fp8, moe_fp8"),
    ],
)
def test_bad_fp8_moe_case_files_are_one_line(over, words, tmp_path):
    with pytest.raises(cases.CaseError, match=words):
        load_any(_case_file(tmp_path, **over))


def test_fp8_moe_case_file_takes_only_its_signature(tmp_path):
    with pytest.raises(cases.CaseError, match="a moe_fp8 case file takes"):
        make_op(load_any(_case_file(tmp_path)), "moe")


def test_composite_fp8_dequantizes_once_per_set_of_weights(monkeypatch, tmp_path):
    """The baseline pays the dequantization on its first call only (same weights, new tokens: none), and new
    weights are dequantized anew; its output is the bf16 composite on the dequantized weights."""
    import gemmlab.ref as ref

    cf = load_any(_case_file(tmp_path))
    op, case, cpu = make_op(cf), cf.correctness[0], torch.device("cpu")
    first = op.fresh(case, "uniform", 1, cpu)
    second = op.fresh(case, "uniform", 2, cpu, first)  # the same weight tensors, new tokens
    other = op.fresh(case, "uniform", 3, cpu)  # new weights
    made = []
    real = ref.dequantize_fp8
    monkeypatch.setattr(ref, "dequantize_fp8", lambda *a: made.append(1) or real(*a))
    fn = candidate.load_kernel("builtin:composite_fp8", "moe_fp8")
    out = torch.full((case.t, case.h), float("nan"), dtype=torch.bfloat16)
    counts = []
    for inputs in (first, second, other):
        candidate.invoke(fn, "moe_fp8", "rowmajor", inputs, out)
        counts.append(len(made))
    assert counts == [2 * case.e, 2 * case.e, 4 * case.e]  # w1 and w2 per expert, at the first call of each set
    x, w1, s1, w2, s2, weights, ids = other
    dw1, dw2 = (
        torch.stack([real(q[e], s[e], (128, 128)) for e in range(case.e)]).bfloat16() for q, s in ((w1, s1), (w2, s2))
    )
    assert torch.equal(out, ref.moe_composite(x, dw1, dw2, weights, ids))


@pytest.mark.gpu
def test_gemmlab_moe_fp8_against_the_composite_on_the_gpu(tmp_path):
    """On the H200 at E 16, H 2048, I 1024, T 1024: never FAIL against the bf16 composite on dequantized weights."""
    shape = {"H": 2048, "I": 1024, "E": 16, "k": 8}
    path = _case_file(
        tmp_path,
        correctness=[{"name": "t1", "T": 1, **shape}, {"name": "t37", "T": 37, **shape}],
        performance={"name": "mid_t1024", "T": 1024, **shape},
    )
    r = grade(path, kernel="builtin:gemmlab_moe_fp8", budget_s=60)
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]
    assert "dequantized" in r["performance"]["baseline"] and r["performance"]["samples_checked"] >= 1
