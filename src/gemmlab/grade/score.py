"""What a grade scores: one case's result (``CaseResult``: status, rule, error, trials) and the verdict of a grade
(``verdict``: 30 correctness points over the listed cases, 70 for the timed case by its ratio; FAIL, INCONCLUSIVE or
PASS). ``grader.py`` fills them; nothing here runs a kernel."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    secret_trials: int = 0  # trials on inputs from a secret seed (``_secret_seed``) run, and passed
    secret_passed: int = 0

    def fail(self, rule: str, reason: str) -> CaseResult:
        self.status, self.rule, self.reason = "FAIL", rule, reason
        return self


def verdict(cf, listed: list[CaseResult], perf: dict | None) -> dict:
    """Score, verdict and failures of a grade: 30 correctness points split over the listed cases,
    70 x min(1, ratio / full_score_ratio) for a passed performance case; none for an inconclusive one."""
    n_pass = sum(r.status == "PASS" for r in listed)
    score_c = cf.score_correctness * n_pass / len(listed) if listed else 0.0
    perf_ok = perf is not None and perf["status"] == "PASS"
    unsure = perf is not None and perf["status"] == "INCONCLUSIVE"
    score_p = cf.score_performance * min(1.0, perf["ratio"] / cf.full_score_ratio) if perf_ok else 0.0
    failed = [r.__dict__ for r in listed if r.status != "PASS"]
    failed += [perf] if perf and not perf_ok and not unsure else []
    passed = listed and not failed and (cf.performance is None or perf_ok or unsure)
    return {
        "score": {
            "correctness": score_c,
            "performance": score_p,
            "total": score_c + score_p,
            "max": cf.score_correctness + cf.score_performance,
        },
        "listed_correctness_passed": bool(listed) and n_pass == len(listed),
        "verdict": ("INCONCLUSIVE" if unsure else "PASS") if passed else "FAIL",
        "inconclusive": perf["reason"] if passed and unsure else None,
        "failures": [{key: f[key] for key in ("name", "rule", "reason")} for f in failed],
    }
