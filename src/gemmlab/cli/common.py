"""What the command modules share: option types, value checks, the one way to show a report (tables, --output-dir,
--json), usage errors (one line on stderr, exit 2), ledger recording. The CLI layer only: nothing below imports it."""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console

from gemmlab import output

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_of(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise typer.BadParameter(f"--dtype {name!r}: float16 or bfloat16")
    return DTYPES[name]


def shapes_of(shapes: list[str] | None, suite_name: str | None, default: str) -> list[tuple[int, int, int]]:
    from gemmlab.problems import parse_shape, suite

    try:
        return [parse_shape(s) for s in shapes] if shapes else suite(suite_name or default)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e


def ints(text: str, n: int) -> list[int]:
    values = [int(v) for v in text.split(",")]
    if len(values) != n:
        raise ValueError(f"{text!r}: {n} comma-separated whole numbers")
    return values


def checked(ok, message: str):
    """A typer callback factory: ``ok(value)`` or a usage error naming the value."""

    def callback(value):
        if value is not None and not ok(value):
            raise typer.BadParameter(f"{value} {message}")
        return value

    return callback


count = checked(lambda v: v >= 1, "is not a count: give a whole number >= 1")  # --processes, --tokens
MAX_ROUNDS = 10_000  # interleaved rounds: far past what any interval needs, short of running for ever
MAX_REPS = 1_000_000  # timed calls per candidate per round
MAX_SECONDS = 7 * 24 * 3600.0  # --warmup-s, --budget-s: a week
rounds_count = checked(
    lambda v: 1 <= v <= MAX_ROUNDS, f"is not a count of rounds: give a whole number from 1 to {MAX_ROUNDS}"
)  # --rounds
reps_count = checked(
    lambda v: 1 <= v <= MAX_REPS, f"is not a count of calls: give a whole number from 1 to {MAX_REPS}"
)  # --reps
nonneg_count = checked(lambda v: v >= 0, "is negative: give a whole number >= 0")  # --warmup calls


def counts(values: list[int] | None) -> list[int] | None:
    """A repeatable count (--tokens 16 --tokens 128): every one a whole number >= 1."""
    for v in values or []:
        count(v)
    return values


def count_list(text: str) -> str:
    """A comma-separated list of counts (--prefill-tokens 4096,16384): whole numbers >= 1."""
    for v in text.split(","):
        try:
            n = int(v.strip())
        except ValueError:
            raise typer.BadParameter(f"{text}: comma-separated whole numbers >= 1 ({v.strip()!r} is not one)") from None
        if n < 1:
            raise typer.BadParameter(f"{text}: {n} is not a count: give whole numbers >= 1")
    return text


seed = checked(lambda v: 0 <= v < 2**63, "is not a seed: give a whole number from 0 to 2**63 - 1")  # --seed
entry_count = checked(
    lambda v: 1 <= v < 2**63, "is not a count of entries: give a whole number from 1 to 2**63 - 1"
)  # ledger list --limit


def out_dir(value: str | None) -> str | None:
    """--output-dir, checked before any work: a directory (created now if missing, never through a symlink) that
    takes a file; else a usage error naming it (a file, /dev/full, /proc/x)."""
    if value is None:
        return value
    p = Path(value)
    if p.is_symlink():
        raise typer.BadParameter(f"{value}: a symlink; refusing to write reports through it")
    if p.exists() and not p.is_dir():
        raise typer.BadParameter(f"{value}: exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".gemmlab-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise typer.BadParameter(f"{value}: cannot write a file there ({e.strerror or e})") from None
    return value


def outputs_ready(output_dir: str | None, stem: str, *extra: str) -> None:
    """Before any work: the refusals of writing STEM.json, .csv, .md (and ``extra`` names) into ``output_dir`` (a
    symlink, a FIFO, a file gemmlab did not write or that changed since: ``output.check_files``), one line, exit 2.
    Writing checks again."""
    if output_dir is None:
        return
    try:
        output.check_files(output_dir, [f"{stem}.json", f"{stem}.csv", f"{stem}.md", *extra])
    except OSError as e:
        raise usage_error(e) from e


def out_file(value: str | None) -> str | None:
    """--output FILE, checked before any work: not a symlink, a directory or anything but a plain file where it
    exists (``output.write_text`` writes it whole later, and refuses the command's own inputs then)."""
    if value is not None and (os.path.lexists(value) and (os.path.islink(value) or not os.path.isfile(value))):
        kind = "a symlink" if os.path.islink(value) else "a directory" if os.path.isdir(value) else "not a plain file"
        raise typer.BadParameter(f"{value}: {kind}; refusing to write through it")
    if value is not None:
        p = Path(value)
        try:  # a file gemmlab did not write is refused now, not after the work
            output.check_files(p.parent, [p.name])
        except ValueError as e:
            raise typer.BadParameter(f"{value}: not a file name to write") from e
        except OSError as e:
            raise typer.BadParameter(str(e)) from None
    return value


# Bytes per element of A, B and C that the smallest GEMM run needs at least: the fp16/bf16 operand and its
# float64 copy for the reference (the float32 draw and the output come on top).
GEMM_BYTES_PER_ELEMENT = 2 + 8
# An MoE layer's weights and activations: only the bf16/fp16 operands themselves (its references go expert by
# expert), so the bound never refuses what fits.
MOE_BYTES_PER_ELEMENT = 2


def memory() -> tuple[int, str]:
    """(bytes, what): the CUDA device's memory, else the host's."""
    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()[1], "the GPU holds"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this host holds"


def fit(need: int, what: str) -> None:
    """A usage error "WHAT is too large: needs N GiB, the GPU holds M GiB" where ``need`` bytes cannot fit."""
    have, where = memory()
    if need > have:
        raise usage_error(
            f"{what} is too large: needs at least {need / 2**30:,.1f} GiB, {where} {have / 2**30:,.1f} GiB"
        )


def fit_shapes(shapes, what: str = "shape") -> None:
    """``fit`` for each GEMM M,N,K (A MxK, B KxN, C MxN)."""
    for m, n, k in shapes:
        fit(GEMM_BYTES_PER_ELEMENT * (m * k + k * n + m * n), f"{what} {m},{n},{k}")


seconds = checked(lambda v: math.isfinite(v) and v > 0, "is not a time limit: give a finite number > 0")
nonneg_seconds = checked(lambda v: math.isfinite(v) and v >= 0, "is not a duration: give a finite number >= 0")
budget_seconds = checked(
    lambda v: math.isfinite(v) and 0 < v <= MAX_SECONDS,
    f"is not a time budget: give seconds > 0, at most {MAX_SECONDS:.0f}",
)
budget_minutes = checked(
    lambda v: math.isfinite(v) and 0 < v <= MAX_SECONDS / 60,
    f"is not a time budget: give minutes > 0, at most {MAX_SECONDS / 60:.0f}",
)
warmup_seconds = checked(
    lambda v: math.isfinite(v) and 0 <= v <= MAX_SECONDS,
    f"is not a warm-up: give seconds >= 0, at most {MAX_SECONDS:.0f}",
)


def backends(values: list[str] | None) -> list[str] | None:
    """--backend: a FILE.py:FN or package.module:FN among the names must exist (gemmlab.cli.kernelspec)."""
    from gemmlab.cli.kernelspec import check

    for v in values or []:
        if ":" in v or v.endswith(".py"):
            check(v, "--backend")
    return values


RecordOpt = Annotated[str | None, typer.Option("--record", help="record this run in the ledger: what changed")]
LedgerOpt = Annotated[
    str | None, typer.Option("--ledger", help="ledger file [default: $GEMMLAB_LEDGER or ~/.gemmlab/ledger.db]")
]
ParentOpt = Annotated[
    int | None,
    typer.Option(
        "--parent", help="ledger entry to decide against [default: the last accepted entry of the same shape]"
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="print the report as one JSON document on stdout (the tables go to stderr)")
]
OutOpt = Annotated[
    str | None, typer.Option(callback=out_dir, help="write NAME.json, NAME.csv (long format) and NAME.md here")
]
Rounds = Annotated[int, typer.Option(callback=rounds_count, help="interleaved rounds")]
Reps = Annotated[int, typer.Option(callback=reps_count, help="timed calls per candidate per round")]
WarmupS = Annotated[float, typer.Option(callback=warmup_seconds, help="seconds of warm-up (clocks settle)")]


def usage_error(message: object) -> typer.Exit:
    """One line on stderr, unwrapped and taken literally (no rich markup), for ``raise ... from e``: exit 2."""
    print(" ".join(str(message).split()), file=sys.stderr)
    return typer.Exit(2)


def ledger_ready(ledger: str | None, when: bool = True, parent: int | None = None, recording: bool = True) -> None:
    """Before any work of a command that records: an unusable ledger, or a --parent it does not hold, is one line
    and exit 2."""
    from gemmlab.ledger import Ledger, LedgerError, check

    if parent is not None and not recording:
        raise usage_error(f"--parent {parent}: goes with --record (it is the entry a recorded run is decided against)")
    try:
        if when:
            path = check(ledger)
            if parent is not None:
                db = Ledger.open(path, read_only=True)
                try:
                    if db.get(parent) is None:
                        raise usage_error(f"--parent {parent}: no such entry in ledger {path}")
                finally:
                    db.close()
    except LedgerError as e:
        raise usage_error(e) from e


def record(entries, note: str, ledger: str | None, parent: int | None) -> None:
    """Write entries to the ledger and print each decision (stderr)."""
    from gemmlab.ledger import LedgerError
    from gemmlab.ledger.records import record as write_entries

    for e in entries:
        e.note = note
    try:
        done = write_entries(entries, ledger, parent)
    except KeyError as e:
        raise typer.BadParameter(str(e)) from e
    except LedgerError as e:
        raise usage_error(e) from e
    for e in done:
        color = "green" if e.decision == "accepted" else "yellow"
        Console(stderr=True, width=150).print(
            f"ledger #{e.id} {output.literal(e.shape)} {output.literal(e.backend)}: "
            f"[{color}]{e.decision}[/] ({output.literal(e.reason)})"
        )


def show(report: dict, mod, json_out: bool, output_dir: str | None, width: int = 150, **write_kw) -> Console:
    """The module's tables (stderr under --json), its --output-dir files, the --json document."""
    con = Console(stderr=json_out, width=width)
    output.print_tables(mod.tables(report), con)
    try:
        written = mod.write(report, output_dir, **write_kw) if output_dir else []
    except OSError as e:  # a symlink or a FIFO where a report goes (output.ReportPathError), a full disk
        raise usage_error(f"{output_dir}: {e}" if not isinstance(e, output.ReportPathError) else e) from e
    for path in written:
        con.print(f"wrote {path}")
    if json_out:
        output.emit_json(report)
    return con
