"""``gemmlab profile``: argument handling; the work is ``gemmlab.instruments.ncu``, the tables
``gemmlab.instruments.ncu_view``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from gemmlab import output
from gemmlab.cli import common as cmd
from gemmlab.cli.common import JsonOpt, LedgerOpt
from gemmlab.cli.ledger import open_ledger, reading


def saved_profile(ref: str, ledger: str | None) -> dict:
    """``--diff`` argument: a profile JSON file, or entry:ID (the latest profile attached to that entry)."""
    from gemmlab.instruments.ncu_view import check_format

    if ref.startswith("entry:"):
        if not ref.removeprefix("entry:").isdigit():
            raise ValueError(f"{ref}: entry:ID takes a ledger entry id, e.g. entry:12")
        found = open_ledger(ledger).attachments(int(ref.removeprefix("entry:")), "profile")
        if not found:
            raise ValueError(f"{ref}: no profile attached to that ledger entry")
        return check_format(found[-1]["data"], ref)
    try:  # bounded: a FIFO or /dev/zero is refused, a 100000-deep file is one line
        data = output.load_json(ref)
    except ValueError:  # (the message names the file)
        raise
    except OSError as e:
        raise ValueError(f"{ref}: {e.strerror or e}") from None
    return check_format(data, ref)


def profile_cmd(
    shape: Annotated[str | None, typer.Option(help="M,N,K (default: the --ledger-entry's)")] = None,
    dtype: Annotated[str | None, typer.Option(help="float16 or bfloat16 (default: the entry's, else float16)")] = None,
    layout: Annotated[str, typer.Option(help="row: B (K, N) row-major; linear: nn.Linear's B = W^T, W (N, K)")] = "row",
    config: Annotated[
        str | None,
        typer.Option(
            help="pin gemmlab's config: a JSON object of GemmConfig fields (default: the entry's, else the plan's)"
        ),
    ] = None,
    ledger_entry: Annotated[
        int | None,
        typer.Option(help="profile this ledger entry's shape, dtype and config, and attach the profile to it"),
    ] = None,
    baseline: Annotated[str, typer.Option(help="cublas (torch.mm) or none")] = "cublas",
    clock_control: Annotated[
        str,
        typer.Option(
            help="ncu --clock-control: none (the GPU's own clocks, as bench runs) or base (locked at base clock)"
        ),
    ] = "none",
    seed: Annotated[int, typer.Option(callback=cmd.seed, help="seed of the random inputs")] = 0,
    diff: Annotated[
        tuple[str, str] | None,
        typer.Option(help="A B: two saved profiles (JSON files from --output-dir, or entry:ID) side by side"),
    ] = None,
    output_dir: Annotated[
        str | None,
        typer.Option(
            callback=cmd.out_dir,
            help="keep the profile JSON (.csv, .md), the ncu reports and "
            "their CSVs here; with --diff: profile-diff.json, .csv, "
            ".md",
        ),
    ] = None,
    json_out: JsonOpt = False,
    ledger: LedgerOpt = None,
) -> None:
    """Hardware counters (Nsight Compute) of one call of gemmlab and of cuBLAS.

    One verified call each, L2 flushed, clocks recorded: tensor-pipe use, SM and DRAM throughput, L2 hit rate,
    occupancy, top warp stalls, bank
    conflicts. Exit 2 without a GPU or ncu; 1 when a profile could not be taken."""
    from gemmlab.instruments import ncu as pf
    from gemmlab.instruments import ncu_view as view

    if diff:
        try:
            a, b = (saved_profile(x, ledger) for x in diff)
        except ValueError as e:
            raise cmd.usage_error(e) from e
        cmd.show(view.diff_report(a, b, *diff), view, json_out, output_dir, width=160)
        return
    entry = None
    if ledger_entry is not None:
        cmd.ledger_ready(ledger)
        with reading(ledger) as db:  # a damaged ledger: one line, exit 2
            entry = db.get(ledger_entry)
        if entry is None:
            raise cmd.usage_error(f"--ledger-entry {ledger_entry}: no such entry in the ledger")
        if entry.op != "gemm" or not (entry.backend or "").startswith("gemmlab"):
            raise cmd.usage_error(
                f"--ledger-entry {ledger_entry}: a {entry.op} entry of backend {entry.backend}; "
                "profile takes gemmlab's GEMM entries"
            )
        if entry.config is not None and not isinstance(entry.config, dict):
            raise cmd.usage_error(
                f"--ledger-entry {ledger_entry}: its config {entry.config!r} is not GemmConfig fields"
            )
    try:
        req = pf.request(
            shape or (entry.shape if entry else None),
            dtype or (entry.dtype if entry else "float16"),
            layout,
            config if config is not None else (entry.config if entry else None),
            baseline,
            clock_control,
        )
        if entry and shape and (req["m"], req["n"], req["k"]) != tuple(map(int, entry.shape.split("x"))):
            raise ValueError(f"--shape {shape} differs from ledger entry {ledger_entry}'s {entry.shape}")
    except ValueError as e:
        raise cmd.usage_error(e) from e
    why = pf.unavailable()
    if why:
        raise cmd.usage_error(why)
    try:
        prof = pf.profile(
            req["m"],
            req["n"],
            req["k"],
            req["dtype"],
            req["layout"],
            req["config"],
            req["baseline"],
            req["clock_control"],
            output_dir,
            seed,
            ledger_entry,
        )
    except pf.ProfileError as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]gemmlab profile: {e}", highlight=False, markup=False)
        raise typer.Exit(e.code) from e
    if entry is not None:
        aid = open_ledger(ledger, write=True).attach(ledger_entry, "profile", prof, prof.get("file"))
        Console(stderr=True).print(f"attached the profile to ledger entry #{ledger_entry} (attachment {aid})")
    g = prof["backends"]["gemmlab"]
    if entry is not None and entry.path and entry.path != g["path"]:
        Console(stderr=json_out).print(
            f"[yellow]note: ledger entry #{ledger_entry} ran path {entry.path}; this profile's plan ran {g['path']}"
        )
    cmd.show(prof, view, json_out, output_dir, width=160)
