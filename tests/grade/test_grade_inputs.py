"""What the candidate controls of the grader's inputs and outputs (issue 29, items 3, 5, 7 and 9): secret trials that
no ``--seed`` predicts, report.md that no candidate text forges, bounded non-blocking reads of the files beside the
kernel, of case files and of logs. Known-bad kernels: tests/bad_kernels/grader_inputs.py. Every grade that could hang
runs in a subprocess with a generous time limit, so a hang fails the test instead of hanging CI."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from gemmlab import output
from gemmlab.grade import cases, grade
from tests.child import no_interpreter_env
from tests.paths import BAD_KERNELS, CASES

BAD = str(BAD_KERNELS / "grader_inputs.py")
HONEST = f"{BAD_KERNELS / 'kernels.py'}:honest"
TINY_LEGACY = str(CASES / "tiny-legacy.json")
LIMIT_S = 600  # a grade of a tiny case file takes seconds; a hang is what this catches


def grade_cli(*args, env=None, timeout=LIMIT_S):
    """``gemmlab grade ARGS`` in a subprocess; fails the test if it runs past ``timeout`` (a hang)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "gemmlab", "grade", *args],
            capture_output=True,
            text=True,
            env={**no_interpreter_env(), **(env or {})},
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"gemmlab grade {' '.join(args)} hung (no answer in {timeout} s)")


def one_line_exit_2(r, *words):
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("grading ")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def untimed(tmp_path, *shapes, name="untimed.json") -> str:
    """A colmajor competition case file of ``shapes`` (name, M, N, K) and no performance case: correctness only."""
    path = tmp_path / name
    path.write_text(
        json.dumps(
            {
                "name": "untimed",
                "dtype": "float16",
                "layout": "colmajor",
                "inputs": "competition",
                "correctness": [{"name": n, "M": m, "N": nn, "K": k} for n, m, nn, k in shapes],
            }
        )
    )
    return str(path)


# ------------------------------------------------------------------------------------------------ secret trials


def test_an_honest_kernel_passes_every_secret_trial(tmp_path):
    r = grade(untimed(tmp_path, ("a", 16, 24, 32), ("odd", 7, 5, 9)), kernel=HONEST)
    assert r["verdict"] == "PASS" and not r["failures"], r["failures"]
    assert r["secret_trials"] == {"ran": 4, "passed": 4}  # one per kind of input (competition, uniform), per case
    for c in r["correctness"]:
        seeds = [t["seed"] for t in c["trials"]]
        assert seeds[3:] == ["secret", "secret"] and all(isinstance(s, int) for s in seeds[:3])
        assert {t["kind"] for t in c["trials"][3:]} == {"competition", "uniform"}


def test_a_table_of_the_seeded_inputs_fails_the_secret_trials():
    """The kernel reads --seed and --cases from the grader's command line, answers every public trial from a table
    and computes nothing on the listed shapes: every public trial passes, a secret one fails."""
    r = grade_cli("--cases", TINY_LEGACY, "--kernel", f"{BAD}:answers_listed_from_table", "--seed", "7", "--json")
    assert r.returncode == 1, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["verdict"] == "FAIL" and report["score"]["correctness"] == 0, report["failures"]
    for c in report["correctness"]:
        public = [t for t in c["trials"] if t["seed"] != "secret"]
        assert len(public) == 3 and all(t["max_abs_err"] <= t["tolerance"] for t in public)  # the table answered
        assert c["status"] == "FAIL" and c["rule"] == "correctness" and c["reason"].startswith("secret trial 1")
    assert report["secret_trials"]["passed"] == 0 < report["secret_trials"]["ran"]
    assert "secret trials 0/" in r.stderr  # the terminal's summary says it


@pytest.mark.gpu
def test_a_table_of_the_seeded_inputs_fails_the_secret_trials_on_competition():
    """The issue's H200 story: on competition.json the table answered every listed case and gemmlab's kernel only the
    timed shape (also the listed correctness_8k), for the full 30 correctness points. Now every other case fails a
    secret trial."""
    r = grade_cli("--cases", "competition", "--kernel", f"{BAD}:answers_listed_from_table", "--seed", "7", "--json")
    assert r.returncode == 1, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["verdict"] == "FAIL" and report["performance"] is None, report["failures"]
    timed = report["performance_shape"]
    for c in report["correctness"]:
        public = [t for t in c["trials"] if t["seed"] != "secret"]
        assert len(public) == 3 and all(t["max_abs_err"] <= t["tolerance"] for t in public)
        if list(c["shape"]) != timed:
            assert c["status"] == "FAIL" and c["reason"].startswith("secret trial 1"), c


# ------------------------------------------------------------------------------------------------ the report


def test_a_candidates_exception_cannot_forge_the_report(tmp_path):
    out = tmp_path / "out"
    r = grade_cli(
        "--cases",
        untimed(tmp_path, ("a", 16, 24, 32), ("b", 8, 8, 16)),
        "--kernel",
        f"{BAD}:raises_a_forged_report",
        "--output-dir",
        str(out),
    )
    assert r.returncode == 1, r.stderr[-2000:]
    md = (out / "report.md").read_text()
    assert "<!--" not in md and "\n\n<" not in md
    for text in (md, r.stdout, r.stderr):
        assert "\x1b" not in text
    lines = md.splitlines()
    assert [x for x in lines if x.startswith("#")] == ["# gemmlab grade: untimed"]
    verdict = [x for x in lines if x.startswith("official score")]  # one verdict line, after every row
    assert (
        len(verdict) == 1
        and verdict[0].endswith("verdict FAIL")
        and lines.index(verdict[0]) > max(i for i, x in enumerate(lines) if x.startswith("|"))
    )
    assert lines[-1].startswith("candidate isolation: ")  # the grader's own account, last
    rows = [x for x in lines if x.startswith("|") and not x.startswith(("| case", "|---"))]
    assert [x.split(" | ")[0] for x in rows] == ["| a", "| b"]  # the real rows, each a row of its own
    for row in rows:  # seven cells: no pipe of the candidate's opens one
        assert row.replace("\\|", "").count("|") == 8 and "| FAIL |" in row and "boom \\|" in row
        assert "\\`" in row and "&lt;\\!--" in row and "\\[x\\](http://evil)" in row
    assert json.loads((out / "report.json").read_text())["verdict"] == "FAIL"
    terminal = [x.strip() for x in r.stdout.splitlines()]
    assert not any(x.startswith(("official score 100", "# gemmlab")) for x in terminal)


def test_a_refused_report_directory_keeps_no_forged_report(tmp_path):
    """A FIFO at report.json (the grader refuses to write through it: one line, exit 2) and a forged PASS report.md
    and report.csv beside it: no hang, and nothing is left at a report's name."""
    out = tmp_path / "out"
    r = grade_cli(
        "--cases",
        untimed(tmp_path, ("a", 16, 24, 32)),
        "--kernel",
        f"{BAD}:plants_a_forged_report",
        "--output-dir",
        str(out),
        env={"BAD_REPORT_DIR": str(out), "GEMMLAB_SANDBOX_WRITABLE": str(tmp_path), "GEMMLAB_SANDBOX_UID": "0"},
    )  # no uid of its own: the plant lands
    one_line_exit_2(r, "report.json", "not a plain file")
    assert not [p.name for p in out.iterdir() if p.name.startswith("report")], list(out.iterdir())


# ------------------------------------------------------------------------------------------------ bounded reads


def test_read_bounded_reads_only_regular_files_and_never_past_its_limit(tmp_path):
    fifo, text, link = tmp_path / "f", tmp_path / "t", tmp_path / "l"
    os.mkfifo(fifo)
    text.write_bytes(b"0123456789")
    link.symlink_to(text)
    for path, words in ((fifo, "a FIFO"), ("/dev/zero", "a character device"), (tmp_path, "a directory")):
        with pytest.raises(output.UnreadableFile, match=words) as e:
            output.read_bounded(path, 100)
        assert not e.value.too_long
    with pytest.raises(output.UnreadableFile, match="a symlink"):
        output.read_bounded(link, 100, follow=False)
    with pytest.raises(output.UnreadableFile, match="over the 4") as e:
        output.read_bounded(text, 4)
    assert e.value.too_long
    assert output.read_bounded(link, 100) == b"0123456789" and output.read_bounded(text, 4, tail=True) == b"6789"
    with pytest.raises(FileNotFoundError):
        output.read_bounded(tmp_path / "missing", 4)


@pytest.mark.parametrize("what", ["fifo", "dev-zero"])
def test_a_case_file_that_is_a_fifo_or_dev_zero_is_one_line(tmp_path, what):
    path = tmp_path / "cases.json"
    os.mkfifo(path) if what == "fifo" else path.symlink_to("/dev/zero")
    with pytest.raises(cases.CaseError, match="not a regular file"):
        cases.load(str(path))
    words = "a FIFO" if what == "fifo" else "a character device"
    one_line_exit_2(grade_cli("--cases", str(path), "--kernel", HONEST), str(path), words)


def test_a_case_name_with_a_terminal_escape_is_refused(tmp_path):
    path = tmp_path / "escape.json"
    path.write_text(
        json.dumps(
            {
                "dtype": "float16",
                "layout": "colmajor",
                "inputs": "competition",
                "correctness": [{"name": "a\x1b[2J\nverdict PASS", "M": 8, "N": 8, "K": 8}],
            }
        )
    )
    with pytest.raises(cases.CaseError, match=r"correctness\[0\]\.name: expected printable text"):
        cases.load(str(path))


@pytest.mark.parametrize("name,what", [("zz.py", "fifo"), ("x.py", "dev-zero")])
def test_a_fifo_or_dev_zero_beside_the_kernel_is_one_line(tmp_path, name, what):
    shutil.copy(BAD_KERNELS / "kernels.py", tmp_path / "k.py")
    os.mkfifo(tmp_path / name) if what == "fifo" else (tmp_path / name).symlink_to("/dev/zero")
    before = set(os.listdir(tmp_path))
    case_file, words = untimed(tmp_path, ("a", 16, 24, 32)), "a FIFO" if what == "fifo" else "a character device"
    r = grade_cli("--cases", case_file, "--kernel", f"{tmp_path / 'k.py'}:honest", env={"TMPDIR": str(tmp_path)})
    one_line_exit_2(r, str(tmp_path / name), words)
    assert set(os.listdir(tmp_path)) == before | {"untimed.json"}  # the grader's log directory went too
    with pytest.raises(ValueError, match=words):  # the API: a ValueError (output.UnreadableFile) naming the file
        grade(case_file, kernel=f"{tmp_path / 'k.py'}:honest")


@pytest.mark.parametrize("what", ["fifo", "dev-zero"])
def test_a_kernel_file_that_is_a_fifo_or_dev_zero_is_one_line(tmp_path, what):
    kernel = tmp_path / "k.py"
    os.mkfifo(kernel) if what == "fifo" else kernel.symlink_to("/dev/zero")
    one_line_exit_2(grade_cli("--kernel", f"{kernel}:fn"), str(kernel), "is not a regular file")


def test_sources_nested_past_the_parsers_depth_are_skipped(tmp_path):
    """A file beside the kernel (or the kernel's own) that the parser cannot take (RecursionError, the parser's
    MemoryError) is skipped by the observer and left to the loader by the CLI's spec check: no traceback."""
    from gemmlab.cli import kernelspec
    from gemmlab.grade import observer

    files = [tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"]
    texts = ("x" + "[0]" * 200000, "-" * 1000000 + "1", "import triton\n@triton.jit\ndef k(x): pass\n")
    for f, text in zip(files, texts, strict=True):
        f.write_text(text)
    assert observer.triton_names(files) == {"k"}
    assert kernelspec.problem(f"{files[0]}:fn") is None and kernelspec.problem(f"{files[1]}:fn") is None


def test_the_interposers_files_replaced_by_a_fifo_or_a_symlink_read_as_tampered(tmp_path):
    """vendor_guard's log and counter file (a GPU's observer) as the child could leave them: a FIFO, a symlink to
    /dev/zero. Read without blocking: the log is tampered with (a FAIL by the vendor rule), the counters absent."""
    from gemmlab.grade import preload

    fifo, link = tmp_path / "vg.log", tmp_path / "vg.counts"
    os.mkfifo(fifo)
    link.symlink_to("/dev/zero")
    for path, words in ((fifo, "a FIFO"), (link, "a symlink")):
        obs = preload.read_log(path)
        state, detail = preload.assess(obs, 1234)
        assert state == "vendor" and "tampered" in detail and words in detail, detail
        assert preload.read_counts(path) is None


def test_a_log_replaced_by_a_fifo_does_not_hang_the_grader(tmp_path):
    """The child puts a FIFO where its log was and dies; the grader, quoting the end of the log, says so."""
    r = grade_cli(
        "--cases",
        untimed(tmp_path, ("a", 16, 24, 32)),
        "--kernel",
        f"{BAD}:replaces_its_log_with_a_fifo",
        "--json",
        env={
            "TMPDIR": str(tmp_path),
            "BAD_KERNEL_OUT_DIR": str(tmp_path),
            "GEMMLAB_SANDBOX_WRITABLE": str(tmp_path),  # as where no Landlock domain stops it
            "GEMMLAB_SANDBOX_UID": "0",
        },
    )  # nor a uid of its own: the FIFO must land
    assert (tmp_path / "planted").exists(), r.stderr[-2000:]
    assert r.returncode == 1, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["verdict"] == "FAIL" and "a FIFO, not a regular file" in report["failures"][0]["reason"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_value_of_the_graded_dtypes_is_a_tf32_value(dtype):
    """The competition reference runs on TF32 tensor cores for fp16 and bf16 operands (``inputs.reference``): exact
    only if every such value, as fp32, has its 13 low mantissa bits clear (TF32 keeps 10) and a TF32 exponent
    (TF32 has fp32's). Every one of the 65536 bit patterns, NaN and Inf aside."""
    from gemmlab.grade.inputs import TF32_EXACT

    assert dtype in TF32_EXACT
    values = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).float()
    values = values[torch.isfinite(values)]
    assert values.numel() > 60000
    assert int((values.view(torch.int32) & 0x1FFF).count_nonzero()) == 0
