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
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gemmlab import output
from gemmlab.instruments import timing
from gemmlab.instruments.compare import compare_many
from gemmlab.output import Table, long_row, num
from gemmlab.problems import MOE_MODELS, MoEModel, generator, matrix, moe_inputs
from gemmlab.ref import gemm_check, moe_check, moe_composite, moe_grad_check, moe_ref

SUITE_MODELS = ("deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b", "olmoe-1b-7b", "gpt-oss-120b-like")
SUITE_TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
ROUTINGS = ("uniform", "zipf")
MODES = ("eager", "graph")
PARTS = ("fwd", "fwd+bwd")
DENSE_MIN_TOKENS, HBM_MAX_TOKENS = 4096, 64
GRAD_SLACK = 4.0  # fwd+bwd: a provider is timed with gradients within 4x the derived tolerance; "strict" says 1x
GEMMLAB, LIGER, COMPOSITE, DENSE = "gemmlab", "liger", "torch composite (_grouped_mm)", "dense torch.mm x2"
SHORT = {GEMMLAB: "gemmlab", LIGER: "liger", COMPOSITE: "composite", DENSE: "dense"}
Provider = Callable[..., torch.Tensor]


def gemmlab_forward(x, w1, w2, topk_weights, topk_ids) -> torch.Tensor:
    import gemmlab

    return gemmlab.moe_forward(x, w1, w2, topk_weights, topk_ids, validate=False)


def load_liger() -> tuple[Provider | None, dict]:
    """Liger's fused MoE as a provider, or None and why. Imports the submodule liger_kernel.ops.fused_moe
    only (the package's own __init__ files still run; they need ``packaging``, and without CUDA they look for
    ``transformers``, optionally). Liger wants int32 topk_ids and returns the combined y (T, H) in x's dtype."""
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
    except Exception as e:  # not installed, or broken: the baseline is skipped, never a crash
        return None, {"available": False, "reason": f"liger-kernel is not importable ({type(e).__name__}: {e}): "
                                                    "the Liger baseline is skipped"}
    import os
    from importlib import metadata

    try:
        version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        version = None

    def liger(x, w1, w2, topk_weights, topk_ids) -> torch.Tensor:
        return LigerFusedMoEFunction.apply(x, w1, w2, topk_ids, topk_weights)

    return liger, {"available": True, "version": version,
                   "autotune": os.environ.get("LIGER_FUSED_MOE_AUTOTUNE", "1") not in ("0", "false", "no")}


def suite_cases(models: Sequence[str] = SUITE_MODELS, tokens: Sequence[int] = SUITE_TOKENS,
                routings: Sequence[str] = ROUTINGS, modes: Sequence[str] = MODES, parts: Sequence[str] = ("fwd",),
                min_bwd_tokens: int = 0) -> list[dict]:
    """The cases in run order (part, model, T, routing, mode: a run cut short by its time limit keeps eager and
    graph of the same case together); fwd+bwd only at T >= ``min_bwd_tokens``."""
    for name, values, known in (("routing", routings, ROUTINGS), ("mode", modes, MODES), ("part", parts, PARTS)):
        bad = [v for v in values if v not in known]
        if bad:
            raise ValueError(f"{name} {bad[0]!r}: one of {', '.join(known)}")
    bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or t < 1]
    if bad:
        raise ValueError(f"tokens {bad[0]!r}: T must be a positive integer")
    return [{"model": m, "tokens": t, "routing": r, "mode": mode, "part": part}
            for part in parts for m in models for t in tokens for r in routings for mode in modes
            if part == "fwd" or t >= min_bwd_tokens]


def forward_flops(model: MoEModel, tokens: int) -> float:
    s = tokens * model.top_k
    return 2.0 * s * model.hidden * 2 * model.intermediate + 2.0 * s * model.intermediate * model.hidden


def hbm_bound(model: MoEModel, topk_ids: torch.Tensor, topk_weights: torch.Tensor, elt: int,
              gbps: float) -> dict:
    """The least bytes a forward moves, over the measured copy bandwidth: every expert hit reads its
    w1 (2I, H) and w2 (H, I) once, x (T, H) is read and y (T, H) written once, and the routing is read."""
    t = topk_ids.shape[0]
    hit = int(torch.unique(topk_ids).numel())
    weight = hit * 3 * model.intermediate * model.hidden * elt
    act = 2 * t * model.hidden * elt
    route = topk_ids.numel() * topk_ids.element_size() + topk_weights.numel() * topk_weights.element_size()
    total = weight + act + route
    return {"experts_hit": hit, "weight_bytes": weight, "activation_bytes": act, "routing_bytes": route,
            "bytes": total, "hbm_gbps": gbps, "hbm_bound_ms": total / (gbps * 1e9) * 1e3}


@dataclass
class DenseOut:
    """The dense bar's two outputs (S, 2I) and (S, H)."""

    c1: torch.Tensor
    c2: torch.Tensor


def dense_call(model: MoEModel, tokens: int, dtype: torch.dtype, w1: torch.Tensor, w2: torch.Tensor,
               seed: int) -> tuple[Callable[[], DenseOut], Callable[[DenseOut], dict]]:
    """The dense bar: (S, H) @ w1[0]^T (H, 2I) then (S, I) @ w2[0]^T (I, H), the same FLOPs as the routed
    work in two torch.mm calls, and its check (three rows of each product against float64)."""
    s, h, i = tokens * model.top_k, model.hidden, model.intermediate
    g = generator(seed + 1, w1.device)
    a1 = matrix(s, h, "centered", g, dtype)
    a2 = matrix(s, i, "centered", g, dtype)
    b1, b2 = w1[0].t(), w2[0].t()
    out = DenseOut(torch.full((s, 2 * i), math.nan, dtype=dtype, device=w1.device),
                   torch.full((s, h), math.nan, dtype=dtype, device=w1.device))

    def call() -> DenseOut:
        torch.mm(a1, b1, out=out.c1)
        torch.mm(a2, b2, out=out.c2)
        return out

    def check(o: DenseOut) -> dict:
        rows = torch.tensor(sorted({0, s // 2, s - 1}), device=w1.device)
        c1, c2 = gemm_check(o.c1[rows], a1[rows], b1), gemm_check(o.c2[rows], a2[rows], b2)
        return {"ok": c1["ok"] and c2["ok"], "max_abs_err": max(c1["max_abs_err"], c2["max_abs_err"]),
                "note": "rows 0, S/2, S-1 of both products against float64"}

    return call, check


def peak_memory(fn: Callable[[], object]) -> dict | None:
    """Peak bytes allocated during one call of ``fn`` (after one unmeasured call: autotuning, lazy buffers),
    absolute and above what was allocated before it. None without CUDA."""
    if not torch.cuda.is_available():
        return None
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return {"peak_bytes": peak, "peak_above_inputs_bytes": peak - base}


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
            return {"ok": False, "error": f"y: expected a {dtype} tensor {tuple(ref.shape)}, got "
                                          f"{getattr(y, 'dtype', type(y).__name__)} {tuple(getattr(y, 'shape', ()))}"}
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
    p["allowed"] = moe_check(p["ref"].to(dtype), p["x"], p["w1"], p["w2"], p["weights"], p["ids"],
                             p["ref"])["allowed"]
    p["key"] = (model, tokens, routing, dtype, seed)
    return p


def bench_case(model_name: str, model: MoEModel, tokens: int, routing: str, mode: str, part: str,
               dtype: torch.dtype, providers: dict[str, Provider], *, hbm_gbps: float | None = None,
               dense: bool = True, rounds: int = 6, reps: int = 5, warmup_s: float = 0.3, seed: int = 0,
               prepared: dict | None = None) -> dict:
    """One case: verify every provider, measure its peak memory, capture (graph mode), time interleaved,
    then the bars. The baseline is Liger when present, else the composite, else gemmlab itself (fwd+bwd: the
    composite is not run). ``prepared``: this case's ``prepare(...)``, made once for its eager and graph runs."""
    p = prepared if prepared is not None else prepare(model, tokens, routing, dtype, seed)
    if p["key"] != (model, tokens, routing, dtype, seed):
        raise ValueError(f"prepared inputs are for {p['key']}, not this case")
    x, w1, w2, wts, ids, ref, allowed = (p[key] for key in ("x", "w1", "w2", "weights", "ids", "ref", "allowed"))
    dname = str(dtype).removeprefix("torch.")
    check_y = _forward_check(ref, allowed, dtype)
    flops = forward_flops(model, tokens)
    if part == "fwd":
        calls = {name: functools.partial(f, x, w1, w2, wts, ids) for name, f in providers.items()}
        check_provider = check_y
    elif part == "fwd+bwd":
        dy = matrix(*x.shape, "centered", generator(seed + 2, x.device), dtype)
        leaves = [t.detach().requires_grad_() for t in (x, w1, w2, wts)]

        def fwd_bwd(f: Provider) -> tuple[torch.Tensor, ...]:
            y = f(*leaves, ids)
            return (y.detach(), *torch.autograd.grad(y, leaves, dy))

        def check_provider(out) -> dict:
            c = check_y(out[0])
            if not c["ok"]:
                return dict(c, error=c.get("error") or "y off the float32 reference")
            gc = moe_grad_check(out[1:], dy, x, w1, w2, wts, ids)
            # timed when every gradient is within GRAD_SLACK x its derived tolerance (a real bug, a missed block
            # or expert, is off by O(|ref|)); "strict" says whether it is within the tolerance itself
            timed = gc.get("worst", math.inf) <= GRAD_SLACK
            return dict(gc, ok=timed, strict=gc["ok"], y_max_abs_err=c["max_abs_err"], y_allowed=allowed)

        # the composite is a forward baseline (its backward is autograd through torch ops, not a peer's kernel)
        calls = {name: functools.partial(fwd_bwd, f) for name, f in providers.items() if name != COMPOSITE}
        flops *= 3
    else:
        raise ValueError(f"part {part!r}: one of {', '.join(PARTS)}")
    memory = {}
    for name, fn in calls.items():
        try:
            memory[name] = peak_memory(fn)
        except Exception as e:  # compare_many reports the provider's failure; no memory figure for it
            memory[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    check_dense = None
    if dense and part == "fwd" and tokens >= DENSE_MIN_TOKENS:
        calls[DENSE], check_dense = dense_call(model, tokens, dtype, w1, w2, seed)

    def check(out) -> dict:
        return check_dense(out) if isinstance(out, DenseOut) else check_provider(out)

    if mode == "graph":
        calls, modes = capture_all(calls)
    elif mode == "eager":
        modes = dict.fromkeys(calls, "eager")
    else:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    baseline = next(n for n in (LIGER, COMPOSITE, GEMMLAB) if n in calls)
    res = compare_many(calls, baseline, check=check, flops=flops, dtype=dname, rounds=rounds, reps=reps,
                       warmup_s=warmup_s, graph=False)
    counts = torch.bincount(ids.reshape(-1).long(), minlength=model.experts)
    bars = {}
    gl = res["candidates"].get(GEMMLAB, {})
    dn = res["candidates"].get(DENSE)
    if dn is not None and dn.get("tflops") and gl.get("tflops"):
        bars["dense"] = {"dense_ms": dn["median_ms"], "dense_tflops": dn["tflops"],
                         "frac_of_dense": gl["tflops"] / dn["tflops"]}
    if part == "fwd" and tokens <= HBM_MAX_TOKENS and hbm_gbps:
        bars["hbm"] = hbm_bound(model, ids, wts, x.element_size(), hbm_gbps)
        for name in providers:
            ms = res["candidates"].get(name, {}).get("median_ms")
            if ms:
                bars["hbm"][f"{SHORT.get(name, name)}_ratio_to_hbm_bound"] = ms / bars["hbm"]["hbm_bound_ms"]
    res["timing"] = res.pop("mode")  # interleaved; "mode" is the case's eager or graph
    return {**res, "model": model_name, "tokens": tokens, "routing": routing, "mode": mode, "part": part,
            "dtype": dname, "graph": mode == "graph",
            "sizes": {"H": model.hidden, "I": model.intermediate, "E": model.experts, "k": model.top_k,
                      "S": tokens * model.top_k},
            "experts_used": int((counts > 0).sum()), "max_rows_per_expert": int(counts.max()),
            "flops": flops, "provider_modes": modes, "memory": memory, "bars": bars}


def tune_liger(liger: Provider, model: MoEModel, part: str, dtype: torch.dtype, tokens: int, seed: int = 0) -> dict:
    """One call of Liger (forward, or forward + backward) at ``tokens`` rows, outside timing: its Triton
    autotuning (keyed by H, I and the dtypes) happens here. Returns the seconds it took."""
    t0 = time.perf_counter()
    p = moe_inputs(model, tokens, "uniform", dtype, seed + 7)
    args = [p["x"], p["w1"], p["w2"], p["weights"]]
    if part == "fwd+bwd":
        args = [t.detach().requires_grad_() for t in args]
        y = liger(*args, p["ids"].to(torch.int32))
        torch.autograd.grad(y, args, torch.ones_like(y))
    else:
        liger(*args, p["ids"].to(torch.int32))
    timing.sync(p["x"].device)
    return {"tokens": tokens, "part": part, "seconds": time.perf_counter() - t0}


def _label(c: dict) -> str:
    return f"{c['model']} T={c['tokens']} {c['routing']} {c['mode']} {c['part']}"


def bench_suite(models: Sequence[str] = SUITE_MODELS, tokens: Sequence[int] = SUITE_TOKENS,
                routings: Sequence[str] = ROUTINGS, modes: Sequence[str] = ("eager",),
                parts: Sequence[str] = ("fwd",), dtype: torch.dtype = torch.bfloat16, *, baseline: str = "liger",
                composite: bool = True, dense: bool = True, min_bwd_tokens: int = 0,
                liger_tune_tokens: int = 4096, time_limit_s: float | None = None,
                custom: MoEModel | None = None, progress: Callable[[str], None] | None = None,
                on_result: Callable[[dict], None] | None = None, **kw) -> dict:
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
    liger, liger_info = load_liger() if baseline == "liger" else (None, {"available": False, "reason": "not asked"})
    if baseline == "liger" and liger is None:
        say(liger_info["reason"])
    providers: dict[str, Provider] = {GEMMLAB: gemmlab_forward}
    if liger is not None:
        providers[LIGER] = liger
    if composite or baseline == "torch":
        providers[COMPOSITE] = moe_composite
    env = timing.env_info()
    env["liger_kernel"] = liger_info.get("version")
    hbm = None
    if torch.cuda.is_available():
        from gemmlab.bench.probe import hbm_copy_gbps

        hbm = hbm_copy_gbps()
    report = {"kind": "moe-liger-bench", "env": env,
              "args": {"models": list(models), "tokens": list(tokens), "routings": list(routings),
                       "modes": list(modes), "parts": list(parts), "baseline": baseline,
                       "dtype": str(dtype).removeprefix("torch."), "composite": composite,
                       "dense": dense, "min_bwd_tokens": min_bwd_tokens,
                       "liger_tune_tokens": liger_tune_tokens, "time_limit_s": time_limit_s, **kw},
              "liger": liger_info, "hbm_copy": hbm, "liger_tuning": [], "results": [], "not_run": []}
    t0 = time.monotonic()
    tuned: set[tuple[str, str]] = set()
    prepared: dict | None = None
    seed = kw.pop("seed", 0)
    for c in cases:
        if time_limit_s is not None and time.monotonic() - t0 > time_limit_s:
            report["not_run"].append(_label(c))
            continue
        model = known[c["model"]]
        say(_label(c))
        try:
            if liger is not None and (c["model"], c["part"]) not in tuned:
                tuned.add((c["model"], c["part"]))
                try:
                    tune = tune_liger(liger, model, c["part"], dtype, liger_tune_tokens)
                except Exception as e:  # its cases then report Liger's failure, each verified as usual
                    tune = {"tokens": liger_tune_tokens, "part": c["part"], "error": f"{type(e).__name__}: {e}"}
                report["liger_tuning"].append({"model": c["model"], **tune})
            key = (model, c["tokens"], c["routing"], dtype, seed)
            if prepared is None or prepared["key"] != key:
                prepared = None  # the last case's tensors go before this one's are made
                prepared = prepare(*key)
            r = bench_case(c["model"], model, c["tokens"], c["routing"], c["mode"], c["part"], dtype, providers,
                           hbm_gbps=(hbm or {}).get("gbps"), dense=dense, seed=seed, prepared=prepared, **kw)
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


def rows(report: dict) -> list[dict]:
    """One flat row per case: each provider's median ms, TFLOPS, mode and peak memory (GiB), ratio_vs_liger
    (Liger time / gemmlab time per round, median; > 1: gemmlab faster), the bars, and ok (every provider
    checked before and after timing)."""
    out = []
    for r in report["results"]:
        row = {key: r.get(key) for key in ("model", "tokens", "routing", "mode", "part")}
        if "candidates" not in r:
            out.append({**row, "ok": False, "error": r.get("error")})
            continue
        cands, errors = r["candidates"], []
        for name, c in cands.items():
            s = SHORT.get(name, name)
            ok = bool(c["check"].get("ok")) and c.get("check_after", True) is True
            if not ok:
                errors.append(f"{s}: {c['check'].get('error') or c.get('check_after_error') or 'wrong'}")
            mem = (r.get("memory") or {}).get(name) or {}
            if c["check"].get("strict") is False:
                worst = {n: round(g["worst"], 2) for n, g in c["check"]["grads"].items() if g["worst"] > 1}
                row[f"{s}_grads_outside_tolerance"] = worst  # timed (within GRAD_SLACK), not within 1x
            row.update({f"{s}_ms": c.get("median_ms"), f"{s}_tflops": c.get("tflops"), f"{s}_ok": ok,
                        f"{s}_mode": (r.get("provider_modes") or {}).get(name),
                        f"{s}_peak_gib": mem["peak_bytes"] / 2**30 if mem.get("peak_bytes") else None})
        vs = (cands.get(GEMMLAB, {}).get("vs_baseline") or {}) if r.get("baseline") == LIGER else {}
        hbm, dense = r["bars"].get("hbm") or {}, r["bars"].get("dense") or {}
        row.update({"ok": not errors, "error": "; ".join(errors) or None, "ratio_vs_liger": vs.get("ratio"),
                    "ratio_ci95": vs.get("ci95"), "dense_tflops": dense.get("dense_tflops"),
                    "frac_of_dense": dense.get("frac_of_dense"), "hbm_bound_ms": hbm.get("hbm_bound_ms"),
                    "ratio_to_hbm_bound": hbm.get("gemmlab_ratio_to_hbm_bound"),
                    "liger_ratio_to_hbm_bound": hbm.get("liger_ratio_to_hbm_bound")})
        out.append(row)
    return out


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in xs) / len(xs)) if xs else None


def summarize(table: list[dict]) -> list[dict]:
    """Per (part, mode): cases, wrong ones, geomean / min of ratio_vs_liger and the cases below 1.0, the
    least frac_of_dense (T >= 4096) and the largest ratio_to_hbm_bound (T <= 64)."""
    out = []
    for key in dict.fromkeys((r["part"], r["mode"]) for r in table):
        group = [r for r in table if (r["part"], r["mode"]) == key]
        rated = [r for r in group if r.get("ok") and r.get("ratio_vs_liger")]
        dense = [r["frac_of_dense"] for r in group if r.get("ok") and r.get("frac_of_dense")]
        hbm = [r["ratio_to_hbm_bound"] for r in group if r.get("ok") and r.get("ratio_to_hbm_bound")]
        worst = min(rated, key=lambda r: r["ratio_vs_liger"], default=None)
        loose = [f"{_label(r)}: {k.removesuffix('_grads_outside_tolerance')} {v}" for r in group
                 for k, v in r.items() if k.endswith("_grads_outside_tolerance")]
        out.append({"part": key[0], "mode": key[1], "cases": len(group),
                    "wrong": sum(not r.get("ok") for r in group), "grads_outside_tolerance": loose,
                    "vs_liger_cases": len(rated),
                    # graph mode: cases whose Liger could not be captured and ran eager (the ratio is against that)
                    "liger_eager_in_graph": sum(key[1] == "graph" and str(r.get("liger_mode")).startswith("eager")
                                                for r in group),
                    "geomean_ratio_vs_liger": _geomean([r["ratio_vs_liger"] for r in rated]),
                    "min_ratio_vs_liger": worst["ratio_vs_liger"] if worst else None,
                    "min_case": _label(worst) if worst else None,
                    "below_1": [f"{_label(r)}: {r['ratio_vs_liger']:.3f}" for r in rated if r["ratio_vs_liger"] < 1.0],
                    "min_frac_of_dense": min(dense, default=None),
                    "geomean_frac_of_dense": _geomean(dense),
                    "max_ratio_to_hbm_bound": max(hbm, default=None)})
    return out


def report_name(parts: Sequence[str], modes: Sequence[str]) -> str:
    """moe-liger_fwd-bwd_eager-graph.json: the parts and modes of a run, in plain file-name characters."""
    return f"moe-liger_{'-'.join(p.replace('+', '-') for p in parts)}_{'-'.join(modes)}.json"


def report_rows(report: dict) -> list[dict]:
    """The report's flat rows (as written; recomputed from its results when it has none)."""
    return report["rows"] if "rows" in report else rows(report)


def tables(report: dict) -> list[Table]:
    """The rows and the summary per part and mode; Liger's absence and the cases not run as notes."""
    args, env = report.get("args") or {}, report.get("env") or {}
    notes = ([] if (report.get("liger") or {}).get("available") else
             [(report.get("liger") or {}).get("reason", "no Liger baseline")])
    if report.get("not_run"):
        notes.append(f"time limit reached: {len(report['not_run'])} cases not run")
    t = Table(f"MoE vs Liger, {args.get('dtype', '')}, on {env.get('gpu') or 'CPU (host clock)'}",
              ("model", "T", "routing", "mode", "part", "gemmlab ms", "TFLOPS", "liger ms", "TFLOPS ", "vs liger",
               "dense frac", "x HBM bound", "peak GiB g/l", "ok"), notes=notes)
    for r in report_rows(report):
        liger_mode = r.get("liger_mode") or ""
        mem = f"{num(r.get('gemmlab_peak_gib'), '.2f')}/{num(r.get('liger_peak_gib'), '.2f')}"
        t.rows.append([str(r["model"]), str(r["tokens"]), str(r["routing"]), str(r["mode"]), str(r["part"]),
                       num(r.get("gemmlab_ms"), ".4f"), num(r.get("gemmlab_tflops"), ".1f"),
                       num(r.get("liger_ms"), ".4f") + (" (eager)" if liger_mode.startswith("eager:") else ""),
                       num(r.get("liger_tflops"), ".1f"), num(r.get("ratio_vs_liger"), ".3f"),
                       num(r.get("frac_of_dense"), ".2f"), num(r.get("ratio_to_hbm_bound"), ".2f"), mem,
                       "[green]ok" if r["ok"] else f"[red]WRONG {r.get('error') or ''}"])
    summary = Table("summary per part and mode (ratio = Liger time / gemmlab time; > 1: gemmlab faster)",
                    ("part", "mode", "cases", "wrong", "geomean vs liger", "min vs liger", "below 1.0",
                     "min dense frac", "max x HBM bound"))
    for s in report.get("summary") or []:
        summary.rows.append([s["part"], s["mode"], str(s["cases"]), str(s["wrong"]),
                             num(s["geomean_ratio_vs_liger"], ".3f"), num(s["min_ratio_vs_liger"], ".3f"),
                             str(len(s["below_1"])), num(s["min_frac_of_dense"], ".2f"),
                             num(s["max_ratio_to_hbm_bound"], ".2f")])
    return [t, summary]


def long_rows(report: dict) -> list[dict]:
    """The long-format CSV: each provider's time (ms) and TFLOPS per case, the ratio to Liger and the bars;
    x = T, the case's model, routing and part in ``extra``."""
    out = []
    for r in report_rows(report):
        extra = {"model": r["model"], "routing": r["routing"], "ok": r["ok"]}
        kernel, mode = f"moe-{r['part']}", r["mode"]
        for s in SHORT.values():
            for metric, unit, key in (("time", "ms", "ms"), ("tflops", "TFLOPS", "tflops"),
                                      ("peak_memory", "GiB", "peak_gib")):
                if (v := r.get(f"{s}_{key}")) is not None:
                    out.append(long_row(kernel, s, metric, unit, "T", r["tokens"], v,
                                        mode=r.get(f"{s}_mode") or mode, **extra))
        for metric, unit in (("ratio_vs_liger", "x"), ("frac_of_dense", "fraction"), ("ratio_to_hbm_bound", "x"),
                             ("liger_ratio_to_hbm_bound", "x")):
            if r.get(metric) is not None:
                out.append(long_row(kernel, "liger" if metric.startswith("liger") else "gemmlab",
                                    metric.removeprefix("liger_"), unit, "T", r["tokens"], r[metric], mode=mode,
                                    **extra, **({"ci95": r.get("ratio_ci95")} if metric == "ratio_vs_liger" else {})))
    return out


def write(report: dict, output_dir: str) -> list:
    """OUTPUT_DIR/report_name(...) as JSON (replaced whole: a step killed mid-write keeps the last report), with
    the long-format .csv and the tables' .md beside it (``gemmlab.output``); returns the paths."""
    stem = report_name(report["args"]["parts"], report["args"]["modes"]).removesuffix(".json")
    return output.write(report, output_dir, stem, tables(report), long_rows(report))


def wrong(report: dict) -> int:
    """How many cases were wrong (an out-of-memory case counts)."""
    return sum(not r["ok"] for r in report_rows(report))


def render(report: dict, console) -> int:
    """The tables on ``console``; returns how many cases were wrong."""
    output.print_tables(tables(report), console)
    return wrong(report)
