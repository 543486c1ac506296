"""Red-team of the fp8 and moe_fp8 grade modes: each cheat of tests/bad_kernels/fp8_redteam.py graded, with the
verdict the grader should give (an xfail, strict, where it does not: the hole is named in its reason). Small CPU
cases; the cheats are torch matmuls, so vendor GEMMs are allowed throughout."""

import shutil
from pathlib import Path

import pytest

from gemmlab.grade import grade
from gemmlab.problems import fp8_operands
from tests.grade.test_fp8_grade import SMALL, SMALL_ROW
from tests.grade.test_fp8_grade import _case_file as _dense_case
from tests.grade.test_fp8_moe_grade import _case_file as _moe_case
from tests.paths import BAD_KERNELS

RT = str(BAD_KERNELS / "fp8_redteam.py")


def _grade(path, fn):
    return grade(path, kernel=f"{RT}:{fn}", allow_vendor=True)


@pytest.mark.parametrize("fn", ["fp16_partial_sums", "fast_accumulation", "promoted_every_128"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_accumulation_fails(fn, dtype, tmp_path):
    """fp16 partial sums, Hopper's unpromoted 13-bit FP8 accumulator, and the same promoted every 128 of K: not
    fp32 accumulation. The max-error bound lets some of them through on some draws (promoted_every_128 at K 272 in
    fp16, fast_accumulation at K 144 in bf16); the rounding counts (hundreds of misrounded outputs against the
    vendor's few) catch every one, in fp16 and bf16 C."""
    path = _dense_case(
        tmp_path,
        dtype=dtype,
        scales="row",
        correctness=[{"name": "odd", "M": 37, "N": 53, "K": 144}, {"name": "prime", "M": 61, "N": 67, "K": 272}],
    )
    r = _grade(path, fn)
    assert r["verdict"] == "FAIL" and r["failures"][0]["rule"] in ("correctness", "honest-arithmetic"), r["failures"]
    assert {f["rule"] for f in r["failures"]} <= {"correctness", "honest-arithmetic"}, r["failures"]


@pytest.mark.parametrize("fn", ["caches_by_scales", "caches_by_leading_bytes"])
def test_memo_keyed_by_scales_or_a_few_bytes_never_hits(fn):
    """Memoizing C by the scales or by the first bytes of a and b gains nothing: every trial draws fresh inputs
    (fresh scales too), so the memo never hits and the kernel is honest (it passes)."""
    assert _grade(SMALL_ROW, fn)["verdict"] == "PASS"


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("kind", ["uniform", "normal", "full-mantissa"])
def test_scales_are_fresh_per_draw(kind, per_row):
    """The premise of the test above, for the timed protocol as well: no two seeds give the same scales."""
    scales = {
        tuple(s.flatten().tolist())
        for seed in range(8)
        for s in fp8_operands(16, 16, 32, kind, per_row, seed, "cpu")[2:]
    }
    assert len(scales) == 16


def test_dishonest_on_the_full_mantissa_share_fails_honest_arithmetic():
    """The secret full-mantissa share is recognisable, but its calls are verified like every timed call."""
    r = _grade(SMALL, "truncates_on_full_mantissa")
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL", r["failures"]
    f = r["failures"][0]
    assert f["rule"] == "honest-arithmetic" and "timed in batch" in f["reason"], r["failures"]


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="open hole: the secret full-mantissa share is recognisable from 32 bytes "
    "(every mantissa bit set) and the case's kind from its value statistics, so a kernel slow on "
    "every other input shows the same speed on both timed kinds: speed_independent_of_values "
    "compares only those two, and the untimed third trial's time is not looked at",
)
def test_slow_off_the_timed_kinds_fails_honest_inputs():
    r = _grade(SMALL, "slow_off_the_timed_kinds")
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL", r["failures"]
    assert r["failures"][0]["rule"] == "honest-inputs", r["failures"]


def test_one_call_doing_the_whole_batch_fails():
    """The first call of a batch computes every slot still poisoned (one fused launch) and the others return at
    once: the outputs of calls not yet made, read at the late call (grade/slots.py), are already written."""
    _assert_fails_if_it_fused(lambda: grade(SMALL, kernel=f"{RT}:fuses_the_batch", allow_vendor=True, keep_logs=True))


def _assert_fails_if_it_fused(run, tries: int = 3):
    """``run()`` grades the fusing kernel (keep_logs); the grade must FAIL once the kernel did fuse. On a loaded
    machine a grade can end before a batch finds two poisoned slots it knows (the slots are learnt in the first
    batch), so a grade in which it never fused is run again, up to ``tries`` grades in all."""
    seen = []
    for _ in range(tries):
        r = run()
        try:
            logs = "".join(p.read_text(errors="replace") for p in Path(r["logs"]).rglob("*") if p.is_file())
        finally:
            shutil.rmtree(r["logs"], ignore_errors=True)
        if "fused" in logs:
            break
        perf = r.get("performance") or {}
        seen.append(
            (
                r["verdict"],
                [f["rule"] for f in r["failures"]],
                perf.get("status"),
                perf.get("rounds"),
                perf.get("calls_per_batch"),
            )
        )
    else:  # not an AssertionError: a kernel that never fused shows nothing
        raise RuntimeError(
            f"the kernel never computed more than its own call in {tries} grades (verdict, rules, "
            f"perf status, rounds, calls per batch: {seen}): the test shows nothing"
        )
    if not r["listed_correctness_passed"]:  # a wrong kernel fails for the wrong reason
        raise RuntimeError(f"the fusing kernel failed its listed cases: {r['failures']}")
    assert r["verdict"] == "FAIL", (r["verdict"], r["performance"])
    assert r["failures"][0]["rule"] == "timed-outputs", r["failures"]
    assert "before those calls were made" in r["failures"][0]["reason"], r["failures"]


# ------------------------------------------------------------------------------------------------ FP8 experts


def test_experts_honest_twin_passes(tmp_path):
    """The red-team layers' honest twin (the contract in float32 torch) passes: what fails below is the cheat."""
    r = _grade(_moe_case(tmp_path), "experts_fp32")
    assert r["verdict"] == "PASS", r["failures"]


@pytest.mark.parametrize(
    "fn",
    [
        "per_tensor_intermediate",
        "unquantized_intermediate",
        "unquantized_activations",
        "skips_small_experts",
        "bf16_weights_cached",
    ],
)
def test_each_experts_cheat_fails_correctness(fn, tmp_path):
    """A per-tensor or missing quantization of the intermediate, unquantized activations (weight-only FP8), experts
    with one routed row skipped, weights dequantized once to bf16: each beyond moe_fp8_check's bound at T 5 (at T 1
    with I 128 a per-tensor scale of one row is its 1x128 block scale, the same arithmetic, and bf16 weights may
    stay within it)."""
    r = _grade(_moe_case(tmp_path), fn)
    assert r["verdict"] == "FAIL" and r["failures"][0]["rule"] == "correctness", r["failures"]
    assert "max |out - ref|" in r["failures"][0]["reason"], r["failures"]


def test_experts_dishonest_on_half_the_timed_calls_fails_timed_outputs(tmp_path):
    """A layer that knows it is timed (the same weights twice in a row: checks draw new ones) and skips its
    tail experts on every other timed call: two secret calls of every batch are verified, so a cheat on half
    the calls escapes a batch with probability 1/4 and the run's at least 12 batches with under 1e-7."""
    shape = {"H": 256, "I": 128, "E": 4, "k": 2}
    path = _moe_case(
        tmp_path, correctness=[{"name": "t5", "T": 5, **shape}], performance={"name": "t3", "T": 3, **shape}
    )
    r = _grade(path, "skips_small_experts_when_timed")
    assert r["listed_correctness_passed"] and r["verdict"] == "FAIL", r["failures"]
    f = r["failures"][0]
    assert f["rule"] == "timed-outputs" and "produced while timing" in f["reason"], r["failures"]


def test_experts_doing_the_whole_batch_in_one_call_fail(tmp_path):
    """N calls of the experts on the fixed weights fused into one, the weights read once a batch: caught as the
    dense one is (test_one_call_doing_the_whole_batch_fails)."""
    shape = {"H": 256, "I": 128, "E": 4, "k": 2}
    path = _moe_case(
        tmp_path, correctness=[{"name": "t5", "T": 5, **shape}], performance={"name": "t3", "T": 3, **shape}
    )
    _assert_fails_if_it_fused(lambda: grade(path, kernel=f"{RT}:fuses_the_moe_batch", keep_logs=True))


@pytest.mark.gpu
def test_experts_doing_the_whole_batch_on_the_gpu(tmp_path):
    """Decode-like experts (T 16, E 16, H 2048, I 1024, k 8) on the H200: the fused kernel's speed against the
    bf16 composite, next to gemmlab's own layer's; it FAILs (the ratios print with -s)."""
    shape = {"H": 2048, "I": 1024, "E": 16, "k": 8}
    path = _moe_case(
        tmp_path, correctness=[{"name": "t5", "T": 5, **shape}], performance={"name": "decode_t16", "T": 16, **shape}
    )
    honest = grade(path, kernel="builtin:gemmlab_moe_fp8", budget_s=30)

    def run():
        r = grade(path, kernel=f"{RT}:fuses_the_moe_batch", budget_s=30, keep_logs=True)
        print(
            "honest",
            honest["verdict"],
            honest["performance"].get("ratio"),
            "fused",
            r["verdict"],
            r["performance"].get("ratio"),
            "calls per batch",
            r["performance"].get("calls_per_batch"),
        )
        return r

    _assert_fails_if_it_fused(run)
