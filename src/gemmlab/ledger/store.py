"""The experiment ledger: every measured attempt, kept or dropped, in one SQLite file.

    db = Ledger.open()                      # GEMMLAB_LEDGER, else ~/.gemmlab/ledger.db
    entry_id = db.record(Entry(...))        # decides accepted / rejected against its parent, in one transaction
    db.get(entry_id), db.list(shape=...), db.history("8192x8192x16384"), db.export("csv")
    db.attach(entry_id, "profile", {...}), db.attachments(entry_id)   # instruments' findings about an entry

WAL journal while a writer has it open, one transaction per write (``BEGIN IMMEDIATE``: the parent is looked
up and the row inserted under the same write lock), a busy timeout so concurrent writers (tuner workers) wait
instead of failing. A process killed mid-transaction leaves the file as it was before that transaction. The
last writer to close puts the file back in the rollback journal mode, so that readers (``read_only``, opened
``mode=ro``) leave no ``-wal``/``-shm`` files beside it (``sqlfile``).

gemmlab writes only to its own files: a ledger carries ``PRAGMA application_id`` (``sqlfile.APPLICATION_ID``;
one from before that is known by its tables), and any other existing file (another application's SQLite
database, a text file) is refused with one line and left as it was.

The file carries its schema version (``PRAGMA user_version``, ``SCHEMA_VERSION``); opening an older file
migrates it in one transaction (``schema.MIGRATIONS``; version 0 is a file from before versions were recorded),
and a file from a newer gemmlab, a directory or a file that is not a SQLite database raise ``LedgerError``
with one line. ``check(path)`` (``gemmlab.ledger.ready``) also proves the file takes a write: the CLI calls it
before any work.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gemmlab import provenance
from gemmlab.ledger.cells import CellError, decode
from gemmlab.ledger.decide import decide
from gemmlab.ledger.schema import COLUMNS, JSON_COLUMNS, MIGRATIONS, SCHEMA, SCHEMA_VERSION, Entry, entry_of_row
from gemmlab.ledger.sqlfile import APPLICATION_ID, busy, connect_reading, peek

__all__ = ["SCHEMA_VERSION", "Entry", "Ledger", "LedgerError", "default_path"]


def default_path() -> Path:
    """``$GEMMLAB_LEDGER``, else ``$GEMMLAB_HOME/ledger.db``, else ``~/.gemmlab/ledger.db``."""
    if os.environ.get("GEMMLAB_LEDGER"):
        return Path(os.environ["GEMMLAB_LEDGER"])
    return Path(os.environ.get("GEMMLAB_HOME", Path.home() / ".gemmlab")) / "ledger.db"


class LedgerError(ValueError):
    """A ledger file that cannot be used: its one-line message names the file and the problem."""


class Ledger:
    """A ledger file. Cheap to open; open one per process (or thread)."""

    def __init__(self, path: str | Path, timeout: float = 60.0, read_only: bool = False):
        """Open (and, unless ``read_only``, create or migrate) the ledger at ``path``. ``read_only``: the read
        commands' way in; it changes no file: an older schema is read as it is, and a missing file or anything
        that is not a ledger raises ``LedgerError`` instead of being created or overwritten."""
        self.path, self.read_only = Path(path), read_only
        if self.path.is_dir():
            raise LedgerError(f"ledger {self.path} is a directory, not a file")
        if read_only and not self.path.exists():
            raise LedgerError(f"no ledger at {self.path} (nothing has been recorded there)")
        if self.path.exists():
            self._refuse_foreign()
        try:
            if read_only:
                self.conn = connect_reading(self.path, timeout)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)  # explicit transactions
        except (OSError, sqlite3.Error) as e:
            raise LedgerError(f"ledger {self.path} cannot be opened: {e}") from None
        self.conn.row_factory = sqlite3.Row
        try:
            if read_only:
                self._check_readable()
            else:
                self._open(timeout)
        except BaseException:
            self.conn.close()
            raise

    def _refuse_foreign(self) -> None:
        """An existing file that is not a gemmlab ledger (not a regular file, not SQLite, another application's
        database) is ``LedgerError``, before anything opens it to write; reading, an empty file is refused too."""
        if not stat.S_ISREG(self.path.stat().st_mode):
            raise LedgerError(f"ledger {self.path} is not a regular file")
        try:
            why = peek(self.path, set(COLUMNS))
        except OSError as e:
            raise LedgerError(f"ledger {self.path} cannot be opened: {e}") from None
        if why is None and self.read_only and self.path.stat().st_size == 0:
            why = "is empty (not a SQLite ledger)"
        if why is not None:
            raise LedgerError(
                f"ledger {self.path} {why}"
                + ("" if self.read_only else "; gemmlab writes only to its own ledgers: give another --ledger path")
            )

    def _check_readable(self) -> None:
        """A ledger this gemmlab can read, read as it is: an older schema is not migrated (its entries table
        is read; the next command that records migrates it), nothing is created."""
        try:
            version = self.schema_version()
            has_entries = self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'"
            ).fetchone()
        except sqlite3.DatabaseError as e:  # "file is not a database"; or locked by a writer past the timeout
            raise LedgerError(
                f"ledger {self.path} "
                + (
                    f"is busy: another process holds it locked ({e}); try again"
                    if busy(e)
                    else f"is not a SQLite ledger ({e})"
                )
            ) from None
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"ledger {self.path} has schema version {version}, newer than this gemmlab's "
                f"{SCHEMA_VERSION} (gemmlab {provenance.version()}): upgrade gemmlab"
            )
        if not has_entries:
            raise LedgerError(f"ledger {self.path} is a SQLite file without a ledger in it")

    def _open(self, timeout: float) -> None:
        # Several processes opening one new file at once (tuner workers) can get "database is locked" at
        # once, not after the busy timeout: SQLite skips its busy handler where waiting could deadlock
        # (switching the journal to WAL, creating the schema). Retry those for up to the timeout.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                self._schema()
                break
            except sqlite3.OperationalError as e:
                if ("locked" not in str(e) and "busy" not in str(e)) or time.monotonic() > deadline:
                    if "readonly" in str(e):
                        raise LedgerError(f"ledger {self.path} is read-only ({e})") from None
                    raise LedgerError(f"ledger {self.path} cannot be opened: {e}") from None
                time.sleep(0.05)
            except sqlite3.DatabaseError as e:  # "file is not a database"
                raise LedgerError(f"ledger {self.path} is not a SQLite ledger ({e})") from None

    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def _schema(self) -> None:
        """Create the schema in a new file, migrate an older one, refuse a newer one."""
        if self.schema_version() > SCHEMA_VERSION:
            raise LedgerError(
                f"ledger {self.path} has schema version {self.schema_version()}, newer than this "
                f"gemmlab's {SCHEMA_VERSION} (gemmlab {provenance.version()}): upgrade gemmlab"
            )
        if self.schema_version() == SCHEMA_VERSION and self._application_id() == APPLICATION_ID:
            return
        with self.transaction() as c:  # under the write lock: another process may have migrated it meanwhile
            version = self.schema_version()
            if version == SCHEMA_VERSION and self._application_id() == APPLICATION_ID:
                return
            c.execute(f"PRAGMA application_id = {APPLICATION_ID}")  # ours from now on (sqlfile.peek)
            if version == SCHEMA_VERSION:
                return
            if c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'").fetchone():
                for v in range(version + 1, SCHEMA_VERSION + 1):
                    for stmt in MIGRATIONS[v]:
                        c.execute(stmt)
            else:
                for stmt in SCHEMA:
                    c.execute(stmt)
            c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @classmethod
    def open(cls, path: str | Path | None = None, read_only: bool = False) -> Ledger:
        return cls(path or default_path(), read_only=read_only)

    def _application_id(self) -> int:
        return self.conn.execute("PRAGMA application_id").fetchone()[0]

    def close(self) -> None:
        """Close; a writer that is the last one open puts the file back in the rollback journal mode (no
        -wal/-shm at rest, so a reader creates none); while others have it open that fails, and is left to
        them."""
        if not self.read_only:
            try:
                self.conn.execute("PRAGMA busy_timeout = 0")
                self.conn.execute("PRAGMA journal_mode = DELETE")
            except sqlite3.Error:
                pass
        self.conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _provenance(self, e: Entry) -> None:
        from gemmlab.instruments.timing import env_info

        env = env_info()
        sha = env.get("git_sha")  # None outside a checkout of gemmlab
        e.created = e.created or env["date"]
        e.gemmlab_version = e.gemmlab_version or env["gemmlab"]
        e.git_sha = e.git_sha or (sha.removesuffix("-dirty") if sha else None)
        e.dirty = (sha.endswith("-dirty") if sha else None) if e.dirty is None else e.dirty
        e.gpu = e.gpu or env.get("gpu") or "cpu"
        e.driver = e.driver or env.get("driver")
        e.torch, e.triton = e.torch or env["torch"], e.triton or env["triton"]

    def record(
        self,
        e: Entry,
        parent_id: int | None = None,
        provenance: bool = True,
        same_problem: Callable[[Entry], bool] | None = None,
    ) -> int:
        """Insert ``e`` and decide it against ``parent_id`` (default: the last accepted entry of the same
        op, shape, dtype and GPU, and, with ``same_problem``, for which ``same_problem(entry)`` holds: the
        same operand layout, the same timing mode). Returns the new id; ``e`` gets its id, decision and
        reason."""
        if provenance:
            self._provenance(e)
        with self.reading(), self.transaction() as c:  # a parent with a bad cell: LedgerError, nothing written
            parent = None
            if parent_id is not None:
                parent = self.get(parent_id)
                if parent is None:
                    raise KeyError(f"no ledger entry {parent_id}")
            else:
                parent = self.last_accepted(e.op, e.shape, e.dtype, e.gpu, same_problem)
            e.parent_id = parent.id if parent else None
            e.decision, e.reason = decide(e, parent)
            values = [getattr(e, col) for col in COLUMNS if col != "id"]
            values = [
                json.dumps(v) if col in JSON_COLUMNS and v is not None else v
                for col, v in zip([c for c in COLUMNS if c != "id"], values, strict=True)
            ]
            cols = [col for col in COLUMNS if col != "id"]
            cur = c.execute(f"INSERT INTO entries ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", values)
            e.id = cur.lastrowid
        return e.id

    def attach(self, entry_id: int, kind: str, data: dict, path: str | None = None) -> int:
        """Attach ``data`` (JSON) of ``kind`` (e.g. "profile") to entry ``entry_id``; returns the attachment's
        id. KeyError if there is no such entry."""
        if self.get(entry_id) is None:
            raise KeyError(f"no ledger entry {entry_id}")
        with self.transaction() as c:
            if c.execute("SELECT 1 FROM entries WHERE id = ?", (entry_id,)).fetchone() is None:
                raise KeyError(f"no ledger entry {entry_id}")
            created = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
            cur = c.execute(
                "INSERT INTO attachments (entry_id, kind, created, path, data) VALUES (?, ?, ?, ?, ?)",
                (entry_id, kind, created, path, json.dumps(data, default=str)),
            )
        return cur.lastrowid

    def attachments(self, entry_id: int, kind: str | None = None) -> list[dict]:
        """An entry's attachments, oldest first: {"id", "entry_id", "kind", "created", "path", "data"}."""
        sql, args = "SELECT * FROM attachments WHERE entry_id = ?", [entry_id]
        if kind is not None:
            sql, args = sql + " AND kind = ?", args + [kind]
        with self.reading():
            rows = [dict(r) for r in self.conn.execute(sql + " ORDER BY id", args).fetchall()]
            for r in rows:
                if r["data"] is not None and not isinstance(r["data"], str):
                    raise CellError(
                        f"attachment {r['id']!r}: column data holds {type(r['data']).__name__}, not JSON text"
                    )
                r["data"] = None if r["data"] is None else decode(r["data"], f"attachment {r['id']!r}", "data")
        return rows

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Around a read: a damaged page (SQLite's "database disk image is malformed") or a cell of the wrong
        type is ``LedgerError`` naming the file, not a traceback or a wrong table."""
        try:
            yield
        except sqlite3.DatabaseError as e:
            raise LedgerError(
                f"ledger {self.path} "
                + (f"is busy: another process holds it locked ({e}); try again" if busy(e) else f"is damaged: {e}")
            ) from None
        except CellError as e:
            raise LedgerError(f"ledger {self.path}: {e}") from None

    def get(self, entry_id: int) -> Entry | None:
        """The entry of that id, or None (also for an id no ledger can hold: beyond SQLite's 64-bit integers)."""
        if not -(2**63) <= entry_id < 2**63:
            return None
        with self.reading():
            r = self.conn.execute("SELECT * FROM entries WHERE id = ?", (entry_id,)).fetchone()
            return entry_of_row(r) if r else None

    def last_accepted(
        self, op: str, shape: str, dtype: str, gpu: str | None, same_problem: Callable[[Entry], bool] | None = None
    ) -> Entry | None:
        sql = (
            "SELECT * FROM entries WHERE op = ? AND shape = ? AND dtype = ? AND gpu IS ? AND "
            "decision = 'accepted' ORDER BY id DESC"
        )
        if same_problem is None:
            r = self.conn.execute(sql + " LIMIT 1", (op, shape, dtype, gpu)).fetchone()
            return entry_of_row(r) if r else None
        return next(
            (e for e in map(entry_of_row, self.conn.execute(sql, (op, shape, dtype, gpu))) if same_problem(e)), None
        )

    def list(
        self,
        shape: str | None = None,
        kind: str | None = None,
        session: str | None = None,
        dtype: str | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        where, args = [], []
        for col, v in (("shape", shape), ("kind", kind), ("session", session), ("dtype", dtype)):
            if v is not None:
                where.append(f"{col} = ?")
                args.append(v)
        sql = "SELECT * FROM entries" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit {limit!r}: a whole number >= 0 (0: all)")
        if limit:  # one beyond SQLite's 64-bit integers asks for no fewer than every entry
            sql = f"SELECT * FROM ({sql} DESC LIMIT ?) ORDER BY id"
            args.append(min(limit, 2**63 - 1))
        with self.reading():
            return [entry_of_row(r) for r in self.conn.execute(sql, args).fetchall()]

    def history(self, shape: str, dtype: str | None = None, op: str = "gemm") -> list[Entry]:
        """Every entry for a shape, in order: accepted versions make the latency curve, rejected ones are
        the attempts around it."""
        return [e for e in self.list(shape=shape, dtype=dtype) if e.op == op]

    def export(self, fmt: str = "json", entries: list[Entry] | None = None) -> str:
        rows = [dataclasses.asdict(e) for e in (entries if entries is not None else self.list())]
        if fmt == "json":
            return json.dumps(rows, indent=1, default=str)
        if fmt != "csv":
            raise ValueError(f"export format {fmt!r}: json or csv")
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=[c for c in COLUMNS if c != "report"], extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in r.items()})
        return buf.getvalue()
