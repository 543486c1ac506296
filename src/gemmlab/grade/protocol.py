"""The grader's timing protocol (``Timing``: the rounds, steps 5-6; one batch, steps 1-4, is ``slots.Slots``), the same
for candidate and baseline, each in a worker of its own. All it needs of the grader comes in a ``slots.Context``.

0. Before any candidate runs (``batches.plan_batches``): the calls per batch N, from the baseline timed in the
   grader's own process and the free memory: a batch lasts >= 20 ms at the baseline's speed. Nothing the
   candidate does moves N.
1. Slots (``Slots.allocate``): N call slots (inputs and an output each) in memory of their own (``batches.own_memory``),
   shared with both workers once: CUDA IPC and shared memory expose the slots and nothing else of the grader's.
2. Before every batch, outside its window (``Slots.prepare``): fresh inputs for every slot from secret seeds
   (``secrets``: nothing the child can see predicts them), of the round's kind (below); every output NaN; the
   device synced; on a GPU ``HEAT_S`` of the grader's own GEMM load, so that each batch starts in the power-capped
   steady state a sustained workload runs in (without it, batches after the grader's host work started near the
   boost clock and the ratio measured bursts); L2 flushed from the grader's process; synced. No call sees inputs
   another call saw, so nothing can be memoized, and each call's inputs are cold. The MoE weights, too large to
   redraw, are the exception: fixed for the run, as in inference.
3. The window (``Slots.window``): the worker is stopped between its batches, so nothing it does can start before the
   inputs are final; every check and restore of waking it is done while it is still frozen (``Sandbox.ready``),
   then t0 = the grader's ``time.perf_counter()``, then it is woken (``Sandbox.wake``: signals and the cgroup
   only; its cost, inside the window, is reported per side as ``wake_ms_by_side``), so that nothing the worker
   does lies before t0 (a thread of a candidate that computed the batch while the grader was still waking it, as
   it once could, is timed); the worker is asked to run the N calls
   back to back between two device syncs (``instruments.timing.time_calls``, no flush) and answers, in segments
   cut before the late calls (on the CPU every call but the first, on a GPU ``slots.LATE_CALLS`` secret ones):
   between two segments the grader reads a sample of the outputs of every call not yet made (still NaN, or an
   output came before its call) and changes ``slots.SPLICED`` secret elements of the late call's first input, after
   the call before it returned, and syncs. This lies inside the window and is not subtracted: both sides run the
   same segments and writes (``late_ms_by_side`` in the report), and the worker's threads run meanwhile, so time
   taken out would be time a candidate computes untimed. The grader
   reads a secret random sample of every output into its own memory and syncs; t1; the worker is stopped
   again (after a check that no process of it stays stopped). A child that answers before its work is done gains
   nothing: the batch fails unless every sampled value equals the final output.
4. After the window, nothing reaching the child (``Slots.verify``): every input is compared with its private copy
   (regenerated from its seed), and the calls to verify (all for GEMM, a secret ``op.verify_per_batch`` and
   every late call for MoE) are checked against references computed from the private copies: max error and honest
   arithmetic (``rules.BATCH_RULES``).
5. Rounds (``time_rounds``): pairs of rounds A B / B A of one kind of input, so each kind is timed in both orders;
   in blocks of three pairs of which one, at a secret place, draws full-mantissa inputs for both sides
   (``op.full_kind``): every kind is timed and verified alike, so a kernel that tells the kinds apart by their
   values (it can: docs/grading.md, "What is not enforced") gains only where both are fast. At least ``MIN_BLOCKS``
   blocks, then more until the 95% interval of the ratio (``instruments.stats``) is within ``TARGET_HALF_WIDTH`` and
   the comparison of the two kinds is decided, or until ``rounds`` or ``BUDGET_S`` are spent: then the performance
   is "inconclusive" and not scored. The time of a call is (t1 - t0) / N on the grader's clock; nothing is
   subtracted. The ratio is measured on the case's own inputs; per-round ratios on full-mantissa inputs against
   those on the case's tell whether the candidate's speed depends on the values, as an honest GEMM's does not
   (``rules.speed_independent_of_values``; on the CPU also by the workers' own clocks, which the protocol's cost on
   a busy host does not enter: they can only fail a grade). The protocol's own cost (the empty call) must stay
   under ``MAX_OVERHEAD`` of a baseline call for a score; over it, the rounds stop once the comparison of the kinds
   is decided. The child's clock is advisory: cross-checked against the interleaved baseline's, never scored.
6. When the candidate's processes are all gone (``solo``), the baseline is timed again alone; an interleaved
   baseline clearly slower than that says the candidate slowed it down (``rules.baseline_undisturbed``).
Both sides alike: the same environment (the observer library), one profiled call each before timing, the same
warm-up by time, every batch prepared the same way and woken right before its window, every order in each kind.
"""

from __future__ import annotations

import math
import secrets
import statistics
import time

from gemmlab.grade import rules
from gemmlab.grade.batches import BatchPlan
from gemmlab.grade.rounding import Rounding
from gemmlab.grade.slots import HEAT_S as HEAT_S
from gemmlab.grade.slots import HELD_RETRIES as HELD_RETRIES
from gemmlab.grade.slots import BaselineFailure, Context, Failed, Side, Slots
from gemmlab.grade.slots import heater as heater
from gemmlab.instruments import stats
from gemmlab.instruments.timing import ClockSampler
from gemmlab.sandbox.box import CandidateError, WorkerFailure

WARMUP_S = {"cuda": 1.0, "cpu": 0.0}
TARGET_HALF_WIDTH = 0.03  # of the ratio's 95% interval, relative, for a score
MAX_OVERHEAD = 0.05  # the protocol's cost per call, of a baseline call, for a score
BUDGET_S = {"cuda": 180.0, "cpu": 30.0}  # of timed rounds
MAX_ROUNDS = {"cuda": 96, "cpu": 12}  # the CPU (a shared scheduler, Triton's interpreter) rarely reaches 3%
PAIRS_PER_BLOCK, MIN_BLOCKS = 3, 2


def advisory_ms(reply: dict, n: int) -> float:
    """The worker's own time a call of a batch (its clock: advisory), NaN where it reported none that adds up."""
    ms = reply.get("ms")
    try:
        total = float(sum(ms)) if isinstance(ms, list) and ms else math.nan
    except (TypeError, ValueError):
        total = math.nan
    return total / n


def round_ratios(records: list[dict], kind: str, clock: str = "ms") -> list[float]:
    """Per-round ratios base / candidate on inputs of ``kind``, by the grader's clock ("ms") or by the workers'
    own ("advisory_ms"): empty unless every such time is a positive finite number (a worker's clock may say
    anything)."""
    pairs = [(r.get(f"base_{clock}"), r.get(f"cand_{clock}")) for r in records if r["kind"] == kind]
    if not all(isinstance(x, int | float) and 0 < x < math.inf for p in pairs for x in p):
        return []
    return [b / c for b, c in pairs]


class Timing:
    """Steps 1-6 for one case (``run``): ``ctx`` is everything it needs of the grader (op, device, both sandboxes,
    the observer, the heat, the progress callback, a fixed baseline's rate)."""

    def __init__(self, ctx: Context, case, plan: BatchPlan, rounds: int | None = None, budget_s: float | None = None):
        self.ctx, self.op, self.case, self.dev, self.n = ctx, ctx.op, case, ctx.device, plan.calls
        dt = self.dev.type
        self.max_rounds = rounds or MAX_ROUNDS[dt]
        self.budget_s = BUDGET_S[dt] if budget_s is None else budget_s
        self.secret = secrets.SystemRandom()
        self.slots = Slots(ctx, case, plan, self.secret)
        self.fixed_ms = case.flops / (ctx.baseline_gflops * 1e9) * 1e3 if ctx.baseline_gflops else None
        self.cand, self.base = Side("candidate"), Side("baseline")
        self.advisory: list[float] = []
        self.records: list[dict] = []  # one per round: kind, candidate ms, baseline ms

    # ------------------------------------------------------------------------------------ steps 5-6

    def warm_up(self) -> float:
        """Both sides by time, then the protocol's own cost (the baseline's empty call, per call, ms), then one
        profiled call each (the candidate's names: what the timed calls run)."""
        ctx, slots = self.ctx, self.slots
        t_end = time.perf_counter() + WARMUP_S[self.dev.type]
        while True:
            for box in (ctx.cand, ctx.base):
                slots.batch(box, None, self.op.timed_kind)
            if time.perf_counter() >= t_end:
                break
        overhead = statistics.median(slots.batch(ctx.base, None, self.op.timed_kind, "empty").ms for _ in range(3))
        profiles = []
        for box in (ctx.cand, ctx.base):
            box.thaw()
            try:
                profiles.append(box.request("call", slot=0, profile=True))
                ctx.observe(box, 1)
            except (WorkerFailure, CandidateError) as e:
                if box is ctx.base:
                    raise BaselineFailure(str(e)) from e
                raise Failed("isolation", str(e)) from e
            box.freeze()
        self.profile = profiles[0]
        return overhead

    def one_round(self, r: int, kind: str) -> None:
        """Round r: both sides, the candidate first in even rounds; the candidate's batch verified."""
        ms, adv = {}, {}
        for who in ("cand", "base") if r % 2 == 0 else ("base", "cand"):
            if who == "base":
                if self.fixed_ms is None:
                    w = self.slots.batch(self.ctx.base, self.base, kind)
                    ms["base"], adv["base"] = w.ms, advisory_ms(w.reply, self.n)
                continue
            w = self.slots.batch(self.ctx.cand, self.cand, kind)
            self.slots.verify(r, w)
            ms["cand"], adv["cand"] = w.ms, advisory_ms(w.reply, self.n)
            if kind == self.op.timed_kind:
                self.advisory.append(adv["cand"])
        self.records.append(
            {
                "kind": kind,
                "cand_ms": ms["cand"],
                "base_ms": ms.get("base", self.fixed_ms),
                "cand_advisory_ms": adv["cand"],
                "base_advisory_ms": adv.get("base", self.fixed_ms),
            }
        )

    def summaries(self) -> tuple[dict | None, dict | None]:
        """(the ratio on the case's inputs, the ratio of that to the ratio on full-mantissa inputs)."""
        main = self.ratios(self.op.timed_kind)
        honest = stats.ratio_of_rounds(main) if main else None
        full = self.ratios(self.op.full_kind) if self.op.full_kind else []
        return honest, (stats.ratio_between(main, full, (rules.VALUE_LEVEL,)) if main and full else None)

    def ratios(self, kind: str, clock: str = "ms") -> list[float]:
        return round_ratios(self.records, kind, clock)

    def value_by_advisory(self) -> dict | None:
        """The value comparison by the workers' own clocks (``rules.ADVISORY_VALUE``: the CPU), free of the
        protocol's cost that a busy host adds to the grader's: evidence that can only fail a grade."""
        if not (rules.ADVISORY_VALUE.get(self.dev.type) and self.op.full_kind):
            return None
        main, full = self.ratios(self.op.timed_kind, "advisory_ms"), self.ratios(self.op.full_kind, "advisory_ms")
        return stats.ratio_between(main, full, (rules.VALUE_LEVEL,)) if main and full else None

    def unscored(self, honest: dict | None, value: dict | None, overhead: float) -> str | None:
        """Why the timing does not determine the score, or None. The score is determined when the ratio's
        interval is within ``TARGET_HALF_WIDTH`` and the comparison of the two kinds of input is decided; against
        a fixed baseline (a number, not a measurement) also when every round beats it by the case's full-score
        ratio. Never when the protocol's own cost is over ``MAX_OVERHEAD`` of a live baseline's call: it pulls
        the ratio towards 1."""
        if honest is None or honest["ci95"] is None:
            rounds = 0 if honest is None else honest["rounds"]
            return f"{rounds} rounds on the case's inputs: too few for a 95% interval"
        if self.fixed_ms is not None:
            if all(r["base_ms"] / r["cand_ms"] >= self.ctx.full_score_ratio for r in self.records):
                return None
        else:
            base_ms = statistics.median(r["base_ms"] for r in self.records if r["kind"] == self.op.timed_kind)
            if overhead > MAX_OVERHEAD * base_ms:
                return (
                    f"the protocol's own cost, {overhead:.3g} ms a call, is {overhead / base_ms:.1%} of a "
                    f"baseline call (over {MAX_OVERHEAD:.0%}): the ratio would measure the protocol"
                )
        if honest["half_width"] > TARGET_HALF_WIDTH:
            lo, hi = honest["ci95"]
            return (
                f"the ratio's 95% interval [{lo:.3f}, {hi:.3f}] is +-{honest['half_width']:.1%} after "
                f"{honest['rounds']} rounds, wider than +-{TARGET_HALF_WIDTH:.0%}"
            )
        if value is not None and not rules.value_dependence_decided(value, self.dev.type):
            ci = value["ci98"]
            return "the speed on full-mantissa inputs against the case's is undecided (" + (
                f"98% interval [{ci[0]:.3f}, {ci[1]:.3f}])" if ci else "too few rounds)"
            )
        return None

    def precise(self, honest: dict | None, value: dict | None) -> bool:
        """The ratio within ``TARGET_HALF_WIDTH`` and the two kinds' comparison decided: no more rounds needed."""
        return (
            honest is not None
            and honest["ci95"] is not None
            and honest["half_width"] <= TARGET_HALF_WIDTH
            and self.value_decided(value)
        )

    def value_decided(self, value: dict | None) -> bool:
        """The two kinds' comparison decided by the grader's clock, or failed by the workers' own."""
        adv = self.value_by_advisory()
        return (
            value is None
            or rules.value_dependence_decided(value, self.dev.type)
            or (adv is not None and rules.depends_on_values(adv, self.dev.type))
        )

    def time_rounds(self, overhead: float) -> str | None:
        """Step 5: blocks of rounds until precise, or until the rounds or the budget are spent (or the protocol's
        cost makes more rounds useless); returns why the score is not determined, or None."""
        op, t_start, r, blocks = self.op, time.perf_counter(), 0, 0
        kinds = [op.timed_kind] * (PAIRS_PER_BLOCK - 1) + [op.full_kind or op.timed_kind]
        while True:
            self.secret.shuffle(kinds)
            for kind in kinds:
                for _ in range(2):
                    self.one_round(r, kind)
                    r += 1
            blocks += 1
            honest, value = self.summaries()
            why = self.unscored(honest, value, overhead)
            # more rounds cannot make the score: they go on only while the value comparison (which can fail the
            # grade) is undecided, as long as the rounds and the budget last
            hopeless = why is not None and why.startswith("the protocol's") and self.value_decided(value)
            spent = r >= self.max_rounds or time.perf_counter() - t_start > self.budget_s
            settled = hopeless or self.precise(honest, value) or (why is None and self.fixed_ms is not None)
            if spent or (blocks >= MIN_BLOCKS and settled):
                return why
            self.ctx.progress(f"timing: {r} rounds, {why or 'narrowing the interval'}")

    def solo(self) -> float | None:
        """Step 6: the baseline alone, after every candidate process is gone."""
        if self.fixed_ms is not None or rules.BASELINE_SLACK.get(self.dev.type) is None:
            return None
        main = sum(r["kind"] == self.op.timed_kind for r in self.records)
        return statistics.median(
            self.slots.batch(self.ctx.base, None, self.op.timed_kind).ms for _ in range(max(2, main // 4))
        )

    def run(self, clocks: ClockSampler) -> dict:
        """Steps 1-5 (the candidate closed after them by the caller's ``close``); the evidence and the numbers."""
        self.slots.allocate()
        overhead = self.warm_up()
        why = self.time_rounds(overhead)
        try:  # the candidate's last window comes after the baseline's last one: its checks, now
            self.ctx.base.check_held()
        except WorkerFailure as e:
            raise BaselineFailure(str(e)) from e
        honest, value = self.summaries()
        main = [r for r in self.records if r["kind"] == self.op.timed_kind]
        counts = self.slots.counts
        out = {
            "honest": honest,
            "value_dependence": value,
            "value_dependence_advisory": self.value_by_advisory(),
            "inconclusive": why,
            "protocol_overhead_ms": overhead,
            "median_ms": statistics.median(r["cand_ms"] for r in main),
            "rounds": len(self.records),
            "rounds_full_mantissa": len(self.records) - len(main),
            "full_mantissa_kind": self.op.full_kind,
            "calls_per_batch": self.n,
            "late_calls_per_batch": self.slots.late_calls,
            "samples_checked": self.slots.checked,
            "held_retries": self.slots.held_retries,
            "advisory_median_ms": statistics.median(self.advisory),
            "per_round": self.records,
            "rounding": {who: dict(zip(Rounding.__dataclass_fields__, c, strict=True)) for who, c in counts.items()}
            if counts["candidate"][0]
            else None,
            "clocks_by_side": {s.name: clocks.summary(s.windows) for s in (self.cand, self.base) if s.windows},
            "wake_ms_by_side": {s.name: statistics.median(s.wake_ms) for s in (self.cand, self.base) if s.wake_ms},
            "late_ms_by_side": {s.name: statistics.median(s.late_ms) for s in (self.cand, self.base) if s.late_ms},
        }
        if self.fixed_ms is None:
            out["baseline_ms"] = statistics.median(r["base_ms"] for r in main)
            gaps = [r["base_ms"] - r["base_advisory_ms"] for r in main if math.isfinite(r["base_advisory_ms"])]
            out["baseline_gap_ms"] = statistics.median(gaps) if gaps else None
        return out
