"""``gemmlab bench model`` (whole models) and ``gemmlab bench layer`` (one decoder layer): arguments; the work and
tables are ``gemmlab.bench.model``'s and ``gemmlab.bench.model_layer``'s. ``cli.bench`` registers the commands.
"""

from __future__ import annotations

from typing import Annotated

import torch
import typer
from rich.console import Console

from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt, Reps, Rounds, WarmupS


def _csv(text: str, kind=str) -> list:
    try:
        return [kind(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise typer.BadParameter(f"{text!r}: comma-separated values ({e})") from e


def bench_model_cmd(
    model: Annotated[
        str, typer.Option(help="qwen3-30b-a3b, olmoe-1b-7b, mixtral-8x7b, deepseek-v3-like (comma-separated)")
    ] = "qwen3-30b-a3b,olmoe-1b-7b,mixtral-8x7b,deepseek-v3-like",
    layers: Annotated[
        int | None,
        typer.Option(
            callback=cmd.count,
            help="cut every model to N decoder layers (training: at most its train_layers) [default: each preset's]",
        ),
    ] = None,
    phases: Annotated[str, typer.Option(help="prefill, decode, train (comma-separated)")] = "prefill,decode,train",
    modes: Annotated[str, typer.Option(help="eager, compile, graph (comma-separated)")] = "eager,compile,graph",
    variants: Annotated[
        str, typer.Option(help="torch, gemmlab, liger (comma-separated; torch is the baseline)")
    ] = "torch,gemmlab,liger",
    prefill_tokens: Annotated[
        str, typer.Option(callback=cmd.count_list, help="prefill T, comma-separated (batch 1)")
    ] = "4096,16384",
    decode_batch: Annotated[
        str, typer.Option(callback=cmd.count_list, help="decode batch sizes, comma-separated")
    ] = "1,8,64",
    context: Annotated[int, typer.Option(callback=cmd.count, help="decode: prompt tokens in the KV cache")] = 1024,
    decode_steps: Annotated[int, typer.Option(callback=cmd.count, help="decode: steps per timed call")] = 16,
    train_batch: Annotated[int, typer.Option(callback=cmd.count, help="train: sequences per step")] = 4,
    train_tokens: Annotated[int, typer.Option(callback=cmd.count, help="train: tokens per sequence")] = 1024,
    optimizer: Annotated[
        str, typer.Option(help="train: auto (AdamW where its states fit, else SGD), adamw, sgd; lr 0")
    ] = "auto",
    compile_backend: Annotated[str, typer.Option(help="mode compile: torch.compile backend")] = "inductor",
    rounds: Rounds = 10,
    reps: Reps = 3,
    warmup_s: WarmupS = 0.5,
    seed: Annotated[int, typer.Option(callback=cmd.seed, help="seed of the weights and inputs")] = 0,
    budget_s: Annotated[
        float | None,
        typer.Option(callback=cmd.budget_seconds, help="start no case after this many seconds (the rest: not_run)"),
    ] = None,
    output_dir: Annotated[
        str | None,
        typer.Option(
            callback=cmd.out_dir,
            help="write whole-model-bench-MODELS-PHASES-MODES.json, .csv, .md here (rewritten after every case)",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Whole Hugging Face MoE models: tokens/s, torch against gemmlab.patch and Liger.

    Published configs, random bf16 weights, no download: tokens/s of
    prefill, decode (StaticCache) and a training step, unpatched torch against gemmlab.patch against
    Liger-Kernel's patch, eager / torch.compile / CUDA graph, verified first, interleaved. Exit 1 if gemmlab is
    wrong anywhere."""
    import importlib.util

    if not torch.cuda.is_available():
        raise cmd.usage_error("bench model needs a CUDA GPU (the models are real-size; --layers cuts them)")
    if importlib.util.find_spec("transformers") is None:
        raise cmd.usage_error("bench model needs transformers: pip install transformers")
    from gemmlab.bench import model as bmod
    from gemmlab.bench import model_view as view

    err = Console(stderr=True)
    write = (lambda r: view.write(r, output_dir)) if output_dir else None
    try:
        rep = bmod.bench_model(
            _csv(model),
            layers=layers,
            phases=_csv(phases),
            modes=_csv(modes),
            variants=_csv(variants),
            prefill_tokens=_csv(prefill_tokens, int),
            decode_batches=_csv(decode_batch, int),
            context=context,
            steps=decode_steps,
            train_batch=train_batch,
            train_tokens=train_tokens,
            optimizer=optimizer,
            compile_backend=compile_backend,
            rounds=rounds,
            reps=reps,
            warmup_s=warmup_s,
            seed=seed,
            budget_s=budget_s,
            progress=err.print,
            on_result=write,
        )
    except ValueError as e:
        raise cmd.usage_error(str(e).splitlines()[0]) from e
    cmd.show(rep, view, json_out, output_dir, width=200)
    if view.failures(rep):
        raise typer.Exit(1)


def bench_layer_cmd(
    model: Annotated[
        str, typer.Option(help="mixtral, qwen3-moe, deepseek-v3 (comma-separated)")
    ] = "mixtral,qwen3-moe,deepseek-v3",
    tokens: Annotated[
        str, typer.Option(callback=cmd.count_list, help="T, comma-separated: prefill 4096, decode 1, 8, 64")
    ] = "4096,1,8,64",
    modes: Annotated[str, typer.Option(help="eager, graph, compile (comma-separated)")] = "eager,graph,compile",
    rounds: Rounds = 10,
    reps: Reps = 5,
    warmup_s: Annotated[float, typer.Option(callback=cmd.warmup_seconds, help="seconds of warm-up per case")] = 0.5,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write layer-bench-MODELS-MODES.json, .csv, .md here")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """One Hugging Face decoder layer: unpatched torch against gemmlab.patch.

    Real dims, random bf16 weights: unpatched torch against
    gemmlab.patch, eager / CUDA graph / torch.compile, verified first, interleaved. Exit 1 if gemmlab is wrong."""
    import importlib.util

    if not torch.cuda.is_available():
        raise cmd.usage_error("bench layer needs a CUDA GPU (the layers are real-size)")
    if importlib.util.find_spec("transformers") is None:
        raise cmd.usage_error("bench layer needs transformers: pip install transformers")
    from gemmlab.bench import model_layer as bmod

    try:
        rep = bmod.bench_model(
            [m.strip() for m in model.split(",")],
            [int(t) for t in tokens.split(",")],
            [m.strip() for m in modes.split(",")],
            rounds=rounds,
            reps=reps,
            warmup_s=warmup_s,
            progress=Console(stderr=True).print,
        )
    except ValueError as e:
        raise cmd.usage_error(str(e).splitlines()[0]) from e
    cmd.show(rep, bmod, json_out, output_dir, width=200)
    if bmod.failures(rep):
        raise typer.Exit(1)
