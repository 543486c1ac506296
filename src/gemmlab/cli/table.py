"""``gemmlab table``: the MoE configuration's GEMM table; the work and the tables live in gemmlab.bench.table.

Without CUDA the defaults are a small table the interpreter finishes in seconds (``CPU_DEFAULTS``); every
option given is honoured as given."""

from __future__ import annotations

from typing import Annotated

import torch
import typer
from rich.console import Console

from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt, LedgerOpt, ParentOpt, RecordOpt

# option: (with CUDA, without); top-k, hidden and intermediate with CUDA are resolve_moe's (4, 7168, 2048)
DEFAULTS = {
    "batch_size": (4, 1),
    "seq_len": (8192, 16),
    "top_k": (None, 2),
    "hidden_size": (None, 64),
    "intermediate_size": (None, 48),
    "num_experts": (None, None),
    "warmup": (10, 2),
    "repeat": (50, 5),
    "warmup_s": (1.0, 0.0),
}


def table_cmd(
    model: Annotated[
        str | None,
        typer.Option(help="deepseek-v3, mixtral-8x7b or qwen3-30b-a3b: fills hidden, intermediate and top-k"),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(callback=cmd.count, help="batch [default: 4; 1 without CUDA]")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(callback=cmd.count, help="sequence length [default: 8192; 16 without CUDA]")
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(callback=cmd.count, help="experts per token [default: the model's, else 4; 2 without CUDA]"),
    ] = None,
    hidden_size: Annotated[
        int | None, typer.Option(callback=cmd.count, help="K [default: the model's, else 7168; 64 without CUDA]")
    ] = None,
    intermediate_size: Annotated[
        int | None, typer.Option(callback=cmd.count, help="N [default: the model's, else 2048; 48 without CUDA]")
    ] = None,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    warmup: Annotated[
        int | None,
        typer.Option(
            callback=cmd.nonneg_count,
            help="warm-up calls per row (and at least --warmup-s seconds) [default: 10; 2 without CUDA]",
        ),
    ] = None,
    repeat: Annotated[
        int | None, typer.Option(callback=cmd.reps_count, help="timed calls per row [default: 50; 5 without CUDA]")
    ] = None,
    warmup_s: Annotated[
        float | None, typer.Option(callback=cmd.warmup_seconds, help="seconds of warm-up [default: 1; 0 without CUDA]")
    ] = None,
    inspect: Annotated[bool, typer.Option(help="read tensor-core instructions from the SASS")] = True,
    num_experts: Annotated[
        int | None, typer.Option(callback=cmd.count, help="experts of the fused MoE row [default: the model's, else 8]")
    ] = None,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write table.json, table.csv, table.md here")
    ] = None,
    json_out: JsonOpt = False,
    record_note: RecordOpt = None,
    ledger: LedgerOpt = None,
    parent: ParentOpt = None,
) -> None:
    """One MoE configuration's GEMM four ways: cuBLAS, gemmlab, gemmlab packed, the grouped MoE kernel.

    The dense GEMM (M = batch*seq_len*top_k, N = intermediate, K = hidden) through cuBLAS, gemmlab, gemmlab with
    a prepacked B, and gemmlab's grouped MoE kernel. Without CUDA the defaults are a small table (M=32 N=48
    K=64) that the interpreter finishes in seconds; --model and every size given are honoured."""
    from gemmlab.bench import table as bt
    from gemmlab.problems import MOE_MODELS, moe_gemm_shape, resolve_moe

    cmd.outputs_ready(output_dir, "table")
    cmd.ledger_ready(ledger, record_note is not None or bool(ledger), parent, record_note is not None)
    given = {
        "batch_size": batch_size,
        "seq_len": seq_len,
        "top_k": top_k,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_experts": num_experts,
        "warmup": warmup,
        "repeat": repeat,
        "warmup_s": warmup_s,
    }
    small = not torch.cuda.is_available()
    if small and model is None and all(v is None for v in given.values()):
        Console(stderr=True).print(
            "no CUDA: the small CPU table (batch 1, seq 16, top-k 2, hidden 64, "
            "intermediate 48); give --model or sizes for others",
            highlight=False,
            soft_wrap=True,
        )
    sizes = ("top_k", "hidden_size", "intermediate_size", "num_experts")
    a = {k: v if v is not None else (None if model and k in sizes else DEFAULTS[k][small]) for k, v in given.items()}
    try:
        k, hidden, inter = resolve_moe(model, a["top_k"], a["hidden_size"], a["intermediate_size"])
        cmd.fit_shapes([moe_gemm_shape(a["batch_size"], a["seq_len"], k, hidden, inter)], "the table's GEMM")
        res = bt.moe_table(
            a["batch_size"],
            a["seq_len"],
            k,
            hidden,
            inter,
            dtype=cmd.dtype_of(dtype),
            warmup=a["warmup"],
            repeat=a["repeat"],
            warmup_s=a["warmup_s"],
            inspect=inspect,
            model=model,
            num_experts=a["num_experts"] or (MOE_MODELS[model].experts if model else 8),
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cmd.show(res, bt, json_out, output_dir, width=200)
    if record_note is not None:
        from gemmlab.ledger.records import from_table

        cmd.record(from_table(res), record_note, ledger, parent)
    if any(r.get("ok") is False for r in res["rows"]):
        raise typer.Exit(1)
