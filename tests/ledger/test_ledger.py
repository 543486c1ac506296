"""The ledger: round trip, every accept/reject reason, concurrent writers, a writer killed mid-transaction,
the CLI over it."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from gemmlab.ledger import Entry, Ledger, decide
from tests.child import no_interpreter_env

ENV = no_interpreter_env()


def good(**kw) -> Entry:
    base = dict(
        kind="bench",
        shape="64x64x64",
        dtype="float16",
        correct=True,
        median_ms=1.0,
        tensor_core_ops=4,
        per_round=[1.0, 1.01, 0.99, 1.0, 1.02, 0.98],
        ratio=1.0,
        ratio_ci=[0.99, 1.01],
        gpu="test-gpu",
        config={"block_m": 64},
        report={"x": [1, 2]},
    )
    base.update(kw)
    return Entry(**base)


def test_round_trip_and_queries(tmp_path):
    db = Ledger.open(tmp_path / "l.db")
    e = good(note="first", vs_parent=None)
    i = db.record(e)
    got = db.get(i)
    assert got.id == i and got.decision == "accepted" and got.config == {"block_m": 64} and got.report == {"x": [1, 2]}
    assert got.per_round == e.per_round and got.correct is True and got.gemmlab_version and got.created and got.torch
    assert db.get(999) is None
    db.record(good(shape="8x8x8"))
    assert [x.shape for x in db.list(shape="8x8x8")] == ["8x8x8"] and len(db.list(limit=1)) == 1
    assert json.loads(db.export("json"))[0]["note"] == "first"
    assert db.export("csv").splitlines()[0].startswith("kind,shape,dtype")
    with pytest.raises(ValueError, match="json or csv"):
        db.export("xml")
    assert sqlite3.connect(tmp_path / "l.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_every_reason():
    parent = good(id=1, median_ms=1.0)
    cases = [
        (good(correct=False, error="max err 3"), None, "rejected", "incorrect: max err 3"),
        (good(tensor_core_ops=None), None, "rejected", "not verified"),
        (good(tensor_core_ops=0), None, "rejected", "no tensor-core instruction"),
        (good(median_ms=None), None, "rejected", "not timed"),
        (good(), None, "accepted", "the baseline"),
        (good(median_ms=1.05), parent, "rejected", "did not drop"),
        (good(median_ms=0.99, per_round=[1.01, 1.0, 0.99, 1.02, 0.98, 1.0]), parent, "rejected", "within noise"),
        (good(median_ms=0.9, per_round=[1.1, 1.11]), parent, "rejected", "no paired interval"),
        (
            good(median_ms=0.9, per_round=[1.11, 1.1, 1.12, 1.1, 1.11, 1.09]),
            parent,
            "accepted",
            "each against cuBLAS interleaved in its own run",
        ),
        (
            good(median_ms=0.9, vs_parent={"ratio": 1.1, "ci95": [1.05, 1.15], "per_round": [1.1] * 6}),
            parent,
            "accepted",
            "interleaved with the parent in one run",
        ),
        (
            good(median_ms=0.9, vs_parent={"ratio": 1.02, "ci95": [0.97, 1.07], "per_round": [1.0] * 6}),
            parent,
            "rejected",
            "within noise",
        ),
        # the same-run medians decide "dropped", not the parent's old entry
        (
            good(
                median_ms=0.9,
                vs_parent={"ratio": 1.1, "ci95": [1.05, 1.15], "per_round": [1.1] * 6, "parent_median_ms": 0.85},
            ),
            parent,
            "rejected",
            "did not drop",
        ),
    ]
    for child, par, want, why in cases:
        decision, reason = decide(child, par)
        assert decision == want and why in reason, (child, decision, reason)


def test_default_parent_is_last_accepted_of_the_same_shape_and_gpu(tmp_path):
    db = Ledger.open(tmp_path / "l.db")
    a = db.record(good())
    db.record(good(shape="1x1x1"))
    db.record(good(gpu="other-gpu"))
    b = good(median_ms=1.2)
    db.record(b)
    assert b.parent_id == a and b.decision == "rejected"
    c = good(median_ms=0.8, per_round=[1.25, 1.26, 1.24, 1.25, 1.27, 1.23])
    db.record(c)
    assert c.parent_id == a and c.decision == "accepted"
    d = good(median_ms=0.9, per_round=[1.12] * 6)
    db.record(d, parent_id=a)  # explicit parent
    assert d.parent_id == a
    assert db.last_accepted("gemm", "64x64x64", "float16", "test-gpu").id == d.id
    with pytest.raises(KeyError):
        db.record(good(), parent_id=12345)


WRITER = """
import sys
from gemmlab.ledger import Entry, Ledger
db = Ledger.open(sys.argv[1])
for i in range(int(sys.argv[2])):
    db.record(Entry(kind="tune", shape=f"{sys.argv[3]}x1x1", dtype="float16", correct=True, median_ms=1.0 + i,
                    tensor_core_ops=1, gpu="g", git_sha="x", dirty=False), provenance=False)
print("done")
"""


def test_two_writers_at_once(tmp_path):
    path = tmp_path / "l.db"
    Ledger.open(path).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), "40", str(w)],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and "done" in out, err
    db = Ledger.open(path)
    rows = db.list()
    assert len(rows) == 80 and len({r.id for r in rows}) == 80
    assert {r.shape for r in rows} == {"0x1x1", "1x1x1"}
    assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_open_retries_a_lock_sqlite_reports_without_waiting(tmp_path, monkeypatch):
    """Tuner workers opening one new ledger at once: SQLite can answer the switch to WAL with "database is
    locked" at once (no busy wait, to avoid a deadlock). Opening retries until its timeout, then raises."""
    from gemmlab.ledger import store

    real = sqlite3.connect

    class Flaky:  # a connection whose WAL switch fails ``fails`` times first
        def __init__(self, conn, fails):
            self.conn, self.fails = conn, fails

        def execute(self, sql, *args):
            if sql.startswith("PRAGMA journal_mode") and self.fails > 0:
                self.fails -= 1
                raise sqlite3.OperationalError("database is locked")
            return self.conn.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.conn, name)

        def __setattr__(self, name, value):
            if name in ("conn", "fails"):
                object.__setattr__(self, name, value)
            else:
                setattr(self.conn, name, value)

    monkeypatch.setattr(store.sqlite3, "connect", lambda *a, **kw: Flaky(real(*a, **kw), 3))
    db = Ledger(tmp_path / "l.db")
    db.record(good(), provenance=False)
    assert len(db.list()) == 1 and db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    monkeypatch.setattr(store.sqlite3, "connect", lambda *a, **kw: Flaky(real(*a, **kw), 10**9))
    t0 = time.monotonic()
    with pytest.raises(store.LedgerError, match="locked"):  # one line, for the CLI's exit 2
        Ledger(tmp_path / "m.db", timeout=0.3)
    assert time.monotonic() - t0 < 5


KILLED = """
import sys, time
from gemmlab.ledger import Entry, Ledger
db = Ledger.open(sys.argv[1])
for i in range(3):
    db.record(Entry(kind="tune", shape="2x2x2", dtype="float16", correct=True, median_ms=1.0, tensor_core_ops=1,
                    gpu="g", git_sha="x", dirty=False), provenance=False)
with db.transaction() as c:
    for i in range(500):
        c.execute("INSERT INTO entries (kind, shape, dtype, correct) VALUES ('tune', 'lost', 'float16', 1)")
    print("inside", flush=True)
    time.sleep(60)
"""


def test_writer_killed_mid_transaction_loses_nothing_committed(tmp_path):
    path = tmp_path / "l.db"
    p = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "inside"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    time.sleep(0.1)
    db = Ledger.open(path)
    assert db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = db.list()
    assert len(rows) == 3 and all(r.shape == "2x2x2" for r in rows)
    db.record(good())  # and it takes new writes
    assert len(db.list()) == 4


def gemmlab(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "gemmlab", *args], capture_output=True, text=True, env=env or ENV, timeout=600
    )


def test_ledger_cli(tmp_path):
    pytest.importorskip("matplotlib", reason="`ledger history --plot` needs matplotlib: pip install -e '.[test]'")
    path = str(tmp_path / "l.db")
    db = Ledger.open(path)
    # the seed's latency curve, 36.16 -> 35.81 -> 33.59 ms, with a slower attempt rejected on the way
    a = db.record(good(shape="64x64x64", median_ms=36.16, per_round=[1.0, 1.001, 0.999, 1.0, 1.0, 1.0]))
    db.record(good(shape="64x64x64", median_ms=40.0))
    b = db.record(good(shape="64x64x64", median_ms=35.81, per_round=[1.01, 1.011, 1.009, 1.01, 1.01, 1.01]))
    db.record(good(shape="64x64x64", median_ms=33.59, per_round=[1.08, 1.079, 1.081, 1.08, 1.08, 1.08]))
    db.close()
    out = gemmlab("ledger", "list", "--ledger", path)
    assert out.returncode == 0 and "accepted" in out.stdout and "rejected" in out.stdout
    show = gemmlab("ledger", "show", str(a), "--ledger", path)
    assert json.loads(show.stdout)["median_ms"] == 36.16
    cmp = gemmlab("ledger", "compare", str(a), str(b), "--ledger", path)
    assert cmp.returncode == 0 and f"#{b} against #{a}" in cmp.stdout
    png = tmp_path / "h.png"
    hist = gemmlab("ledger", "history", "--shape", "64,64,64", "--plot", str(png), "--ledger", path)
    assert hist.returncode == 0 and "36.1600 -> 35.8100 -> 33.5900" in hist.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    csv_out = tmp_path / "l.csv"
    assert gemmlab("ledger", "export", "--format", "csv", "--output", str(csv_out), "--ledger", path).returncode == 0
    assert len(csv_out.read_text().splitlines()) == 5
    assert gemmlab("ledger", "show", "99", "--ledger", path).returncode == 2
    env = dict(ENV, GEMMLAB_LEDGER=path)  # the environment chooses the file too
    assert "33.5900" in gemmlab("ledger", "list", env=env).stdout


def test_bench_records_itself(tmp_path):
    path = str(tmp_path / "l.db")
    res = gemmlab(
        "bench",
        "gemm",
        "--shapes",
        "48,40,64",
        "--rounds",
        "4",
        "--reps",
        "1",
        "--warmup-s",
        "0",
        "--record",
        "first try",
        "--ledger",
        path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "ledger #1 48x40x64 gemmlab" in res.stderr
    e = Ledger.open(path).get(1)
    assert e.kind == "bench" and e.note == "first try" and e.correct and e.tensor_core_ops > 0
    assert e.decision == "accepted" and e.median_ms > 0 and len(e.per_round) == 4 and e.report["env"]["gemmlab"]
    assert "gemmlab bench gemm" in e.command or "gemmlab" in e.command


@pytest.mark.parametrize(
    "mode, shape, op",
    [
        ("fp8", [64, 48, 32], "gemm_fp8"),
        ("moe_fp8", [5, 256, 128, 4, 2], "moe_forward_fp8"),
        ("gemm", [64, 48, 32], "gemm"),
    ],
)
def test_an_fp8_grade_records_as_an_op_of_its_own(mode, shape, op):
    """FP8 grades never land beside the bf16 ops' (a compare or an accept across them would mix two problems), and
    gemmlab's own FP8 kernels are not reported with the bf16 kernels' SASS."""
    from gemmlab.ledger.records import from_grade

    report = {
        "mode": mode,
        "kernel": "gemmlab (default)",
        "dtype": "bfloat16",
        "verdict": "PASS",
        "failures": [],
        "performance": {"shape": shape, "median_ms": 1.0, "tflops": 1.0, "ratio": 1.0},
    }
    (entry,) = from_grade(report)
    assert entry.op == op, entry.op
    if mode != "gemm":
        assert entry.tensor_core_ops is None
