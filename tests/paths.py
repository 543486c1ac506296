"""Where the tests' shared data lives, for every area's tests: the grader's case files and known-bad kernels."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CASES = TESTS / "cases"  # small grader case files (tiny.json, moe-small.json, ...)
BAD_KERNELS = TESTS / "bad_kernels"  # known-bad kernels, one or more per grader rule (README.md there)
