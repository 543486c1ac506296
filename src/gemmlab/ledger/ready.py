"""``check(path)``: prove, before any work, that the ledger at a path can record; one line (``LedgerError``)
if not."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from gemmlab.ledger.store import SCHEMA_VERSION, Ledger, LedgerError, default_path


def _writable(path: Path) -> bool:
    """Writable by this process, and not marked read-only: a file or directory without any write bit is
    read-only for root too, although root could write it."""
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def check(path: str | Path | None = None) -> Path:
    """Prove the ledger at ``path`` (default: ``default_path()``) can record: not a directory, not
    read-only (nor its directory, where SQLite keeps its journal), a SQLite ledger of a schema this gemmlab
    knows (an older one is migrated), and a write goes through (rolled back). Returns the path; raises
    ``LedgerError`` with one line."""
    p = Path(path or default_path())
    if p.is_dir():
        raise LedgerError(f"ledger {p} is a directory, not a file")
    if p.exists() and not _writable(p):
        raise LedgerError(f"ledger {p} is read-only")
    where = p.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir() or not _writable(where):
        raise LedgerError(f"ledger {p}: its directory {where} is {'read-only' if where.is_dir() else 'a file'}")
    db = Ledger(p)
    try:
        db.conn.execute("BEGIN IMMEDIATE")
        try:  # a write (the version it has), rolled back: SQLite refuses it where it cannot write
            db.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        finally:
            db.conn.execute("ROLLBACK")
    except sqlite3.Error as e:
        raise LedgerError(
            f"ledger {p} cannot be written: {e}" if "readonly" not in str(e) else f"ledger {p} is read-only ({e})"
        ) from None
    finally:
        db.close()
    return p
