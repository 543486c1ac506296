"""`gemmlab grade`: the competition grader with its blind spot closed.

The candidate runs in a child process (``worker.py``); inputs, references, checks, timing of the
baseline and the verdict stay here. The rules, each with a test that fires it on a known-bad kernel
(tests/bad_kernels/):

1. Exact shape: the performance shape is verified through the same call before it is timed (even when
   the case file lists no such correctness case), and outputs sampled during timing are checked again.
2. Dispatch coverage: gemmlab's own plan path and, on CUDA, the launched kernel names are recorded per
   case; a path or kernel name seen in the timed run but in no verified call fails.
3. Poison and freshness: outputs start as NaN; every trial draws fresh inputs (new seeds, two
   distributions); inputs are compared with saved copies after the call; an output equal to the previous
   trial's, for new inputs, is a stale result.
4. No vendor BLAS (cuBLAS/cuBLASLt/CUTLASS kernels, aten::mm and friends) unless allowed.
5. Honest timing: generated random inputs, L2 flushed, device-wide sync inside the host clock, host time
   cross-checks the event time, and more than the dense tensor peak is rejected as impossible.
6. Isolation: a candidate that raises, crashes its process or exceeds the time limit gets FAIL with the
   reason; grading goes on with a fresh process.
"""

from __future__ import annotations

import math
import random
import re
import statistics
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.multiprocessing as tmp

from gemmlab.bench.stats import ratio_summary, tensor_peak_tflops
from gemmlab.bench.timing import ClockSampler, env_info
from gemmlab.grade.cases import CaseFile, Shape
from gemmlab.grade.inputs import SECOND_DISTRIBUTION, operands, reference
from gemmlab.grade.worker import serve, timed_loop

VENDOR_KERNEL = re.compile(r"cublas|cutlass|xmma|nvjet|gemv|gemmk|ampere_|volta_|turing_|cudnn", re.IGNORECASE)
VENDOR_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::mv", "aten::addmv",
              "aten::dot", "aten::matmul", "aten::linear", "aten::_scaled_mm", "aten::_grouped_mm",
              "aten::_int_mm", "aten::_addmm_activation", "aten::einsum", "aten::tensordot"}
# Dense fp16/bf16 tensor peak at the maximum boost clock, TFLOPS (vendor datasheets).
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0}


class WorkerFailure(RuntimeError):
    """The candidate's process timed out, died, or could not load the kernel."""


class CandidateError(RuntimeError):
    """The candidate raised."""


class Worker:
    """The candidate's process, restarted after any failure so one bad case cannot poison the next."""

    def __init__(self, spec: str | None, signature: str, layout: str, timeout: float, interpret: bool):
        self.args = (spec, signature, layout, interpret)
        self.timeout = timeout
        self.proc = None
        self.starts = 0

    def _start(self) -> None:
        ctx = tmp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.log = tempfile.NamedTemporaryFile(prefix="gemmlab-candidate-", suffix=".log", delete=False).name
        self.proc = ctx.Process(target=serve, args=(child, *self.args, self.log), daemon=True)
        self.proc.start()
        child.close()
        self.starts += 1
        hello = self._recv(max(self.timeout, 120.0))  # importing torch + the kernel module
        if not hello.get("ok"):
            self.kill()
            raise WorkerFailure(f"kernel could not be loaded: {hello.get('error')}")

    def request(self, op: str, timeout: float | None = None, **req) -> dict:
        if self.proc is None:
            self._start()
        self.conn.send({"op": op, **req})
        reply = self._recv(timeout or self.timeout)
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()
        if "error" in reply:
            self.kill()  # the candidate raised; its CUDA context may be unusable: start afresh next time
            raise CandidateError(reply["error"])
        return reply

    def _recv(self, timeout: float) -> dict:
        if not self.conn.poll(timeout):
            self.kill()
            raise WorkerFailure(f"no answer within {timeout:g} s (time limit); candidate process killed")
        try:
            return self.conn.recv()
        except (EOFError, OSError) as e:
            self.proc.join(5)
            code = self.proc.exitcode
            self.kill()
            raise WorkerFailure(f"candidate process died (exit code {code}; e.g. an illegal memory access "
                                f"or a crash){self.log_tail()}") from e

    def log_tail(self, chars: int = 600) -> str:
        """The end of the candidate's stderr, without the profiler's chatter."""
        try:
            lines = Path(self.log).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        text = "\n".join(line for line in lines if not line.startswith("USDT:"))[-chars:].strip()
        return f"; its stderr ends: {text}" if text else ""

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(10)
            self.conn.close()
        self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send({"op": "stop"})
                self.proc.join(10)
            except OSError:
                pass
        self.kill()


@dataclass
class CaseResult:
    name: str
    shape: tuple[int, int, int]
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


def _logical_out(reply: dict, c: torch.Tensor | None, signature: str, layout: str, m: int, n: int):
    if signature == "rowmajor":
        return reply["out"]
    return c.view(n, m).t() if layout == "colmajor" else c.view(m, n)


def _vendor(kernels: list[str], ops: list[str]) -> list[str]:
    return [k for k in kernels if VENDOR_KERNEL.search(k)] + [o for o in ops if o in VENDOR_OPS]


def _output_problem(out, m: int, n: int, dtype: torch.dtype, device: torch.device) -> str | None:
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a torch.Tensor"
    if tuple(out.shape) != (m, n):
        return f"returned shape {tuple(out.shape)}, expected ({m}, {n})"
    if out.dtype != dtype:
        return f"returned dtype {out.dtype}, expected {dtype}"
    if out.device != device:
        return f"returned a tensor on {out.device}, expected {device}"
    return None


class Grader:
    def __init__(self, cases: CaseFile, kernel: str | None = None, signature: str | None = None,
                 allow_vendor: bool = False, timeout: float = 60.0, seed: int = 0, rounds: int | None = None,
                 progress=None, worker: Worker | None = None):
        self.cases, self.kernel, self.allow_vendor, self.seed = cases, kernel, allow_vendor, seed
        self.signature = signature or cases.layout
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        self.dtype = getattr(torch, cases.dtype)
        self.rounds = rounds or (10 if self.device.type == "cuda" else 3)
        self.worker = worker or Worker(kernel, self.signature, cases.layout, timeout, self.device.type == "cpu")
        self.progress = progress or (lambda msg: None)

    # -------------------------------------------------------------------------------- correctness

    def check(self, shape: Shape, tag: str = "correctness") -> CaseResult:
        """Rules 2-4 and 6 on one shape: three trials, fresh seeds, two distributions."""
        cf, (m, n, k) = self.cases, shape.mnk
        res = CaseResult(shape.name, shape.mnk)
        prev = None
        for t, dist in enumerate((cf.inputs, cf.inputs, SECOND_DISTRIBUTION[cf.inputs])):
            seed = _seed(self.seed, tag, shape.name, t)
            a, b = operands(m, n, k, dist, seed, self.dtype, self.device.type, cf.layout)
            a0, b0 = a.clone(), b.clone()
            c = torch.full((m * n,), float("nan"), dtype=self.dtype, device=self.device) \
                if self.signature == "colmajor" else None
            try:
                reply = self.worker.request("call", a=a, b=b, c=c)
            except CandidateError as e:
                return res.fail("isolation", f"raised {e}")
            except WorkerFailure as e:
                return res.fail("isolation", str(e))
            out = _logical_out(reply, c, self.signature, cf.layout, m, n)
            res.paths = sorted(set(res.paths) | ({reply["path"]} if reply["path"] else set()))
            res.kernels = sorted(set(res.kernels) | set(reply["kernels"]))
            vendor = _vendor(reply["kernels"], reply["ops"])
            if vendor and not self.allow_vendor:
                return res.fail("no-vendor-blas", f"called the vendor BLAS: {', '.join(vendor[:4])}")
            problem = _output_problem(out, m, n, self.dtype, self.device)
            if problem:
                return res.fail("output", problem)
            if not (torch.equal(a, a0) and torch.equal(b, b0)):
                return res.fail("poison-freshness", "modified an input (A or B differs from its saved copy)")
            bad = int((~torch.isfinite(out)).sum())
            if bad:
                return res.fail("poison-freshness", f"{bad} NaN/Inf elements in C (unwritten or corrupted)")
            if prev is not None and torch.equal(out, prev):
                return res.fail("poison-freshness", "same output for new inputs: a stale or cached result")
            ref = reference(a, b, dist, self.dtype, cf.tol_base, cf.tol_ref_k)
            err = (out.double() - ref["c_ref"].double()).abs().max().item()
            res.trials.append({"dist": dist, "seed": seed, "max_abs_err": err, "tolerance": ref["tol"],
                               "rule": ref["rule"]})
            if res.max_abs_err is None or err / ref["tol"] > res.max_abs_err / res.tolerance:
                res.max_abs_err, res.tolerance, res.tolerance_rule = err, ref["tol"], ref["rule"]
            if not err <= ref["tol"]:
                return res.fail("correctness", f"max |C - C_ref| = {err:.4g} > {ref['tol']:.4g} ({dist} inputs)")
            prev = out.clone()
            del ref, a, b, a0, b0, c, out, reply
        return res

    # -------------------------------------------------------------------------------- performance

    def perf(self, shape: Shape, verified: list[CaseResult]) -> dict:
        """Rules 1, 2, 4, 5: verify the exact shape if no passed case did, time interleaved with the
        baseline, re-check sampled outputs, cross-check clocks, check coverage."""
        cf, (m, n, k) = self.cases, shape.mnk
        out = {"name": shape.name, "shape": shape.mnk, "status": "PASS", "rule": "", "reason": ""}
        exact = [r for r in verified if r.shape == shape.mnk and r.status == "PASS"]
        if not exact:
            self.progress(f"exact-shape check of {shape.name} (no listed correctness case has this shape)")
            r = self.check(shape, tag="exact-shape")
            r.name = f"{shape.name} (exact-shape check)"
            verified.append(r)
            out["exact_shape_check"] = r
            if r.status != "PASS":
                return dict(out, status="FAIL", rule="exact-shape",
                            reason=f"the timed shape failed verification: {r.reason}")
        cuda = self.device.type == "cuda"
        n_sets = 3 if cuda else 2
        sets, refs = [], []
        for i in range(n_sets):
            a, b = operands(m, n, k, cf.inputs, _seed(self.seed, "perf", shape.name, i), self.dtype,
                            self.device.type, cf.layout)
            c = torch.full((m * n,), float("nan"), dtype=self.dtype, device=self.device)
            sets.append((a, b, c if self.signature == "colmajor" else None))
            refs.append(reference(a, b, cf.inputs, self.dtype, cf.tol_base, cf.tol_ref_k))
        base_c = torch.empty((m * n,), dtype=self.dtype, device=self.device)
        rng = random.Random(_seed(self.seed, "samples", shape.name))
        reps = 5 if cuda else 3
        sample_plan = {(r, rng.randrange(reps)) for r in rng.sample(range(self.rounds), min(3, self.rounds))}
        samples = [torch.full((m, n), float("nan"), dtype=self.dtype, device=self.device) for _ in sample_plan]
        # (round, call) -> (sample buffer, input set that call used)
        sample_slots = {rr: (slot, rr[1] % n_sets) for slot, rr in enumerate(sorted(sample_plan))}

        def baseline(i):
            a, b, _ = sets[i % n_sets]
            if cf.layout == "colmajor":  # C^T (N, M) = B^T (N, K) @ A^T (K, M), all row-major views
                return torch.mm(b.t(), a.t(), out=base_c.view(n, m))
            return torch.mm(a, b, out=base_c.view(m, n))

        try:
            self.worker.request("warmup", a=sets[0][0], b=sets[0][1], c=sets[0][2], seconds=1.0 if cuda else 0.0)
        except (CandidateError, WorkerFailure) as e:
            return dict(out, status="FAIL", rule="isolation", reason=str(e))
        cand, base, host, kernels, ops, path = [], [], [], set(), set(), None
        with ClockSampler() as clocks:
            for r in range(self.rounds):
                at = {rep: slot for (rr, rep), (slot, _) in sample_slots.items() if rr == r}
                order = ("cand", "base") if r % 2 == 0 else ("base", "cand")
                for who in order:
                    if who == "base":
                        if cf.baseline_gflops is None:
                            base.append(timed_loop(baseline, reps, self.device, cuda)[0])
                        continue
                    try:
                        reply = self.worker.request("time", sets=sets, reps=reps, samples=samples, sample_at=at,
                                                    flush=cuda, profile=(r == 0))
                    except (CandidateError, WorkerFailure) as e:
                        return dict(out, status="FAIL", rule="isolation", reason=str(e))
                    cand.append(reply["device_ms"])
                    host.append(reply["host_ms"])
                    kernels |= set(reply["kernels"])
                    ops |= set(reply["ops"])
                    path = reply["path"] or path
        flops = 2.0 * m * n * k
        cand_ms = statistics.median(t for r in cand for t in r)
        host_med = statistics.median(t for r in host for t in r)
        tflops = flops / (cand_ms * 1e-3) / 1e12
        out.update(median_ms=cand_ms, host_median_ms=host_med, tflops=tflops, clocks=clocks.summary(),
                   timed_kernels=sorted(kernels), timed_path=path)
        if cf.baseline_gflops is None:
            base_ms = statistics.median(t for r in base for t in r)
            out.update(baseline_ms=base_ms, baseline_tflops=flops / (base_ms * 1e-3) / 1e12,
                       baseline="vendor BLAS (torch.mm), interleaved", honest=ratio_summary(cand, base))
        else:
            out.update(baseline_tflops=cf.baseline_gflops / 1e3, baseline=f"fixed {cf.baseline_gflops} GFLOPS")
        out["ratio"] = tflops / out["baseline_tflops"]
        # rule 1, second half: what the timed calls produced (each sampled call saw its A negated first)
        flips = [0] * n_sets
        for (rr, rep_i), (slot, set_i) in sorted(sample_slots.items()):
            ref = refs[set_i]
            flips[set_i] += 1
            sign = -1.0 if flips[set_i] % 2 else 1.0
            err = (samples[slot].double() - sign * ref["c_ref"].double()).abs().max().item()
            if not err <= ref["tol"]:
                return dict(out, status="FAIL", rule="exact-shape",
                            reason=f"an output produced while timing (round {rr}, call {rep_i}) is wrong: "
                                   f"max err {err:.4g} > {ref['tol']:.4g}")
        out["samples_checked"] = len(sample_slots)
        failed = timed_run_problem(cand_ms, host_med, tflops, self.device, kernels, ops, self.allow_vendor, path,
                                   verified)
        return dict(out, status="FAIL", rule=failed[0], reason=failed[1]) if failed else out

    # -------------------------------------------------------------------------------------- run

    def run(self) -> dict:
        cf = self.cases
        results: list[CaseResult] = []
        try:
            for shape in cf.correctness:
                self.progress(f"correctness {shape.name} {shape.m}x{shape.n}x{shape.k}")
                results.append(self.check(shape))
            listed = list(results)
            correct = all(r.status == "PASS" for r in listed)
            perf = None
            if cf.performance is not None and correct:
                self.progress(f"performance {cf.performance.name}")
                perf = self.perf(cf.performance, results)
        finally:
            self.worker.close()
        return self._report(listed, results, perf)

    def _report(self, listed: list[CaseResult], results: list[CaseResult], perf: dict | None) -> dict:
        cf = self.cases
        if perf and "exact_shape_check" in perf:
            perf = dict(perf, exact_shape_check=perf["exact_shape_check"].__dict__)
        return {
            "cases_file": cf.path, "cases_name": cf.name, "kernel": self.kernel or "gemmlab (default)",
            "signature": self.signature, "layout": cf.layout, "dtype": cf.dtype, "device": str(self.device),
            "env": env_info(), "seed": self.seed, "allow_vendor": self.allow_vendor,
            "worker_starts": self.worker.starts,
            "correctness": [r.__dict__ for r in results], "performance": perf,
            "performance_shape": list(cf.performance.mnk) if cf.performance is not None else None,
            **verdict(cf, listed, perf),
        }


def verdict(cf, listed: list[CaseResult], perf: dict | None) -> dict:
    """Score, verdict and failures of a grade (GEMM or MoE case file): 30 correctness points split over
    the listed cases, 70 x min(1, ratio / full_score_ratio) for a passed performance case. An exact-shape
    check that failed is reported once, as the performance case's failure."""
    n_pass = sum(r.status == "PASS" for r in listed)
    score_c = cf.score_correctness * n_pass / len(listed)
    perf_ok = perf is not None and perf["status"] == "PASS"
    score_p = cf.score_performance * min(1.0, perf["ratio"] / cf.full_score_ratio) if perf_ok else 0.0
    failed = [r.__dict__ for r in listed if r.status != "PASS"]
    failed += [perf] if perf and not perf_ok else []
    return {"score": {"correctness": score_c, "performance": score_p, "total": score_c + score_p,
                      "max": cf.score_correctness + cf.score_performance},
            "listed_correctness_passed": n_pass == len(listed),
            "verdict": "PASS" if not failed and (cf.performance is None or perf_ok) else "FAIL",
            "failures": [{key: f[key] for key in ("name", "rule", "reason")} for f in failed]}


def timed_run_problem(device_ms: float, host_ms: float, tflops: float, device: torch.device, kernels: set[str],
                      ops: set[str], allow_vendor: bool, timed_path: str | None,
                      verified: list[CaseResult]) -> tuple[str, str] | None:
    """Rules 5, 4 and 2 on a timed run, in that order: (rule, reason) of the first that fails, else None.
    Shared by the GEMM and the MoE grader."""
    problem = timing_problem(device_ms, host_ms, tflops, device)
    if problem:
        return "honest-timing", problem
    vendor = _vendor(sorted(kernels), sorted(ops))
    if vendor and not allow_vendor:
        return "no-vendor-blas", f"timed run called {', '.join(vendor[:4])}"
    problem = coverage_problem(timed_path, kernels, verified)
    if problem:
        return "dispatch-coverage", problem
    return None


def coverage_problem(timed_path: str | None, timed_kernels: set[str], verified: list[CaseResult]) -> str | None:
    """Rule 2: every plan path and GPU kernel of the timed run must have run in a verified call."""
    seen_paths = {p for r in verified if r.status == "PASS" for p in r.paths}
    seen_kernels = {kn for r in verified if r.status == "PASS" for kn in r.kernels}
    if timed_path is not None and timed_path not in seen_paths:
        return f"timed path {timed_path!r} never verified"
    unverified = sorted(set(timed_kernels) - seen_kernels)
    if unverified:
        return f"timed kernels never seen in a verified call: {', '.join(unverified[:3])}"
    return None


def peak_tflops(device: torch.device) -> float | None:
    """Dense fp16/bf16 tensor peak of the GPU at its maximum clock; None on the CPU."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    for name, peak in PEAK_TFLOPS.items():
        if name in props.name:
            return peak
    try:
        import pynvml

        pynvml.nvmlInit()
        mhz = pynvml.nvmlDeviceGetMaxClockInfo(pynvml.nvmlDeviceGetHandleByIndex(device.index or 0),
                                               pynvml.NVML_CLOCK_SM)
    except Exception:
        mhz = 2000
    peak = tensor_peak_tflops((props.major, props.minor), "float16", props.multi_processor_count, mhz)
    return peak if peak is not None else 4096 * props.multi_processor_count * mhz * 1e6 / 1e12  # sm_90's rate


def timing_problem(device_ms: float, host_ms: float, tflops: float, device: torch.device,
                   peak: float | None = None) -> str | None:
    """Rule 5: an impossible rate, or an event time the host clock contradicts (work outside the timed
    stream, or a faked timer)."""
    peak = peak if peak is not None else peak_tflops(device)
    if peak is not None and tflops > peak:
        return f"{tflops:.0f} TFLOPS is above the device's dense peak ({peak:.0f}): impossible"
    if device.type == "cuda":
        if device_ms > host_ms * 1.05 + 0.05:
            return f"event time {device_ms:.3f} ms exceeds the host time {host_ms:.3f} ms around it"
        if host_ms > 1.5 * device_ms + 0.5:
            return (f"host time {host_ms:.3f} ms (device-wide sync) far exceeds the event time "
                    f"{device_ms:.3f} ms: work ran outside the timed stream")
    if not math.isfinite(device_ms) or device_ms <= 0:
        return f"non-positive time {device_ms}"
    return None
