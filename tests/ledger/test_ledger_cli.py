"""The ledger's read commands: --json on each (one JSON document on stdout, nothing else there), `compare`
saying its speedup in the direction it reports, and damaged files (a corrupted page in the middle of a valid
SQLite ledger, cells of the wrong type) as one line and exit 2, with the file's bytes unchanged."""

import json
import re
import sqlite3

import pytest
from typer.testing import CliRunner

from gemmlab.cli import app
from gemmlab.ledger import Entry, Ledger

READS = [
    ["list"],
    ["show", "2"],
    ["compare", "1", "2"],
    ["history", "--shape", "64,64,64"],
    ["export"],
    ["export", "--format", "csv"],
]
ROUNDS = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]


def entry(median_ms: float, scale: float = 1.0, per_round: bool = True, **kw) -> Entry:
    """A correct, inspected entry at 64x64x64 whose per-round ratios to cuBLAS are ``scale`` times ROUNDS."""
    return Entry(
        kind="bench",
        shape="64x64x64",
        dtype="float16",
        correct=True,
        median_ms=median_ms,
        tensor_core_ops=4,
        ratio=scale,
        ratio_ci=[0.99 * scale, 1.01 * scale],
        gpu="test-gpu",
        per_round=[scale * r for r in ROUNDS] if per_round else None,
        config={"block_m": 64},
        **kw,
    )


def ledger(tmp_path, *entries: Entry, name: str = "l.db") -> str:
    path = tmp_path / name
    db = Ledger.open(path)
    for e in entries:
        db.record(e)
    db.close()  # the last connection: the WAL is checkpointed into the file
    return str(path)


def run(*args):
    return CliRunner().invoke(app, ["ledger", *args])


@pytest.mark.parametrize(
    "argv", [["list"], ["show", "1"], ["compare", "1", "2"], ["history", "--shape", "64,64,64"], ["export"]]
)
def test_json_is_one_document_on_stdout(tmp_path, argv):
    path = ledger(tmp_path, entry(2.0), entry(1.0, scale=2.0))
    res = run(*argv, "--ledger", path, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # the whole of stdout parses: no table, no line before or after
    entries = {
        "list": lambda d: d["entries"],
        "history": lambda d: d["entries"],
        "export": lambda d: d,
        "show": lambda d: [d],
        "compare": lambda d: [d["first"], d["second"]],
    }[argv[0]](doc)
    assert [e["median_ms"] for e in entries] == ([2.0] if argv[0] == "show" else [2.0, 1.0])


def test_json_compare_and_history_carry_their_findings(tmp_path):
    path = ledger(tmp_path, entry(2.0), entry(1.0, scale=2.0))
    doc = json.loads(run("compare", "1", "2", "--ledger", path, "--json").stdout)
    assert doc["comparable"] and doc["decision"] == "accepted" and doc["speedup"]["of"] == 2
    assert doc["speedup"]["ratio"] == pytest.approx(2.0, rel=0.02) and "faster" in doc["summary"]
    hist = json.loads(run("history", "--shape", "64,64,64", "--ledger", path, "--json").stdout)
    assert hist["accepted_ms"] == [2.0, 1.0]
    assert run("export", "--json", "--format", "csv", "--ledger", path).exit_code == 2


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "medians"])
def test_compare_says_which_is_faster(tmp_path, paired):
    """#2 takes half #1's time: "#2 is 2x faster than #1"; the other way round, "#1 is 2x slower than #2"."""
    path = ledger(tmp_path, entry(2.0, per_round=paired), entry(1.0, scale=2.0, per_round=paired))
    fwd, back = run("compare", "1", "2", "--ledger", path), run("compare", "2", "1", "--ledger", path)
    assert fwd.exit_code == 0 and back.exit_code == 0, fwd.output + back.output
    found = re.search(r"#2 is ([\d.]+)x faster than #1 \(time #1 / time #2", fwd.stdout)
    assert found and float(found.group(1)) == pytest.approx(2.0, rel=0.02), fwd.stdout
    found = re.search(r"#1 is ([\d.]+)x slower than #2 \(time #1 / time #2", back.stdout)
    assert found and float(found.group(1)) == pytest.approx(2.0, rel=0.02), back.stdout
    assert ("95% interval" in fwd.stdout) == paired and ("median times" in fwd.stdout) == (not paired)
    for out in (fwd.stdout, back.stdout):
        assert "speedup #" not in out  # the old, unlabelled ratio


def corrupt_middle_page(path: str) -> None:
    """Overwrite one page in the middle of the file (not the header page) with a fixed pattern."""
    with open(path, "r+b") as f:
        header = f.read(100)
        page = int.from_bytes(header[16:18], "big")
        page = 65536 if page == 1 else page
        pages = int.from_bytes(header[28:32], "big")
        assert pages >= 8, pages
        f.seek(page * (pages // 2))
        f.write(bytes(range(256)) * (page // 256))


def test_a_corrupted_page_is_one_line(tmp_path):
    """A valid ledger with a page in the middle overwritten: every read is either right or one line and exit 2;
    the commands that scan the entries (list, history, export) all see the damage."""
    big = {"log": "x" * 3000}  # one entry a page: the middle page holds an entry
    path = ledger(tmp_path, *(entry(1.0 + i / 100, report=dict(big, i=i)) for i in range(24)))
    corrupt_middle_page(path)
    before = open(path, "rb").read()
    outcomes = []
    argvs = (
        [["list"], ["history", "--shape", "64,64,64"], ["export"], ["export", "--format", "csv"], ["list", "--json"]]
        + [["show", str(i)] for i in range(1, 25)]
        + [["compare", "1", str(i)] for i in range(2, 25)]
    )
    for argv in argvs:
        res = run(*argv, "--ledger", path)
        outcomes.append(res.exit_code)
        assert res.exception is None or isinstance(res.exception, SystemExit), (argv, res.exception)
        assert res.exit_code in (0, 2), (argv, res.output)
        if res.exit_code == 2:
            lines = res.stderr.strip().splitlines()
            assert len(lines) == 1 and "damaged" in lines[0] and path in lines[0], (argv, res.stderr)
    assert outcomes[:5] == [2] * 5
    assert 2 in outcomes[5:29] and 2 in outcomes[29:]  # the entry on that page, shown and compared
    assert open(path, "rb").read() == before


BAD_CELLS = [
    ("median_ms", "'fast'", "median_ms holds str"),
    ("report", "'{not json'", "report is not valid JSON"),
    ("ratio_ci", "'5'", "ratio_ci holds JSON int"),
    ("per_round", "'[1, \"x\"]'", "per_round holds a list"),
    ("shape", "64", "shape holds int"),
    ("correct", "'yes'", "correct holds 'yes'"),
    ("config", "X'00ff'", "config holds bytes"),
]


@pytest.mark.parametrize("column,value,says", BAD_CELLS, ids=[c[0] for c in BAD_CELLS])
@pytest.mark.parametrize("argv", READS, ids=" ".join)
def test_a_bad_cell_is_one_line(tmp_path, column, value, says, argv):
    path = ledger(tmp_path, entry(2.0), entry(1.0, scale=2.0))
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE entries SET {column} = {value} WHERE id = 2")
    conn.close()
    before = open(path, "rb").read()
    res = run(*argv, "--ledger", path)
    if column == "shape" and argv[0] == "history":  # a shape of 64 is not 64x64x64: the entry is not selected
        assert res.exit_code == 0 and "1.0000" not in res.stdout, res.output
        return
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert says in lines[0] and "ledger entry 2" in lines[0] and path in lines[0], lines[0]
    assert open(path, "rb").read() == before and res.stdout == ""
