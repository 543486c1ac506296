"""How ``bench fp8`` verifies and times its candidates (``bench.fp8`` builds the rows with these):

fp8_checker(qa, qb, sa, sb, (M, N))    a check of an FP8 output against its operands' float64 reference
routed_checks(checks)                  one check that routes each candidate's output to its own check
time_modes(...)                        every mode's interleaved run (``compare_many``) into the row
mode_ratios(res, pairs)                the ratios' medians and 95% intervals (``stats.ratio_summary``)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gemmlab.instruments import stats
from gemmlab.instruments.compare import compare_many
from gemmlab.ref import gemm_fp8_bound, gemm_fp8_ref


def fp8_checker(qa, qb, sa, sb, shape) -> Callable[[object], dict]:
    """A check of outputs of (qa * sa) @ (qb * sb): the float64 reference and bound computed once."""
    ref = gemm_fp8_ref(qa, qb, sa, sb)
    bound = gemm_fp8_bound(qa, qb, sa, sb, torch.bfloat16, ref)

    def check(out) -> dict:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != torch.bfloat16:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return {"ok": False, "error": f"returned {got}, expected a {shape} bfloat16 tensor"}
        finite = bool(torch.isfinite(out).all())
        worst = (((out.double() - ref).abs() / bound).max().item() if out.numel() else 0.0) if finite else float("inf")
        return {"ok": finite and worst <= 1.0, "worst": worst}

    return check


def routed_checks(checks: dict[str, Callable[[object], dict]]) -> tuple[Callable[[object], dict], Callable]:
    """One check for compare_many that routes each output to the check of the candidate that wrote it last
    (by address), and ``tagged(name, fn)``, the call that records the writer."""
    owner: dict[int, str] = {}  # output address -> the candidate that wrote it last

    def check(out) -> dict:
        name = owner.get(out.data_ptr()) if isinstance(out, torch.Tensor) else None
        if name is None:
            return {"ok": False, "error": f"an output no candidate wrote ({type(out).__name__})"}
        return checks[name](out)

    def tagged(name: str, fn: Callable[[], object]) -> Callable[[], object]:
        def call():
            y = fn()
            if isinstance(y, torch.Tensor):
                owner[y.data_ptr()] = name
            return y

        return call

    return check, tagged


def mode_ratios(res: dict, pairs: dict[str, tuple[str, str]]) -> dict[str, dict | None]:
    """Each named ratio's summary (ratio, ci95, verdict: "inconclusive" where the interval holds 1 or there is none),
    None where either side was not timed."""
    c, out = res["candidates"], {}
    for label, (cand, base) in pairs.items():
        if not res.get("timed") or "per_round_ms" not in c.get(cand, {}) or "per_round_ms" not in c.get(base, {}):
            out[label] = None
            continue
        s = stats.ratio_summary(c[cand]["per_round_ms"], c[base]["per_round_ms"])
        verdict = s["verdict"] if s["verdict"] in ("faster", "slower") else "inconclusive"
        out[label] = {"ratio": s["ratio"], "ci95": s["ci95"], "verdict": verdict}
    return out


def time_modes(
    row: dict,
    fns: dict,
    check,
    baseline: str,
    flops: float,
    pairs: dict,
    modes: Sequence[str],
    rounds: int,
    reps: int,
    warmup_s: float,
    progress: Callable[[str], None] | None,
    what: str,
) -> None:
    """Per mode one compare_many run, its TFLOPS, checks and ratios written into ``row`` (``<mode>_*`` fields)."""
    for mode in modes:
        if progress:
            progress(f"{what} {mode}")
        res = compare_many(
            fns,
            baseline,
            check=check,
            flops=flops,
            dtype="float8_e4m3fn",
            rounds=rounds,
            reps=reps,
            warmup_s=warmup_s,
            graph=mode == "graph",
        )
        row[mode] = res
        row[f"{mode}_ms"] = {c: v["median_ms"] for c, v in res["candidates"].items() if "median_ms" in v}
        row[f"{mode}_tflops"] = {c: v["tflops"] for c, v in res["candidates"].items() if "tflops" in v}
        row[f"{mode}_checks"] = {
            c: bool(v["check"].get("ok") and v.get("check_after", True)) for c, v in res["candidates"].items()
        }
        row[f"{mode}_intervals"] = mode_ratios(res, pairs)
