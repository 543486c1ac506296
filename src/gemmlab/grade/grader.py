"""`gemmlab grade`: one grader for every op (``op.py``: GEMM and MoE), rules as data (``rules.py``), one timing
protocol (``protocol.py``).

The candidate is arbitrary Python and GPU code, so everything in its process is its own: gemmlab's code
there, torch, the clock, the profiler, CUDA events. The grader decides only on what its own process
observes: the outputs it reads, the inputs it compares, the times it takes. The candidate runs in a
sandbox (``gemmlab.sandbox``: own session, a keeper between it and the grader, output to a log, every
process it starts killed before the report is written).

A grade (``Grader.run``):
0. With a timed case, the calls per timed batch are planned first, from the baseline timed in the grader's own
   process and the free memory, before any candidate process exists (``protocol.plan_batches``).
1. Correctness: each listed case runs ``op.trials`` trials, each on fresh inputs drawn by the grader from a
   seed of ``--seed`` (reproducible), then one secret trial per kind of input among them, on inputs from a seed of
   ``os.urandom`` made in the grader as the trial starts (never written, passed or reported: a kernel that reads
   ``--seed`` and answers the public trials from a table fails them; the report counts them); the child gets
   copies in shared memory (CUDA IPC on a GPU, shared CPU memory without), and a NaN-poisoned output buffer the
   grader owns. ``rules.TRIAL_RULES`` judge each: the
   max error against the reference, and for a GEMM honest arithmetic (``rounding.py``: how the outputs round
   against the exact sum, next to the vendor's GEMM on the same inputs). The baseline's worker loads meanwhile.
2. The timed case, verified through the same call first when no listed case has its sizes, then timed by
   ``protocol.Timing`` (steps 1-6 there; one batch: ``slots.Slots``), the same way for candidate and baseline;
   every timed call verified (a secret two a batch and every late one for MoE), by the same rules.
Verdict: FAIL when a rule fails; INCONCLUSIVE when every rule passed but the timing cannot score (too few
rounds for an interval, the interval wider than the protocol's target within its budget, the protocol's own cost
over 5% of a call, or the comparison of the case's inputs with full-mantissa ones undecided): the performance
is then not scored; else PASS.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import tempfile
import zlib

import torch

from gemmlab.device import peak_tflops
from gemmlab.grade import observer, probe, rules
from gemmlab.grade.batches import own_memory, plan_batches
from gemmlab.grade.cases import CaseFile
from gemmlab.grade.op import Op
from gemmlab.grade.protocol import Timing
from gemmlab.grade.score import CaseResult, verdict
from gemmlab.grade.slots import HEAT_S, BaselineFailure, Context, Failed
from gemmlab.instruments.timing import ClockSampler, env_info
from gemmlab.sandbox.box import CandidateError, Sandbox, WorkerFailure


def _seed(base: int, *parts) -> int:
    return (zlib.crc32("/".join(map(str, parts)).encode()) + 7919 * base) % (1 << 31)


def _trial_seeds(kinds: tuple[str, ...], base: int, tag: str, case: str) -> list[tuple[str, int | None]]:
    """(kind, seed) of a case's trials: the public ones, seeded from ``--seed`` (a candidate can read it, from the
    grader's command line, and draw the same inputs), then one secret trial (seed None) per kind among them."""
    public = [(kind, _seed(base, tag, case, t)) for t, kind in enumerate(kinds)]
    return public + [(kind, None) for kind in dict.fromkeys(kinds)]


def _secret_seed() -> int:
    """A seed from ``os.urandom``, made in the grader when the trial starts: never written, passed or reported."""
    return int.from_bytes(os.urandom(8), "little") >> 2


def _preload(log_dir: str, device: torch.device, kernel: str | None, allow_vendor: bool) -> observer.Watch:
    """The observers outside the candidate's Python (``grade/observer.py``): vendor_guard, an LD_PRELOAD library
    that records every cuBLAS / cuBLASLt / cuDNN GEMM-class call, and on CUDA the kernel observer, a CUPTI
    injection library that reports every kernel by name. Both sandboxes run under them (the same overhead on
    both sides); what cannot be built here is said in the report, never read as clean."""
    return observer.Watch(log_dir, device.type, kernel, allow_vendor)


class Grader:
    def __init__(
        self,
        op: Op,
        cases: CaseFile,
        kernel: str | None = None,
        allow_vendor: bool = False,
        timeout: float = 120.0,
        seed: int = 0,
        rounds: int | None = None,
        progress=None,
        keep_logs: bool = False,
        heat_s: float | None = None,
        budget_s: float | None = None,
    ):
        self.op, self.cases, self.kernel, self.allow_vendor, self.seed = op, cases, kernel, allow_vendor, seed
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        )
        self.rounds, self.budget_s = rounds, budget_s  # caps of the timed rounds (None: the protocol's)
        self.heat_s = (HEAT_S if self.device.type == "cuda" else 0.0) if heat_s is None else heat_s
        self.timeout, self.keep_logs = timeout, keep_logs
        self.progress = progress or (lambda msg: None)
        self.log_dir = tempfile.mkdtemp(prefix="gemmlab-grade-")
        try:  # reads the sources beside the kernel: one that is a FIFO or a device is refused (output.UnreadableFile)
            self.watch = _preload(self.log_dir, self.device, kernel, allow_vendor)
        except BaseException:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            raise
        self.vendor_seen: list[str] = []
        self.timed_kernels: set[str] = set()  # what the kernel observer saw in the candidate's batches
        self.plan = None  # batches.BatchPlan, made before the candidate starts
        # with CUDA, the layers left to the probe: on where gemmlab's own kernel ran under them here (``probe``)
        self.layers, self.probed = probe.cuda_layers(op, cases, self.device, timeout)
        self.cand = Sandbox(
            kernel,
            op.signature,
            op.layout,
            timeout,
            self.interpret,
            self.log_dir,
            self.watch.env("candidate"),
            layers=self.layers,
        )
        self.base = Sandbox(
            op.baseline,
            op.baseline_signature,
            op.layout,
            timeout,
            self.interpret,
            self.log_dir,
            self.watch.env("baseline"),
            name="baseline",
            layers=self.layers,
        )
        if self.cand.triton_cache:  # a Landlock sandbox compiles into a cache of its own
            self.watch.triton_caches.append(self.cand.triton_cache)

    def _recorded(self) -> list[str]:
        """What the observers recorded against the candidate so far (kept after it is gone)."""
        if self.cand.proc is not None:
            self.vendor_seen = self.watch.recorded(self.cand.proc.pid) or self.vendor_seen
        return self.vendor_seen

    def observe(self, box: Sandbox, calls: int, batch: bool = False) -> list[str]:
        """The kernel observer's answer for ``box`` since its last one (``calls`` calls that produced outputs):
        the kernel names, which for the candidate's timed batches (``batch``) add to ``timed_kernels``; the
        candidate's findings go to ``_recorded``. Asked before the box is stopped (the observer answers from its
        process)."""
        seen = self.watch.answer(box.name, box.proc.pid if box.proc is not None else None, calls)
        if batch and box is self.cand:
            self.timed_kernels |= set(seen)
        return seen

    @property
    def interpret(self) -> bool:
        return self.device.type == "cpu"

    # -------------------------------------------------------------------------------- correctness

    def check(self, case, tag: str = "correctness") -> CaseResult:
        """``op.trials`` trials on fresh inputs from seeds of ``--seed`` (reproducible), then one secret trial per
        kind of input among them, each judged by ``rules.TRIAL_RULES``."""
        op = self.op
        res = CaseResult(case.name, case.dims)
        prev = None
        for t, (kind, seed) in enumerate(_trial_seeds(op.trials, self.seed, tag, case.name)):
            secret = seed is None
            inputs = shared = flat = None  # free the last trial's tensors first (DeepSeek-V3: 22 GB a set)
            inputs = op.fresh(case, kind, _secret_seed() if secret else seed, self.device)
            res.secret_trials += secret
            with own_memory(self.device):  # shared with the child: IPC maps the slots' memory only
                shared = tuple(x.clone() for x in inputs)
                flat = torch.full((op.out_numel(case),), float("nan"), dtype=op.dtype, device=self.device)
            try:
                self.cand.bind([(shared, flat)])
                reply = self.cand.request("call", slot=0, profile=True)
            except CandidateError as e:
                return res.fail("isolation", f"raised {e}")
            except WorkerFailure as e:
                return res.fail("isolation", str(e))
            seen = self.observe(self.cand, 1)
            out = op.view(flat, case).clone()
            changed = not all(torch.equal(s, x) for s, x in zip(shared, inputs, strict=True))
            res.paths = sorted(set(res.paths) | ({reply["path"]} if reply.get("path") else set()))
            res.kernels = sorted(set(res.kernels) | set(seen if self.watch.channels else reply.get("kernels", [])))
            # which elements the rounding counts look at: secret (the inputs are reproducible, so predictable)
            gen = torch.Generator().manual_seed(secrets.randbits(62))
            trial = rules.Trial(
                reply,
                out,
                changed,
                prev,
                lambda o=out, i=inputs, k=kind, g=gen: op.check(o, i, k, g),
                self.allow_vendor,
                kind,
                self._recorded(),
            )
            failed = rules.first_failure(rules.TRIAL_RULES, trial)
            if trial.result is not None:
                c = trial.result
                res.trials.append(
                    {
                        "kind": kind,
                        "seed": "secret" if secret else seed,
                        "max_abs_err": c.err,
                        "tolerance": c.tol,
                        "rule": c.rule,
                        "rounding": None
                        if c.rounding is None
                        else {"candidate": c.rounding[0].as_dict(), "vendor": c.rounding[1].as_dict()},
                    }
                )
                if res.max_abs_err is None or c.err / max(c.tol, 1e-30) > res.max_abs_err / max(res.tolerance, 1e-30):
                    res.max_abs_err, res.tolerance, res.tolerance_rule = c.err, c.tol, c.rule
            if failed:
                rule, why = failed
                return res.fail(
                    rule,
                    f"secret trial {t + 1 - len(op.trials)} ({kind} inputs no seed predicts): {why}" if secret else why,
                )
            res.secret_passed += secret
            prev = out
        return res

    # -------------------------------------------------------------------------------- performance

    def perf(self, case, verified: list[CaseResult]) -> dict:
        out = {"name": case.name, "shape": case.dims, "status": "PASS", "rule": "", "reason": ""}
        if not [r for r in verified if r.shape == case.dims and r.status == "PASS"]:
            self.progress(f"exact-shape check of {case.name} (no listed correctness case has these sizes)")
            r = self.check(case, tag="exact-shape")
            r.name = f"{case.name} (exact-shape check)"
            verified.append(r)
            out["exact_shape_check"] = r.__dict__
            if r.status != "PASS":
                return dict(
                    out, status="FAIL", rule="exact-shape", reason=f"the timed shape failed verification: {r.reason}"
                )
        try:
            return self._timed(case, verified, out)
        except BaselineFailure as e:  # the baseline's process failed (the candidate can reach it)
            return dict(out, status="FAIL", rule="isolation", reason=f"baseline worker: {e}")
        finally:
            try:
                self.base.close()
            except WorkerFailure:
                pass  # the baseline is gemmlab's own code: nothing of it can outlive the kill
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.ipc_collect()

    def _timed(self, case, verified: list[CaseResult], out: dict) -> dict:
        """``protocol.Timing`` (steps 1-5), the candidate closed, the baseline alone (step 6), then the run's
        rules; a timing that passes them but cannot score is INCONCLUSIVE."""
        op, dev = self.op, self.device
        self.progress(f"timing {case.name} ({self.plan.calls} calls a batch)")
        ctx = Context(
            op=op,
            device=dev,
            cand=self.cand,
            base=self.base,
            observe=self.observe,
            progress=self.progress,
            heat_s=self.heat_s,
            baseline_gflops=getattr(self.cases, "baseline_gflops", None),
            full_score_ratio=self.cases.full_score_ratio,
        )
        timing = Timing(ctx, case, self.plan, self.rounds, self.budget_s)
        with ClockSampler() as clocks:
            try:
                got = timing.run(clocks)
            except Failed as f:
                return dict(out, status="FAIL", rule=f.args[0], reason=f.args[1])
        self._recorded()
        try:
            self.cand.close()  # the candidate's processes are gone before the baseline is timed alone
        except WorkerFailure as e:
            return dict(out, status="FAIL", rule="containment", reason=str(e))
        solo = timing.solo()
        prof = timing.profile
        # with the kernel observer: the names of every candidate batch (the set grows over the rounds)
        kernels = self.timed_kernels if self.watch.channels else set(prof.get("kernels", []))
        ops, path = set(prof.get("ops", [])), prof.get("path")
        wall = got["median_ms"]
        tflops = case.flops / (wall * 1e-3) / 1e12
        out.update(
            got,
            tflops=tflops,
            clocks=clocks.summary(),
            timed_kernels=sorted(kernels),
            timed_path=path,
            heat_s=self.heat_s,
            batch_plan=dataclasses.asdict(self.plan),
            timer=(
                "grader's clock around each batch of calls in the worker (woken inside the window, "
                "device synced at both ends, outputs read back), per call; the worker's own clock is "
                "advisory"
            ),
            preload=self.watch.guard,
        )
        if "baseline_ms" in got:
            b_med = got["baseline_ms"]
            out.update(
                baseline_tflops=case.flops / (b_med * 1e-3) / 1e12,
                baseline_solo_ms=solo,
                baseline=f"{op.baseline_label}, interleaved, same protocol",
            )
        else:
            b_med = None
            out.update(
                baseline_tflops=self.cases.baseline_gflops / 1e3, baseline=f"fixed {self.cases.baseline_gflops} GFLOPS"
            )
        out["ratio"] = tflops / out["baseline_tflops"]
        seen = [r for r in verified if r.status == "PASS"]
        evidence = rules.Run(
            wall_ms=wall,
            advisory_ms=out["advisory_median_ms"],
            overhead_ms=got["protocol_overhead_ms"],
            tflops=tflops,
            peak=peak_tflops(dev),
            device=dev.type,
            baseline_ms=b_med,
            baseline_solo_ms=solo,
            kernels=kernels,
            ops=ops,
            preload_calls=self.vendor_seen,
            allow_vendor=self.allow_vendor,
            timed_path=path,
            seen_paths={p for r in seen for p in r.paths},
            seen_kernels={k for r in seen for k in r.kernels},
            value_dependence=got["value_dependence"],
            value_dependence_advisory=got.get("value_dependence_advisory"),
            baseline_gap_ms=got.get("baseline_gap_ms"),
        )
        failed = rules.first_failure(rules.RUN_RULES, evidence)
        if failed:
            return dict(out, status="FAIL", rule=failed[0], reason=failed[1])
        if got["inconclusive"]:
            return dict(out, status="INCONCLUSIVE", rule="precision", reason=got["inconclusive"])
        return out

    # -------------------------------------------------------------------------------------- run

    def run(self) -> dict:
        cf = self.cases
        results: list[CaseResult] = []
        listed: list[CaseResult] = []
        perf, containment = None, None
        try:
            if cf.performance is not None:  # before any candidate process exists (protocol step 0)
                self.progress(f"planning the timed batches of {cf.performance.name} (baseline, in the grader)")
                self.plan = plan_batches(self.op, cf.performance, self.device)
            for case in cf.correctness:
                if self.cand.failed:  # the kernel is loaded once: a dead sandbox is not restarted
                    results.append(CaseResult(case.name, case.dims).fail("isolation", f"not run: {self.cand.failed}"))
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
        dims = "T x H x I x E x k" if op.name in ("moe", "moe_fp8") else "M x N x K"
        return {
            "kind": "grade",
            "cases_file": cf.path,
            "cases_name": cf.name,
            "mode": op.name,
            "kernel": self.kernel or "gemmlab (default)",
            "signature": op.signature,
            "layout": op.layout,
            "dtype": cf.dtype,
            "device": str(self.device),
            "dims": dims,
            "env": env_info(),
            "seed": self.seed,
            "allow_vendor": self.allow_vendor,
            "worker_starts": self.cand.starts,
            "logs": self.log_dir if self.keep_logs else None,
            "isolation": {
                "candidate": self.cand.isolation,
                "baseline": self.base.isolation,
                **({"probe": self.probed} if self.probed else {}),
            },
            "correctness": [r.__dict__ for r in results],
            "performance": perf,
            "secret_trials": {
                "ran": sum(r.secret_trials for r in results),
                "passed": sum(r.secret_passed for r in results),
            },
            "vendor_check": self.watch.words(),
            "observers": self.watch.summary(),
            "performance_shape": list(cf.performance.dims) if cf.performance is not None else None,
            **verdict(cf, listed, perf),
        }
