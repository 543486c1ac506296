"""The commands' progress display: a count of steps toward a known total that never passes it and ends at it.

    with Steps("grading", 6, Console(stderr=True)) as steps:
        steps.step("correctness tiny 8x8x8")   # step 1 of 6 begins
        steps.note("timing: 5 rounds")         # the message changes, the count does not
    # leaving the block normally: 6/6

On a terminal it is a rich bar (erased when done); anywhere else (a pipe, a file, a CI log) it is one plain line
per update, ``grading 1/6: correctness tiny 8x8x8``, and a last ``grading 6/6: done``. A step reported past the
total (a callback that says more than was planned) changes the message only."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape


class Steps:
    """``total`` steps (``seconds=True``: a time budget of ``total`` seconds, advanced with ``at``)."""

    def __init__(self, label: str, total: float, console: Console, seconds: bool = False):
        self.label, self.total, self.console, self.seconds = label, max(total, 0), console, seconds
        self.started = 0  # steps begun; the bar shows those done (started - 1 while one runs)
        self.done = 0.0
        self.bar = None
        self.t0 = time.perf_counter()

    def __enter__(self) -> Steps:
        if self.console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            count = () if self.seconds else (TextColumn("{task.completed:.0f}/{task.total:.0f}"),)
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                *count,
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.total)
        return self

    def _show(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, description=escape(f"{self.label}: {msg}"))
        elif self.seconds:
            self.console.print(
                f"{self.label} {self.done:.0f}/{self.total:.0f} s: {msg}", markup=False, highlight=False, soft_wrap=True
            )
        else:
            self.console.print(
                f"{self.label} {self.shown()}/{self.total:.0f}: {msg}", markup=False, highlight=False, soft_wrap=True
            )

    def shown(self) -> int:
        """The step number a plain line shows: the one running, never past the total."""
        return min(self.started, int(self.total))

    def step(self, msg: str) -> None:
        """One more step begins (past the total: the message only)."""
        if self.started < self.total:
            self.started += 1
        self.done = float(max(self.started - 1, 0))
        self._show(msg)

    def note(self, msg: str) -> None:
        """A message within the running step."""
        self._show(msg)

    def at(self, done: float, msg: str) -> None:
        """The count set to ``done`` (clamped to [0, total]): a time budget's seconds spent."""
        self.done = min(max(done, 0.0), self.total)
        self._show(msg)

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.started, self.done = int(self.total), float(self.total)
            if self.bar is None:
                self._show("done")
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
            self.bar.__exit__(kind, value, tb)
