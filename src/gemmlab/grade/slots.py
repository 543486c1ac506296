"""One timed batch of the grader's protocol (steps 1-4 of ``protocol.py``): the slots, their inputs, the window,
and the checks of what the batch left behind. ``Slots`` is driven by ``protocol.Timing`` (the rounds); everything
it needs of the grader comes in one ``Context``.

The late inputs (step 3; issue 29, "one call doing the whole batch"): a batch is run as segments, each a "run"
request of the worker. The first call of every segment but the first is a late call: the grader changes secret
elements of its first input (``SPLICED`` of them, values of a fresh secret draw) only after the worker answered the
segment before, that is after the call before it returned and the device was synced, and only then asks for the
next segment. Before writing, it reads a sample of the outputs of every call not yet made: still the NaN poison, or
an output was written before its call. A candidate that computes calls ahead of time (the whole batch in its first
call) either wrote those outputs early or computed the late calls from inputs that were changed since: its late
call's output is wrong, and every late call is verified. On the CPU every call but the first is late (a batch has
at most two calls there), so no call's inputs exist before the call before it returned; on a GPU ``LATE_CALLS``
secret calls a batch are (each costs a round trip of the worker, on both sides alike).

The slots' copies of each input drawn per call are views of one storage (``stacked_like``), so a batch shares a
handful of storages with the workers whatever its N.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gemmlab.grade import rules
from gemmlab.grade.batches import BatchPlan, own_memory
from gemmlab.grade.op import Op
from gemmlab.instruments.timing import l2_flush_buffer, sync
from gemmlab.sandbox.box import CandidateError, Sandbox, WorkerFailure

HEAT_S = 0.5  # seconds of grader-owned GEMM load before every timed batch on a GPU (step 2)
SAMPLED_PER_OUTPUT = 1024  # output elements read back at the end of every batch
AHEAD_SAMPLED = 16  # of those, read at every late call in every output of a call not yet made
MIN_SAMPLES_TO_COMPARE = 16  # two calls' samples that agree on at least this many elements: one answer twice
HELD_RETRIES = 2  # a baseline batch held off the CPU is run again this often before the run fails (step 3)
# calls a batch whose inputs are written after the call before them returned: on the CPU every call but the first;
# on a GPU a secret few (each is a round trip of the worker inside the window, ~0.1 ms, on both sides alike)
LATE_CALLS = {"cuda": 2, "cpu": 1 << 30}
SPLICED = 64  # elements of a late call's first input changed after the call before it returned


class BaselineFailure(RuntimeError):
    """The baseline's worker failed: something killed or stopped it (the candidate can reach it)."""


class HeldOff(Exception):
    """A trusted sandbox's batch that was not its own time (``Sandbox.held_off``): retried, not timed."""


class Failed(Exception):
    """The candidate failed a rule while timed: (rule, reason)."""


@dataclass(frozen=True)
class Context:
    """What the protocol needs of the grader, handed to it (it never reaches back)."""

    op: Op
    device: torch.device
    cand: Sandbox
    base: Sandbox
    observe: Callable  # (box, calls, batch=) -> kernel names the observer saw (grader.observe)
    progress: Callable  # (message) -> None
    heat_s: float  # seconds of the grader's own GEMM load before every batch (0: none)
    baseline_gflops: float | None = None  # a fixed baseline (a number, not a measurement); None: the live one
    full_score_ratio: float = 1.0


@dataclass
class Draw:
    """What ``prepare`` drew for one batch: which output elements are sampled, the segments, the late splices."""

    idx: torch.Tensor  # (sampled,) output elements read when the batch ends
    segments: list[list[int]]  # the calls of each "run" request, in order
    late: dict = field(default_factory=dict)  # call -> (index tensors, values as ``bits``) for its first input


@dataclass
class Window:
    ms: float  # per call, the grader's clock
    reply: dict  # the segments' replies, merged
    sample: torch.Tensor  # (N, sampled) outputs as read when the batch ended
    idx: torch.Tensor  # (sampled,) which elements
    ahead: list[int] = field(default_factory=list)  # calls whose output was written before the call was made
    late: list[int] = field(default_factory=list)  # calls whose inputs were written after the previous returned


@dataclass
class Side:
    name: str
    windows: list = field(default_factory=list)  # host (t0, t1) of its timed batches, for the clock sampler
    wake_ms: list = field(default_factory=list)  # how long waking it took, at the start of each window
    late_ms: list = field(default_factory=list)  # how long the late writes took, inside each window


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


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


SLOT_ALIGN = 512  # bytes: where each slot's input starts, as the caching allocator aligns a tensor of its own


def stacked_like(x: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` tensors of ``x``'s shape, dtype and strides, each starting ``SLOT_ALIGN``-aligned in one storage, none
    overlapping another: one CUDA IPC handle (and interprocess event) for all the slots' copies of an input, not one
    each (at tiny shapes a batch has up to ``MAX_CALLS`` calls; torch warned of over 1000 IPC blocks there)."""
    extent = 1 + sum((size - 1) * stride for size, stride in zip(x.shape, x.stride(), strict=True)) if x.numel() else 0
    step = max(1, SLOT_ALIGN // x.element_size())
    span = -(-extent // step) * step
    whole = torch.empty(n * span, dtype=x.dtype, device=x.device)
    return [whole.as_strided(x.shape, x.stride(), i * span) for i in range(n)]


def bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` viewed as integers of its element size: indexing that every dtype supports on every device (float8
    included), bit for bit."""
    return x.view(_BITS[x.element_size()])


def segments(n: int, late: list[int]) -> list[list[int]]:
    """Calls 0..n-1 cut before every late call (sorted, each in 1..n-1): the "run" requests of one batch."""
    cuts = [0, *late, n]
    return [list(range(a, b)) for a, b in zip(cuts, cuts[1:], strict=False)]


def merged(replies: list[dict]) -> dict:
    """One reply for a batch run as several requests: the times concatenated, the first problem, the held and
    loop times summed (None where a segment reported none)."""

    def total(key):
        vals = [r.get(key) for r in replies]
        return None if any(v is None for v in vals) else sum(vals)

    return {
        "ms": [t for r in replies for t in r.get("ms", [])],
        "problem": next((r["problem"] for r in replies if r.get("problem")), None),
        "held_ms": total("held_ms"),
        "loop_ms": total("loop_ms"),
    }


class Slots:
    """Steps 1-4 for one case: the N slots shared with both workers, a batch prepared, timed and verified."""

    def __init__(self, ctx: Context, case, plan: BatchPlan, secret: secrets.SystemRandom):
        self.ctx, self.op, self.case, self.dev, self.n = ctx, ctx.op, case, ctx.device, plan.calls
        self.secret = secret
        self.gen = torch.Generator(device=self.dev).manual_seed(secret.getrandbits(62))
        self.pos_gen = torch.Generator().manual_seed(secret.getrandbits(62))  # where late inputs are spliced
        self.sample_gen = torch.Generator().manual_seed(secret.getrandbits(62))  # rounding samples
        op = self.op
        self.keep = op.fresh(case, op.timed_kind, secret.getrandbits(62), self.dev) if op.fixed else None
        self.seeds: list[int] = []
        self.kind = op.timed_kind
        self.draw: Draw | None = None
        self.checked = 0
        self.counts = {"candidate": [0, 0, 0, 0], "vendor": [0, 0, 0, 0]}  # summed Rounding fields
        self.held_retries = 0  # baseline batches run again (held off the CPU)
        self.late_calls = min(self.n - 1, LATE_CALLS[self.dev.type])  # calls a batch whose inputs come late

    def allocate(self) -> None:
        """Step 1: the slots, shared with both workers."""
        op, first = self.op, self.op.fresh(self.case, self.kind, 0, self.dev, self.keep)
        with own_memory(self.dev):
            shared_fixed = {j: self.keep[j].clone() for j in op.fixed}
            drawn = {j: stacked_like(x, self.n) for j, x in enumerate(first) if j not in op.fixed}
            self.slot_in = [
                tuple(shared_fixed[j] if j in op.fixed else drawn[j][i] for j in range(len(first)))
                for i in range(self.n)
            ]
            self.outs = torch.full((self.n, op.out_numel(self.case)), float("nan"), dtype=op.dtype, device=self.dev)
        slots = [(self.slot_in[i], self.outs[i]) for i in range(self.n)]
        self.flusher = l2_flush_buffer(self.dev) if self.dev.type == "cuda" else None
        self.heat = heater(self.dev) if self.ctx.heat_s > 0 else None
        try:
            self.ctx.cand.bind(slots)
        except CandidateError as e:
            raise Failed("isolation", f"raised {e}") from e
        try:
            self.ctx.base.bind(slots)
        except (WorkerFailure, CandidateError) as e:
            raise BaselineFailure(str(e)) from e

    def private(self, i: int) -> tuple:
        """The grader's copy of call i's inputs, regenerated from its secret seed (a late call's with its splice)."""
        inputs = self.op.fresh(self.case, self.kind, self.seeds[i], self.dev, self.keep)
        if self.draw is not None and i in self.draw.late:
            pos, values = self.draw.late[i]
            bits(inputs[0])[pos] = values
        return inputs

    def prepare(self, kind: str) -> Draw:
        """Step 2: fresh inputs of ``kind`` in every slot, outputs poisoned, the late calls and their splices drawn,
        the device heated and L2 flushed."""
        self.kind, self.seeds, self.draw = kind, [self.secret.getrandbits(62) for _ in range(self.n)], None
        for i in range(self.n):
            for j, (s, x) in enumerate(zip(self.slot_in[i], self.private(i), strict=True)):
                if j not in self.op.fixed:
                    s.copy_(x)
        self.outs.fill_(float("nan"))
        numel = self.outs.shape[1]
        idx = torch.randint(0, numel, (min(SAMPLED_PER_OUTPUT, numel),), generator=self.gen, device=self.dev)
        late = sorted(self.secret.sample(range(1, self.n), self.late_calls))
        splices = {}
        for i in late:
            x = self.slot_in[i][0]
            pos = tuple(torch.randint(0, d, (SPLICED,), generator=self.pos_gen).to(self.dev) for d in x.shape)
            fresh = self.op.fresh(self.case, kind, self.secret.getrandbits(62), self.dev, self.keep)[0]
            splices[i] = (pos, bits(fresh)[pos].clone())
        if self.heat is not None:
            self.heat(self.ctx.heat_s)
        sync(self.dev)
        if self.flusher is not None:
            self.flusher.zero_()
            sync(self.dev)
        self.draw = Draw(idx, segments(self.n, late), splices)
        return self.draw

    def window(self, box: Sandbox, side: Side | None, draw: Draw, fn: str = "kernel") -> Window:
        """Step 3: one timed batch of ``box``, woken right before its window and stopped right after; its segments
        requested one after the other, the late inputs written between them (inside the window: below)."""
        ahead, late_s, replies = [], 0.0, []
        try:  # waking and stopping may fail too (the sandbox checks its processes): the window's own failure
            box.ready()  # both workers are frozen between their batches: every check of waking done before t0
            t0 = time.perf_counter()
            box.wake()  # inside the window: nothing the worker does comes before t0
            woken = time.perf_counter()
            for k, seg in enumerate(draw.segments):
                if k:  # after the call before returned (the worker synced and answered): write the late inputs
                    tl = time.perf_counter()
                    ahead.append((seg[0], self.outs[seg[0] :, draw.idx[:AHEAD_SAMPLED]].clone()))
                    pos, values = draw.late[seg[0]]
                    bits(self.slot_in[seg[0]][0])[pos] = values
                    sync(self.dev)
                    late_s += time.perf_counter() - tl
                replies.append(box.request("run", order=seg, fn=fn))
            sample = self.outs[:, draw.idx].clone()  # reading the outputs back ends the batch
            sync(self.dev)
            t1 = time.perf_counter()
            box.running()
            self.ctx.observe(box, self.n if fn == "kernel" else 0, batch=True)  # before the freeze: it answers
            box.freeze()
        except (WorkerFailure, CandidateError) as e:
            if box is self.ctx.base:
                raise BaselineFailure(str(e)) from e
            raise Failed("isolation", f"raised {e}" if isinstance(e, CandidateError) else str(e)) from e
        reply = merged(replies)
        held = box.held_off(reply)
        if held:
            raise HeldOff(held)
        if side is not None:
            side.windows.append((t0, t1))
            side.wake_ms.append((woken - t0) * 1e3)
            side.late_ms.append(late_s * 1e3)
        early = sorted(
            {first + r for first, snap in ahead for r in (~torch.isnan(snap)).any(dim=1).nonzero().flatten().tolist()}
        )
        return Window((t1 - t0) * 1e3 / self.n, reply, sample, draw.idx, early, sorted(draw.late))

    def batch(self, box: Sandbox, side: Side | None, kind: str, fn: str = "kernel") -> Window:
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
        """Step 4: the candidate's batch, judged by ``rules.BATCH_RULES`` (raises ``Failed``). Every late call is
        verified (for MoE besides the secret ``op.verify_per_batch``)."""
        op, n = self.op, self.n
        changed, checks = [], {}
        which = (
            set(range(n))
            if op.verify_per_batch is None
            else (set(self.secret.sample(range(n), min(n, op.verify_per_batch))) | set(w.late))
        )
        for i in range(n):
            mine = self.private(i)
            if not all(
                torch.equal(s, x)
                for j, (s, x) in enumerate(zip(self.slot_in[i], mine, strict=True))
                if j not in op.fixed or i == 0
            ):
                changed.append(i)
            if i in which:
                checks[i] = self.check_call(i, mine)
        final = self.outs[:, w.idx]
        same = ((w.sample == final) | (torch.isnan(w.sample) & torch.isnan(final))).all(dim=1)
        unwritten = (~torch.isfinite(w.sample).all(dim=1)).nonzero().flatten().tolist()
        evidence = rules.Batch(
            index=index,
            reply=w.reply,
            changed=changed,
            incomplete=(~same).nonzero().flatten().tolist(),
            wrong=[(i, c[0]) for i, c in checks.items() if c[0]],
            verified=len(which),
            unwritten=unwritten,
            repeated=repeated_samples(w.sample, set(unwritten)),
            dishonest=[(i, c[1]) for i, c in checks.items() if c[1]],
            ahead=w.ahead,
            late=w.late,
        )
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
