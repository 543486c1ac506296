"""``gemmlab bench moe``: arguments, the suite's sizes and the memory bound they must fit; the work and tables are
``gemmlab.bench.moe``'s (``bench.moe_liger``'s with ``--baseline liger``). ``cli.bench`` registers the command.
"""

from __future__ import annotations

from typing import Annotated

import torch
import typer
from rich.console import Console

from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt, LedgerOpt, ParentOpt, RecordOpt
from gemmlab.cli.progress import Steps

CPU_MOE = {"custom": "64,32,4,2", "tokens": [8, 32]}  # bench moe's default suite without CUDA (H,I,E,k; T)


def bench_moe_cmd(
    model: Annotated[
        list[str] | None,
        typer.Option(help="deepseek-v3, mixtral-8x7b, qwen3-30b-a3b, olmoe-1b-7b, gpt-oss-120b-like (repeatable)"),
    ] = None,
    tokens: Annotated[
        list[int] | None,
        typer.Option(callback=cmd.counts, help="T (repeatable) [default: 16 128 1024 4096 16384; 8 32 without CUDA]"),
    ] = None,
    routing: Annotated[list[str] | None, typer.Option(help="uniform or zipf (repeatable)")] = None,
    part: Annotated[
        list[str] | None,
        typer.Option(help="grouped (first GEMM) or forward (whole body); --baseline liger: fwd or fwd+bwd"),
    ] = None,
    dtype: Annotated[str, typer.Option(help="bfloat16 or float16")] = "bfloat16",
    rounds: Annotated[
        int | None, typer.Option(callback=cmd.rounds_count, help="interleaved rounds [default: 10; 3 without CUDA]")
    ] = None,
    reps: Annotated[
        int | None,
        typer.Option(callback=cmd.reps_count, help="timed calls per candidate per round [default: 5; 2 without CUDA]"),
    ] = None,
    warmup_s: Annotated[
        float | None,
        typer.Option(
            callback=cmd.warmup_seconds, help="seconds of warm-up (clocks settle) [default: 1; 0 without CUDA]"
        ),
    ] = None,
    graph: Annotated[bool, typer.Option(help="time CUDA-graph replays")] = False,
    custom: Annotated[
        str | None,
        typer.Option(help="H,I,E,k of a model of your own (model name: custom) [default without CUDA: 64,32,4,2]"),
    ] = None,
    output_dir: Annotated[
        str | None,
        typer.Option(
            callback=cmd.out_dir,
            help="write moe-bench.json, .csv and .md here (--baseline liger: moe-liger_PARTS_MODES.json, .csv, .md)",
        ),
    ] = None,
    json_out: JsonOpt = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
    baseline: Annotated[
        str,
        typer.Option(
            help="torch, or liger: the suite against Liger-Kernel's fused MoE (parts fwd, fwd+bwd; bench.moe_liger)"
        ),
    ] = "torch",
    mode: Annotated[list[str] | None, typer.Option(help="--baseline liger: eager or graph (repeatable)")] = None,
    time_limit_s: Annotated[
        float | None,
        typer.Option(callback=cmd.budget_seconds, help="--baseline liger: start no case after this many seconds"),
    ] = None,
    composite: Annotated[bool, typer.Option(help="--baseline liger: time the torch composite too (fwd)")] = True,
    min_bwd_tokens: Annotated[
        int, typer.Option(callback=cmd.nonneg_count, help="--baseline liger: fwd+bwd only at T >= this")
    ] = 0,
    liger_tune_tokens: Annotated[
        int,
        typer.Option(
            callback=cmd.count, help="--baseline liger: T of Liger's autotuning call per model (outside timing)"
        ),
    ] = 4096,
) -> None:
    """gemmlab's MoE kernels against torch._grouped_mm, verified first, interleaved.

    Also against a per-expert loop and the dense GEMM of the same size. With --baseline liger: the suite against
    Liger-Kernel (five models x T 1..16384, uniform and zipf, eager and graph, fwd and fwd+bwd) with the dense and
    HBM bars. Without CUDA the default is a small suite (a custom model H=64 I=32 E=4 k=2, T 8 and 32, 3 rounds
    of 2 calls) that the interpreter finishes in seconds; --model, --custom, --tokens and the rest are honoured.
    Exit 1 if anything is wrong."""
    from gemmlab.bench import moe as bm
    from gemmlab.problems import MoEModel

    if baseline == "liger":  # a baseline asked for that cannot run is an error, not a skip
        from gemmlab.bench import moe_liger

        if moe_liger.load_liger()[0] is None:
            why = moe_liger.load_liger()[1]["reason"].removesuffix(": the Liger baseline is skipped")
            raise cmd.usage_error(
                f"bench moe --baseline liger: {why}; install it: pip install liger-kernel "
                "(gemmlab's extra: pip install -e '.[liger]')"
            )
    if baseline != "liger":  # its report's name comes from its parts and modes
        cmd.outputs_ready(output_dir, "moe-bench")
    cmd.ledger_ready(ledger, record_note is not None or bool(ledger), parent, record_note is not None)
    err = Console(stderr=True)
    small = not torch.cuda.is_available()
    if small and not (model or custom or tokens):
        custom, tokens = CPU_MOE["custom"], CPU_MOE["tokens"]
        err.print(
            f"no CUDA: the small CPU suite (a custom model H,I,E,k = {custom}, T {' '.join(map(str, tokens))}"
            "); give --model, --custom or --tokens for others",
            highlight=False,
            soft_wrap=True,
        )
    rounds = rounds or (3 if small else 10)
    reps = reps or (2 if small else 5)
    warmup_s = (0.0 if small else 1.0) if warmup_s is None else warmup_s
    try:
        own = MoEModel(*moe_sizes(custom)) if custom else None  # H, I, E, k
        moe_fits(model, own, tokens)
        if baseline == "liger":
            if record_note is not None:
                raise ValueError("--record: not with --baseline liger (its rows are not ledger entries yet)")
            _bench_moe_liger(
                model,
                tokens,
                routing,
                part,
                mode or ["graph" if graph else "eager"],
                cmd.dtype_of(dtype),
                own,
                output_dir,
                json_out,
                err,
                composite=composite,
                min_bwd_tokens=min_bwd_tokens,
                liger_tune_tokens=liger_tune_tokens,
                time_limit_s=time_limit_s,
                rounds=rounds,
                reps=reps,
                warmup_s=warmup_s,
            )
            return
        if baseline != "torch":
            raise ValueError(f"--baseline {baseline!r}: torch or liger")
        models, tokens = model or (["custom"] if own else ["deepseek-v3"]), tokens or [16, 128, 1024, 4096, 16384]
        routing, part = routing or ["uniform"], part or ["grouped", "forward"]
        with Steps("bench moe", len(models) * len(tokens) * len(routing) * len(part), err) as steps:
            rep = bm.bench_moe(
                models,
                tokens,
                routing,
                part,
                cmd.dtype_of(dtype),
                custom=own,
                rounds=rounds,
                reps=reps,
                warmup_s=warmup_s,
                graph=graph,
                progress=steps.step,
            )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cmd.show(rep, bm, json_out, output_dir, width=170)
    if record_note is not None:
        from gemmlab.ledger.records import from_moe_bench

        cmd.record(from_moe_bench(rep), record_note, ledger, parent)
    if not all(r["ok"] for r in bm.rows(rep)):
        raise typer.Exit(1)


def moe_sizes(text: str) -> list[int]:
    """--custom H,I,E,k: four whole numbers, H, I and E >= 1, 1 <= k <= E (ValueError naming the one that is not),
    small enough to hold: the expert weights (E x 3I x H) in memory."""
    h, i, e, k = cmd.ints(text, 4)
    for name, v in (("H", h), ("I", i), ("E", e), ("k", k)):
        if v < 1:
            raise ValueError(f"--custom {text}: {name} = {v}; H, I, E and k are whole numbers >= 1")
    if k > e:
        raise ValueError(f"--custom {text}: top-k {k} is more than the {e} experts")
    cmd.fit(cmd.MOE_BYTES_PER_ELEMENT * 3 * e * i * h, f"--custom {text} (the expert weights)")
    return [h, i, e, k]


def moe_fits(names: list[str] | None, own, tokens: list[int] | None) -> None:
    """Each model (a preset by name, or ``own``) at the largest --tokens fits in memory: the expert weights, and x,
    the routed rows' intermediates and y (a usage error, "too large: needs N GiB", where not)."""
    from gemmlab.problems import MOE_MODELS

    t = max(tokens or [1])
    for m in [MOE_MODELS[n] for n in names or [] if n in MOE_MODELS] + ([own] if own else []):
        h, i, e, k = m.hidden, m.intermediate, m.experts, m.top_k
        cmd.fit(
            cmd.MOE_BYTES_PER_ELEMENT * (3 * e * i * h + t * (2 * h + k * (2 * i + h))),
            f"the MoE H,I,E,k = {h},{i},{e},{k} at T {t}",
        )


def _bench_moe_liger(model, tokens, routing, part, mode, dtype, own, output_dir, json_out, err, **kw) -> None:
    """``bench moe --baseline liger``: bench.moe_liger's suite; the files are rewritten after every case (a step
    killed by its time limit keeps what it measured)."""
    from gemmlab.bench import moe_liger as ml
    from gemmlab.bench import moe_liger_view as view

    models = model or (["custom"] if own else ml.SUITE_MODELS)
    write = (lambda r: view.write(r, output_dir)) if output_dir else None
    rep = ml.bench_suite(
        models,
        tokens or ml.SUITE_TOKENS,
        routing or ml.ROUTINGS,
        mode,
        part or ["fwd"],
        dtype,
        custom=own,
        progress=err.print,
        on_result=write,
        **kw,
    )
    cmd.show(rep, view, json_out, output_dir, width=200)
    if view.wrong(rep):
        raise typer.Exit(1)
