"""The README's main command works from a fresh process (it picks the interpreter itself without CUDA)."""

import os
import subprocess
import sys

import torch

ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def gemmlab(*args):
    return subprocess.run([sys.executable, "-m", "gemmlab", *args], capture_output=True, text=True, env=ENV,
                          timeout=600)


def test_check_passes_and_reports_paths():
    shapes = ["--shapes", "300,40,64", "--shapes", "8,40,64", "--shapes", "37,53,71"]
    res = gemmlab("check", *shapes, "--dtype", "both")
    assert res.returncode == 0, res.stdout + res.stderr
    for word in ("tma_persistent", "tma_splitk", "portable", "PASS"):
        assert word in res.stdout
    assert "FAIL" not in res.stdout
    assert ("CPU (Triton interpreter)" in res.stdout) == (not torch.cuda.is_available())


def test_bad_shape_is_a_usage_error():
    res = gemmlab("check", "--shapes", "5,7")
    assert res.returncode == 2 and "expected M,N,K" in res.stdout + res.stderr


def test_paths():
    res = gemmlab("paths")
    assert res.returncode == 0
    assert res.stdout.split() == ["empty", "tma_persistent", "tma_splitk", "portable"]
