"""The commands' progress display (gemmlab.cli.progress.Steps): the count never passes its total and ends at
it, on a terminal (a rich bar) and on a pipe (plain lines); the grader's messages advance it once per case."""

import io
import re
import subprocess
import sys

from rich.console import Console
from rich.text import Text

from gemmlab.cli.grade import grade_step
from gemmlab.cli.progress import Steps
from tests.cli.test_cli import ENV


def plain(total, calls):
    out = io.StringIO()
    with Steps("work", total, Console(file=out, width=80)) as steps:
        for kind, msg in calls:
            getattr(steps, kind)(msg)
    return out.getvalue().splitlines()


def counts(lines, label="work"):
    return [(int(m.group(1)), int(m.group(2))) for line in lines if (m := re.match(rf"{label} (\d+)/(\d+): ", line))]


def test_plain_lines_end_at_the_total_and_never_pass_it():
    """Six steps reported against a total of five (the old "6/5"): the sixth says its message at 5/5."""
    lines = plain(5, [("step", f"case {i}") for i in range(1, 7)] + [("note", "still case 6")])
    seen = counts(lines)
    assert [n for n, _ in seen] == [1, 2, 3, 4, 5, 5, 5, 5] and {t for _, t in seen} == {5}
    assert lines[-1] == "work 5/5: done" and "case 6" in lines[5]


def test_a_step_short_of_the_total_still_ends_at_it():
    """Fewer steps than planned (a case skipped): leaving the block normally shows the total reached."""
    assert plain(4, [("step", "a"), ("step", "b")])[-1] == "work 4/4: done"


def test_the_terminal_bar_never_passes_its_total():
    con = Console(file=io.StringIO(), force_terminal=True, width=80)
    seen = []
    with Steps("work", 3, con) as steps:
        assert steps.bar is not None  # a terminal: the rich bar, not plain lines
        for i in range(5):
            steps.step(f"case {i}")
            seen.append(steps.bar.tasks[0].completed)
        steps.at(99.0, "past the end")
        seen.append(steps.bar.tasks[0].completed)
    assert max(seen) <= 3 and steps.bar.tasks[0].completed == 3 == steps.bar.tasks[0].total


def test_a_message_is_text_not_markup():
    """A case named like rich markup ('[/bold]' made the grader's bar raise MarkupError) shows as it is."""
    con = Console(file=io.StringIO(), force_terminal=True, width=80)
    with Steps("work", 1, con) as steps:
        steps.step("case [/bold] [red]x")
        steps.bar.refresh()  # rendered as markup here: unescaped, '[/bold]' would raise
        assert "[/bold] [red]x" in Text.from_markup(steps.bar.tasks[0].description).plain
    assert "[/bold] [red]x" in plain(1, [("step", "case [/bold] [red]x")])[0]


def test_a_failure_leaves_the_count_where_it_was():
    out = io.StringIO()
    try:
        with Steps("work", 3, Console(file=out, width=80)) as steps:
            steps.step("a")
            raise RuntimeError("broken")
    except RuntimeError:
        pass
    assert "done" not in out.getvalue() and counts(out.getvalue().splitlines()) == [(1, 3)]


def test_the_graders_messages_advance_once_per_case():
    """What gemmlab.grade says while grading 3 correctness cases and the performance case: planning, an
    exact-shape check and timing rounds are notes, so the count is 1..4 of 4, then done."""
    out = io.StringIO()
    msgs = [
        "planning the timed batches of perf (baseline, in the grader)",
        "correctness a 8x8x8",
        "correctness b 9x9x9",
        "correctness c 7x7x7",
        "performance perf",
        "exact-shape check of perf (no listed correctness case has these sizes)",
        "timing perf (4 calls a batch)",
        "timing: 3 rounds, narrowing the interval",
    ]
    with Steps("grading", 4, Console(file=out, width=80)) as steps:
        for m in msgs:
            grade_step(steps, m)
    seen = counts(out.getvalue().splitlines(), "grading")
    assert [n for n, _ in seen] == [0, 1, 2, 3, 4, 4, 4, 4, 4] and out.getvalue().endswith("grading 4/4: done\n")


def test_bench_on_a_pipe_shows_plain_lines_to_its_total(tmp_path):
    """`gemmlab bench gemm` with its stderr a pipe: one line per shape, the last at the total, no bar."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gemmlab",
            "bench",
            "gemm",
            "--shapes",
            "16,16,16",
            "--shapes",
            "8,24,16",
            "--rounds",
            "2",
            "--reps",
            "1",
            "--warmup-s",
            "0",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    seen = counts(res.stderr.splitlines(), "bench")
    assert seen == [(1, 2), (2, 2), (2, 2)] and "bench 2/2: done" in res.stderr
    assert "\x1b[" not in res.stderr and "\r" not in res.stderr  # no terminal control codes on a pipe


def test_grade_on_a_pipe_counts_its_cases_to_the_total():
    """`gemmlab grade` on a one-case file with a performance case: 2 steps, whatever else the grader says
    (planning, timing rounds) shown at the step it belongs to, ending at 2/2."""
    from tests.paths import CASES

    res = subprocess.run(
        [sys.executable, "-m", "gemmlab", "grade", "--cases", str(CASES / "tiny.json")],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert res.returncode in (0, 3), res.stderr[-2000:]  # PASS, or INCONCLUSIVE timing on a CPU
    seen = counts(res.stderr.splitlines(), "grading")
    assert seen and {t for _, t in seen} == {2} and max(n for n, _ in seen) == 2, res.stderr
    assert [n for n, _ in seen] == sorted(n for n, _ in seen) and "grading 2/2: done" in res.stderr
