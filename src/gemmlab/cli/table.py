"""``gemmlab table``: the MoE configuration's GEMM table; the work and the tables live in gemmlab.bench.table."""

from __future__ import annotations

from typing import Annotated

import typer

from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt, LedgerOpt, ParentOpt, RecordOpt


def table_cmd(
    model: Annotated[str | None, typer.Option(help="deepseek-v3, mixtral-8x7b or qwen3-30b-a3b: fills hidden, "
                                                   "intermediate and top-k")] = None,
    batch_size: Annotated[int, typer.Option(callback=cmd.count, help="batch")] = 4,
    seq_len: Annotated[int, typer.Option(callback=cmd.count, help="sequence length")] = 8192,
    top_k: Annotated[int | None, typer.Option(callback=cmd.count, help="experts per token [default: 4]")] = None,
    hidden_size: Annotated[int | None, typer.Option(callback=cmd.count, help="K [default: 7168]")] = None,
    intermediate_size: Annotated[int | None, typer.Option(callback=cmd.count, help="N [default: 2048]")] = None,
    dtype: Annotated[str, typer.Option(help="float16 or bfloat16")] = "float16",
    warmup: Annotated[int, typer.Option(callback=cmd.nonneg_count,
                                        help="warm-up calls per row (and at least --warmup-s seconds)")] = 10,
    repeat: Annotated[int, typer.Option(callback=cmd.count, help="timed calls per row")] = 50,
    warmup_s: Annotated[float, typer.Option(callback=cmd.nonneg_seconds, help="seconds of warm-up")] = 1.0,
    inspect: Annotated[bool, typer.Option(help="read tensor-core instructions from the SASS")] = True,
    num_experts: Annotated[int | None, typer.Option(
        callback=cmd.count, help="experts of the fused MoE row [default: the model's, else 8]")] = None,
    output_dir: Annotated[str | None, typer.Option(help="write table.json, table.csv, table.md here")] = None,
    json_out: JsonOpt = False, record_note: RecordOpt = None, ledger: LedgerOpt = None, parent: ParentOpt = None,
) -> None:
    """The seed's GEMM table: an MoE configuration's dense GEMM (M = batch*seq_len*top_k, N = intermediate,
    K = hidden) through cuBLAS, gemmlab, gemmlab with a prepacked B, and gemmlab's grouped MoE kernel."""
    from gemmlab.bench import table as bt
    from gemmlab.problems import MOE_MODELS, resolve_moe

    cmd.ledger_ready(ledger, record_note is not None or bool(ledger))
    try:
        top_k, hidden_size, intermediate_size = resolve_moe(model, top_k, hidden_size, intermediate_size)
        res = bt.moe_table(batch_size, seq_len, top_k, hidden_size, intermediate_size, dtype=cmd.dtype_of(dtype),
                           warmup=warmup, repeat=repeat, warmup_s=warmup_s, inspect=inspect, model=model,
                           num_experts=num_experts or (MOE_MODELS[model].experts if model else 8))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cmd.show(res, bt, json_out, output_dir, width=200)
    if record_note is not None:
        from gemmlab.ledger.records import from_table

        cmd.record(from_table(res), record_note, ledger, parent)
    if any(r.get("ok") is False for r in res["rows"]):
        raise typer.Exit(1)
