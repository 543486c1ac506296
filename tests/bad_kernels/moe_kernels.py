"""Known-bad MoE layers FN(x, w1, w2, topk_weights, topk_ids) -> y for the grader's MoE mode: each breaks
one rule. ``torch_layer`` is a correct one built from aten matmuls (vendor BLAS: needs --allow-vendor)."""

import traceback

import torch

from gemmlab.ref import moe_same_dtype

PERF_T = 24  # the performance case's T in tests/cases/moe-small.json

_cache = {}
_calls = {"n": 0}


def _timed() -> bool:
    """Whether this call is one of a timed batch (the worker's timing loop, ``time_calls``, is on the stack)."""
    return any(f.f_code.co_name == "time_calls" for f, _ in traceback.walk_stack(None))


def torch_layer(x, w1, w2, w, ids):
    return moe_same_dtype(x, w1, w2, w, ids)


def wrong_only_at_perf_size(x, w1, w2, w, ids):
    """Right on every listed case, wrong at the timed size (the competition story)."""
    import gemmlab

    y = gemmlab.moe_forward(x, w1, w2, w, ids)
    return y * 1.25 if x.shape[0] == PERF_T else y


def stale(x, w1, w2, w, ids):
    """Computes once per shape, then returns the cached result."""
    import gemmlab

    key = tuple(x.shape)
    if key not in _cache:
        _cache[key] = gemmlab.moe_forward(x, w1, w2, w, ids)
    return _cache[key]


def modifies_input(x, w1, w2, w, ids):
    import gemmlab

    w.mul_(1.0).add_(1e-3)
    return gemmlab.moe_forward(x, w1, w2, w, ids)


def nan_row(x, w1, w2, w, ids):
    import gemmlab

    y = gemmlab.moe_forward(x, w1, w2, w, ids)
    y[-1, -1] = float("nan")
    return y


def raises(x, w1, w2, w, ids):
    raise RuntimeError("kernel exploded")


def ignores_weights(x, w1, w2, w, ids):
    """Sums the experts' outputs without the top-k weights."""
    import gemmlab

    return gemmlab.moe_forward(x, w1, w2, torch.ones_like(w), ids)


def zeroes_topk_weights(x, w1, w2, w, ids):
    """The issue's story: zero the routing weights, return zeros (right for the mutated inputs)."""
    w.zero_()
    return torch.zeros_like(x)


def zeroes_topk_weights_when_timed(x, w1, w2, w, ids):
    """Honest through the correctness and exact-shape trials, then zeroes the routing weights and returns zeros while
    being timed."""
    import gemmlab

    if not _timed():
        return gemmlab.moe_forward(x, w1, w2, w, ids)
    w.zero_()
    return torch.zeros_like(x)


def skips_timed_calls(x, w1, w2, w, ids):
    """Honest through the trials, then every other timed call is skipped: its output stays unwritten."""
    import gemmlab

    _calls["n"] += _timed()
    if not _timed() or _calls["n"] % 2:
        return gemmlab.moe_forward(x, w1, w2, w, ids)
    return torch.full_like(x, float("nan"))


def repeats_timed_outputs(x, w1, w2, w, ids):
    """Honest through the trials; while timed it computes once and returns that answer again."""
    import gemmlab

    if not _timed() or "last" not in _calls:
        _calls["last"] = gemmlab.moe_forward(x, w1, w2, w, ids)
    return _calls["last"].clone()
