"""One whole model's cases for ``bench model`` (``bench.model`` runs them): its variants (torch, gemmlab, liger:
shared copies), then per phase, shape and mode one case, verified first and then timed interleaved (``run_case``).

    inference(ctx, name, layers, ...)   prefill and decode cases of one model
    training(ctx, name, layers, ...)    the training-step cases (AdamW where it fits: ``ADAMW_FRACTION``)
    Ctx                                 what every case of one run shares
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from gemmlab.bench import model_build as mb
from gemmlab.bench import model_run as run
from gemmlab.bench.model_presets import PRESETS, make_config
from gemmlab.instruments import stats
from gemmlab.instruments.compare import compare_many

ADAMW_FRACTION = 0.75  # AdamW when weights + gradients + its two states fit in this share of the GPU


@dataclass
class Variant:
    model: torch.nn.Module | None
    scope: Callable = contextlib.nullcontext
    info: dict = field(default_factory=dict)
    compiled: torch.nn.Module | None = None


@dataclass
class Ctx:
    """What every case of one run shares."""

    report: dict
    rounds: int
    reps: int
    warmup_s: float
    device: torch.device
    dtype: torch.dtype
    seed: int
    deadline: float | None
    say: Callable[[str], None]
    on_result: Callable[[dict], None] | None
    compile_backend: str = "inductor"


def short_error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _variants(model: torch.nn.Module, wanted: Sequence[str], liger_fns: dict | None) -> dict[str, Variant]:
    out = {"torch": Variant(model)}
    if "gemmlab" in wanted:
        try:
            patched, summary = mb.gemmlab_variant(model)
            counts = {
                k: (len(v) if isinstance(v, (list, tuple)) and k != "skipped" else v) for k, v in summary.items()
            }  # what it replaced (counts) and skipped (why)
            out["gemmlab"] = Variant(patched, info={"patch": counts})
        except Exception as e:
            out["gemmlab"] = Variant(None, info={"error": f"gemmlab.patch failed: {short_error(e)}"})
    if "liger" in wanted:
        try:
            patched, scope, info = mb.liger_variant(model, liger_fns)
            out["liger"] = Variant(patched, scope, info)
        except Exception as e:
            out["liger"] = Variant(None, info={"error": f"Liger's patch failed: {short_error(e)}"})
    return out


def _model_for(mode: str, v: Variant, backend: str) -> torch.nn.Module:
    """The variant's model, or its torch.compile wrapper (one per variant; recompiles per shape)."""
    if mode != "compile":
        return v.model
    if v.compiled is None:
        v.compiled = torch.compile(v.model, dynamic=False, backend=backend)
    return v.compiled


def run_case(
    ctx: Ctx,
    meta: dict,
    variants: dict[str, Variant],
    make_call: Callable,
    measure: Callable,
    allowed: dict,
    tokens: int,
    fresh: bool = False,
) -> dict:
    """One (model, phase, shape, mode): set every variant up (compile / capture: setup), verify, time
    interleaved against torch (or the first variant that runs when torch cannot), peak memory, ratios."""
    mode, cands, fns = meta["mode"], {}, {}
    result = {**meta, "tokens_per_call": tokens, "allowed": allowed, "candidates": cands, "timed": False}
    if mode == "graph" and ctx.device.type != "cuda":
        return {**result, "error": "mode graph needs CUDA (CUDA-graph capture)"}
    for name, v in variants.items():
        if v.model is None:
            cands[name] = {"unavailable": v.info.get("reason") or v.info.get("error")}
            continue
        t0, cands[name] = time.perf_counter(), {}
        try:
            fn = run.scoped(make_call(_model_for(mode, v, ctx.compile_backend), name), v.scope)
            if mode == "graph":
                before = torch.cuda.memory_allocated(ctx.device)
                fn = run.graphed(fn, fresh)
                cands[name]["captured_gib"] = (torch.cuda.memory_allocated(ctx.device) - before) / 2**30
            else:
                fn()  # mode compile: compiles here
                run.sync(ctx.device)
            fn.variant = name  # which variant a timed function is (logs, an injected clock)
            fns[name] = fn
        except Exception as e:  # a variant that cannot run in this mode is a result, not a crash
            cands[name]["error"] = short_error(e)
            free_memory(ctx.device)
        cands[name]["setup_s"] = time.perf_counter() - t0
    baseline = "torch" if "torch" in fns else next(iter(fns), None)
    if baseline is None:
        return result
    try:
        res = compare_many(
            fns,
            baseline,
            check=run.checker(measure, allowed),
            dtype="bfloat16",
            rounds=ctx.rounds,
            reps=ctx.reps,
            warmup_s=ctx.warmup_s,
            device=ctx.device,
        )
    except Exception as e:  # out of memory while timing, a replay that faults: said in the row
        for name in fns:
            cands[name]["error"] = f"while timing: {short_error(e)}"
        free_memory(ctx.device)
        return result
    result.update(timed=res.get("timed", False), baseline=baseline, timer=res.get("timer"), clocks=res.get("clocks"))
    for name, c in res["candidates"].items():
        cands[name].update(c, **run.throughput(tokens, c))
        ok = bool(c.get("check", {}).get("ok")) and c.get("check_after", False) is True
        cands[name]["ok"] = ok
        if ok and "median_ms" in c:
            with contextlib.suppress(Exception):
                cands[name].update(run.memory(fns[name], ctx.device))
        if baseline == "torch" and name != "torch":
            cands[name]["vs_torch"] = c.get("vs_baseline")
    gl, lg = cands.get("gemmlab", {}), cands.get("liger", {})
    if gl.get("ok") and lg.get("ok") and gl.get("per_round_ms") and lg.get("per_round_ms"):
        gl["vs_liger"] = stats.ratio_summary(gl["per_round_ms"], lg["per_round_ms"])
    return result


def _record(ctx: Ctx, result: dict) -> None:
    ctx.report["results"].append(result)
    if ctx.on_result:
        ctx.on_result(ctx.report)


def _cases(
    ctx: Ctx,
    model_name: str,
    layers: int,
    phase: str,
    shapes: list,
    modes: Sequence[str],
    setup: Callable,
    variants: dict[str, Variant],
) -> None:
    """Every shape x mode of one phase: ``setup(shape)`` -> (make_call, measure, allowed, tokens, fresh)."""
    for shape in shapes:
        todo = list(modes)
        if ctx.deadline is not None and time.perf_counter() > ctx.deadline:
            ctx.report["not_run"] += [{"model": model_name, "phase": phase, "shape": shape, "mode": m} for m in todo]
            continue
        ctx.say(f"{model_name} ({layers} layers) {phase} {shape}: reference and sensitivity")
        try:
            make_call, measure, allowed, tokens, fresh = setup(shape)
        except Exception as e:
            for m in todo:
                _record(
                    ctx,
                    {
                        "model": model_name,
                        "layers": layers,
                        "phase": phase,
                        "shape": shape,
                        "mode": m,
                        "candidates": {},
                        "timed": False,
                        "error": f"reference run failed: {short_error(e)}",
                    },
                )
            free_memory(ctx.device)
            continue
        for mode in todo:
            if ctx.deadline is not None and time.perf_counter() > ctx.deadline:
                ctx.report["not_run"].append({"model": model_name, "phase": phase, "shape": shape, "mode": mode})
                continue
            ctx.say(f"{model_name} {phase} {shape} {mode}")
            meta = {"model": model_name, "layers": layers, "phase": phase, "shape": shape, "mode": mode}
            _record(ctx, run_case(ctx, meta, variants, make_call, measure, allowed, tokens, fresh))
            free_memory(ctx.device)
        del make_call, measure
        free_memory(ctx.device)


def _describe(
    name: str, model: torch.nn.Module, config, layers: int, variants: dict[str, Variant], build_s: float
) -> dict:
    n = sum(p.numel() for p in model.parameters())
    return {
        "source": PRESETS[name].source,
        "published_layers": PRESETS[name].published_layers,
        "layers": layers,
        "note": PRESETS[name].note,
        "parameters": n,
        "weights_gib": n * 2 / 2**30,
        "build_s": build_s,
        "model_type": config.model_type,
        "class": type(model).__name__,
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "experts_implementation": getattr(config, "_experts_implementation", None),
        "variants": {k: v.info for k, v in variants.items()},
    }


def inference(
    ctx: Ctx,
    name: str,
    layers: int,
    overrides: dict | None,
    wanted: Sequence[str],
    phases,
    modes,
    prefill_tokens,
    decode_batches,
    context: int,
    steps: int,
    liger_fns,
) -> None:
    t0 = time.perf_counter()
    config = make_config(PRESETS[name], layers, overrides)
    model = mb.build(config, ctx.dtype, ctx.device, ctx.seed)
    variants = _variants(model, wanted, liger_fns)
    ctx.report["models"].setdefault(name, {})["inference"] = _describe(
        name, model, config, layers, variants, time.perf_counter() - t0
    )
    kw = {n: run.cache_kwarg(v.model) for n, v in variants.items() if v.model is not None}

    def prefill(tokens: int):
        inputs = run.prefill_inputs(config.vocab_size, tokens, ctx.device, ctx.seed)
        ref = run.prefill_call(model, inputs)()
        measure = lambda out: run.logits_error(out, ref)
        allowed = run.bound(model, run.prefill_call(model, inputs), measure)
        return (lambda m, _n: run.prefill_call(m, inputs)), measure, allowed, tokens, False

    def decode(batch: int):
        state = run.decode_state(model, config, batch, context, steps, ctx.device, ctx.seed)
        shape = (batch, steps, config.vocab_size)
        ref = run.decode_call(model, state, torch.empty(shape, dtype=ctx.dtype, device=ctx.device), kw["torch"])()
        scratch = torch.empty_like(ref)
        measure = lambda out: run.logits_error(out, ref)
        allowed = run.bound(model, run.decode_call(model, state, scratch, kw["torch"]), measure)
        outs = {n: torch.empty_like(ref) for n in variants}
        return ((lambda m, n: run.decode_call(m, state, outs[n], kw[n])), measure, allowed, batch * steps, False)

    if "prefill" in phases:
        _cases(ctx, name, layers, "prefill", [int(t) for t in prefill_tokens], modes, prefill, variants)
    if "decode" in phases:
        _cases(ctx, name, layers, "decode", [int(b) for b in decode_batches], modes, decode, variants)


def _optimizer_choice(choice: str, params: int, device: torch.device) -> tuple[str, str]:
    """("adamw" | "sgd", why): "auto" is AdamW when weights, gradients, the reference gradients the check keeps
    and AdamW's two states (5x the bf16 weights) fit in ADAMW_FRACTION of the GPU, else SGD."""
    if choice != "auto":
        return choice, "asked for"
    need = 5 * params * 2
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else math.inf
    if need <= ADAMW_FRACTION * total:
        return "adamw", f"weights, gradients (and the check's copy), AdamW states: {need / 2**30:.0f} GiB fit"
    return "sgd", (
        f"AdamW's two states would not fit (weights, gradients and the check's copy, states: "
        f"{need / 2**30:.0f} GiB > "
        f"{ADAMW_FRACTION:.0%} of {total / 2**30:.0f} GiB): SGD, no optimizer state"
    )


def training(
    ctx: Ctx,
    name: str,
    layers: int,
    overrides: dict | None,
    wanted: Sequence[str],
    modes,
    train_batch: int,
    train_tokens: int,
    optimizer: str,
    liger_fns,
) -> None:
    t0 = time.perf_counter()
    config = make_config(PRESETS[name], layers, overrides)
    model = mb.build(config, ctx.dtype, ctx.device, ctx.seed).train()
    variants = _variants(model, wanted, liger_fns)
    for v in variants.values():
        if v.model is not None:
            v.model.train()
    params = list(model.parameters())
    choice, why = _optimizer_choice(optimizer, sum(p.numel() for p in params), ctx.device)
    opt = run.optimizer_for(params, choice, ctx.device)
    info = _describe(name, model, config, layers, variants, time.perf_counter() - t0)
    ctx.report["models"].setdefault(name, {})["train"] = {**info, "optimizer": choice, "optimizer_why": why}

    def train(batch_tokens: tuple[int, int]):
        batch, tokens = batch_tokens
        inputs = run.train_inputs(config.vocab_size, batch, tokens, ctx.device, ctx.seed)
        loss = run.train_call(model, opt, inputs)()
        ref = {"loss": float(loss), "grads": run.grads_of(params)}
        measure = lambda out: run.train_error(out, params, ref)
        allowed = run.bound(model, run.train_call(model, opt, inputs), measure)
        return (lambda m, _n: run.train_call(m, opt, inputs)), measure, allowed, batch * tokens, True

    _cases(ctx, name, layers, "train", [(train_batch, train_tokens)], modes, train, variants)
    opt.zero_grad(set_to_none=True)
