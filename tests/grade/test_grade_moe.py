"""The grader's MoE mode: gemmlab's layer passes; each rule fires on a known-bad layer
(tests/bad_kernels/moe_kernels.py). Small cases (tests/cases/moe-small.json) so it runs on the CPU."""

import json

import pytest

from gemmlab.grade import cases, grade, load_any
from tests.paths import BAD_KERNELS, CASES

BAD = str(BAD_KERNELS / "moe_kernels.py")
SMALL = str(CASES / "moe-small.json")


def rules(report):
    return {f["rule"] for f in report["failures"]}


def test_gemmlab_layer_passes():
    r = grade(SMALL)
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]
    assert r["mode"] == "moe" and r["score"]["correctness"] == 30 and r["dims"] == "T x H x I x E x k"
    perf = r["performance"]
    assert perf["status"] in ("PASS", "INCONCLUSIVE") and perf["samples_checked"] >= 1 and perf["ratio"] > 0
    assert perf["rounds_full_mantissa"] == 0 and perf["rounding"] is None  # no full-mantissa share, no ulp rule
    assert any(c["name"].endswith("(exact-shape check)") for c in r["correctness"])  # perf size not listed


def test_wrong_only_at_the_timed_size_fails_exact_shape():
    r = grade(SMALL, kernel=f"{BAD}:wrong_only_at_perf_size")
    assert r["verdict"] == "FAIL" and rules(r) == {"exact-shape"}
    assert r["listed_correctness_passed"]  # every listed case passed, as in the competition


@pytest.mark.parametrize(
    ("fn", "rule", "words"),
    [
        ("stale", "poison-freshness", "stale"),
        ("modifies_input", "poison-freshness", "modified an input"),
        ("nan_row", "poison-freshness", "NaN"),
        ("raises", "isolation", "kernel exploded"),
        ("ignores_weights", "correctness", "max |out - ref|"),
        ("zeroes_topk_weights", "poison-freshness", "modified an input"),
        ("zeroes_topk_weights_when_timed", "poison-freshness", "modified the inputs of"),
        ("skips_timed_calls", "timed-outputs", "were not written"),
        ("repeats_timed_outputs", "timed-outputs", "returned the same values on new inputs"),
    ],
)
def test_each_rule_fires(fn, rule, words):
    r = grade(SMALL, kernel=f"{BAD}:{fn}")
    assert r["verdict"] == "FAIL" and rule in rules(r), r["failures"]
    assert any(words in f["reason"] for f in r["failures"]), r["failures"]


def test_vendor_blas_needs_permission():
    r = grade(SMALL, kernel=f"{BAD}:torch_layer")
    assert r["verdict"] == "FAIL" and "vendor" in rules(r)
    ok = grade(SMALL, kernel=f"{BAD}:torch_layer", allow_vendor=True)
    assert all(c["status"] == "PASS" for c in ok["correctness"]), ok["failures"]


def test_moe_case_files():
    cf = load_any("moe-layer")
    assert cf.mode == "moe" and cf.performance.dims == (4096, 7168, 2048, 256, 8)
    assert load_any("moe-layer-cpu").correctness
    assert load_any("competition").performance.mnk == (8192, 8192, 16384)


def test_moe_case_file_schema(tmp_path):
    good = {"mode": "moe", "dtype": "bfloat16", "correctness": [{"T": 1, "H": 8, "I": 8, "E": 2, "k": 2}]}
    for change, words in (
        ({"correctness": [{"T": 1, "H": 8, "I": 8, "E": 2, "k": 3}]}, "must be <= E"),
        ({"correctness": [{"T": 1, "H": 8, "I": 8, "E": 2, "kk": 1}]}, "kk: unknown key"),
        (
            {"performance": {"T": 1, "H": 8, "I": 8, "E": 2, "k": 1, "full_score_ratio": 0}},
            "full_score_ratio: must be > 0",
        ),
        ({"dtype": "float32"}, "dtype: expected one of"),
    ):
        f = tmp_path / "m.json"
        f.write_text(json.dumps({**good, **change}))
        with pytest.raises(cases.CaseError, match=words):
            load_any(str(f))
    with pytest.raises(cases.CaseError, match="signature"):
        grade(SMALL, signature="rowmajor")


def test_an_moe_grade_records_as_its_own_op(tmp_path):
    from gemmlab.ledger import Ledger
    from gemmlab.ledger.records import from_grade, record

    r = grade(SMALL)
    entries = from_grade(r, "first moe grade")
    assert len(entries) == 1 and entries[0].op == "moe_forward" and entries[0].shape == "24x32x16x4x2"
    record(entries, str(tmp_path / "l.db"))
    e = Ledger.open(tmp_path / "l.db").get(1)
    assert e.correct and e.median_ms > 0 and e.note == "first moe grade" and e.per_round
