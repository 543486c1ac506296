"""`gemmlab grade`: one grader for every op (``op.py``: GEMM and MoE), rules as data (``rules.py``).

The candidate is arbitrary Python and GPU code, so everything in its process is its own: gemmlab's code
there, torch, the clock, the profiler, CUDA events. The grader decides only on what its own process
observes: the outputs it reads, the inputs it compares, the times it takes. The candidate runs in a
sandbox (``gemmlab.sandbox``: own session, a keeper between it and the grader, output to a log, every
process it starts killed before the report is written).

Correctness: each listed case runs ``op.trials`` trials, each on fresh inputs drawn by the grader from a
seed of ``--seed`` (reproducible); the child gets copies in shared memory (CUDA IPC on a GPU, shared CPU
memory without), and a NaN-poisoned output buffer the grader owns. ``rules.TRIAL_RULES`` judge each.
The timed case is verified through the same call first when no listed case has its sizes.

Timing protocol (``Grader.perf``), the same for candidate and baseline, each in a worker of its own:
1. The grader allocates N call slots (inputs and a flat output each) and shares them with both workers
   once. N is what fits in half the free memory, at most 16 (2 on the CPU), so a batch at the seed shapes
   lasts tens of milliseconds and the round trip is small beside it (measured, below).
2. Before every batch, outside the timed window, the grader draws fresh inputs for every slot from a
   secret generator (``secrets``: nothing the child can see predicts them), keeps them as its private
   copies, copies them into the slots, fills every output with NaN, syncs its device, and flushes L2 from
   its own process. No call sees inputs another call saw, so nothing can be memoized; every call reads
   buffers untouched since the flush, so each starts with its inputs cold, as a per-call flush would give,
   without a flush kernel inside the window that the candidate could skip. (The MoE weights, too large to
   redraw, are the exception: fixed for the run, as in inference.) On a GPU the grader first runs a GEMM
   load of its own for ``HEAT_S`` seconds, so each batch starts in the power-capped steady state that a
   sustained workload sees (the H200 at its 700 W cap runs at 1300-1500 MHz there). Without it, batches
   that followed the grader's host work started near the 1980 MHz boost clock and the ratio measured
   bursts (H200, 2026-12-01: 0.931x at 8192x8192x16384 at 1934 MHz, where the benchmark protocol,
   power-capped, gave 1.005x on the same inputs: benchmarks/grade_gap.py).
3. The window: t0 = the grader's ``time.perf_counter()``; the request "run N calls" goes to the worker,
   which syncs, runs the calls back to back (``instruments.timing.time_calls``, no flush), syncs and answers;
   the grader then reads a secret random sample of every output into its own memory and syncs; t1.
   A child that answers before its work is done gains nothing: the sample is taken after the answer, and
   the batch fails unless every sampled value equals the final output.
4. After the window, with the candidate's processes stopped (SIGSTOP) and nothing reaching the child: all
   inputs are compared with the private copies, and the calls to verify are picked (all for GEMM, a
   random ``op.verify_per_batch`` for MoE) and checked against references computed from the private
   copies (``rules.BATCH_RULES``).
5. Rounds alternate candidate and baseline batches (A B / B A). The time of a call is (t1 - t0) / N, the
   grader's clock; nothing is subtracted. The protocol's own cost is measured with an empty candidate
   and reported. The child's clock (event times) is advisory: cross-checked, never used for the ratio.
6. When the candidate's processes are all gone, the baseline is timed again alone; an interleaved baseline
   clearly slower than that says the candidate slowed it down (``rules.baseline_undisturbed``).
"""

from __future__ import annotations

import math
import secrets
import shutil
import statistics
import tempfile
import time
import zlib
from dataclasses import dataclass, field

import torch

from gemmlab.device import peak_tflops
from gemmlab.grade import observer, rules
from gemmlab.grade.cases import CaseFile
from gemmlab.grade.op import Op
from gemmlab.instruments.stats import ratio_summary
from gemmlab.instruments.timing import ClockSampler, _sync, env_info, l2_flush_buffer
from gemmlab.sandbox.box import CandidateError, Sandbox, WorkerFailure
from gemmlab.sandbox.share import slot_memory

SAMPLED_PER_OUTPUT = 1024  # output elements read back at the end of every batch
MIN_SAMPLES_TO_COMPARE = 16  # two calls' samples that agree on at least this many elements: one answer twice
# Seconds of grader-owned GEMM load right before every timed batch on a GPU (step 2 of the protocol): both sides
# are timed in the power-capped state a sustained workload runs in, not in a burst after the host's idle work.
HEAT_S = 0.5


class BaselineFailure(RuntimeError):
    """The baseline's worker failed: something killed or stopped it (the candidate can reach it)."""


@dataclass
class CaseResult:
    name: str
    shape: tuple
    status: str = "PASS"
    reason: str = ""
    rule: str = ""
    max_abs_err: float | None = None
    tolerance: float | None = None
    tolerance_rule: str = ""
    trials: list[dict] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)

    def fail(self, rule: str, reason: str) -> CaseResult:
        self.status, self.rule, self.reason = "FAIL", rule, reason
        return self


def _seed(base: int, *parts) -> int:
    return (zlib.crc32("/".join(map(str, parts)).encode()) + 7919 * base) % (1 << 31)


def _preload(log_dir: str, device: torch.device, kernel: str | None, allow_vendor: bool) -> observer.Watch:
    """The observers outside the candidate's Python (``grade/observer.py``): vendor_guard, an LD_PRELOAD library
    that records every cuBLAS / cuBLASLt / cuDNN GEMM-class call, and on CUDA the kernel observer, a CUPTI
    injection library that reports every kernel by name. Both sandboxes run under them (the same overhead on
    both sides); what cannot be built here is said in the report, never read as clean."""
    return observer.Watch(log_dir, device.type, kernel, allow_vendor)


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
            _sync(device)

    return heat


class Grader:
    def __init__(self, op: Op, cases: CaseFile, kernel: str | None = None, allow_vendor: bool = False,
                 timeout: float = 120.0, seed: int = 0, rounds: int | None = None, progress=None,
                 keep_logs: bool = False, heat_s: float | None = None):
        self.op, self.cases, self.kernel, self.allow_vendor, self.seed = op, cases, kernel, allow_vendor, seed
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        self.rounds = rounds or (10 if self.device.type == "cuda" else 3)
        self.heat_s = (HEAT_S if self.device.type == "cuda" else 0.0) if heat_s is None else heat_s
        self.timeout, self.keep_logs = timeout, keep_logs
        self.progress = progress or (lambda msg: None)
        self.log_dir = tempfile.mkdtemp(prefix="gemmlab-grade-")
        self.watch = _preload(self.log_dir, self.device, kernel, allow_vendor)
        self.vendor_seen: list[str] = []
        self.timed_kernels: set[str] = set()  # what the kernel observer saw in the candidate's batches
        self.cand = Sandbox(kernel, op.signature, op.layout, timeout, self.interpret, self.log_dir,
                            self.watch.env("candidate"))
        self.base = Sandbox(op.baseline, op.baseline_signature, op.layout, timeout, self.interpret, self.log_dir,
                            self.watch.env("baseline"), name="baseline")

    def _recorded(self) -> list[str]:
        """What the observers recorded against the candidate so far (kept after it is gone)."""
        if self.cand.proc is not None:
            self.vendor_seen = self.watch.recorded(self.cand.proc.pid) or self.vendor_seen
        return self.vendor_seen

    def _observe(self, box: Sandbox, calls: int) -> list[str]:
        """The kernel observer's answer for ``box`` since its last one (``calls`` calls that produced outputs):
        the kernel names; the candidate's findings go to ``_recorded``."""
        return self.watch.answer(box.name, box.proc.pid if box.proc is not None else None, calls)

    @property
    def interpret(self) -> bool:
        return self.device.type == "cpu"

    # -------------------------------------------------------------------------------- correctness

    def check(self, case, tag: str = "correctness") -> CaseResult:
        """``op.trials`` trials on fresh inputs, each judged by ``rules.TRIAL_RULES``."""
        op = self.op
        res = CaseResult(case.name, case.dims)
        prev = None
        for t, kind in enumerate(op.trials):
            seed = _seed(self.seed, tag, case.name, t)
            inputs = shared = flat = None  # free the last trial's tensors first (DeepSeek-V3: 22 GB a set)
            inputs = op.fresh(case, kind, seed, self.device)
            with slot_memory(self.device):  # shared with the child: CUDA IPC maps these segments only
                shared = tuple(x.clone() for x in inputs)
                flat = torch.full((op.out_numel(case),), float("nan"), dtype=op.dtype, device=self.device)
            try:
                self.cand.bind([(shared, flat)])
                reply = self.cand.request("call", slot=0, profile=True)
            except CandidateError as e:
                return res.fail("isolation", f"raised {e}")
            except WorkerFailure as e:
                return res.fail("isolation", str(e))
            seen = self._observe(self.cand, 1)
            out = op.view(flat, case).clone()
            changed = not all(torch.equal(s, x) for s, x in zip(shared, inputs, strict=True))
            res.paths = sorted(set(res.paths) | ({reply["path"]} if reply.get("path") else set()))
            res.kernels = sorted(set(res.kernels) | set(seen if self.watch.channels else reply.get("kernels", [])))
            trial = rules.Trial(reply, out, changed, prev, lambda o=out, i=inputs, k=kind: op.check(o, i, k),
                                self.allow_vendor, kind, self._recorded())
            failed = rules.first_failure(rules.TRIAL_RULES, trial)
            if trial.result is not None:
                err, tol, rule = trial.result
                res.trials.append({"kind": kind, "seed": seed, "max_abs_err": err, "tolerance": tol, "rule": rule})
                if res.max_abs_err is None or err / max(tol, 1e-30) > res.max_abs_err / max(res.tolerance, 1e-30):
                    res.max_abs_err, res.tolerance, res.tolerance_rule = err, tol, rule
            if failed:
                return res.fail(*failed)
            prev = out
        return res

    # -------------------------------------------------------------------------------- performance

    def calls_per_batch(self, per_call: int, fixed: int) -> int:
        """Calls in one timed batch: as many as fit in half the free memory (each needs ``per_call`` bytes:
        its slot, the grader's private copy, an output; ``fixed`` bytes are still to allocate once), at
        most 16; 2 on the CPU (the interpreter is slow)."""
        if self.device.type != "cuda":
            return 2
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info(self.device)[0]
        return max(2, min(16, int((0.5 * free - fixed) // per_call)))

    def perf(self, case, verified: list[CaseResult]) -> dict:
        out = {"name": case.name, "shape": case.dims, "status": "PASS", "rule": "", "reason": ""}
        if not [r for r in verified if r.shape == case.dims and r.status == "PASS"]:
            self.progress(f"exact-shape check of {case.name} (no listed correctness case has these sizes)")
            r = self.check(case, tag="exact-shape")
            r.name = f"{case.name} (exact-shape check)"
            verified.append(r)
            out["exact_shape_check"] = r.__dict__
            if r.status != "PASS":
                return dict(out, status="FAIL", rule="exact-shape",
                            reason=f"the timed shape failed verification: {r.reason}")
        base = self.base
        try:
            return self._timed(case, verified, out, base)
        except BaselineFailure as e:  # the baseline's process failed (the candidate can reach it)
            return dict(out, status="FAIL", rule="isolation", reason=f"baseline worker: {e}")
        finally:
            try:
                base.close()
            except WorkerFailure:
                pass  # the baseline is gemmlab's own code: nothing of it can outlive the kill
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.ipc_collect()

    def _timed(self, case, verified: list[CaseResult], out: dict, base: Sandbox) -> dict:
        op, dev, cand = self.op, self.device, self.cand
        cuda = dev.type == "cuda"
        secret = secrets.SystemRandom()
        gen = torch.Generator(device=dev).manual_seed(secret.getrandbits(62))
        keep = op.fresh(case, op.timed_kind, secret.getrandbits(62), dev) if op.fixed else None

        def draw():
            return op.fresh(case, op.timed_kind, secret.getrandbits(62), dev, keep)

        first = draw()
        per_call = sum(2 * x.numel() * x.element_size() for j, x in enumerate(first) if j not in op.fixed)
        n = self.calls_per_batch(per_call + op.out_numel(case) * op.dtype.itemsize,
                                 sum(keep[j].numel() * keep[j].element_size() for j in op.fixed))
        private = [first] + [draw() for _ in range(n - 1)]
        numel = op.out_numel(case)
        with slot_memory(dev):  # shared with the children: CUDA IPC maps these segments only
            shared_fixed = {j: keep[j].clone() for j in op.fixed}
            slot_in = [tuple(shared_fixed[j] if j in op.fixed else x.clone() for j, x in enumerate(p))
                       for p in private]
            outs = torch.full((n, numel), float("nan"), dtype=op.dtype, device=dev)
        slots = [(slot_in[i], outs[i]) for i in range(n)]
        flusher = l2_flush_buffer(dev) if cuda else None
        heat = heater(dev) if self.heat_s > 0 else None
        try:
            cand.bind(slots)
        except CandidateError as e:
            return dict(out, status="FAIL", rule="isolation", reason=f"raised {e}")
        try:
            base.bind(slots)
        except (WorkerFailure, CandidateError) as e:
            raise BaselineFailure(str(e)) from e

        def batch(box: Sandbox, fn: str = "kernel"):
            for i in range(n):
                private[i] = draw()
                for j, (s, x) in enumerate(zip(slot_in[i], private[i], strict=True)):
                    if j not in op.fixed:
                        s.copy_(x)
            outs.fill_(float("nan"))
            idx = torch.randint(0, numel, (min(SAMPLED_PER_OUTPUT, numel),), generator=gen, device=dev)
            if heat is not None:
                heat(self.heat_s)
            _sync(dev)
            if flusher is not None:
                flusher.zero_()
                _sync(dev)
            try:  # thaw and freeze check the sandboxes too (sandbox.box): a baseline they fail is the candidate's doing
                box.thaw()  # both workers are stopped between their batches, and woken alike
                t0 = time.perf_counter()
                reply = box.request("run", order=list(range(n)), fn=fn)
                sample = outs[:, idx].clone()  # reading the outputs back ends the batch
                _sync(dev)
                wall = (time.perf_counter() - t0) * 1e3
                seen = self._observe(box, n if fn == "kernel" else 0)  # before the freeze: the observer answers
                if box is cand:
                    self.timed_kernels |= set(seen)
                box.freeze()
            except (WorkerFailure, CandidateError) as e:
                if box is base:
                    raise BaselineFailure(str(e)) from e
                raise
            return wall / n, reply, sample, idx

        def verify(b: int, reply, sample, idx) -> tuple[str, str] | None:
            changed = [i for i in range(n) if not all(
                torch.equal(s, x) for j, (s, x) in enumerate(zip(slot_in[i], private[i], strict=True))
                if j not in op.fixed or i == 0)]
            final = outs[:, idx]
            same = (sample == final) | (torch.isnan(sample) & torch.isnan(final))
            incomplete = [i for i in range(n) if not bool(same[i].all())]
            which = range(n) if op.verify_per_batch is None else sorted(secret.sample(range(n),
                                                                                       min(n, op.verify_per_batch)))
            wrong = []
            for i in which:
                o = op.view(outs[i], case)
                bad = int((~torch.isfinite(o)).sum())
                if bad:
                    wrong.append((i, f"{bad} NaN/Inf elements"))
                    continue
                err, tol, _ = op.check(o, private[i], op.timed_kind)
                if not err <= tol:
                    wrong.append((i, f"max err {err:.4g} > {tol:.4g}"))
            unwritten = [i for i in range(n) if not bool(torch.isfinite(sample[i]).all())]
            repeated = [] if sample.shape[1] < MIN_SAMPLES_TO_COMPARE else [
                (i, j) for j in range(n) for i in range(j) if i not in unwritten and torch.equal(sample[i], sample[j])]
            evidence = rules.Batch(b, reply, changed, incomplete, wrong, len(which), unwritten, repeated[:1])
            return rules.first_failure(rules.BATCH_RULES, evidence), len(which)

        try:
            self.progress(f"warm-up of {case.name} ({n} calls a batch)")
            t_end = time.perf_counter() + (1.0 if cuda else 0.0)
            while True:
                for box in (cand, base):
                    batch(box)
                if time.perf_counter() >= t_end:
                    break
            overhead = statistics.median(batch(base, "empty")[0] for _ in range(3))
            cand.thaw()
            prof = cand.request("call", slot=0, profile=True)
            self._observe(cand, 1)
            cand.freeze()
        except (CandidateError, WorkerFailure) as e:
            return dict(out, status="FAIL", rule="isolation", reason=str(e))
        # with the kernel observer: the names of every candidate batch (the set grows over the rounds)
        kernels = self.timed_kernels if self.watch.channels else set(prof.get("kernels", []))
        ops, path = set(prof.get("ops", [])), prof.get("path")
        fixed_baseline = getattr(self.cases, "baseline_gflops", None)
        cand_ms, base_ms, advisory, checked = [], [], [], 0
        with ClockSampler() as clocks:
            for r in range(self.rounds):
                for who in (("cand", "base") if r % 2 == 0 else ("base", "cand")):
                    if who == "base":
                        if fixed_baseline is None:
                            base_ms.append([batch(base)[0]])
                        continue
                    try:
                        ms, reply, sample, idx = batch(cand)
                    except CandidateError as e:
                        return dict(out, status="FAIL", rule="isolation", reason=f"raised {e}")
                    except WorkerFailure as e:
                        return dict(out, status="FAIL", rule="isolation", reason=str(e))
                    failed, nv = verify(r, reply, sample, idx)
                    if failed:
                        return dict(out, status="FAIL", rule=failed[0], reason=failed[1])
                    checked += nv
                    cand_ms.append([ms])
                    advisory.append(sum(reply.get("ms") or [math.nan]) / n)
        self._recorded()
        try:
            cand.close()  # the candidate's processes are gone before the baseline is timed alone
        except WorkerFailure as e:
            return dict(out, status="FAIL", rule="containment", reason=str(e))
        solo = None
        if fixed_baseline is None and rules.BASELINE_SLACK.get(dev.type) is not None:
            solo = statistics.median(batch(base)[0] for _ in range(max(2, self.rounds // 2)))
        wall = statistics.median(t for rr in cand_ms for t in rr)
        tflops = case.flops / (wall * 1e-3) / 1e12
        out.update(median_ms=wall, tflops=tflops, clocks=clocks.summary(), timed_kernels=sorted(kernels),
                   timed_path=path, heat_s=self.heat_s, calls_per_batch=n, samples_checked=checked,
                   protocol_overhead_ms=overhead,
                   advisory_median_ms=statistics.median(advisory),
                   timer=("grader's clock around each batch of calls in the worker (device synced at both ends, "
                          "outputs read back), per call; the worker's own clock is advisory"),
                   preload=self.watch.guard)
        if fixed_baseline is None:
            b_med = statistics.median(t for rr in base_ms for t in rr)
            out.update(baseline_ms=b_med, baseline_tflops=case.flops / (b_med * 1e-3) / 1e12,
                       baseline=f"{op.baseline_label}, interleaved, same protocol", baseline_solo_ms=solo,
                       honest=ratio_summary(cand_ms, base_ms))
        else:
            b_med = None
            out.update(baseline_tflops=fixed_baseline / 1e3, baseline=f"fixed {fixed_baseline} GFLOPS")
        out["ratio"] = tflops / out["baseline_tflops"]
        seen = [r for r in verified if r.status == "PASS"]
        evidence = rules.Run(wall, out["advisory_median_ms"], overhead, tflops, peak_tflops(dev), dev.type, b_med,
                             solo, kernels, ops, self.vendor_seen, self.allow_vendor, path,
                             {p for r in seen for p in r.paths}, {k for r in seen for k in r.kernels})
        failed = rules.first_failure(rules.RUN_RULES, evidence)
        return dict(out, status="FAIL", rule=failed[0], reason=failed[1]) if failed else out

    # -------------------------------------------------------------------------------------- run

    def run(self) -> dict:
        cf = self.cases
        results: list[CaseResult] = []
        listed: list[CaseResult] = []
        perf, containment = None, None
        try:
            for case in cf.correctness:
                if self.cand.failed:  # the kernel is loaded once: a dead sandbox is not restarted
                    results.append(CaseResult(case.name, case.dims).fail("isolation",
                                                                         f"not run: {self.cand.failed}"))
                    continue
                self.progress(f"correctness {case.name} {'x'.join(map(str, case.dims))}")
                results.append(self.check(case))
                if cf.performance is not None and self.base.proc is None and results[-1].status == "PASS":
                    self.base.launch()  # it loads while the other cases are checked
            listed = list(results)
            if cf.performance is not None and all(r.status == "PASS" for r in listed):
                self.progress(f"performance {cf.performance.name}")
                perf = self.perf(cf.performance, results)
        finally:
            try:
                self.cand.close()
            except WorkerFailure as e:
                containment = str(e)
            try:
                self.base.close()
            except WorkerFailure:
                pass
            self.watch.close()
            if not self.keep_logs:
                shutil.rmtree(self.log_dir, ignore_errors=True)
        report = self._report(listed, results, perf)
        if containment:
            report["verdict"] = "FAIL"
            report["failures"].append({"name": "sandbox", "rule": "containment", "reason": containment})
        return report

    def _report(self, listed: list[CaseResult], results: list[CaseResult], perf: dict | None) -> dict:
        cf, op = self.cases, self.op
        dims = "T x H x I x E x k" if op.name == "moe" else "M x N x K"
        return {
            "kind": "grade", "cases_file": cf.path, "cases_name": cf.name, "mode": op.name,
            "kernel": self.kernel or "gemmlab (default)",
            "signature": op.signature, "layout": op.layout, "dtype": cf.dtype, "device": str(self.device),
            "dims": dims, "env": env_info(), "seed": self.seed, "allow_vendor": self.allow_vendor,
            "worker_starts": self.cand.starts, "logs": self.log_dir if self.keep_logs else None,
            "correctness": [r.__dict__ for r in results], "performance": perf,
            "vendor_check": self.watch.words(), "observers": self.watch.summary(),
            "performance_shape": list(cf.performance.dims) if cf.performance is not None else None,
            **verdict(cf, listed, perf),
        }


def verdict(cf, listed: list[CaseResult], perf: dict | None) -> dict:
    """Score, verdict and failures of a grade: 30 correctness points split over the listed cases,
    70 x min(1, ratio / full_score_ratio) for a passed performance case."""
    n_pass = sum(r.status == "PASS" for r in listed)
    score_c = cf.score_correctness * n_pass / len(listed) if listed else 0.0
    perf_ok = perf is not None and perf["status"] == "PASS"
    score_p = cf.score_performance * min(1.0, perf["ratio"] / cf.full_score_ratio) if perf_ok else 0.0
    failed = [r.__dict__ for r in listed if r.status != "PASS"]
    failed += [perf] if perf and not perf_ok else []
    return {"score": {"correctness": score_c, "performance": score_p, "total": score_c + score_p,
                      "max": cf.score_correctness + cf.score_performance},
            "listed_correctness_passed": bool(listed) and n_pass == len(listed),
            "verdict": "PASS" if listed and not failed and (cf.performance is None or perf_ok) else "FAIL",
            "failures": [{key: f[key] for key in ("name", "rule", "reason")} for f in failed]}
