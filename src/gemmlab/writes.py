"""Report files written safely, and only over gemmlab's own: a leaf module (stdlib only) under ``gemmlab.output``.

    write_files(out_dir, {name: text})   each file whole or not at all, never through a symlink or a FIFO, never over
                                         a file that gemmlab did not write
    check_files(out_dir, names)          the same refusals before a command's work, writing nothing

Which files are gemmlab's: ``out_dir/.gemmlab-written.json`` (``MANIFEST``) maps each name that gemmlab wrote there
to the SHA-256 of what it wrote. An existing file may be replaced only if the manifest lists it with the hash of what
is on disk now (unchanged since gemmlab wrote it), or if the caller's ``owned(text)`` says it is gemmlab's by its
content (the ``--docs`` pages and the README's headline block carry gemmlab's markers). Everything else (a user's
file, one that gemmlab wrote and someone edited since, one written by a gemmlab without a manifest) is refused,
naming the path. Writers of one directory take turns: an exclusive ``flock`` on the directory while they check,
write and update the manifest, so two gemmlab processes never lose each other's entries.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

MANIFEST = ".gemmlab-written.json"
MANIFEST_LIMIT = 8 << 20  # bytes of a manifest read, at most
HASH_LIMIT = 1 << 30  # bytes of an existing file hashed, at most: a longer one is not taken for gemmlab's
OWNED_LIMIT = 16 << 20  # bytes of an existing file that ``owned`` sees, at most
LOCK_WAIT_S = 60.0  # how long a writer waits for another one's lock on the directory


class ReportPathError(OSError):
    """A report path that is not a plain file of ours to replace: a symlink, a FIFO, a directory, a file gemmlab
    did not write (or that changed since it did)."""


def _name_ok(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or name == MANIFEST or "\0" in name:
        raise ValueError(f"{name!r}: not a report file name (a plain name in the directory, not {MANIFEST})")


def _open_dir(out: Path) -> int:
    try:
        return os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        kind = "a symlink" if out.is_symlink() else "not a directory"
        raise ReportPathError(f"{out}: {kind}; refusing to write reports through it ({e.strerror})") from e


def _open_plain(dfd: int, out: Path, name: str) -> int | None:
    """A read descriptor of the plain file ``name`` (None where nothing is there); ReportPathError where a symlink,
    a FIFO or anything but a plain file stands there."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ReportPathError(f"{out / name}: a symlink; refusing to write the report through it") from None
        if e.errno == errno.EISDIR:
            raise ReportPathError(f"{out / name}: not a plain file; refusing to write the report through it") from None
        raise OSError(e.errno, e.strerror, str(out / name)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ReportPathError(f"{out / name}: not a plain file; refusing to write the report through it")
    return fd


def _digest(fd: int) -> str:
    """The sha256 hex of an open file, read in chunks from its start."""
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def _manifest(dfd: int, out: Path) -> dict[str, list[str]]:
    """{name: [sha256, ...]} of the directory's manifest ({} where there is none). A damaged one is refused: it is
    what says which files may be replaced."""
    fd = _open_plain(dfd, out, MANIFEST)
    if fd is None:
        return {}
    bad = f"{out / MANIFEST}: damaged (the list of files gemmlab wrote here); remove it and the reports it lists"
    try:
        raw = os.read(fd, MANIFEST_LIMIT + 1)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8")) if len(raw) <= MANIFEST_LIMIT else None
    except (ValueError, RecursionError):
        data = None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(v, list) and all(isinstance(h, str) for h in v) for v in files.values()
    ):
        raise ReportPathError(bad)
    return files


def _check(dfd: int, out: Path, name: str, listed: dict, owned: Callable[[str], bool] | None) -> None:
    fd = _open_plain(dfd, out, name)
    if fd is None:
        return
    try:  # hashed only where listed, and only up to HASH_LIMIT (what a candidate placed may be huge)
        if name in listed and os.fstat(fd).st_size <= HASH_LIMIT and _digest(fd) in listed[name]:
            return
        head = os.pread(fd, OWNED_LIMIT, 0) if owned is not None else b""
    finally:
        os.close(fd)
    if owned is not None and owned(head.decode("utf-8", "replace")):
        return
    how = (
        "remove it or choose another path"
        if listed or owned
        else f"remove it or choose another path (no {MANIFEST} here: reports of a gemmlab before it are not known)"
    )
    raise ReportPathError(
        f"{out / name}: exists and gemmlab did not write it (or it changed since); refusing to replace it: {how}"
    )


def check_files(out_dir: str | Path, names: Iterable[str], owned: Callable[[str], bool] | None = None) -> None:
    """``write_files``'s refusals for ``names`` in ``out_dir``, before a command's work; writes nothing. A missing
    directory, or a missing name, is fine. Raises ReportPathError naming the path."""
    out = Path(out_dir)
    names = list(names)
    for name in names:
        _name_ok(name)
    if not os.path.lexists(out):
        return
    dfd = _open_dir(out)
    try:
        listed = _manifest(dfd, out)
        for name in names:
            _check(dfd, out, name, listed, owned)
    finally:
        os.close(dfd)


def _lock(dfd: int, out: Path) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ReportPathError(
                    f"{out}: busy: another process has held its lock for {LOCK_WAIT_S:.0f} s; try again"
                ) from None
            time.sleep(0.05)


def _put(dfd: int, out: Path, name: str, data: bytes, shown: str | None = None) -> None:
    """``data`` into a new file of an unpredictable name (O_EXCL | O_NOFOLLOW), renamed over ``name``; a file that
    cannot be created is named as ``shown`` (the report asked for, where ``name`` is the manifest)."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o644,
            dir_fd=dfd,
        )
    except OSError as e:  # named by the file asked for, not the temporary name (/proc, a read-only mount)
        raise OSError(e.errno, e.strerror, str(out / (shown or name))) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        os.unlink(tmp, dir_fd=dfd)
        raise


def _put_manifest(dfd: int, out: Path, listed: dict, shown: str) -> None:
    doc = {"about": "the files gemmlab wrote here: name -> sha256 of what it wrote (gemmlab replaces only these)"}
    text = json.dumps({**doc, "files": listed}, indent=1, sort_keys=True) + "\n"
    _put(dfd, out, MANIFEST, text.encode(), shown)


def write_files(
    out_dir: str | Path, files: dict[str, str | bytes], owned: Callable[[str], bool] | None = None, record: bool = True
) -> list[Path]:
    """Write each ``{name: text}`` (a str as UTF-8, or bytes) into ``out_dir`` (created if missing) whole: into a
    new file of an unpredictable name (O_CREAT | O_EXCL | O_NOFOLLOW: never an existing file, symlink or FIFO), then
    renamed over ``name``, so a reader sees the old file or the new one, and a process killed mid-write leaves the
    last whole one. Raises ReportPathError, naming the path, before writing anything, if ``out_dir`` or an existing
    ``name`` is a symlink or not a plain file, or is a file that gemmlab did not write (the manifest, or
    ``owned(text)`` for files gemmlab's by their content). ``record``: list what was written in the manifest (off
    for files that are owned by their markers and live in a repository: the --docs pages, the README)."""
    out = Path(out_dir)
    for name in files:
        _name_ok(name)
    out.mkdir(parents=True, exist_ok=True)
    dfd = _open_dir(out)
    try:
        _lock(dfd, out)
        listed = _manifest(dfd, out)
        for name in files:
            _check(dfd, out, name, listed, owned)
        data = {name: text if isinstance(text, bytes) else text.encode("utf-8") for name, text in files.items()}
        sha = {name: hashlib.sha256(b).hexdigest() for name, b in data.items()}
        first = next(iter(files), "")
        if record:  # the new text is gemmlab's before it lands, the old until the rename: a kill between is no refusal
            _put_manifest(dfd, out, {**listed, **{n: [*listed.get(n, [])[-1:], sha[n]] for n in files}}, first)
        for name, b in data.items():
            _put(dfd, out, name, b)
        if record:
            _put_manifest(dfd, out, {**listed, **{n: [sha[n]] for n in files}}, first)
    finally:
        os.close(dfd)  # and the lock with it
    return [out / name for name in files]
