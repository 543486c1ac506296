"""Bad `bench gemm --backend FILE.py:FN` backends (row-major FN(a, b) -> c): each must end with its own row
and a reason while the others are benchmarked (tests/bench/test_bench_isolated.py)."""

import os
import time


def _mm(a, b):
    return (a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype)


def good(a, b):
    return _mm(a, b)


def crashes(a, b):
    os._exit(11)  # as a segfault ends a process


def hangs(a, b):
    time.sleep(600)


def zeroes_inputs(a, b):
    """Right for the inputs it was given, then zeroes them (which once made cuBLAS look wrong)."""
    c = _mm(a, b)
    a.zero_()
    b.zero_()
    return c
