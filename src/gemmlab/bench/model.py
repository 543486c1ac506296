"""``gemmlab bench model``: whole Hugging Face MoE models, unpatched against ``gemmlab.patch`` against
Liger-Kernel's patch, in tokens per second: prefill, decode with a KV cache, and a training step.

Each model is built from its published config (``model_presets``) with random weights (``model_build``), bf16,
on one GPU; the variants are shared copies of it (no weight copied): "torch" (the model as transformers runs
it: sdpa attention, grouped_mm experts), "gemmlab" (``gemmlab.patch``), "liger" (``apply_liger_kernel_to_<type>``
where liger-kernel has one; otherwise the rows say why). What each phase calls, how a mode wraps it and how
outputs are verified: ``model_run``. Per (model, phase, shape, mode) the variants are verified first against
the unpatched eager model's logits (a wrong one is reported and never timed), then timed interleaved (ABAB
rounds, L2 flushed, clocks sampled: ``compare_many``); compile and capture happen before, outside timing
(``setup_s``). Results: tokens/s at the median (and p20/p80), the per-round ratio to torch and to Liger, the
peak memory of one more call. The inference model and the training model are built one after the other
(the training one with fewer layers where its gradients and optimizer states would not fit: ``train_layers``).
One model's variants and cases (verify, then time): ``model_cases``; this module checks the arguments and runs
every model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from gemmlab.bench import model_build as mb
from gemmlab.bench import model_run as run
from gemmlab.bench.model_cases import (
    ADAMW_FRACTION,
    Ctx,
    Variant,
    free_memory,
    inference,
    run_case,
    short_error,
    training,
)
from gemmlab.bench.model_presets import PRESETS
from gemmlab.instruments import timing

__all__ = [
    "ADAMW_FRACTION",
    "CACHE",
    "DECODE_BATCHES",
    "PREFILL_TOKENS",
    "VARIANTS",
    "Ctx",
    "Variant",
    "bench_model",
    "run_case",
]

VARIANTS = ("torch", "gemmlab", "liger")
PREFILL_TOKENS, DECODE_BATCHES = (4096, 16384), (1, 8, 64)
CACHE = "transformers StaticCache of P + n positions, one per batch size, shared by the variants"


def _check_args(
    models,
    phases,
    modes,
    variants,
    prefill_tokens,
    decode_batches,
    context,
    steps,
    train_batch,
    train_tokens,
    layers,
    optimizer,
) -> None:
    for kind, values, known in (
        ("model", models, PRESETS),
        ("phase", phases, run.PHASES),
        ("mode", modes, run.MODES),
        ("variant", variants, VARIANTS),
    ):
        bad = [v for v in values if v not in known]
        if bad:
            raise ValueError(f"{kind} {bad[0]!r}: one of {', '.join(known)}")
    counts = {
        "prefill tokens": list(prefill_tokens),
        "decode batch": list(decode_batches),
        "context": [context],
        "decode steps": [steps],
        "train batch": [train_batch],
        "train tokens": [train_tokens],
    }
    if layers is not None:
        counts["layers"] = [layers]
    for what, values in counts.items():
        if any(int(v) < 1 for v in values):
            raise ValueError(f"{what} must be >= 1, got {values}")
    if optimizer not in ("auto", "adamw", "sgd"):
        raise ValueError(f"optimizer {optimizer!r}: auto, adamw or sgd")


def bench_model(
    models: Sequence[str],
    *,
    layers: int | None = None,
    phases: Sequence[str] = run.PHASES,
    modes: Sequence[str] = run.MODES,
    variants: Sequence[str] = VARIANTS,
    prefill_tokens: Sequence[int] = PREFILL_TOKENS,
    decode_batches: Sequence[int] = DECODE_BATCHES,
    context: int = 1024,
    steps: int = 16,
    train_batch: int = 4,
    train_tokens: int = 1024,
    optimizer: str = "auto",
    compile_backend: str = "inductor",
    dtype: torch.dtype = torch.bfloat16,
    rounds: int = 10,
    reps: int = 3,
    warmup_s: float = 0.5,
    seed: int = 0,
    overrides: dict | None = None,
    device: torch.device | str | None = None,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[dict], None] | None = None,
) -> dict:
    """Every model x phase x shape x mode (the module docstring). ``layers``: cut every model to this many
    decoder layers (training: at most its ``train_layers``). ``overrides``: {model: config values} (tests
    build tiny models). ``budget_s``: start no case after this many seconds (the rest: ``not_run``).
    ``on_result(report)`` after every case (the CLI rewrites its files). ``compile_backend``: mode compile's
    torch.compile backend (tests trace with "eager": Dynamo only)."""
    import transformers

    _check_args(
        models,
        phases,
        modes,
        variants,
        prefill_tokens,
        decode_batches,
        context,
        steps,
        train_batch,
        train_tokens,
        layers,
        optimizer,
    )
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dyn = torch._dynamo.config
    for limit in ("recompile_limit", "cache_size_limit"):  # one compile per variant x shape of a model
        if hasattr(dyn, limit):
            setattr(dyn, limit, max(getattr(dyn, limit), 64))
    liger_fns, liger_info = (
        mb.load_liger() if "liger" in variants else (None, {"available": False, "reason": "not asked for"})
    )
    env = timing.env_info()
    env.update(transformers=transformers.__version__, liger_kernel=liger_info.get("version"))
    args = {
        "models": list(models),
        "layers": layers,
        "phases": list(phases),
        "modes": list(modes),
        "variants": list(variants),
        "prefill_tokens": list(prefill_tokens),
        "decode_batches": list(decode_batches),
        "context": context,
        "steps": steps,
        "train_batch": train_batch,
        "train_tokens": train_tokens,
        "optimizer": optimizer,
        "compile_backend": compile_backend,
        "dtype": str(dtype).removeprefix("torch."),
        "rounds": rounds,
        "reps": reps,
        "warmup_s": warmup_s,
        "seed": seed,
        "budget_s": budget_s,
        "cache": CACHE,
        "kept_positions": run.KEPT_POSITIONS,
        "overrides": overrides,
    }
    report = {
        "kind": "whole-model-bench",
        "env": env,
        "args": args,
        "liger": liger_info,
        "models": {},
        "results": [],
        "not_run": [],
    }
    start = time.perf_counter()
    ctx = Ctx(
        report,
        rounds,
        reps,
        warmup_s,
        device,
        dtype,
        seed,
        start + budget_s if budget_s else None,
        progress or (lambda _m: None),
        on_result,
        compile_backend,
    )
    for name in models:
        preset, over = PRESETS[name], (overrides or {}).get(name)
        for part in ("inference", "train"):
            asked = [p for p in phases if (p == "train") == (part == "train")]
            if not asked:
                continue
            n = layers or (preset.train_layers if part == "train" else preset.layers)
            if part == "train":
                n = min(n, preset.train_layers)
            ctx.say(f"{name}: building {n} layers ({preset.source} config, random weights) for {part}")
            try:
                if part == "train":
                    training(ctx, name, n, over, variants, modes, train_batch, train_tokens, optimizer, liger_fns)
                else:
                    inference(
                        ctx,
                        name,
                        n,
                        over,
                        variants,
                        asked,
                        modes,
                        prefill_tokens,
                        decode_batches,
                        context,
                        steps,
                        liger_fns,
                    )
            except Exception as e:  # a model that cannot be built (out of memory): its rows say so
                report["models"].setdefault(name, {})[f"{part}_error"] = short_error(e)
                ctx.say(f"{name} {part}: {short_error(e)}")
            if "compile" in modes:  # compiled graphs of this model: not needed by the next one
                torch._dynamo.reset()
            free_memory(device)  # the part's model, variants and caches went with its frame
    report["wall_s"] = time.perf_counter() - start
    return report
