"""``gemmlab bench moe --baseline liger``: gemmlab.moe_forward against Liger-Kernel's fused MoE (the peer users
pick) and against the device's own limits, all measured in the same run.

Legend: T tokens, H hidden, I expert intermediate, E experts, k top-k, S = T*k routed rows.

Providers share one signature, (x (T, H), w1 (E, 2I, H), w2 (E, H, I), topk_weights (T, k) fp32,
topk_ids (T, k) int32) -> y (T, H):
    gemmlab          gemmlab.moe_forward (fwd+bwd: autograd through the custom op)
    liger            liger_kernel.ops.fused_moe.LigerFusedMoEFunction.apply(x, w1, w2, topk_ids, topk_weights)
                     (optional: when liger-kernel is not importable the baseline is skipped, with a message)
    torch composite  ref.moe_composite on torch._grouped_mm (optional; forward only)
Cases: model x T x routing (uniform, zipf) x mode x part. mode "eager", or "graph": each provider captured once
in a CUDA graph after its warm-up and autotuning, replays timed; a provider that cannot be captured (Liger reads
its tile count on the host with .item()) is timed eager and its row says so. part "fwd", or "fwd+bwd": the forward,
then torch.autograd.grad of sum(y * dy) with respect to x, w1, w2 and topk_weights.
Verification: every provider's y (and for fwd+bwd its four gradients) against the float32 references
(ref.moe_ref; ref.moe_grad_check, autograd of the same loop) before and after timing; then interleaved
rounds with the L2 flushed (compare_many). y must be within its derived tolerance; gradients within
GRAD_SLACK times theirs to be timed (a peer that accumulates d(topk_weights) in bf16 atomics is less exact
than torch, not wrong), and a row lists every gradient outside 1x (``*_grads_outside_tolerance``).
Peak memory per provider: torch.cuda.max_memory_allocated around one more call, outside timing.
Liger autotunes on its first call per (H, I, dtypes), whatever T that call has: it is called once per model
and part at ``liger_tune_tokens`` rows before any case of that model, outside timing.
Bars, measured in the same process (forward only):
    dense (T >= 4096): torch.mm (S, H) @ (H, 2I) then (S, I) @ (I, H), one timed call interleaved with the
        providers; frac_of_dense = gemmlab TFLOPS / dense TFLOPS.
    hbm (T <= 64): bytes of the experts hit (unique ids x (2I*H + H*I) elements) + x and y (2*T*H elements)
        + topk ids and weights, over the device-to-device copy bandwidth (``probe.hbm_copy_gbps``):
        hbm_bound_ms; ratio_to_hbm_bound = median time / bound (>= 1 by physics; the target is <= 1.25).
TFLOPS count the routed work: 2*S*H*2I + 2*S*I*H (fwd); three times that (fwd+bwd: dX and dW of both GEMMs).
The providers are in ``bench.moe_peers``, the bars in ``bench.moe_bars``, the tables and files in
``bench.moe_liger_view``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence

import torch

from gemmlab.bench.moe_bars import DenseOut, dense_call, hbm_bound, peak_memory
from gemmlab.bench.moe_liger_rows import DENSE, HBM_MAX_TOKENS, SHORT, case_bars, case_label, rows, summarize
from gemmlab.bench.moe_peers import (
    COMPOSITE,
    GEMMLAB,
    LIGER,
    Provider,
    gemmlab_forward,
    load_liger,
    tune_liger_safely,
)
from gemmlab.instruments import timing
from gemmlab.instruments.compare import compare_many
from gemmlab.problems import MOE_MODELS, MoEModel, generator, matrix, moe_inputs
from gemmlab.ref import moe_check, moe_composite, moe_grad_check, moe_ref

__all__ = [
    "DENSE",
    "DENSE_MIN_TOKENS",
    "GRAD_SLACK",
    "HBM_MAX_TOKENS",
    "MODES",
    "PARTS",
    "ROUTINGS",
    "SHORT",
    "SUITE_MODELS",
    "SUITE_TOKENS",
    "bench_case",
    "bench_suite",
    "capture_all",
    "case_bars",
    "forward_flops",
    "hbm_bound",
    "part_calls",
    "prepare",
    "rows",
    "suite_cases",
    "suite_providers",
    "summarize",
]

SUITE_MODELS = ("deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b", "olmoe-1b-7b", "gpt-oss-120b-like")
SUITE_TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
ROUTINGS = ("uniform", "zipf")
MODES = ("eager", "graph")
PARTS = ("fwd", "fwd+bwd")
DENSE_MIN_TOKENS = 4096
GRAD_SLACK = 4.0  # fwd+bwd: a provider is timed with gradients within 4x the derived tolerance; "strict" says 1x


def suite_cases(
    models: Sequence[str] = SUITE_MODELS,
    tokens: Sequence[int] = SUITE_TOKENS,
    routings: Sequence[str] = ROUTINGS,
    modes: Sequence[str] = MODES,
    parts: Sequence[str] = ("fwd",),
    min_bwd_tokens: int = 0,
) -> list[dict]:
    """The cases in run order (part, model, T, routing, mode: a run cut short by its time limit keeps eager and
    graph of the same case together); fwd+bwd only at T >= ``min_bwd_tokens``."""
    for name, values, known in (("routing", routings, ROUTINGS), ("mode", modes, MODES), ("part", parts, PARTS)):
        bad = [v for v in values if v not in known]
        if bad:
            raise ValueError(f"{name} {bad[0]!r}: one of {', '.join(known)}")
    bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or t < 1]
    if bad:
        raise ValueError(f"tokens {bad[0]!r}: T must be a positive integer")
    return [
        {"model": m, "tokens": t, "routing": r, "mode": mode, "part": part}
        for part in parts
        for m in models
        for t in tokens
        for r in routings
        for mode in modes
        if part == "fwd" or t >= min_bwd_tokens
    ]


def forward_flops(model: MoEModel, tokens: int) -> float:
    s = tokens * model.top_k
    return 2.0 * s * model.hidden * 2 * model.intermediate + 2.0 * s * model.intermediate * model.hidden


def _device_alive() -> None:
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
    except Exception as e:
        raise RuntimeError(f"the CUDA context is unusable after a failed graph capture: {e}") from e


def capture_all(calls: dict[str, Callable[[], object]]) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """Each call captured in its own CUDA graph (``timing.capture``: a warm-up call on the capture stream
    first) and replaced by replay-and-return-the-static-output. A call whose capture fails stays eager;
    ``modes[name]`` says which it got and why."""
    out, modes = {}, {}
    for name, fn in calls.items():
        stream = torch.cuda.current_stream()
        try:
            graph, static = timing.capture(fn)
        except Exception as e:
            torch.cuda.set_stream(stream)  # a capture_end that raised left its capture stream current
            _device_alive()
            out[name], modes[name] = fn, f"eager: CUDA-graph capture failed ({type(e).__name__}: {str(e)[:160]})"
            continue
        out[name], modes[name] = (lambda g=graph, s=static: (g.replay(), s)[1]), "graph"
    return out, modes


def _forward_check(ref: torch.Tensor, allowed: float, dtype: torch.dtype) -> Callable[[torch.Tensor], dict]:
    def check(y) -> dict:
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(ref.shape) or y.dtype != dtype:
            return {
                "ok": False,
                "error": f"y: expected a {dtype} tensor {tuple(ref.shape)}, got "
                f"{getattr(y, 'dtype', type(y).__name__)} {tuple(getattr(y, 'shape', ()))}",
            }
        finite = bool(torch.isfinite(y).all())
        err = (y.float() - ref).abs().max().item() if finite and y.numel() else (0.0 if finite else math.inf)
        return {"ok": finite and err <= allowed, "max_abs_err": err, "allowed": allowed}

    return check


def prepare(model: MoEModel, tokens: int, routing: str, dtype: torch.dtype, seed: int = 0) -> dict:
    """A case's inputs (``problems.moe_inputs``; int32 ids), its float32 reference y and the derived tolerance
    (``ref.moe_check``'s); eager and graph of one case share them."""
    p = moe_inputs(model, tokens, routing, dtype, seed)
    p["ids"] = p["ids"].to(torch.int32)
    p["ref"] = moe_ref(p["x"], p["w1"], p["w2"], p["weights"], p["ids"])
    p["allowed"] = moe_check(p["ref"].to(dtype), p["x"], p["w1"], p["w2"], p["weights"], p["ids"], p["ref"])["allowed"]
    p["key"] = (model, tokens, routing, dtype, seed)
    return p


def part_calls(
    part: str, providers: dict[str, Provider], p: dict, dtype: torch.dtype, seed: int
) -> tuple[dict[str, Callable[[], object]], Callable[[object], dict], int]:
    """The calls of one part on a prepared case: (calls, their check, the work as a multiple of the forward's).
    "fwd": each provider's y, checked against the float32 reference. "fwd+bwd": y and torch.autograd.grad of
    sum(y * dy) for x, w1, w2 and topk_weights, checked by ``ref.moe_grad_check``; the composite is not run (a
    forward baseline: its backward is autograd through torch ops, not a peer's kernel)."""
    x, w1, w2, wts, ids = (p[key] for key in ("x", "w1", "w2", "weights", "ids"))
    check_y = _forward_check(p["ref"], p["allowed"], dtype)
    if part == "fwd":
        return {name: functools.partial(f, x, w1, w2, wts, ids) for name, f in providers.items()}, check_y, 1
    if part != "fwd+bwd":
        raise ValueError(f"part {part!r}: one of {', '.join(PARTS)}")
    dy = matrix(*x.shape, "centered", generator(seed + 2, x.device), dtype)
    leaves = [t.detach().requires_grad_() for t in (x, w1, w2, wts)]

    def fwd_bwd(f: Provider) -> tuple[torch.Tensor, ...]:
        y = f(*leaves, ids)
        return (y.detach(), *torch.autograd.grad(y, leaves, dy))

    def check(out) -> dict:
        c = check_y(out[0])
        if not c["ok"]:
            return dict(c, error=c.get("error") or "y off the float32 reference")
        gc = moe_grad_check(out[1:], dy, x, w1, w2, wts, ids)
        # timed when every gradient is within GRAD_SLACK x its derived tolerance (a real bug, a missed block
        # or expert, is off by O(|ref|)); "strict" says whether it is within the tolerance itself
        timed = gc.get("worst", math.inf) <= GRAD_SLACK
        return dict(gc, ok=timed, strict=gc["ok"], y_max_abs_err=c["max_abs_err"], y_allowed=p["allowed"])

    return {name: functools.partial(fwd_bwd, f) for name, f in providers.items() if name != COMPOSITE}, check, 3


def bench_case(
    model_name: str,
    model: MoEModel,
    tokens: int,
    routing: str,
    mode: str,
    part: str,
    dtype: torch.dtype,
    providers: dict[str, Provider],
    *,
    hbm_gbps: float | None = None,
    dense: bool = True,
    rounds: int = 6,
    reps: int = 5,
    warmup_s: float = 0.3,
    seed: int = 0,
    prepared: dict | None = None,
) -> dict:
    """One case: verify every provider, measure its peak memory, capture (graph mode), time interleaved,
    then the bars. The baseline is Liger when present, else the composite, else gemmlab itself (fwd+bwd: the
    composite is not run). ``prepared``: this case's ``prepare(...)``, made once for its eager and graph runs."""
    p = prepared if prepared is not None else prepare(model, tokens, routing, dtype, seed)
    if p["key"] != (model, tokens, routing, dtype, seed):
        raise ValueError(f"prepared inputs are for {p['key']}, not this case")
    dname = str(dtype).removeprefix("torch.")
    calls, check_provider, work = part_calls(part, providers, p, dtype, seed)
    flops = forward_flops(model, tokens) * work
    memory = {}
    for name, fn in calls.items():
        try:
            memory[name] = peak_memory(fn)
        except Exception as e:  # compare_many reports the provider's failure; no memory figure for it
            memory[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    check_dense = None
    if dense and part == "fwd" and tokens >= DENSE_MIN_TOKENS:
        calls[DENSE], check_dense = dense_call(model, tokens, dtype, p["w1"], p["w2"], seed)

    def check(out) -> dict:
        return check_dense(out) if isinstance(out, DenseOut) else check_provider(out)

    if mode == "graph":
        calls, modes = capture_all(calls)
    elif mode == "eager":
        modes = dict.fromkeys(calls, "eager")
    else:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    baseline = next(n for n in (LIGER, COMPOSITE, GEMMLAB) if n in calls)
    res = compare_many(
        calls, baseline, check=check, flops=flops, dtype=dname, rounds=rounds, reps=reps, warmup_s=warmup_s, graph=False
    )
    counts = torch.bincount(p["ids"].reshape(-1).long(), minlength=model.experts)
    bars = case_bars(res, model, tokens, part, p, providers, hbm_gbps)
    res["timing"] = res.pop("mode")  # interleaved; "mode" is the case's eager or graph
    return {
        **res,
        "model": model_name,
        "tokens": tokens,
        "routing": routing,
        "mode": mode,
        "part": part,
        "dtype": dname,
        "graph": mode == "graph",
        "sizes": {
            "H": model.hidden,
            "I": model.intermediate,
            "E": model.experts,
            "k": model.top_k,
            "S": tokens * model.top_k,
        },
        "experts_used": int((counts > 0).sum()),
        "max_rows_per_expert": int(counts.max()),
        "flops": flops,
        "provider_modes": modes,
        "memory": memory,
        "bars": bars,
    }


def suite_providers(
    baseline: str, composite: bool, say: Callable[[str], None]
) -> tuple[dict[str, Provider], Provider | None, dict]:
    """(the providers: gemmlab, Liger when asked and importable, the composite; Liger or None; Liger's info)."""
    liger, liger_info = load_liger() if baseline == "liger" else (None, {"available": False, "reason": "not asked"})
    if baseline == "liger" and liger is None:
        say(liger_info["reason"])
    providers: dict[str, Provider] = {GEMMLAB: gemmlab_forward}
    if liger is not None:
        providers[LIGER] = liger
    if composite or baseline == "torch":
        providers[COMPOSITE] = moe_composite
    return providers, liger, liger_info


def bench_suite(
    models: Sequence[str] = SUITE_MODELS,
    tokens: Sequence[int] = SUITE_TOKENS,
    routings: Sequence[str] = ROUTINGS,
    modes: Sequence[str] = ("eager",),
    parts: Sequence[str] = ("fwd",),
    dtype: torch.dtype = torch.bfloat16,
    *,
    baseline: str = "liger",
    composite: bool = True,
    dense: bool = True,
    min_bwd_tokens: int = 0,
    liger_tune_tokens: int = 4096,
    time_limit_s: float | None = None,
    custom: MoEModel | None = None,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[dict], None] | None = None,
    **kw,
) -> dict:
    """Every case of ``suite_cases`` until ``time_limit_s`` (the rest listed under "not_run"). ``baseline``:
    "liger" (skipped with a message when not importable) or "torch" (the composite). ``on_result(report)``
    after every case (write partial results: a step killed by its time limit keeps what it measured)."""
    if baseline not in ("liger", "torch"):
        raise ValueError(f"baseline {baseline!r}: liger or torch")
    known = {**MOE_MODELS, **({"custom": custom} if custom else {})}
    for name in models:
        if name not in known:
            raise ValueError(f"model {name!r}: one of {', '.join(MOE_MODELS)} (or custom)")
    cases = suite_cases(models, tokens, routings, modes, parts, min_bwd_tokens)
    if "graph" in modes and not torch.cuda.is_available():
        raise ValueError("mode graph needs CUDA (CUDA-graph replay)")
    say = progress or (lambda msg: None)
    providers, liger, liger_info = suite_providers(baseline, composite, say)
    env = timing.env_info()
    env["liger_kernel"] = liger_info.get("version")
    hbm = None
    if torch.cuda.is_available():
        from gemmlab.bench.probe import hbm_copy_gbps

        hbm = hbm_copy_gbps()
    report = {
        "kind": "moe-liger-bench",
        "env": env,
        "args": {
            "models": list(models),
            "tokens": list(tokens),
            "routings": list(routings),
            "modes": list(modes),
            "parts": list(parts),
            "baseline": baseline,
            "dtype": str(dtype).removeprefix("torch."),
            "composite": composite,
            "dense": dense,
            "min_bwd_tokens": min_bwd_tokens,
            "liger_tune_tokens": liger_tune_tokens,
            "time_limit_s": time_limit_s,
            **kw,
        },
        "liger": liger_info,
        "hbm_copy": hbm,
        "liger_tuning": [],
        "results": [],
        "not_run": [],
    }
    t0 = time.monotonic()
    tuned: set[tuple[str, str]] = set()
    prepared: dict | None = None
    seed = kw.pop("seed", 0)
    for c in cases:
        if time_limit_s is not None and time.monotonic() - t0 > time_limit_s:
            report["not_run"].append(case_label(c))
            continue
        model = known[c["model"]]
        say(case_label(c))
        try:
            if liger is not None and (c["model"], c["part"]) not in tuned:
                tuned.add((c["model"], c["part"]))
                report["liger_tuning"].append(
                    {"model": c["model"], **tune_liger_safely(liger, model, c["part"], dtype, liger_tune_tokens)}
                )
            key = (model, c["tokens"], c["routing"], dtype, seed)
            if prepared is None or prepared["key"] != key:
                prepared = None  # the last case's tensors go before this one's are made
                prepared = prepare(*key)
            r = bench_case(
                c["model"],
                model,
                c["tokens"],
                c["routing"],
                c["mode"],
                c["part"],
                dtype,
                providers,
                hbm_gbps=(hbm or {}).get("gbps"),
                dense=dense,
                seed=seed,
                prepared=prepared,
                **kw,
            )
        except torch.OutOfMemoryError as e:  # one case too large for the device: say so, go on
            prepared = None
            r = {**c, "error": f"out of memory: {str(e)[:200]}"}
        report["results"].append(r)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        report["rows"] = rows(report)
        report["summary"] = summarize(report["rows"])
        if on_result:
            on_result(report)
    report["rows"] = rows(report)
    report["summary"] = summarize(report["rows"])
    report["elapsed_s"] = time.monotonic() - t0
    return report
