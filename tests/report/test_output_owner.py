"""A report write never touches a file that gemmlab did not write (issue 34): ``output.write_files`` replaces an
existing file only where the directory's manifest (``.gemmlab-written.json``: name -> sha256 of what gemmlab wrote)
lists it unchanged, or where the caller knows it as gemmlab's by its markers (the --docs pages, the README's headline
block); ``check_files`` gives the same refusals before a command's work; writers of one directory take turns."""

import json
import os
import threading

import pytest

from gemmlab import output
from gemmlab.report import docs
from tests.paths import REPO

RESULTS = REPO / "benchmarks" / "results"


def test_a_file_gemmlab_did_not_write_is_refused_and_left_byte_identical(tmp_path):
    (tmp_path / "check.json").write_bytes(b"mine\x00\xff")
    with pytest.raises(output.ReportPathError, match="check.json: exists and gemmlab did not write it") as e:
        output.write_files(tmp_path, {"check.csv": "a", "check.json": "{}"})
    assert output.MANIFEST in str(e.value)  # no manifest here: the line says why (a report of an older gemmlab)
    assert (tmp_path / "check.json").read_bytes() == b"mine\x00\xff"
    assert sorted(os.listdir(tmp_path)) == ["check.json"]  # nothing written: not the other name, no manifest
    with pytest.raises(output.ReportPathError, match="did not write it"):
        output.write_text(tmp_path / "check.json", "{}")  # --output FILE: the same rule
    assert (tmp_path / "check.json").read_bytes() == b"mine\x00\xff"


def test_gemmlabs_own_file_is_replaced_and_one_edited_since_is_refused(tmp_path):
    written = output.write_files(tmp_path, {"r.json": "one", "r.png": b"\x89PNG"})
    assert written == [tmp_path / "r.json", tmp_path / "r.png"]
    output.write_files(tmp_path, {"r.json": "two"})  # gemmlab's own, unchanged: replaced
    assert (tmp_path / "r.json").read_text() == "two" and (tmp_path / "r.png").read_bytes() == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == [output.MANIFEST, "r.json", "r.png"]  # no temporary file left
    (tmp_path / "r.json").write_text("two, edited by hand")
    with pytest.raises(output.ReportPathError, match="gemmlab did not write it \\(or it changed since\\)"):
        output.write_files(tmp_path, {"r.json": "three"})
    assert (tmp_path / "r.json").read_text() == "two, edited by hand"
    (tmp_path / "r.json").unlink()  # what the message says to do
    output.write_files(tmp_path, {"r.json": "three"})
    assert (tmp_path / "r.json").read_text() == "three"


def test_a_damaged_manifest_refuses_every_replacement(tmp_path):
    output.write_files(tmp_path, {"r.json": "one"})
    for bad in ("{not json", '{"files": {"r.json": "abc"}}', "[]", "{" * 100_000):
        (tmp_path / output.MANIFEST).write_text(bad)
        with pytest.raises(output.ReportPathError, match="gemmlab-written.json: damaged"):
            output.write_files(tmp_path, {"r.json": "two"})
        assert (tmp_path / "r.json").read_text() == "one"
    with pytest.raises(ValueError, match="not a report file name"):
        output.write_files(tmp_path, {output.MANIFEST: "{}"})  # the manifest is no report name
    with pytest.raises(ValueError, match="not a report file name"):
        output.write_files(tmp_path, {"../x.json": "{}"})


def test_check_files_refuses_before_the_work_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    output.check_files(out, ["a.json"])  # a directory not there yet: fine, and not created
    assert not out.exists()
    out.mkdir()
    (out / "link.json").symlink_to(tmp_path / "victim")
    os.mkfifo(out / "fifo.json")
    (out / "mine.json").write_text("mine")
    for name, words in (("link.json", "a symlink"), ("fifo.json", "not a plain file"), ("mine.json", "did not")):
        with pytest.raises(output.ReportPathError, match=words):
            output.check_files(out, ["new.json", name])
    output.check_files(out, ["new.json"])
    assert sorted(os.listdir(out)) == ["fifo.json", "link.json", "mine.json"] and not (tmp_path / "victim").exists()
    output.write_files(out, {"new.json": "x"})
    output.check_files(out, ["new.json"])  # gemmlab's own now


def test_concurrent_writers_keep_every_entry_of_the_manifest(tmp_path):
    """Threads of one process open the directory separately (flock: one lock per open), as processes would."""
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for n in range(15):
                output.write_files(tmp_path, {f"w{i}.json": f"{i} {n}", "shared.json": f"{i} {n}"})
        except BaseException as e:  # noqa: BLE001 - reported by the assert below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    listed = json.loads((tmp_path / output.MANIFEST).read_text())["files"]
    assert sorted(listed) == ["shared.json", "w0.json", "w1.json", "w2.json", "w3.json"]
    output.check_files(tmp_path, list(listed))  # every file on disk is what the manifest says gemmlab wrote
    assert sorted(os.listdir(tmp_path)) == sorted([output.MANIFEST, *listed])


def test_docs_pages_and_the_readme_block_are_gemmlabs_by_their_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{docs.HEADLINE_BEGIN}\n| old | 9.99 |\n{docs.HEADLINE_END}\nrest\n")
    pages = tmp_path / "pages"
    docs.write(RESULTS, pages, readme)  # a fresh directory: every page written
    assert "9.99" not in readme.read_text() and docs.stale(RESULTS, pages, readme) == []
    assert not (pages / output.MANIFEST).exists()  # pages of a repository: owned by their marker, not listed
    gemm = pages / "gemm.md"
    gemm.write_text(gemm.read_text().replace("|", "| ", 1))  # a generated page edited by hand: still regenerated
    docs.write(RESULTS, pages, readme)
    assert docs.stale(RESULTS, pages, readme) == []
    gemm.write_text("my own notes\n")  # a user's file at a page's name (no marker): refused, left as it is
    with pytest.raises(output.ReportPathError, match="gemm.md: exists and gemmlab did not write it"):
        docs.write(RESULTS, pages, readme)
    assert gemm.read_text() == "my own notes\n"
    gemm.unlink()
    (tmp_path / "real.md").write_text(readme.read_text())
    readme.unlink()
    readme.symlink_to(tmp_path / "real.md")  # the README through a symlink: refused before any page is written
    with pytest.raises(output.ReportPathError, match="README.md: a symlink"):
        docs.write(RESULTS, pages, readme)
    assert not gemm.exists()


def test_a_directory_locked_too_long_is_busy_not_a_hang(tmp_path, monkeypatch):
    import fcntl

    from gemmlab import writes

    monkeypatch.setattr(writes, "LOCK_WAIT_S", 0.2)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another writer (or a candidate) holding the directory
        with pytest.raises(output.ReportPathError, match="busy: another process has held its lock"):
            output.write_files(tmp_path, {"r.json": "{}"})
        assert not (tmp_path / "r.json").exists()
    finally:
        os.close(fd)
    output.write_files(tmp_path, {"r.json": "{}"})
