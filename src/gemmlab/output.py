"""One output format for every measuring command: a leaf module (stdlib and rich only) that every layer may use.

    Table(title, columns, rows, notes)   what a command prints; cells are strings (rich markup allowed: "[green]ok")
    long_row(kernel, provider, metric, unit, x_name, x_value, p50, p20, p80, mode=, **extra)
    write(report, out_dir, stem, tables, rows) -> [stem.json, stem.csv, stem.md]
    write_files(out_dir, {name: text})   each file whole or not at all, never through a symlink or a FIFO, never over
                                         a file gemmlab did not write (gemmlab.writes: its manifest)
    check_files(out_dir, names)          write_files' refusals before a command's work, writing nothing
    write_text(path, text, keep=inputs)  ``--output FILE``: write_files, refusing the command's inputs and ledgers
    read_bounded(path, limit)            a regular file's bytes, never a FIFO's or a device's, never past ``limit``
    emit_json(report)                    ``--json``: exactly one JSON document on stdout
    nesting(data, limit)                 how deep JSON data nests, counted without recursion
    load_json(path)                      JSON from a file someone else controls: bounded, UTF-8, not too deep
    plot_missing(path)                   a requested PNG without matplotlib: one line on stderr, never silent
    literal(value)                       text from elsewhere (a ledger cell, a file name) for a cell: shown as it is

The CSV is long-format, one row per (kernel, provider, mode, metric, x value) with the median and the 20th and
80th percentiles (p50, p20, p80; empty where the metric has no spread), as Liger-Kernel's benchmark CSV; every
report carries a "kind" (``KINDS``), the field ``gemmlab report`` reads to know what a JSON file holds.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gemmlab.writes import MANIFEST as MANIFEST  # re-exported: gemmlab.writes holds the safe writes
from gemmlab.writes import ReportPathError, write_files
from gemmlab.writes import check_files as check_files

KINDS = (
    "gemm-bench",
    "moe-bench",
    "moe-liger-bench",
    "stable-bench",
    "model-bench",
    "whole-model-bench",
    "moe-ep-bench",
    "fp8-bench",
    "table",
    "grade",
    "check",
    "tune",
    "device-profile",
    "device-health",
    "roofline",
    "ncu-profile",
    "profile-diff",
)
LONG_FIELDS = (
    "kind",
    "kernel",
    "provider",
    "mode",
    "metric",
    "unit",
    "x_name",
    "x_value",
    "p50",
    "p20",
    "p80",
    "gpu",
    "date",
    "git_sha",
    "extra",
)


@dataclass
class Table:
    """A printed table: the terminal (rich), report.md and the HTML page all draw this one object."""

    title: str
    columns: Sequence[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def num(v, fmt: str) -> str:
    """A number for a cell; None is "-"."""
    return "-" if v is None else format(v, fmt)


def _text(cell: object):
    """The cell as rich Text: its markup applied; a cell whose brackets are not valid markup ("[/]") taken
    literally instead of raising rich's MarkupError."""
    from rich.errors import MarkupError
    from rich.text import Text

    try:
        return Text.from_markup(str(cell))
    except MarkupError:
        return Text(str(cell))


def plain(cell: object) -> str:
    """A cell without its rich markup ("[green]ok" -> "ok"), for Markdown, CSV and HTML."""
    return _text(cell).plain


def literal(value: object) -> str:
    """Text that gemmlab did not write (a ledger cell, a path, a backend's name) for a table cell or a printed
    line: its brackets escaped (not read as rich markup) and its control characters (a terminal's escape
    sequences) written as \\xNN, so it prints as the text it is and does nothing to the terminal."""
    from rich.markup import escape

    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return escape(text)


def long_row(
    kernel: str,
    provider: str,
    metric: str,
    unit: str,
    x_name: str,
    x_value,
    p50,
    p20=None,
    p80=None,
    *,
    mode: str = "",
    **extra,
) -> dict:
    """One row of the long-format CSV (``LONG_FIELDS``; kind, gpu, date and git_sha come from the report)."""
    return {
        "kernel": kernel,
        "provider": provider,
        "mode": mode,
        "metric": metric,
        "unit": unit,
        "x_name": x_name,
        "x_value": x_value,
        "p50": p50,
        "p20": p20,
        "p80": p80,
        "extra": json.dumps({k: v for k, v in extra.items() if v is not None}, default=str) if extra else "",
    }


def print_tables(tables: Iterable[Table], console) -> None:
    """Each table on a rich console, its notes under it."""
    from rich.table import Table as RichTable

    for t in tables:
        rt = RichTable(title=_text(t.title))
        for col in t.columns:
            rt.add_column(_text(col))
        for row in t.rows:
            rt.add_row(*map(_text, row))
        console.print(rt)
        for note in t.notes:
            console.print(_text(note))


def _md_cell(cell: object) -> str:
    return plain(cell).replace("|", "\\|").replace("\n", " ")


def markdown(tables: Iterable[Table], head: str = "") -> str:
    """The tables as Markdown (markup stripped), under an optional heading paragraph."""
    parts = [head.rstrip() + "\n"] if head else []
    for t in tables:
        lines = [
            f"## {_md_cell(t.title)}",
            "",
            "| " + " | ".join(map(_md_cell, t.columns)) + " |",
            "|" + "---|" * len(t.columns),
        ]
        lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in t.rows]
        lines += [""] + [plain(n) + "\n" for n in t.notes]
        parts.append("\n".join(lines))
    return "\n".join(parts)


def csv_text(report: dict, rows: Iterable[dict]) -> str:
    """The long-format CSV, each row stamped with the report's kind, GPU, date and git SHA."""
    env = report.get("env") or {}
    stamp = {
        "kind": report.get("kind", ""),
        "gpu": env.get("gpu") or env.get("device") or "cpu",
        "date": env.get("date", ""),
        "git_sha": env.get("git_sha") or "",
    }
    f = io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=LONG_FIELDS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({**stamp, **{k: ("" if v is None else v) for k, v in r.items()}})
    return f.getvalue()


def write_csv(report: dict, rows: Iterable[dict], path: Path) -> Path:
    """``csv_text`` written to ``path`` (``write_files``: whole, never through a symlink)."""
    path = Path(path)
    return write_files(path.parent, {path.name: csv_text(report, rows)})[0]


def write_text(path: str | Path, text: str, keep: Iterable[str | Path] = ()) -> Path:
    """``--output FILE``: ``text`` written whole through ``write_files`` (a new file renamed over ``path``; never
    through a symlink, a FIFO or into a directory, never over a file gemmlab did not write). Raises ReportPathError,
    naming the path, where ``path`` is one of ``keep`` (the files the command read: its ledger, its inputs) or an
    existing SQLite database."""
    path = Path(path)
    if path.is_file() and not path.is_symlink():
        for k in keep:
            if Path(k).exists() and os.path.samefile(path, k):
                raise ReportPathError(f"{path}: is {k}, which this command reads; refusing to overwrite it")
        with open(path, "rb") as f:
            if f.read(16) == b"SQLite format 3\x00":
                raise ReportPathError(f"{path}: a SQLite database (a ledger?); refusing to overwrite it")
    return write_files(path.parent, {path.name: text})[0]


class UnreadableFile(OSError, ValueError):
    """A file that ``read_bounded`` refuses: not a regular file (a FIFO, a device, a socket, a directory), a symlink
    where none may be, or longer than the reader's cap (``too_long``). The message names the path and what it is. A
    ValueError too: bad input, as the API reports it."""

    def __init__(self, message: str, too_long: bool = False):
        super().__init__(message)
        self.too_long = too_long


def _what(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
    )
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def read_bounded(path: str | Path, limit: int, follow: bool = True, tail: bool = False) -> bytes:
    """The bytes of the regular file ``path``, for a file someone else controls (a candidate's sources, a case file,
    a child's log): never opened when it is not a regular file (checked again on the open descriptor, so a swap in
    between is caught), opened O_NONBLOCK (a FIFO swapped in cannot block the open), and never read past ``limit``
    bytes, however long it is or grows. ``follow=False``: a symlink at ``path`` is refused too (O_NOFOLLOW).
    ``tail``: the last ``limit`` bytes of a longer file instead of refusing it. Raises ``UnreadableFile`` naming the
    path and what it is; a missing file is FileNotFoundError, as ``open``'s."""
    shown = str(path) if str(path).isprintable() else ascii(str(path))  # a name can carry terminal escapes
    try:
        mode = (os.stat if follow else os.lstat)(path).st_mode
    except OSError as e:
        raise OSError(e.errno, e.strerror, shown) from None
    if not stat.S_ISREG(mode):
        raise UnreadableFile(f"{shown}: {_what(mode)}, not a regular file; refusing to read it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise UnreadableFile(f"{shown}: a symlink, not a regular file; refusing to read it") from None
        raise OSError(e.errno, e.strerror, shown) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFile(f"{shown}: {_what(st.st_mode)}, not a regular file; refusing to read it")
        if tail and st.st_size > limit:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        elif st.st_size > limit:
            raise UnreadableFile(f"{shown}: {st.st_size} bytes, over the {limit} read of it", too_long=True)
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        if n > limit and tail:
            return b"".join(chunks)[-limit:]
        if n > limit:
            raise UnreadableFile(f"{shown}: grew past the {limit} bytes read of it while read", too_long=True)
        return b"".join(chunks)
    finally:
        os.close(fd)


def nesting(data: object, limit: int) -> int:
    """How deep ``data`` nests (a scalar: 0), counted without recursion and only up to ``limit + 1``: a check that
    JSON from elsewhere is no deeper than a reader may recurse."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        item, d = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, d)
            if d > limit:
                return deepest
            todo += [(v, d + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


def load_json(path: str | Path, limit: int = 64 << 20, depth: int = 64) -> object:
    """The JSON document in the file ``path``, a file someone else controls: read with ``read_bounded`` (never a
    FIFO's or a device's bytes, never past ``limit``), UTF-8, nested at most ``depth`` deep (deeper breaks the
    parser, or whatever recurses over it later). ValueError naming the path otherwise; a missing file is
    FileNotFoundError."""
    shown = str(path) if str(path).isprintable() else ascii(str(path))
    deep = f"{shown}: JSON nested deeper than the {depth} levels read"
    raw = read_bounded(path, limit)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{shown}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    except RecursionError:  # the parser gave up: deeper still
        raise ValueError(deep) from None
    except ValueError as e:
        raise ValueError(f"{shown}: not JSON ({e})") from None
    if nesting(data, depth) > depth:
        raise ValueError(deep)
    return data


def dumps(report: dict) -> str:
    return json.dumps(report, indent=1, default=str)


def write(
    report: dict, out_dir: str | Path, stem: str, tables: Sequence[Table], rows: Iterable[dict], head: str = ""
) -> list[Path]:
    """``--output-dir``: OUT/STEM.json (the whole report), STEM.csv (long format), STEM.md (the tables)."""
    return write_files(
        out_dir,
        {f"{stem}.json": dumps(report), f"{stem}.csv": csv_text(report, rows), f"{stem}.md": markdown(tables, head)},
    )


def emit_json(report: dict) -> None:
    """``--json``: the report as one JSON document on stdout (everything else a command prints goes to stderr)."""
    sys.stdout.write(dumps(report) + "\n")
    sys.stdout.flush()


def have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot_missing(path: str | Path) -> None:
    """A requested plot that cannot be drawn says so (stderr), instead of being skipped in silence."""
    print(f"no plot {path}: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
