"""A kernel module that takes a minute to import (the grader's time limit covers loading)."""

import time

time.sleep(60)


def kernel(A, B, C, M, N, K):
    pass
