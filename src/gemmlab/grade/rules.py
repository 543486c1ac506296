"""The grader's rules: ordered lists of named functions over what the grader's own process observed.
Each returns None (passed) or the reason it failed; the first failure names the rule in the report.
Adding a rule means one function here, one bad kernel in tests/bad_kernels/ and one test row.

    TRIAL_RULES  one correctness trial (a call on fresh inputs)             evidence: ``Trial``
    BATCH_RULES  one timed batch of the candidate (all its calls)           evidence: ``Batch``
    RUN_RULES    the whole timed run (times, names of what ran, coverage)   evidence: ``Run``

What the child reports (result problems, profiler names, plan paths, its own clock) can only make a rule
fail, never pass: a verdict rests on outputs, inputs and times the grader read itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

VENDOR_KERNEL = re.compile(r"cublas|cutlass|xmma|nvjet|gemv|gemmk|ampere_|volta_|turing_|cudnn", re.IGNORECASE)
VENDOR_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::addbmm",
    "aten::mv",
    "aten::addmv",
    "aten::dot",
    "aten::matmul",
    "aten::linear",
    "aten::_scaled_mm",
    "aten::_grouped_mm",
    "aten::_int_mm",
    "aten::_addmm_activation",
    "aten::einsum",
    "aten::tensordot",
}
BASELINE_SLACK = {"cuda": 0.10, "cpu": None}  # interleaved baseline may be this much slower than solo
# An honest GEMM's time does not depend on the values it multiplies; the power they draw moves both sides alike
# (benchmarks/grade_gap.py measures it), which the ratio cancels. The comparison is judged on a 98% interval (1%
# one-sided) and beyond this margin. On a busy shared CPU whole stretches of rounds run several times slower than
# others, so there only a kernel ten times as fast on the case's inputs is caught (docs/history.md).
VALUE_MARGIN = {"cuda": 0.05, "cpu": 9.0}
VALUE_LEVEL = 0.98
# The same comparison by the workers' own clocks, which the protocol's cost (waking, the request, reading back:
# tens of ms a batch on a loaded CPU) does not enter: a kernel that depends on the values but whose grader-clock
# signal drowns in that cost fails on it. The child's clock can only fail a grade. On a GPU the grader's clock is
# the one compared (the power drawn by each kind is cancelled there by the interleaved baseline, as measured).
ADVISORY_VALUE = {"cuda": False, "cpu": True}


@dataclass
class Rule:
    name: str
    check: Callable


def vendor(kernels, ops, preload_calls=()) -> list[str]:
    """Vendor GEMMs seen: kernel names and aten ops the child's profiler reported (advisory), and what the
    observers outside the candidate's Python recorded (``grade/observer.py``: cuBLAS / cuBLASLt / cuDNN calls,
    vendor kernels by name, an observer silenced or bypassed)."""
    return [k for k in kernels if VENDOR_KERNEL.search(k)] + [o for o in ops if o in VENDOR_OPS] + list(preload_calls)


# ------------------------------------------------------------------------------------------- trials


@dataclass
class Trial:
    reply: dict  # the child's (advisory) report of the call
    out: torch.Tensor  # the output buffer as the grader reads it, logical view
    inputs_changed: bool  # shared inputs differ from the grader's private copies
    prev: torch.Tensor | None  # the previous trial's output (new inputs since)
    check: Callable  # () -> op.Checked, against the grader's private inputs
    allow_vendor: bool
    kind: str
    preload_calls: list = field(default_factory=list)  # the outside observers' findings so far
    result: object | None = None  # the op.Checked, once ``correct`` ran


def no_vendor_blas(t: Trial):
    names = vendor(t.reply.get("kernels", []), t.reply.get("ops", []), t.preload_calls)
    if names and not t.allow_vendor:
        return f"vendor GEMM in the candidate's process: {'; '.join(names[:4])}"


def output(t: Trial):
    return t.reply.get("problem")


def inputs_unchanged(t: Trial):
    if t.inputs_changed:
        return "modified an input (it differs from the grader's saved copy)"


def finite(t: Trial):
    bad = int((~torch.isfinite(t.out)).sum())
    if bad:
        return f"{bad} NaN/Inf elements in the output (unwritten or corrupted)"


def fresh(t: Trial):
    if t.prev is not None and torch.equal(t.out, t.prev):
        return "same output for new inputs: a stale or cached result"


def correct(t: Trial):
    t.result = t.check()
    if not t.result.within:
        return f"max |out - ref| = {t.result.err:.4g} > {t.result.tol:.4g} ({t.kind} inputs)"


def honest_arithmetic(t: Trial):
    """How the outputs round against the exact sum, next to the vendor's on the same inputs (grade/rounding.py)."""
    why = t.result.dishonest() if t.result is not None else None
    if why:
        return f"{t.kind} inputs: {why}"


TRIAL_RULES = [
    Rule("vendor", no_vendor_blas),
    Rule("output", output),
    Rule("poison-freshness", inputs_unchanged),
    Rule("poison-freshness", finite),
    Rule("poison-freshness", fresh),
    Rule("correctness", correct),
    Rule("honest-arithmetic", honest_arithmetic),
]


# ------------------------------------------------------------------------------------------ batches


@dataclass
class Batch:
    index: int  # which candidate batch of the run
    reply: dict
    changed: list[int]  # calls whose shared inputs differ from the private copies
    incomplete: list[int]  # calls whose output, sampled when the batch ended, differs from it now
    wrong: list[tuple[int, str]]  # verified calls that are wrong, with why
    verified: int
    unwritten: list[int] = field(default_factory=list)  # calls whose sampled output holds NaN/Inf (every call)
    repeated: list[tuple[int, int]] = field(default_factory=list)  # calls whose samples equal an earlier call's
    dishonest: list[tuple[int, str]] = field(default_factory=list)  # verified calls that do not round honestly
    ahead: list[int] = field(default_factory=list)  # calls whose output was written before the call was made
    late: list[int] = field(default_factory=list)  # calls whose inputs were written after the call before returned


def batch_output(b: Batch):
    return b.reply.get("problem")


def batch_inputs_unchanged(b: Batch):
    if b.changed:
        return (
            f"modified the inputs of {len(b.changed)} timed call(s) (batch {b.index}, first call "
            f"{b.changed[0]}): they differ from the grader's saved copies"
        )


def complete_when_timed(b: Batch):
    if b.incomplete:
        return (
            f"the outputs of {len(b.incomplete)} call(s) (batch {b.index}, first call {b.incomplete[0]}) "
            "were not all written when the batch's time was taken: work continued after the answer"
        )


def sampled_outputs_written(b: Batch):
    """Checked on every call, verified or not (MoE verifies two a batch): its sample is finite."""
    if b.unwritten:
        return (
            f"the outputs of {len(b.unwritten)} timed call(s) (batch {b.index}, first call {b.unwritten[0]}) "
            "were not written: NaN or Inf where the sample was read"
        )


def sampled_outputs_fresh(b: Batch):
    """Every call has inputs no other call had: two calls whose samples agree returned one answer twice."""
    if b.repeated:
        i, j = b.repeated[0]
        return (
            f"timed calls {i} and {j} of batch {b.index} returned the same values on new inputs: a stale "
            "or copied result"
        )


def no_output_before_its_call(b: Batch):
    """Read at every late call: the outputs of the calls not yet made must still hold the grader's NaN poison."""
    if b.ahead:
        return (
            f"the outputs of {len(b.ahead)} timed call(s) (batch {b.index}, first call {b.ahead[0]}) were "
            "written before those calls were made: one call computed others' results ahead of them"
        )


def timed_outputs_correct(b: Batch):
    """Every verified call is correct; a wrong late call (its inputs changed after the call before it returned) is
    named first: an output computed ahead of its call, from inputs it never had."""
    if b.wrong:
        late = [w for w in b.wrong if w[0] in b.late]
        i, why = (late or b.wrong)[0]
        ahead = (
            (
                f"; its inputs were written only after call {i - 1} returned (an output computed ahead of the "
                "call had other inputs)"
            )
            if late
            else ""
        )
        return f"an output produced while timing (batch {b.index}, call {i}) is wrong: {why}{ahead}"


def timed_arithmetic_honest(b: Batch):
    if b.dishonest:
        return f"a call timed in batch {b.index} is not an honest GEMM: {b.dishonest[0][1]}"


BATCH_RULES = [
    Rule("output", batch_output),
    Rule("poison-freshness", batch_inputs_unchanged),
    Rule("timed-outputs", complete_when_timed),
    Rule("timed-outputs", sampled_outputs_written),
    Rule("timed-outputs", sampled_outputs_fresh),
    Rule("timed-outputs", no_output_before_its_call),
    Rule("timed-outputs", timed_outputs_correct),
    Rule("honest-arithmetic", timed_arithmetic_honest),
]


# ---------------------------------------------------------------------------------------------- run


@dataclass(kw_only=True)
class Run:
    wall_ms: float  # grader's clock, median per call
    advisory_ms: float  # the child's own clock, median per call (advisory)
    overhead_ms: float  # protocol overhead per call (empty candidate)
    tflops: float
    peak: float | None
    device: str
    baseline_ms: float | None  # interleaved
    baseline_solo_ms: float | None  # after every candidate process was gone
    kernels: set
    ops: set
    preload_calls: list  # the outside observers' findings (grade/observer.py)
    allow_vendor: bool
    timed_path: str | None
    seen_paths: set
    seen_kernels: set
    value_dependence: dict | None = None  # stats.ratio_between(ratios on the case's inputs, on full-mantissa ones)
    value_dependence_advisory: dict | None = None  # the same by the workers' own clocks (ADVISORY_VALUE)
    baseline_gap_ms: float | None = None  # interleaved baseline: median of (grader's clock - its own clock) a call


def advisory_clock_agrees(r: Run):
    """The child's clock is advisory; it only fails a grade, where it contradicts the grader's. The gap between
    the two clocks is the protocol's cost (waking the worker, the request, reading back): it is compared with the
    larger of the cost measured before the rounds (``overhead_ms``) and the same gap of the interleaved baseline
    over the same rounds (``baseline_gap_ms``: a machine that got busy after the warm-up widens both sides')."""
    if not math.isfinite(r.advisory_ms) or r.advisory_ms < 0:
        return f"the candidate's process reported a time of {r.advisory_ms}"
    if r.advisory_ms > 1.05 * r.wall_ms + 0.05:
        return (
            f"the candidate's clock says {r.advisory_ms:.4g} ms a call, more than the {r.wall_ms:.4g} ms "
            "the grader measured around it: a broken or faked clock"
        )
    # ms a call: on a loaded CPU each of a batch's wake-ups and replies can wait a scheduling period, and the two
    # sides' gaps can differ by that much (tests/grade/test_grade_arith.py has a measured case)
    noise = 0.05 if r.device == "cuda" else 10.0
    cost = max(r.overhead_ms, r.baseline_gap_ms or 0.0)
    if r.advisory_ms < 0.5 * r.wall_ms and r.wall_ms - r.advisory_ms > 4 * cost + noise:
        return (
            f"the candidate's clock says {r.advisory_ms:.4g} ms a call, the grader measured "
            f"{r.wall_ms:.4g} ms (protocol cost {cost:.3g} ms a call): work outside the timed stream, "
            "or a faked clock"
        )


def possible_rate(r: Run):
    if r.peak is not None and r.tflops > r.peak:
        return f"{r.tflops:.0f} TFLOPS is above the device's dense peak ({r.peak:.0f}): impossible"
    if not r.wall_ms > 0:
        return f"non-positive time {r.wall_ms}"


def baseline_undisturbed(r: Run):
    """Where a baseline call lasts at least 20 times the protocol's overhead (else noise decides)."""
    slack = BASELINE_SLACK.get(r.device)
    if slack is None or r.baseline_ms is None or r.baseline_solo_ms is None:
        return None
    if r.baseline_solo_ms < 20 * r.overhead_ms:
        return None
    if r.baseline_ms > (1 + slack) * r.baseline_solo_ms:
        return (
            f"the baseline ran {r.baseline_ms / r.baseline_solo_ms - 1:.1%} slower while the candidate's "
            f"processes were alive ({r.baseline_ms:.4g} ms) than after they were gone "
            f"({r.baseline_solo_ms:.4g} ms): the candidate slowed the baseline down"
        )


def timed_no_vendor_blas(r: Run):
    names = vendor(sorted(r.kernels), sorted(r.ops), r.preload_calls)
    if names and not r.allow_vendor:
        return f"vendor GEMM in the candidate's process (timed run included): {'; '.join(names[:4])}"


def dispatch_coverage(r: Run):
    """Every plan path and GPU kernel of the timed run must have run in a verified call."""
    if r.timed_path is not None and r.timed_path not in r.seen_paths:
        return f"timed path {r.timed_path!r} never verified"
    unverified = sorted(set(r.kernels) - r.seen_kernels)
    if unverified:
        return f"timed kernels never seen in a verified call: {', '.join(unverified[:3])}"


def value_dependence_decided(v: dict, device: str) -> bool:
    """Whether the comparison of the two kinds of input is decided: its interval clear of 1 + the margin."""
    ci, bound = v.get("ci98"), 1 + VALUE_MARGIN[device]
    return bool(ci) and (ci[0] > bound or ci[1] < bound)


def depends_on_values(v: dict | None, device: str) -> bool:
    """Whether a value comparison's 98% interval lies above 1 + the margin: faster on the case's inputs."""
    return bool(v and v.get("ci98") and v["ci98"][0] > 1 + VALUE_MARGIN[device])


def speed_independent_of_values(r: Run):
    """The candidate against the baseline on the case's inputs, over the same on full-mantissa inputs: a kernel
    with a fast path for the case's distribution (and an honest one for the rest) is faster on the first. By the
    grader's clock, and where ``ADVISORY_VALUE`` says so by the workers' own (which can only fail a grade)."""
    for clock, v in (
        ("the grader's clock", r.value_dependence),
        ("the workers' own clocks", r.value_dependence_advisory),
    ):
        if depends_on_values(v, r.device):
            lo, hi = v["ci98"]
            return (
                f"its speed depends on the input values: against the baseline it is {v['ratio']:.3f}x as fast "
                f"on the case's inputs as on full-mantissa ones by {clock} (98% interval [{lo:.3f}, {hi:.3f}], "
                f"over {v['rounds']} and {v['parent_rounds']} rounds): a fast path for the timed distribution"
            )


RUN_RULES = [
    Rule("honest-timing", possible_rate),
    Rule("honest-timing", advisory_clock_agrees),
    Rule("honest-timing", baseline_undisturbed),
    Rule("honest-inputs", speed_independent_of_values),
    Rule("vendor", timed_no_vendor_blas),
    Rule("dispatch-coverage", dispatch_coverage),
]


def first_failure(rules: list[Rule], evidence) -> tuple[str, str] | None:
    """(rule name, reason) of the first rule that fails, else None."""
    for rule in rules:
        reason = rule.check(evidence)
        if reason:
            return rule.name, reason
    return None
