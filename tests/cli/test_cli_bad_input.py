"""Bad input that nothing bounded, and errors that came late or never: each is exit 2 and one line from the real
entry point, before any work (grading, timing, tuning, allocating).

Sizes are bounded by what memory can hold ("too large: needs at least N GiB"), seeds by 63 bits, output
directories are checked up front (a file, /dev/full, /proc/x), and options that used to be accepted in
silence (--suite with --shapes, --modes '', tune --resume of no session, --parent without --record or of no
entry, grade --record of a case file with no timed case) say so."""

import json
import sys

import pytest

from gemmlab.ledger import Entry, Ledger

# A kernel that leaves a mark when it is loaded: a grade that refused before grading leaves none.
MARKER_KERNEL = """
import pathlib
pathlib.Path({marker!r}).write_text("graded")
def gemm(a, b):
    return a @ b
"""


def cli(argv, monkeypatch, capsys):
    """``gemmlab ARGV`` in-process, through the real entry point (its one-line usage errors): (status, out, err)."""
    from gemmlab.cli.root import main

    monkeypatch.setattr(sys, "argv", ["gemmlab", *map(str, argv)])
    with pytest.raises(SystemExit) as e:
        main()
    got = capsys.readouterr()
    return e.value.code, got.out, got.err


@pytest.fixture
def env(tmp_path):
    """Paths the rows refer to: a ledger with one entry (L), a plain file (FILE), a marker kernel (KERNEL) and
    its mark (MARK), a symlink to a directory (LINKDIR), case files too deep (DEEP), too large (HUGE, HUGE64)
    and with no timed case (UNTIMED)."""
    ledger = tmp_path / "l.db"
    db = Ledger.open(ledger)
    db.record(Entry(kind="bench", shape="8x8x8", dtype="float16", correct=True, median_ms=1.0), provenance=False)
    db.close()
    (tmp_path / "file").write_text("a file, not a directory")
    kernel = tmp_path / "k.py"
    kernel.write_text(MARKER_KERNEL.format(marker=str(tmp_path / "mark")))
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    case = {
        "name": "mine",
        "dtype": "float16",
        "layout": "rowmajor",
        "inputs": "competition",
        "tolerance": {"base": 0.01, "ref_k": 512},
        "score": {"correctness": 30, "performance": 70},
        "correctness": [{"name": "a", "M": 8, "N": 8, "K": 8}],
    }
    (tmp_path / "untimed.json").write_text(json.dumps(case))
    for name, size in (("huge", 10**7), ("huge64", 2**64)):
        big = {**case, "correctness": [{"name": "big", "M": size, "N": size, "K": size}]}
        (tmp_path / f"{name}.json").write_text(json.dumps(big))
    (tmp_path / "linkdir").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    mine = tmp_path / "mine"  # files of the user's at the names of the commands' reports
    mine.mkdir()
    names = "check.json report.md gemm-bench-rows.csv tune-report.csv table.json page.html moe-bench.md"
    for name in f"{names} stable-bench.csv fp8-bench.json moe-ep-bench.json".split():
        (mine / name).write_text("mine")
    return {
        "MINE": mine,
        "MINE_PAGE": mine / "page.html",
        "L": ledger,
        "FILE": tmp_path / "file",
        "LINKDIR": tmp_path / "linkdir",
        "KERNEL": f"{kernel}:gemm",
        "MARK": tmp_path / "mark",
        "DEEP": tmp_path / "deep.json",
        "HUGE": tmp_path / "huge.json",
        "HUGE64": tmp_path / "huge64.json",
        "UNTIMED": tmp_path / "untimed.json",
    }


GRADE = ["grade", "--kernel", "KERNEL", "--signature", "rowmajor"]
ROWS = [  # (argv, words the one line must hold); capitals are the fixture's paths
    (["check", "--shapes", "100000000,100000000,100000000"], ["too large", "GiB"]),
    (["check", "--shapes", f"{2**64},{2**64},{2**64}"], ["too large", "GiB"]),
    (["bench", "gemm", "--shapes", "100000000,100000000,100000000", "--warmup-s", "0"], ["too large"]),
    (["tune", "--shapes", "100000000,100000000,100000000", "--ledger", "L"], ["too large"]),
    (["tune", "--op", "moe", "--moe", "100000000,100000000,1000,2", "--ledger", "L"], ["too large", "GiB"]),
    (["tune", "--op", "moe", "--moe", "64,32,4,2", "--tokens", str(10**15), "--ledger", "L"], ["too large"]),
    (["table", "--batch-size", str(10**14), "--seq-len", "5"], ["too large", "GiB"]),  # M = batch*seq*top_k
    (["check", "--seed", str(10**23)], ["--seed", str(10**23)]),
    (["check", "--seed", "-1"], ["--seed"]),
    (["check", "--shapes", "8,8,8", "--output-dir", "FILE"], ["--output-dir", "not a directory"]),
    (["check", "--shapes", "8,8,8", "--output-dir", "/proc/x"], ["--output-dir", "/proc/x"]),
    (["check", "--shapes", "8,8,8", "--output-dir", "/dev/full"], ["--output-dir", "/dev/full"]),
    (["check", "--shapes", "8,8,8", "--output-dir", "LINKDIR"], ["--output-dir", "symlink"]),
    (["probe", "--output", "LINKDIR"], ["--output", "symlink"]),  # refused before it probes (or needs CUDA)
    (["ledger", "export", "--ledger", "L", "--output", "LINKDIR"], ["--output", "symlink"]),
    (["ledger", "history", "--shape", "8,8,8", "--ledger", "L", "--plot", "LINKDIR"], ["--plot", "symlink"]),
    (["bench", "moe", "--custom", "0,0,0,0"], ["--custom", "H = 0"]),
    (["bench", "moe", "--custom", "-32,16,4,2"], ["--custom", "H = -32"]),
    (["bench", "moe", "--custom", "32,16,4,8"], ["--custom", "top-k 8"]),
    (["bench", "moe", "--custom", "100000000,100000000,1000,2"], ["--custom", "too large"]),
    (["bench", "moe", "--custom", "64,32,4,2", "--tokens", str(10**15)], ["too large", "GiB"]),
    (["bench", "moe", "--model", "deepseek-v3", "--tokens", str(10**12)], ["too large", "GiB"]),
    (["bench", "gemm", "--suite", "nosuch", "--shapes", "8,8,8"], ["--shapes", "--suite"]),
    (["bench", "gemm", "--modes", "", "--shapes", "8,8,8", "--warmup-s", "0"], ["timing mode ''"]),
    (["tune", "--resume", "nosuch", "--shapes", "8,8,8", "--ledger", "L"], ["--resume nosuch", "no tune session"]),
    ([*GRADE, "--cases", "DEEP"], ["nested too deep"]),
    ([*GRADE, "--cases", "HUGE"], ["too large", "GiB"]),
    ([*GRADE, "--cases", "HUGE64"], ["too large", "GiB"]),
    ([*GRADE, "--cases", "UNTIMED", "--record", "x", "--ledger", "L"], ["--record", "no timed"]),
    (
        [*GRADE, "--cases", "UNTIMED", "--parent", "999", "--record", "x", "--ledger", "L"],
        ["--parent 999", "no such entry"],
    ),
    ([*GRADE, "--cases", "UNTIMED", "--parent", "1", "--ledger", "L"], ["--parent 1", "--record"]),
    ([*GRADE, "--cases", "UNTIMED", "--output-dir", "/proc/x"], ["--output-dir", "/proc/x"]),
    (["bench", "gemm", "--shapes", "8,8,8", "--parent", "999", "--record", "x", "--ledger", "L"], ["--parent 999"]),
    # a file gemmlab did not write at a report's name: refused before the work (output.check_files)
    (["check", "--shapes", "8,8,8", "--output-dir", "MINE"], ["check.json", "gemmlab did not write it"]),
    ([*GRADE, "--cases", "UNTIMED", "--output-dir", "MINE"], ["report.md", "gemmlab did not write it"]),
    (["bench", "gemm", "--shapes", "8,8,8", "--output-dir", "MINE"], ["gemm-bench-rows.csv", "did not write it"]),
    (["tune", "--shapes", "8,8,8", "--ledger", "L", "--output-dir", "MINE"], ["tune-report.csv", "did not write"]),
    (["table", "--output-dir", "MINE"], ["table.json", "gemmlab did not write it"]),
    (["bench", "moe", "--output-dir", "MINE"], ["moe-bench.md", "gemmlab did not write it"]),
    (["bench", "stable", "--shape", "8,8,8", "--output-dir", "MINE"], ["stable-bench.csv", "did not write it"]),
    (["bench", "fp8", "--output-dir", "MINE"], ["fp8-bench.json", "gemmlab did not write it"]),
    (["bench", "moe-ep", "--output-dir", "MINE"], ["moe-ep-bench.json", "gemmlab did not write it"]),
    (["report", "L", "--output", "MINE_PAGE"], ["page.html", "gemmlab did not write it"]),
    (["ledger", "export", "--ledger", "L", "--output", "MINE_PAGE"], ["page.html", "gemmlab did not write it"]),
    # counts and durations that would run for ever: bounded
    (["bench", "gemm", "--shapes", "8,8,8", "--rounds", str(10**30)], ["--rounds", "from 1 to 10000"]),
    (["bench", "gemm", "--shapes", "8,8,8", "--reps", str(10**30)], ["--reps", "from 1 to 1000000"]),
    (["bench", "gemm", "--shapes", "8,8,8", "--warmup-s", "1e30"], ["--warmup-s", "at most 604800"]),
    (["bench", "gemm", "--shapes", "8,8,8", "--budget-s", "1e30"], ["--budget-s", "at most 604800"]),
    (["bench", "moe", "--rounds", str(10**30)], ["--rounds", "from 1 to 10000"]),
    (["bench", "stable", "--rounds", str(10**30)], ["--rounds"]),
    (["bench", "fp8", "--reps", str(10**30)], ["--reps"]),
    (["table", "--repeat", str(10**30)], ["--repeat"]),
    ([*GRADE, "--cases", "UNTIMED", "--rounds", str(10**30)], ["--rounds", "from 1 to 10000"]),
    (["tune", "--budget-minutes", "1e30", "--ledger", "L"], ["--budget-minutes", "at most 10080"]),
]


@pytest.mark.parametrize("argv,words", ROWS, ids=lambda x: " ".join(map(str, x)) if isinstance(x, list) else None)
def test_bad_input_is_one_line_before_any_work(env, monkeypatch, capsys, argv, words):
    status, out, err = cli([env.get(a, a) for a in argv], monkeypatch, capsys)
    assert status == 2, (status, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    assert not env["MARK"].exists()  # a grade refused before its kernel was loaded


def test_the_memory_bound_passes_what_fits(monkeypatch, capsys, tmp_path):
    """The bound refuses only what cannot fit: a small check still runs (and its --output-dir, created up front,
    receives the report)."""
    status, out, err = cli(
        ["check", "--shapes", "8,8,8", "--output-dir", tmp_path / "new" / "dir"], monkeypatch, capsys
    )
    assert status == 0, err
    assert (tmp_path / "new" / "dir" / "check.json").exists()


def test_a_foreign_report_is_refused_up_front_left_as_it_is_and_no_work_done(monkeypatch, capsys, tmp_path):
    """check --output-dir over a file of the user's: refused before the check runs, the file byte-identical and
    nothing written; once gemmlab wrote the report, a second run replaces it; edited since, it is refused again."""
    from gemmlab.bench import check as bc

    real = bc.run_check
    ran = []
    monkeypatch.setattr(bc, "run_check", lambda *a: ran.append(a) or real(*a))
    (tmp_path / "check.md").write_bytes(b"my notes\n")
    status, out, err = cli(["check", "--shapes", "8,8,8", "--output-dir", tmp_path], monkeypatch, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "check.md" in err and "did not write" in err, err
    assert not ran and sorted(p.name for p in tmp_path.iterdir()) == ["check.md"]
    assert (tmp_path / "check.md").read_bytes() == b"my notes\n"
    (tmp_path / "check.md").unlink()
    for _ in range(2):  # the first run into an empty directory, the second over its own files
        status, out, err = cli(["check", "--shapes", "8,8,8", "--output-dir", tmp_path], monkeypatch, capsys)
        assert status == 0, err
    assert len(ran) == 2 and {"check.json", "check.csv", "check.md"} <= {p.name for p in tmp_path.iterdir()}
    with open(tmp_path / "check.csv", "a") as f:
        f.write("edited\n")
    status, out, err = cli(["check", "--shapes", "8,8,8", "--output-dir", tmp_path], monkeypatch, capsys)
    assert status == 2 and "check.csv" in err and "changed since" in err and len(ran) == 2, err


def test_a_write_that_fails_late_is_one_line(monkeypatch, capsys, tmp_path):
    """A disk that fills after the up-front check: the writer's OSError is one line naming the directory."""
    from gemmlab import output

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output, "write_files", full)
    status, out, err = cli(["check", "--shapes", "8,8,8", "--output-dir", tmp_path], monkeypatch, capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "No space left" in err and str(tmp_path) in err, err


@pytest.mark.gpu
def test_the_memory_bound_refuses_nothing_the_shipped_work_needs():
    """On the GPU: every shipped shape suite, MoE preset (at the largest default T) and case file fits the bound
    (a bound that refused the benchmarks themselves would be a defect of its own)."""
    from gemmlab.cli import bench, common
    from gemmlab.cli import grade as grade_cli
    from gemmlab.grade import load_any
    from gemmlab.problems import CASE_SUITES, MOE_MODELS, SUITES, suite

    for name in [*SUITES, *CASE_SUITES, "all"]:
        common.fit_shapes(suite(name))
    bench.moe_fits(list(MOE_MODELS), None, [16384])
    for name in ("competition", "competition-legacy", "moe", "llm", "moe-layer", "fp8", "fp8-moe"):
        grade_cli.fits(load_any(name), recording=False)
