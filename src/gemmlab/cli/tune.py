"""``gemmlab tune``: argument handling and the progress bar; the search lives in gemmlab.tune.tuner, its tables in
gemmlab.tune.view."""

from __future__ import annotations

from typing import Annotated

import torch
import typer
from rich.console import Console

from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt, LedgerOpt
from gemmlab.cli.progress import Steps


def resumable(session: str, ledger: str | None) -> None:
    """--resume NAME: a session the ledger holds attempts of; else one line and exit 2."""
    from gemmlab.cli.ledger import reading

    with reading(ledger) as db:
        if not db.list(session=session, limit=1):
            raise cmd.usage_error(
                f"--resume {session}: ledger {db.path} holds no tune session of that name "
                "(start one with --session, or leave --resume out)"
            )


def configs_ready(configs_dir: str | None, target: str) -> None:
    """--write: the table that confirmed winners go into, checked before any tuning (it was written only at the
    end): its directory is a directory where it exists, and an existing table is a plain file that reads as one
    (a file gemmlab cannot read would be lost, or the run's winners); else one line and exit 2."""
    from pathlib import Path

    from gemmlab.ops import configs

    where = Path(configs_dir) if configs_dir is not None else configs.user_dir()
    path = where / f"{target}.json"
    if where.exists() and not where.is_dir():
        raise cmd.usage_error(
            f"--configs-dir {where}: exists and is not a directory (tune --write puts "
            f"{path.name} there; or give --no-write)"
        )
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise cmd.usage_error(f"{path}: not a plain file; tune --write would replace it (or give --no-write)")
        try:
            configs.read(path)
        except ValueError as e:
            raise cmd.usage_error(f"{e}; tune --write would update it: fix or move it, or give --no-write") from None


def tune_cmd(
    shapes: Annotated[list[str] | None, typer.Option(help="M,N,K (repeatable)")] = None,
    suite: Annotated[
        list[str] | None,
        typer.Option(help="shape suites (repeatable) [default: seeds and small-m with CUDA, cpu without]"),
    ] = None,
    dtype: Annotated[
        str | None, typer.Option(help="float16 or bfloat16 [default: float16; bfloat16 with --op moe]")
    ] = None,
    budget_minutes: Annotated[
        float, typer.Option(callback=cmd.budget_minutes, help="time budget for all shapes")
    ] = 5.0,
    session: Annotated[str | None, typer.Option(help="session name [default: tune-<date>-<time>]")] = None,
    resume: Annotated[str | None, typer.Option(help="resume a session: skip what the ledger holds for it")] = None,
    op: Annotated[str, typer.Option(help="gemm, or moe (the MoE layer's grouped GEMMs)")] = "gemm",
    model: Annotated[str | None, typer.Option(help="--op moe: deepseek-v3, mixtral-8x7b, qwen3-30b-a3b")] = None,
    moe: Annotated[str | None, typer.Option(help="--op moe: H,I,E,k of a model of your own")] = None,
    tokens: Annotated[
        list[int] | None, typer.Option(callback=cmd.counts, help="--op moe: T (repeatable) [default: 4096]")
    ] = None,
    moe_mode: Annotated[
        list[str] | None, typer.Option(help="--op moe: gate_up, down, grouped (repeatable) [default: all three]")
    ] = None,
    write: Annotated[bool, typer.Option(help="write confirmed winners to the user's <gpu>.json")] = True,
    configs_dir: Annotated[
        str | None,
        typer.Option(
            help="where to write <gpu>.json [default: $GEMMLAB_CONFIGS, "
            "else $GEMMLAB_HOME/configs, else ~/.gemmlab/configs: "
            "the directory plan reads]"
        ),
    ] = None,
    output_dir: Annotated[
        str | None, typer.Option(callback=cmd.out_dir, help="write tune-report.json, .csv and .md here")
    ] = None,
    json_out: JsonOpt = False,
    record_note: Annotated[str, typer.Option("--record", help="what this tuning run is about")] = "tune",
    ledger: LedgerOpt = None,
    seed: Annotated[int, typer.Option(callback=cmd.seed, help="seed of inputs and search order")] = 0,
) -> None:
    """Search kernel configs per shape; record every attempt, keep only confirmed winners.

    Each shape's config space (--op gemm), or the MoE layer's grouped GEMMs (--op moe): verify every
    candidate at the shape, time it against the incumbent and the baseline (cuBLAS; torch's grouped GEMM),
    accept only what is faster beyond noise on tensor cores; every attempt goes to the ledger; confirmed
    winners become rules in the user's <gpu>.json, which `plan` and the MoE ops read before the bundled ones."""
    import time

    from gemmlab.device import target_for
    from gemmlab.ops import configs
    from gemmlab.tune import view as tr
    from gemmlab.tune.tuner import moe_items, moe_model, tune, write_configs

    todo: list = []
    if op == "moe":
        if shapes or suite:
            raise typer.BadParameter("--shapes and --suite are for --op gemm; --op moe takes --model/--moe, --tokens")
        try:
            sizes = moe_model(model, moe)
            todo = moe_items(sizes, tokens or [4096], moe_mode or ("gate_up", "down", "grouped"))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        h, i, e, k = sizes.hidden, sizes.intermediate, sizes.experts, sizes.top_k
        t = max(tokens or [4096])  # the expert weights, and x, the routed rows' intermediates and y at the largest T
        cmd.fit(
            cmd.MOE_BYTES_PER_ELEMENT * (3 * e * i * h + t * (2 * h + k * (2 * i + h))),
            f"--op moe with H,I,E,k = {h},{i},{e},{k} at T {t}",
        )
    elif op == "gemm":
        given = [
            name
            for name, v in (("--model", model), ("--moe", moe), ("--tokens", tokens), ("--moe-mode", moe_mode))
            if v
        ]
        if given:
            raise typer.BadParameter(f"{', '.join(given)}: for --op moe only (this is --op gemm)")
        todo = cmd.shapes_of(shapes, None, "cpu") if shapes else []
        for name in suite or ([] if shapes else (["seeds", "small-m"] if torch.cuda.is_available() else ["cpu"])):
            todo += cmd.shapes_of(None, name, "cpu")
        todo = list(dict.fromkeys(todo))
    else:
        raise typer.BadParameter(f"--op {op!r}: gemm or moe")
    if op == "gemm":
        cmd.fit_shapes(todo)
    if resume is not None and session is not None and session != resume:
        raise cmd.usage_error(
            f"--session {session} --resume {resume}: --resume names the session it continues; give one of them"
        )
    if write:
        configs_ready(configs_dir, target_for(torch.device("cuda" if torch.cuda.is_available() else "cpu")).name)
    cmd.outputs_ready(output_dir, "tune-report")
    cmd.ledger_ready(ledger)  # every attempt is recorded
    if resume is not None:
        resumable(resume, ledger)
    err, total = Console(stderr=True, width=150), 60.0 * budget_minutes
    with Steps("tuning", total, err, seconds=True) as steps:
        t0, counts = time.perf_counter(), {}

        def step(ev: dict) -> None:
            counts[ev["shape"]] = ev.get("tried", counts.get(ev["shape"], 0))
            steps.at(time.perf_counter() - t0, f"{ev['shape']}: {counts[ev['shape']]} tried")

        res = tr.report(
            tune(
                todo,
                cmd.dtype_of(dtype or ("bfloat16" if op == "moe" else "float16")),
                budget_minutes=budget_minutes,
                ledger=ledger,
                session=resume or session,
                seed=seed,
                note=record_note,
                progress=step,
            )
        )
    con = cmd.show(res, tr, json_out, output_dir)
    if write and any(r["confirmed"] for r in res["results"]):
        path = write_configs(
            res["results"], target_for(torch.device("cuda" if torch.cuda.is_available() else "cpu")).name, configs_dir
        )
        con.print(f"wrote the confirmed winners to {path}")
        if path.parent.resolve() != configs.user_dir().resolve():
            con.print(f"note: plan reads {configs.user_dir()}; set GEMMLAB_CONFIGS={path.parent} to use {path}")
    if res.get("failed_workers"):
        raise typer.Exit(1)
