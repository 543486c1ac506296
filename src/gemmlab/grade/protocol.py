"""The grader's timing protocol (``Timing``), the same for candidate and baseline, each in a worker of its own.

0. Before any candidate runs (``batches.plan_batches``): the calls per batch N, from the baseline timed in the
   grader's own process and the free memory: a batch lasts >= 20 ms at the baseline's speed. Nothing the
   candidate does moves N.
1. Slots (``allocate``): N call slots (inputs and an output each) in memory of their own (``batches.own_memory``),
   shared with both workers once: CUDA IPC and shared memory expose the slots and nothing else of the grader's.
2. Before every batch, outside its window (``prepare``): fresh inputs for every slot from secret seeds
   (``secrets``: nothing the child can see predicts them), of the round's kind (below); every output NaN; the
   device synced; on a GPU ``HEAT_S`` of the grader's own GEMM load, so that each batch starts in the power-capped
   steady state a sustained workload runs in (without it, batches after the grader's host work started near the
   boost clock and the ratio measured bursts); L2 flushed from the grader's process; synced. No call sees inputs
   another call saw, so nothing can be memoized, and each call's inputs are cold. The MoE weights, too large to
   redraw, are the exception: fixed for the run, as in inference.
3. The window (``window``): the worker is stopped between its batches, so nothing it does can start before the
   inputs are final; every check and restore of waking it is done while it is still frozen (``Sandbox.ready``),
   then t0 = the grader's ``time.perf_counter()``, then it is woken (``Sandbox.wake``: signals and the cgroup
   only; its cost, inside the window, is reported per side as ``wake_ms_by_side``), so that nothing the worker
   does lies before t0 (a thread of a candidate that computed the batch while the grader was still waking it, as
   it once could, is timed); the worker is asked to run the N calls
   back to back between two device syncs (``instruments.timing.time_calls``, no flush) and answers; the grader
   reads a secret random sample of every output into its own memory and syncs; t1; the worker is stopped
   again (after a check that no process of it stays stopped). A child that answers before its work is done gains
   nothing: the batch fails unless every sampled value equals the final output.
4. After the window, nothing reaching the child (``verify``): every input is compared with its private copy
   (regenerated from its seed), and the calls to verify (all for GEMM, a secret ``op.verify_per_batch`` for
   MoE) are checked against references computed from the private copies: max error and honest arithmetic
   (``rules.BATCH_RULES``).
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
from dataclasses import dataclass, field

import torch

from gemmlab.grade import rules
from gemmlab.grade.batches import BatchPlan, own_memory
from gemmlab.grade.rounding import Rounding
from gemmlab.instruments import stats
from gemmlab.instruments.timing import ClockSampler, l2_flush_buffer, sync
from gemmlab.sandbox.box import CandidateError, WorkerFailure

HEAT_S = 0.5  # seconds of grader-owned GEMM load before every timed batch on a GPU (step 2)
WARMUP_S = {"cuda": 1.0, "cpu": 0.0}
TARGET_HALF_WIDTH = 0.03  # of the ratio's 95% interval, relative, for a score
MAX_OVERHEAD = 0.05  # the protocol's cost per call, of a baseline call, for a score
BUDGET_S = {"cuda": 180.0, "cpu": 30.0}  # of timed rounds
MAX_ROUNDS = {"cuda": 96, "cpu": 12}  # the CPU (a shared scheduler, Triton's interpreter) rarely reaches 3%
PAIRS_PER_BLOCK, MIN_BLOCKS = 3, 2
SAMPLED_PER_OUTPUT = 1024  # output elements read back at the end of every batch
MIN_SAMPLES_TO_COMPARE = 16  # two calls' samples that agree on at least this many elements: one answer twice
HELD_RETRIES = 2  # a baseline batch held off the CPU is run again this often before the run fails (step 3)


class BaselineFailure(RuntimeError):
    """The baseline's worker failed: something killed or stopped it (the candidate can reach it)."""


class HeldOff(Exception):
    """A trusted sandbox's batch that was not its own time (``Sandbox.held_off``): retried, not timed."""


class Failed(Exception):
    """The candidate failed a rule while timed: (rule, reason)."""


@dataclass
class Window:
    ms: float                 # per call, the grader's clock
    reply: dict
    sample: torch.Tensor      # (N, sampled) outputs as read when the batch ended
    idx: torch.Tensor         # (sampled,) which elements


@dataclass
class Side:
    name: str
    windows: list = field(default_factory=list)  # host (t0, t1) of its timed batches, for the clock sampler
    wake_ms: list = field(default_factory=list)  # how long waking it took, at the start of each window


def heater(device: torch.device, size: int = 4096):
    """A GEMM load of the grader's own: ``heat(seconds)`` runs (size x size) @ (size x size) products on
    ``device`` until that much time has passed, synchronized, so the device is busy up to the return."""
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    a, b = (torch.rand((size, size), generator=g, device=device).to(dtype) - 0.5 for _ in range(2))
    c = torch.empty_like(a)

    def heat(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                torch.mm(a, b, out=c)
            sync(device)

    return heat


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


def repeated_samples(sample: torch.Tensor, skip: set[int]) -> list[tuple[int, int]]:
    """The first pair (i, j), i < j, of calls whose sampled outputs are equal (one answer written twice), as a
    one-element list; empty if none. Calls in ``skip`` (unwritten) are not compared. One pass: rows by content."""
    if sample.shape[1] < MIN_SAMPLES_TO_COMPARE:
        return []
    first: dict[bytes, int] = {}
    for j, row in enumerate(sample.cpu().contiguous().view(torch.uint8).numpy()):  # bytes: any dtype
        if j in skip:
            continue
        key = row.tobytes()
        if key in first:
            return [(first[key], j)]
        first[key] = j
    return []


class Timing:
    """Steps 1-6 for one case (``run``). ``grader`` supplies the op, device, both sandboxes, the heat, rounds
    and the progress callback."""

    def __init__(self, grader, case, plan: BatchPlan, rounds: int | None = None, budget_s: float | None = None):
        self.g, self.op, self.case, self.dev, self.n = grader, grader.op, case, grader.device, plan.calls
        dt = self.dev.type
        self.max_rounds = rounds or MAX_ROUNDS[dt]
        self.budget_s = BUDGET_S[dt] if budget_s is None else budget_s
        self.secret = secrets.SystemRandom()
        self.gen = torch.Generator(device=self.dev).manual_seed(self.secret.getrandbits(62))
        self.sample_gen = torch.Generator().manual_seed(self.secret.getrandbits(62))  # rounding samples
        op = self.op
        self.keep = op.fresh(case, op.timed_kind, self.secret.getrandbits(62), self.dev) if op.fixed else None
        self.seeds: list[int] = []
        self.kind = op.timed_kind
        self.fixed_ms = (case.flops / (grader.cases.baseline_gflops * 1e9) * 1e3
                         if getattr(grader.cases, "baseline_gflops", None) else None)
        self.cand, self.base = Side("candidate"), Side("baseline")
        self.checked, self.advisory = 0, []
        self.counts = {"candidate": [0, 0, 0, 0], "vendor": [0, 0, 0, 0]}  # summed Rounding fields
        self.records: list[dict] = []  # one per round: kind, candidate ms, baseline ms
        self.held_retries = 0  # baseline batches run again (held off the CPU)

    # ------------------------------------------------------------------------------------ steps 1-4

    def allocate(self) -> None:
        """Step 1: the slots, shared with both workers."""
        op, first = self.op, self.op.fresh(self.case, self.kind, 0, self.dev, self.keep)
        with own_memory(self.dev):
            shared_fixed = {j: self.keep[j].clone() for j in op.fixed}
            self.slot_in = [tuple(shared_fixed[j] if j in op.fixed else torch.empty_like(x) for j, x in
                                  enumerate(first)) for _ in range(self.n)]
            self.outs = torch.full((self.n, op.out_numel(self.case)), float("nan"), dtype=op.dtype, device=self.dev)
        slots = [(self.slot_in[i], self.outs[i]) for i in range(self.n)]
        self.flusher = l2_flush_buffer(self.dev) if self.dev.type == "cuda" else None
        self.heat = heater(self.dev) if self.g.heat_s > 0 else None
        try:
            self.g.cand.bind(slots)
        except CandidateError as e:
            raise Failed("isolation", f"raised {e}") from e
        try:
            self.g.base.bind(slots)
        except (WorkerFailure, CandidateError) as e:
            raise BaselineFailure(str(e)) from e

    def private(self, i: int) -> tuple:
        """The grader's copy of call i's inputs, regenerated from its secret seed."""
        return self.op.fresh(self.case, self.kind, self.seeds[i], self.dev, self.keep)

    def prepare(self, kind: str) -> torch.Tensor:
        """Step 2: fresh inputs of ``kind`` in every slot, outputs poisoned, the device heated and L2 flushed.
        Returns the secret sample of output elements."""
        self.kind, self.seeds = kind, [self.secret.getrandbits(62) for _ in range(self.n)]
        for i in range(self.n):
            for j, (s, x) in enumerate(zip(self.slot_in[i], self.private(i), strict=True)):
                if j not in self.op.fixed:
                    s.copy_(x)
        self.outs.fill_(float("nan"))
        numel = self.outs.shape[1]
        idx = torch.randint(0, numel, (min(SAMPLED_PER_OUTPUT, numel),), generator=self.gen, device=self.dev)
        if self.heat is not None:
            self.heat(self.g.heat_s)
        sync(self.dev)
        if self.flusher is not None:
            self.flusher.zero_()
            sync(self.dev)
        return idx

    def window(self, box, side: Side | None, idx: torch.Tensor, fn: str = "kernel") -> Window:
        """Step 3: one timed batch of ``box``, woken right before its window and stopped right after."""
        try:  # waking and stopping may fail too (the sandbox checks its processes): the window's own failure
            box.ready()  # both workers are frozen between their batches: every check of waking done before t0
            t0 = time.perf_counter()
            box.wake()  # inside the window: nothing the worker does comes before t0
            woken = time.perf_counter()
            reply = box.request("run", order=list(range(self.n)), fn=fn)
            sample = self.outs[:, idx].clone()  # reading the outputs back ends the batch
            sync(self.dev)
            t1 = time.perf_counter()
            box.running()
            self.g.observe(box, self.n if fn == "kernel" else 0, batch=True)  # before the freeze: it answers
            box.freeze()
        except (WorkerFailure, CandidateError) as e:
            if box is self.g.base:
                raise BaselineFailure(str(e)) from e
            raise Failed("isolation", f"raised {e}" if isinstance(e, CandidateError) else str(e)) from e
        held = box.held_off(reply)
        if held:
            raise HeldOff(held)
        if side is not None:
            side.windows.append((t0, t1))
            side.wake_ms.append((woken - t0) * 1e3)
        return Window((t1 - t0) * 1e3 / self.n, reply, sample, idx)

    def batch(self, box, side: Side | None, kind: str, fn: str = "kernel") -> Window:
        """Steps 2 and 3; a batch of the baseline held off the CPU (stopped by another process, or its CPU taken by
        a virtual machine's host) is drawn and run again, up to ``HELD_RETRIES`` times: held in every try, it fails
        the run (the candidate can reach it)."""
        tries = 0
        while True:
            try:
                return self.window(box, side, self.prepare(kind), fn)
            except HeldOff as e:
                self.held_retries, tries = self.held_retries + 1, tries + 1
                if tries > HELD_RETRIES:
                    raise BaselineFailure(f"{e}, in {tries} tries in a row (stopped by another process)") from e

    def verify(self, index: int, w: Window) -> None:
        """Step 4: the candidate's batch, judged by ``rules.BATCH_RULES`` (raises ``Failed``)."""
        op, n = self.op, self.n
        changed, checks = [], {}
        which = range(n) if op.verify_per_batch is None else sorted(self.secret.sample(range(n),
                                                                                     min(n, op.verify_per_batch)))
        for i in range(n):
            mine = self.private(i)
            if not all(torch.equal(s, x) for j, (s, x) in enumerate(zip(self.slot_in[i], mine, strict=True))
                       if j not in op.fixed or i == 0):
                changed.append(i)
            if i in which:
                checks[i] = self.check_call(i, mine)
        final = self.outs[:, w.idx]
        same = ((w.sample == final) | (torch.isnan(w.sample) & torch.isnan(final))).all(dim=1)
        incomplete = (~same).nonzero().flatten().tolist()
        wrong = [(i, c[0]) for i, c in checks.items() if c[0]]
        dishonest = [(i, c[1]) for i, c in checks.items() if c[1]]
        unwritten = (~torch.isfinite(w.sample).all(dim=1)).nonzero().flatten().tolist()
        evidence = rules.Batch(index, w.reply, changed, incomplete, wrong, len(which), unwritten,
                               repeated_samples(w.sample, set(unwritten)), dishonest)
        failed = rules.first_failure(rules.BATCH_RULES, evidence)
        if failed:
            raise Failed(*failed)
        self.checked += len(which)

    def check_call(self, i: int, inputs: tuple) -> tuple[str | None, str | None]:
        """(why call i's output is wrong, why its arithmetic is not honest): None where it is not."""
        o = self.op.view(self.outs[i], self.case)
        bad = int((~torch.isfinite(o)).sum())
        if bad:
            return f"{bad} NaN/Inf elements", None
        c = self.op.check(o, inputs, self.kind, self.sample_gen)
        if c.rounding is not None:
            for who, r in zip(("candidate", "vendor"), c.rounding, strict=True):
                self.counts[who] = [s + v for s, v in zip(self.counts[who], r.as_dict().values(), strict=True)]
        if not c.within:
            return f"max err {c.err:.4g} > {c.tol:.4g} ({self.kind} inputs)", None
        why = c.dishonest()
        return None, (f"call {i} ({self.kind} inputs): {why}" if why else None)

    # ------------------------------------------------------------------------------------ steps 5-6

    def warm_up(self) -> float:
        """Both sides by time, then the protocol's own cost (the baseline's empty call, per call, ms), then one
        profiled call each (the candidate's names: what the timed calls run)."""
        g = self.g
        t_end = time.perf_counter() + WARMUP_S[self.dev.type]
        while True:
            for box in (g.cand, g.base):
                self.batch(box, None, self.op.timed_kind)
            if time.perf_counter() >= t_end:
                break
        overhead = statistics.median(self.batch(g.base, None, self.op.timed_kind, "empty").ms for _ in range(3))
        profiles = []
        for box in (g.cand, g.base):
            box.thaw()
            try:
                profiles.append(box.request("call", slot=0, profile=True))
                self.g.observe(box, 1)
            except (WorkerFailure, CandidateError) as e:
                if box is g.base:
                    raise BaselineFailure(str(e)) from e
                raise Failed("isolation", str(e)) from e
            box.freeze()
        self.profile = profiles[0]
        return overhead

    def one_round(self, r: int, kind: str) -> None:
        """Round r: both sides, the candidate first in even rounds; the candidate's batch verified."""
        ms, adv = {}, {}
        for who in (("cand", "base") if r % 2 == 0 else ("base", "cand")):
            if who == "base":
                if self.fixed_ms is None:
                    w = self.batch(self.g.base, self.base, kind)
                    ms["base"], adv["base"] = w.ms, advisory_ms(w.reply, self.n)
                continue
            w = self.batch(self.g.cand, self.cand, kind)
            self.verify(r, w)
            ms["cand"], adv["cand"] = w.ms, advisory_ms(w.reply, self.n)
            if kind == self.op.timed_kind:
                self.advisory.append(adv["cand"])
        self.records.append({"kind": kind, "cand_ms": ms["cand"], "base_ms": ms.get("base", self.fixed_ms),
                             "cand_advisory_ms": adv["cand"], "base_advisory_ms": adv.get("base", self.fixed_ms)})

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
            if all(r["base_ms"] / r["cand_ms"] >= self.g.cases.full_score_ratio for r in self.records):
                return None
        else:
            base_ms = statistics.median(r["base_ms"] for r in self.records if r["kind"] == self.op.timed_kind)
            if overhead > MAX_OVERHEAD * base_ms:
                return (f"the protocol's own cost, {overhead:.3g} ms a call, is {overhead / base_ms:.1%} of a "
                        f"baseline call (over {MAX_OVERHEAD:.0%}): the ratio would measure the protocol")
        if honest["half_width"] > TARGET_HALF_WIDTH:
            lo, hi = honest["ci95"]
            return (f"the ratio's 95% interval [{lo:.3f}, {hi:.3f}] is +-{honest['half_width']:.1%} after "
                    f"{honest['rounds']} rounds, wider than +-{TARGET_HALF_WIDTH:.0%}")
        if value is not None and not rules.value_dependence_decided(value, self.dev.type):
            ci = value["ci98"]
            return ("the speed on full-mantissa inputs against the case's is undecided ("
                    + (f"98% interval [{ci[0]:.3f}, {ci[1]:.3f}])" if ci else "too few rounds)"))
        return None

    def precise(self, honest: dict | None, value: dict | None) -> bool:
        """The ratio within ``TARGET_HALF_WIDTH`` and the two kinds' comparison decided: no more rounds needed."""
        return (honest is not None and honest["ci95"] is not None
                and honest["half_width"] <= TARGET_HALF_WIDTH and self.value_decided(value))

    def value_decided(self, value: dict | None) -> bool:
        """The two kinds' comparison decided by the grader's clock, or failed by the workers' own."""
        adv = self.value_by_advisory()
        return (value is None or rules.value_dependence_decided(value, self.dev.type)
                or (adv is not None and rules.depends_on_values(adv, self.dev.type)))

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
            self.g.progress(f"timing: {r} rounds, {why or 'narrowing the interval'}")

    def solo(self) -> float | None:
        """Step 6: the baseline alone, after every candidate process is gone."""
        if self.fixed_ms is not None or rules.BASELINE_SLACK.get(self.dev.type) is None:
            return None
        main = sum(r["kind"] == self.op.timed_kind for r in self.records)
        return statistics.median(self.batch(self.g.base, None, self.op.timed_kind).ms
                                 for _ in range(max(2, main // 4)))

    def run(self, clocks: ClockSampler) -> dict:
        """Steps 1-5 (the candidate closed after them by the caller's ``close``); the evidence and the numbers."""
        self.allocate()
        overhead = self.warm_up()
        why = self.time_rounds(overhead)
        try:  # the candidate's last window comes after the baseline's last one: its checks, now
            self.g.base.check_held()
        except WorkerFailure as e:
            raise BaselineFailure(str(e)) from e
        honest, value = self.summaries()
        main = [r for r in self.records if r["kind"] == self.op.timed_kind]
        out = {"honest": honest, "value_dependence": value, "value_dependence_advisory": self.value_by_advisory(),
               "inconclusive": why, "protocol_overhead_ms": overhead,
               "median_ms": statistics.median(r["cand_ms"] for r in main), "rounds": len(self.records),
               "rounds_full_mantissa": len(self.records) - len(main), "full_mantissa_kind": self.op.full_kind,
               "calls_per_batch": self.n, "samples_checked": self.checked, "held_retries": self.held_retries,
               "advisory_median_ms": statistics.median(self.advisory), "per_round": self.records,
               "rounding": {who: dict(zip(Rounding.__dataclass_fields__, c, strict=True))
                            for who, c in self.counts.items()} if self.counts["candidate"][0] else None,
               "clocks_by_side": {s.name: clocks.summary(s.windows) for s in (self.cand, self.base) if s.windows},
               "wake_ms_by_side": {s.name: statistics.median(s.wake_ms) for s in (self.cand, self.base) if s.wake_ms}}
        if self.fixed_ms is None:
            out["baseline_ms"] = statistics.median(r["base_ms"] for r in main)
            gaps = [r["base_ms"] - r["base_advisory_ms"] for r in main if math.isfinite(r["base_advisory_ms"])]
            out["baseline_gap_ms"] = statistics.median(gaps) if gaps else None
        return out
