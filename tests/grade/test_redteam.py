"""The red team's round: attacks of the issue's classes that the grader's tests did not name, each a known-bad kernel
(tests/bad_kernels/redteam.py) graded here, and each FAILs or gains nothing. Those that could take the grader down run
it as a subprocess (`gemmlab grade`), so a crash is seen as one, not as a dead test run."""

import json
import os

import pytest

from gemmlab.grade import grade
from gemmlab.sandbox import sched
from tests.grade.test_grade import TINY, failed_rules
from tests.paths import BAD_KERNELS
from tests.sandbox.test_sandbox import grade_cli

RED = str(BAD_KERNELS / "redteam.py")
BOX = str(BAD_KERNELS / "containment.py")


def _one_verdict(r) -> None:
    """The grader ended on its own (no signal, no traceback) with a verdict line."""
    assert r is not None, "the grader hung"
    assert r.returncode in (0, 1, 3), (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-3000:]
    assert "verdict " in r.stdout, r.stdout[-2000:]


# ------------------------------------------------------------------------------------- the grader's clock


def test_work_done_before_the_window_opens_is_timed():
    """A thread of the candidate computed each batch while the grader was still waking the sandbox (its scheduling
    restored thread by thread, /proc scanned), before t0: 4 ms of work a call was timed at well under 1 ms. Now
    t0 is taken while the sandbox is still frozen, and only the wake-up lies between it and the request."""
    from tests.bad_kernels.redteam import WORK_S

    r = grade(TINY, kernel=f"{RED}:works_before_window")
    # its thread may also leave a slot half written when the call sees it no longer NaN: timed-outputs
    assert not r["failures"] or failed_rules(r) <= {"honest-timing", "isolation", "timed-outputs"}, r["failures"]
    if not r["failures"]:
        perf = r["performance"]
        assert perf["median_ms"] >= WORK_S * 1e3, perf["median_ms"]  # gains nothing


# ------------------------------------------------------------------------------------- the grader survives


def test_shrinking_the_shared_memory_cannot_crash_the_grader(tmp_path):
    """The child owns the descriptors of the slots' shared memory; ftruncate on them made the grader's next read of
    an output a SIGBUS (the grader died, no report). The slots live in sealed memfds: the shrink is refused."""
    r = grade_cli(
        "--cases",
        TINY,
        "--kernel",
        f"{RED}:truncates_shared_memory",
        env={"BAD_KERNEL_OUT_DIR": str(tmp_path), "GEMMLAB_SANDBOX_WRITABLE": str(tmp_path)},
    )
    _one_verdict(r)
    notes = (tmp_path / "truncated").read_text().split("\n")
    assert notes[0].startswith("refused"), notes
    assert r.returncode in (0, 3), r.stdout[-2000:]  # honest after the refusal: it passes, and gained nothing


def test_a_huge_log_is_quoted_by_its_end(tmp_path):
    """A worker that dies is quoted by the end of its log; a log made a terabyte long (sparse, one ftruncate) must
    not be read whole."""
    r = grade(TINY, kernel=f"{RED}:grows_its_log_then_dies")
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"isolation"}, r["failures"]
    assert "process died" in r["failures"][0]["reason"]


def test_a_huge_observer_log_is_not_read_whole(tmp_path, monkeypatch):
    """vendor_guard's log and counter files are the grader's evidence, read after every trial, but the child can
    write them: made a terabyte long they are not read (MemoryError), and a log that is not the library's fails
    the grade as tampered with (where the candidate could grow it)."""
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    r = grade(TINY, kernel=f"{RED}:grows_the_vendor_log")
    notes = (tmp_path / "grown").read_text().split("\n") if (tmp_path / "grown").exists() else []
    if not [n for n in notes if n and "refused" not in n]:  # the files were out of its reach: an honest kernel
        assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]
    else:  # through the library's own descriptor (opened before any Landlock domain): the log was grown
        assert r["verdict"] == "FAIL" and failed_rules(r) == {"vendor"}, r["failures"]
        assert "tampered" in r["failures"][0]["reason"]


@pytest.mark.parametrize(
    "kernel,env",
    [
        (f"{RED}:raises_text_for_the_terminal", {}),  # in a failure's reason
        (
            f"{BOX}:forges_replies",
            {
                "BAD_REPLY": json.dumps(
                    {"kernels": ["[/b]\x1b[2J\x1b[H" + "\ud800"], "path": "[link=file:///etc/passwd]x\x1b]8;;\x07"}
                )
            },
        ),
    ],
)
def test_the_candidates_text_is_data_in_the_report_and_on_the_terminal(tmp_path, kernel, env):
    """Text from the child (an exception's message, the kernel names and plan path its profiler reports) reaches the
    verdict table, report.md and report.json: markup there crashed the grader (MarkupError), escape sequences
    rewrote the terminal, a lone surrogate crashed it writing (UnicodeEncodeError). Now each is shown as text."""
    out = tmp_path / "out"
    r = grade_cli("--cases", TINY, "--kernel", kernel, "--output-dir", str(out), env=env)
    _one_verdict(r)
    assert "\x1b" not in r.stdout + r.stderr and "\r" not in r.stdout
    report = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text()
    assert "\x1b" not in md and "\ud800" not in md
    if "raises" in kernel:
        assert r.returncode == 1 and report["verdict"] == "FAIL"
        assert "[/bold]" in r.stdout and "[/bold]" in report["failures"][0]["reason"]  # the text, as text
    else:
        assert r.returncode in (0, 3), r.stdout[-2000:]
        assert "[/b]" in r.stdout


# ------------------------------------------------------------------------------------- files and /proc


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    """$BAD_KERNEL_OUT_DIR, where the bad kernels note what they did, and writable for them (GEMMLAB_SANDBOX_WRITABLE,
    the owner's environment); $BAD_PATH_DIR, a directory on the grader's PYTHONPATH, which the workers inherit."""
    notes, path_dir = tmp_path / "notes", tmp_path / "on-the-path"
    notes.mkdir()
    path_dir.mkdir()
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(notes))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(notes))
    monkeypatch.setenv("BAD_PATH_DIR", str(path_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(path_dir), os.environ.get("PYTHONPATH", "")]))
    return notes


def test_code_planted_for_the_baseline_is_never_written(out_dir):
    """The candidate runs before the baseline's worker starts, and Python runs any sitecustomize.py (.pth file,
    stale-checked .pyc) on its path: written by the candidate into a directory the grader's user can write, it slowed
    the trusted baseline's torch.mm by 20 ms a call, unseen on the CPU. In its Landlock domain the candidate can
    write only below its own scratch directory."""
    r = grade(TINY, kernel=f"{RED}:writes_code_for_the_baseline")
    assert (out_dir / "sitecustomize").read_text().startswith("refused"), (out_dir / "sitecustomize").read_text()
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]
    assert r["performance"]["baseline_ms"] < 20, r["performance"]["baseline_ms"]


def test_a_file_write_reaches_nothing_outside_the_sandbox(out_dir):
    """No write reaches the baseline's autogroup (/proc), the grader's log directory or its Python path."""
    r = grade(TINY, kernel=f"{RED}:reaches_outside_by_files")
    found = json.loads((out_dir / "files.json").read_text())
    assert any(k.startswith("autogroup") for k in found) and {"log_dir", "python_path"} <= set(found), found
    assert all(v is not True for v in found.values()), found
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]


def test_an_autogroup_reniced_baseline_fails_the_candidate(out_dir, monkeypatch):
    """Without a Landlock domain or a uid of its own (with CUDA by default) the write lands: the baseline's session
    then runs at autogroup nice 19, which no thread's nice value shows. The scheduling record holds each process's
    autogroup: changed while the baseline was held, it fails the candidate."""
    monkeypatch.setenv("GEMMLAB_SANDBOX_LANDLOCK", "0")
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", "0")
    if sched.autogroup_nice(sched.autogroup("self")) is None:
        pytest.skip("no autogroups here")
    r = grade(TINY, kernel=f"{RED}:reaches_outside_by_files")
    found = json.loads((out_dir / "files.json").read_text())
    assert any(v is True for k, v in found.items() if k.startswith("autogroup")), found
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"isolation"}, r["failures"]
    assert "autogroup" in r["failures"][0]["reason"], r["failures"][0]["reason"]


@pytest.mark.parametrize("held_batches", [1, "every"])
def test_a_held_baseline_batch_is_run_again_and_held_every_time_fails(monkeypatch, held_batches):
    """A baseline batch held off the CPU is not the baseline's time (stopped by another process, or on a virtual
    machine its CPU taken by the host, which an honest run on a busy CI machine meets): it is drawn and run again.
    Held once, the run goes on and says how often; held in every try, it fails the candidate (isolation)."""
    from gemmlab.grade import protocol
    from gemmlab.sandbox.box import Sandbox

    seen = {"held": 0}

    def held_off(self, reply):
        if self.trusted and reply.get("loop_ms") is not None and (held_batches == "every" or seen["held"] < 1):
            seen["held"] += 1
            return f"the {self.name}'s process was held off the CPU (as the test says)"
        return None

    monkeypatch.setattr(Sandbox, "held_off", held_off)
    r = grade(TINY)
    if held_batches == "every":
        assert r["verdict"] == "FAIL" and failed_rules(r) == {"isolation"}, r["failures"]
        reason = r["failures"][0]["reason"]
        assert "held off the CPU" in reason and f"{protocol.HELD_RETRIES + 1} tries in a row" in reason, reason
    else:
        assert not r["failures"], r["failures"]
        assert r["performance"]["held_retries"] == 1 and seen["held"] == 1
