"""Child processes of the tests without Triton's interpreter: the interpreter is chosen when Triton is imported,
and the tests set it for themselves (conftest), so a child that compiles for an H200 on a machine without one
(``triton.compile(..., target=GPUTarget("cuda", 90, 32))``) or runs gemmlab's own CLI as a user would leaves it out."""

import json
import os
import subprocess
import sys


def no_interpreter_env() -> dict:
    """This process's environment without TRITON_INTERPRET."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def run_child(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    """``python ARGS`` under ``no_interpreter_env()``, output captured as text."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=no_interpreter_env(), timeout=timeout
    )


def child_json(args: list[str], timeout: int = 900):
    """The JSON that ``python ARGS`` prints on its last line (a nonzero exit fails the test with its stderr)."""
    res = run_child(args, timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
