"""Which SQLite files are gemmlab's ledgers, and how to read one without leaving anything behind.

    APPLICATION_ID                     ``PRAGMA application_id`` of every ledger gemmlab creates or migrates
    peek(path, columns) -> str | None  why an existing file is not a gemmlab ledger (None: it is one, or it is empty)
    connect_reading(path, timeout)     a read-only connection that creates no -wal/-shm file

A file is a ledger if it carries ``APPLICATION_ID``, or, from before that was set, if its tables are a ledger's
(``entries`` with a ledger's columns, ``attachments``) and nothing else. A SQLite file with no schema at all and
no ids (what SQLite writes first when it creates a file) holds nothing to lose: it is a ledger being created.

Reading: a file in the rollback journal mode (how a ledger is left at rest: ``Ledger.close``) is opened
``mode=ro`` (shared locks, no file created); a file in WAL mode whose ``-wal`` is gone (nothing pending) is read
``immutable`` (SQLite would otherwise create ``-wal`` and ``-shm`` beside it and, read-only, never remove them,
or fail where the directory is read-only); one with a ``-wal`` is read ``mode=ro`` (its files exist already).
An immutable read takes no lock: a writer that starts meanwhile writes to a new ``-wal`` and copies it into the
file only when it closes, so only a read overlapping that copy can see a torn page (one "damaged" line, no
change to the file); gemmlab itself no longer leaves a ledger in WAL mode at rest.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from sqlite3 import DatabaseError, OperationalError
from sqlite3 import connect as _sqlite_connect  # not the module attribute: tests patch sqlite3.connect for writers

APPLICATION_ID = 0x67656D6D  # "gemm"
MAGIC = b"SQLite format 3\x00"
# Columns of a version 0 ledger's entries table (every later column was added by a migration).
V0_LATER = {"gemmlab_version"}


def header(path: Path) -> bytes:
    """The first 100 bytes of the file (fewer for a short file)."""
    with open(path, "rb") as f:
        return f.read(100)


def _uri(path: Path, query: str) -> str:
    # the file system's bytes, percent-encoded: a name that is not UTF-8 (a surrogate in Python's str) too
    return f"file:{urllib.parse.quote(os.fsencode(Path(path).resolve()))}?{query}"


def connect_reading(path: Path, timeout: float = 60.0):
    """A read-only connection to ``path`` (an existing SQLite file) that leaves no file beside it."""
    wal = header(path)[18:20] == b"\x02\x02"
    pending = Path(str(path) + "-wal").exists()
    query = "immutable=1" if wal and not pending else "mode=ro"
    return _sqlite_connect(_uri(path, query), uri=True, timeout=timeout, isolation_level=None)


def busy(e: Exception) -> bool:
    """SQLite's "database is locked" / "busy": another process holds the file locked, longer than the timeout. The
    file is sound; saying it is not a ledger, or damaged, would be wrong."""
    return isinstance(e, OperationalError) and ("locked" in str(e) or "busy" in str(e))


def peek(path: Path, columns: set[str]) -> str | None:
    """Why the existing file at ``path`` is not a gemmlab ledger (one clause, e.g. "is a SQLite file of
    another application (tables: t)"), or None: it is one, it is empty (0 bytes, or a SQLite file with no
    schema and no ids), or it is being created. Opens the file only to read, leaving nothing beside it."""
    head = header(path)
    if not head:
        return None
    if not head.startswith(MAGIC) or len(head) < 100:
        return "is not a SQLite ledger (file is not a database)"
    if int.from_bytes(head[68:72], "big") == APPLICATION_ID:
        return None
    try:
        conn = connect_reading(path, timeout=5.0)
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            names = {r[0]: r[1] for r in conn.execute("SELECT name, type FROM sqlite_master")}
            cols = {r[1] for r in conn.execute("PRAGMA table_info(entries)")} if "entries" in names else set()
        finally:
            conn.close()
    except DatabaseError as e:
        return (
            f"is busy: another process holds it locked ({e}); try again" if busy(e) else f"is not a SQLite ledger ({e})"
        )
    if app_id == APPLICATION_ID:
        return None
    if app_id:
        return f"is a SQLite file of another application (application_id {app_id:#x}), not a gemmlab ledger"
    tables = sorted(n for n, t in names.items() if t == "table" and not n.startswith("sqlite_"))
    if not names and not version:
        return None
    if (
        set(tables) <= {"entries", "attachments"}
        and "entries" in tables
        and (cols == columns or cols == columns - V0_LATER)
    ):
        return None
    if not tables:
        return f"is a SQLite file without a ledger in it (user_version {version}), not a gemmlab ledger"
    return (
        f"is a SQLite file of another application (tables: {', '.join(tables[:6])}"
        f"{', ...' if len(tables) > 6 else ''}), not a gemmlab ledger"
    )
