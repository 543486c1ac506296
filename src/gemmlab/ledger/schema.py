"""A ledger's entry and the SQLite schema that stores it (``ledger.store`` opens, migrates and writes the file).

Entry                   one measured attempt: its problem, config, timing, decision and provenance
COLUMNS, JSON_COLUMNS   the entries table's columns (the Entry's fields), those stored as JSON
SCHEMA, SCHEMA_VERSION  the statements of a new file, and its version (``PRAGMA user_version``)
MIGRATIONS[v]           the statements that take a version v-1 file to version v
entry_of_row(row)       an Entry from a row (a column a ledger does not have: ``CellError``)
"""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import dataclass, field

from gemmlab.ledger.cells import CellError, entry_fields


@dataclass
class Entry:
    """One measured attempt at one shape. ``ratio`` is cuBLAS time / this time (interleaved, same run) with
    ``ratio_ci``; ``per_round`` its per-round ratios; ``vs_parent`` a speedup over the parent measured in
    the same run when there is one (the tuner's incumbent), as {"ratio", "ci95"}."""

    kind: str  # grade | bench | table | tune
    shape: str  # "MxNxK"
    dtype: str
    op: str = "gemm"
    note: str = ""  # what changed
    command: str = ""
    backend: str = "gemmlab"
    path: str | None = None
    config: dict | None = None
    correct: bool = False
    error: str | None = None
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    tflops: float | None = None
    ratio: float | None = None
    ratio_ci: list[float] | None = None
    per_round: list[float] | None = None
    vs_parent: dict | None = None
    sm_clock_mhz: float | None = None
    tensor_core_ops: int | None = None  # None: not inspected
    session: str | None = None  # a tune run, for resuming
    parent_id: int | None = None
    report: dict = field(default_factory=dict)
    # filled by record():
    id: int | None = None
    created: str | None = None
    gemmlab_version: str | None = None
    git_sha: str | None = None  # None unless gemmlab ran from a git checkout of gemmlab
    dirty: bool | None = None
    gpu: str | None = None
    driver: str | None = None
    torch: str | None = None
    triton: str | None = None
    decision: str | None = None
    reason: str | None = None


JSON_COLUMNS = ("config", "ratio_ci", "per_round", "vs_parent", "report")


COLUMNS = [f.name for f in dataclasses.fields(Entry)]


SCHEMA_VERSION = 2


# Attachments: what an instrument measured about an entry after the fact (``gemmlab profile``'s counters),
# kept beside the entry rather than in it; ``data`` is JSON, ``path`` where the full artefact was written.
ATTACHMENTS = [
    "CREATE TABLE attachments (id INTEGER PRIMARY KEY AUTOINCREMENT, entry_id INTEGER NOT NULL REFERENCES "
    "entries (id), kind TEXT NOT NULL, created TEXT, path TEXT, data TEXT)",
    "CREATE INDEX attachments_entry ON attachments (entry_id, kind)",
]


SCHEMA = [
    f"CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, {', '.join(c for c in COLUMNS if c != 'id')})",
    "CREATE INDEX entries_shape ON entries (op, shape, dtype, gpu, decision)",
    "CREATE INDEX entries_session ON entries (session)",
    *ATTACHMENTS,
]


# MIGRATIONS[v]: the statements that take a version v-1 file to version v (tests/ledger/test_ledger_schema.py
# opens a version 0 file and checks that a migrated file has every column and table a new one has).
MIGRATIONS = {
    1: ["ALTER TABLE entries ADD COLUMN gemmlab_version"],
    2: ATTACHMENTS,
}


def entry_of_row(r: sqlite3.Row) -> Entry:
    fields = entry_fields(r)
    if unknown := set(fields) - set(COLUMNS):
        raise CellError(f"its entries table has columns a ledger does not: {', '.join(sorted(unknown))}")
    return Entry(**fields)
