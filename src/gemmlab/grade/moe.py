"""The grader's MoE mode: ``gemmlab grade --cases moe-layer``. Legend: T tokens, H hidden, I expert
intermediate, E experts, k top-k, S = T*k.

The candidate: ``FN(x (T, H), w1 (E, 2I, H), w2 (E, H, I), topk_weights (T, k) fp32, topk_ids (T, k) int32)
-> y (T, H)`` (gemmlab's own: ``moe_forward``). The GEMM grader's rules, as they apply to a layer:

1. Exact shape: the performance case is verified through the same call before it is timed when no listed
   case has its sizes, and outputs sampled while timing are checked (their x was negated in place first;
   the grader holds the reference for either sign).
2. Coverage: every GPU kernel of the timed run must have run in a verified case.
3. Poison and freshness: fresh seeds for every trial, uniform then Zipf-skewed routing; inputs compared
   with saved copies after the call; NaN/Inf fails; the same output for new inputs is a stale result.
4. No vendor BLAS (cuBLAS kernels, ``aten::_grouped_mm``, ``aten::mm`` ...) unless allowed.
5. Honest timing: interleaved with the baseline (a composite of torch ops on ``torch._grouped_mm``),
   L2 flushed, device-wide sync inside the host clock; more than the dense peak is impossible.
6. Isolation: the candidate runs in its own process; raising, crashing or hanging is a FAIL with a reason.

Tolerance: ``ref.moe_check``: twice what PyTorch itself misses in the same dtype, plus one ulp.
Case file::

    {"name": "moe-layer", "mode": "moe", "dtype": "bfloat16",
     "correctness": [{"name": "decode", "T": 1, "H": 2048, "I": 768, "E": 128, "k": 8}, ...],
     "performance": {"name": "deepseek_t4096", "T": 4096, "H": 7168, "I": 2048, "E": 256, "k": 8,
                     "full_score_ratio": 2.0},
     "score": {"correctness": 30, "performance": 70}}
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from gemmlab.bench.stats import ratio_summary
from gemmlab.bench.timing import ClockSampler, env_info
from gemmlab.grade.cases import CaseError
from gemmlab.grade.grader import (
    CandidateError,
    CaseResult,
    Worker,
    WorkerFailure,
    _seed,
    _vendor,
    timed_run_problem,
    verdict,
)
from gemmlab.grade.worker import timed_loop

ROUTINGS = ("uniform", "zipf")


@dataclass(frozen=True)
class MoECase:
    name: str
    t: int
    h: int
    i: int
    e: int
    k: int

    @property
    def dims(self) -> tuple[int, int, int, int, int]:
        return (self.t, self.h, self.i, self.e, self.k)

    @property
    def flops(self) -> float:
        return 2.0 * self.t * self.k * self.h * 3 * self.i  # gate + up (2I) and down (I), per routed row


@dataclass(frozen=True)
class MoECaseFile:
    name: str
    path: str
    dtype: str
    correctness: tuple[MoECase, ...]
    performance: MoECase | None
    full_score_ratio: float
    score_correctness: float
    score_performance: float
    about: str = ""
    mode: str = "moe"
    layout: str = "rowmajor"


def _case(d: dict, where: str) -> MoECase:
    try:
        t, h, i, e, k = (int(d[x]) for x in ("T", "H", "I", "E", "k"))
    except (KeyError, TypeError, ValueError) as err:
        raise CaseError(f"{where}: needs integer T, H, I, E, k ({err})") from err
    if min(t, h, i, e, k) < 1 or k > e:
        raise CaseError(f"{where}: T, H, I, E, k must be >= 1 and k <= E")
    return MoECase(str(d.get("name", f"T{t}")), t, h, i, e, k)


def load(path: Path, d: dict) -> MoECaseFile:
    """A case file whose "mode" is "moe" (``grade.load_any`` dispatches here)."""
    if d.get("dtype") not in ("float16", "bfloat16"):
        raise CaseError(f"{path}: dtype must be float16 or bfloat16")
    if not d.get("correctness"):
        raise CaseError(f"{path}: no correctness cases")
    perf, score = d.get("performance"), d.get("score", {})
    return MoECaseFile(name=str(d.get("name", path.stem)), path=str(path), dtype=d["dtype"],
                       correctness=tuple(_case(c, f"{path}: correctness[{n}]") for n, c in enumerate(d["correctness"])),
                       performance=_case(perf, f"{path}: performance") if perf else None,
                       full_score_ratio=float(perf.get("full_score_ratio", 1.0)) if perf else 1.0,
                       score_correctness=float(score.get("correctness", 30)),
                       score_performance=float(score.get("performance", 70)), about=str(d.get("about", "")))


def inputs(case: MoECase, routing: str, seed: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """(x, w1, w2, topk_weights, topk_ids): random (never constant), activations O(1)."""
    from gemmlab.bench.moe import problem
    from gemmlab.problems import MoEModel

    p = problem(MoEModel(hidden=case.h, intermediate=case.i, experts=case.e, top_k=case.k), case.t, routing,
                dtype, seed, device)
    return p["x"], p["w1"], p["w2"], p["weights"], p["ids"]


class MoEGrader:
    def __init__(self, cases: MoECaseFile, kernel: str | None = None, allow_vendor: bool = False,
                 timeout: float = 120.0, seed: int = 0, rounds: int | None = None, progress=None,
                 worker: Worker | None = None):
        self.cases, self.kernel, self.allow_vendor, self.seed = cases, kernel, allow_vendor, seed
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        self.dtype = getattr(torch, cases.dtype)
        self.rounds = rounds or (10 if self.device.type == "cuda" else 3)
        self.worker = worker or Worker(kernel, "moe", "rowmajor", timeout, self.device.type == "cpu")
        self.progress = progress or (lambda msg: None)

    def _judge(self, out, args, ref=None) -> tuple[str, str, dict | None]:
        """(rule, reason, check) of one output: empty rule when it passes."""
        from gemmlab.ref import moe_check

        x = args[0]
        if not isinstance(out, torch.Tensor):
            return "output", f"returned {type(out).__name__}, expected a torch.Tensor", None
        if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or out.device != x.device:
            return "output", (f"returned {tuple(out.shape)} {out.dtype} on {out.device}, expected "
                              f"{tuple(x.shape)} {x.dtype} on {x.device}"), None
        bad = int((~torch.isfinite(out)).sum())
        if bad:
            return "poison-freshness", f"{bad} NaN/Inf elements in y (unwritten or corrupted)", None
        chk = moe_check(out, *args, ref)
        if not chk["ok"]:
            return "correctness", f"max |y - y_ref| = {chk['max_abs_err']:.4g} > {chk['allowed']:.4g}", chk
        return "", "", chk

    def check(self, case: MoECase, tag: str = "correctness") -> CaseResult:
        """Two trials (uniform, then Zipf-skewed routing), fresh seeds, every rule that applies."""
        res = CaseResult(case.name, case.dims)
        prev = None
        for trial, routing in enumerate(ROUTINGS):
            seed = _seed(self.seed, tag, case.name, trial)
            args = saved = reply = out = None  # free the last trial's tensors first (DeepSeek-V3: 22 GB a set)
            args = inputs(case, routing, seed, self.dtype, self.device)
            saved = [a.clone() for a in args]
            try:
                reply = self.worker.request("call_args", args=args)
            except CandidateError as e:
                return res.fail("isolation", f"raised {e}")
            except WorkerFailure as e:
                return res.fail("isolation", str(e))
            res.kernels = sorted(set(res.kernels) | set(reply["kernels"]))
            vendor = _vendor(reply["kernels"], reply["ops"])
            if vendor and not self.allow_vendor:
                return res.fail("no-vendor-blas", f"called the vendor BLAS: {', '.join(vendor[:4])}")
            if not all(torch.equal(a, b) for a, b in zip(args, saved, strict=True)):
                return res.fail("poison-freshness", "modified an input (it differs from its saved copy)")
            out = reply["out"]
            if prev is not None and isinstance(out, torch.Tensor) and torch.equal(out, prev):
                return res.fail("poison-freshness", "same output for new inputs: a stale or cached result")
            rule, reason, chk = self._judge(out, args)
            if chk:
                res.trials.append({"routing": routing, "seed": seed, "max_abs_err": chk["max_abs_err"],
                                   "tolerance": chk["allowed"]})
                if res.max_abs_err is None or chk["max_abs_err"] / max(chk["allowed"], 1e-30) > \
                        res.max_abs_err / max(res.tolerance, 1e-30):
                    res.max_abs_err, res.tolerance = chk["max_abs_err"], chk["allowed"]
                    res.tolerance_rule = "2 x torch same-dtype error + 1 ulp"
            if rule:
                return res.fail(rule, f"{reason} ({routing} routing)")
            prev = out.clone()
        return res

    def perf(self, case: MoECase, verified: list[CaseResult]) -> dict:
        from gemmlab.bench.moe import composite_forward

        out = {"name": case.name, "shape": case.dims, "status": "PASS", "rule": "", "reason": ""}
        if not [r for r in verified if r.shape == case.dims and r.status == "PASS"]:
            self.progress(f"exact-shape check of {case.name} (no listed correctness case has these sizes)")
            r = self.check(case, tag="exact-shape")
            r.name = f"{case.name} (exact-shape check)"
            verified.append(r)
            out["exact_shape_check"] = r.__dict__
            if r.status != "PASS":
                return dict(out, status="FAIL", rule="exact-shape",
                            reason=f"the timed case failed verification: {r.reason}")
        cuda = self.device.type == "cuda"
        n_sets = 2
        # one set of weights (the big tensors), fresh x and routing per set
        base_args = inputs(case, "uniform", _seed(self.seed, "perf", case.name, 0), self.dtype, self.device)
        sets = [base_args]
        for s in range(1, n_sets):
            x, _, _, wts, ids = inputs(case, ROUTINGS[s % 2], _seed(self.seed, "perf", case.name, s), self.dtype,
                                       self.device)
            sets.append((x, base_args[1], base_args[2], wts, ids))
        originals = [a[0].clone() for a in sets]
        reps = 5 if cuda else 2
        rng = random.Random(_seed(self.seed, "samples", case.name))
        plan = sorted({(r, rng.randrange(reps)) for r in rng.sample(range(self.rounds), min(2, self.rounds))})
        samples = [torch.full(tuple(sets[0][0].shape), float("nan"), dtype=self.dtype, device=self.device)
                   for _ in plan]
        slots = {rr: (slot, rr[1] % n_sets) for slot, rr in enumerate(plan)}
        base_out = [None]

        def baseline(i):
            base_out[0] = composite_forward(*sets[i % n_sets])
            return base_out[0]

        try:
            self.worker.request("warmup_args", args=sets[0], seconds=1.0 if cuda else 0.0)
        except (CandidateError, WorkerFailure) as e:
            return dict(out, status="FAIL", rule="isolation", reason=str(e))
        cand, base, host, kernels, ops = [], [], [], set(), set()
        with ClockSampler() as clocks:
            for r in range(self.rounds):
                at = {rep: slot for (rr, rep), (slot, _) in slots.items() if rr == r}
                for who in (("cand", "base") if r % 2 == 0 else ("base", "cand")):
                    if who == "base":
                        base.append(timed_loop(baseline, reps, self.device, cuda)[0])
                        continue
                    try:
                        reply = self.worker.request("time_args", sets=sets, reps=reps, samples=samples, sample_at=at,
                                                    flush=cuda, profile=(r == 0))
                    except (CandidateError, WorkerFailure) as e:
                        return dict(out, status="FAIL", rule="isolation", reason=str(e))
                    cand.append(reply["device_ms"])
                    host.append(reply["host_ms"])
                    kernels |= set(reply["kernels"])
                    ops |= set(reply["ops"])
        cand_ms = statistics.median(t for rr in cand for t in rr)
        host_med = statistics.median(t for rr in host for t in rr)
        base_ms = statistics.median(t for rr in base for t in rr)
        tflops = case.flops / (cand_ms * 1e-3) / 1e12
        out.update(median_ms=cand_ms, host_median_ms=host_med, tflops=tflops, clocks=clocks.summary(),
                   timed_kernels=sorted(kernels), timed_path=None, baseline_ms=base_ms,
                   baseline_tflops=case.flops / (base_ms * 1e-3) / 1e12,
                   baseline="torch composite on torch._grouped_mm, interleaved", honest=ratio_summary(cand, base))
        out["ratio"] = tflops / out["baseline_tflops"]
        flips = [0] * n_sets  # sampled calls saw their x negated: the expected output follows the sign
        for (rr, rep_i), (slot, set_i) in sorted(slots.items()):
            flips[set_i] += 1
            x = originals[set_i] * (-1.0 if flips[set_i] % 2 else 1.0)
            rule, reason, _ = self._judge(samples[slot], (x, *sets[set_i][1:]))
            if rule:
                return dict(out, status="FAIL", rule="exact-shape",
                            reason=f"an output produced while timing (round {rr}, call {rep_i}) is wrong: {reason}")
        out["samples_checked"] = len(slots)
        failed = timed_run_problem(cand_ms, host_med, tflops, self.device, kernels, ops, self.allow_vendor, None,
                                   verified)
        return dict(out, status="FAIL", rule=failed[0], reason=failed[1]) if failed else out

    def run(self) -> dict:
        cf = self.cases
        results: list[CaseResult] = []
        try:
            for case in cf.correctness:
                self.progress(f"correctness {case.name} T={case.t} H={case.h} I={case.i} E={case.e} k={case.k}")
                results.append(self.check(case))
            listed = list(results)
            perf = None
            if cf.performance is not None and all(r.status == "PASS" for r in listed):
                self.progress(f"performance {cf.performance.name}")
                perf = self.perf(cf.performance, results)
        finally:
            self.worker.close()
        return {
            "cases_file": cf.path, "cases_name": cf.name, "mode": "moe", "kernel": self.kernel or "gemmlab (default)",
            "signature": "moe", "layout": "rowmajor", "dtype": cf.dtype, "device": str(self.device),
            "dims": "T x H x I x E x k", "env": env_info(), "seed": self.seed, "allow_vendor": self.allow_vendor,
            "worker_starts": self.worker.starts, "correctness": [r.__dict__ for r in results], "performance": perf,
            "performance_shape": list(cf.performance.dims) if cf.performance else None,
            **verdict(cf, listed, perf),
        }
