"""Replaces torch's profilers with no-ops at import, then calls torch.mm: the in-process profiler sees
nothing (on the GPU the observers outside the candidate's Python still do). Row-major FN(a, b) -> c."""

import torch
import torch.autograd.profiler_legacy


class _Nothing:
    function_events: list = []

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def events(self):
        return []


torch.profiler.profile = _Nothing
torch.autograd.profiler_legacy.profile = _Nothing


def mm(a, b):
    return torch.mm(a, b)
