"""One call doing a whole timed batch (issue 29, item 8), in the competition's column-major signature
``FN(A, B, C, M, N, K)`` (C^T (N, M) = B^T (N, K) @ A^T (K, M) on the flat buffers), graded by
tests/grade/test_batch_hole.py.

The grader runs a batch's calls in slot order, and the slots are the same tensors batch after batch, so a kernel
learns them in one batch and knows, at the first call of the next, every call still to come. Both cheats below
compute those calls in one launch (a batched GEMM: one kernel for N small products, the gain on a GPU) at the first
call of a batch, with honest arithmetic, and print "fused N" to their log when they did more than their own call.
No host sync: the first call of a batch is told by its output's address (the slots' outputs are rows of one
buffer, called in rising order). ``honest`` is their twin: one product a call, the same arithmetic.
"""

import sys

import torch

_SEQ: dict = {"last": None, "prev": [], "cur": [], "done": set()}  # the calls of this batch and the last one
_AHEAD: dict = {}  # C's address -> its product, computed ahead (``fuses_ahead_privately``)


def honest(A, B, C, M, N, K):
    torch.mm(B.view(N, K), A.view(K, M), out=C.view(N, M))


def _learn(A, B, C, M, N, K) -> list:
    """Note this call; the calls of the last sequence (batch) that come after it in this one (same sizes)."""
    key = C.data_ptr()
    if _SEQ["last"] is not None and key <= _SEQ["last"]:  # addresses fall again: a new batch begins
        _SEQ["prev"], _SEQ["cur"], _SEQ["done"] = _SEQ["cur"], [], set()
        _AHEAD.clear()
    _SEQ["cur"].append((key, (A, B, C, M, N, K)))
    _SEQ["last"] = key
    return [s for k, s in _SEQ["prev"] if k > key and s[3:] == (M, N, K)]


def _products(calls: list) -> torch.Tensor:
    """(S, N, M): every call's C^T, in one batched GEMM."""
    _, _, _, M, N, K = calls[0]
    return torch.bmm(torch.stack([b.view(N, K) for _, b, *_ in calls]), torch.stack([a.view(K, M) for a, *_ in calls]))


def fuses_the_batch(A, B, C, M, N, K):
    """At the first call of a batch, every call still to come computed into its own output (one batched GEMM);
    those calls then return at once."""
    ahead = _learn(A, B, C, M, N, K)
    if C.data_ptr() in _SEQ["done"]:
        return
    todo = [(A, B, C, M, N, K), *ahead]
    products = _products(todo)
    torch._foreach_copy_([c.view(N, M) for _, _, c, *_ in todo], list(products.unbind(0)))
    _SEQ["done"] |= {s[2].data_ptr() for s in ahead}
    if ahead:
        print(f"fused {len(todo)}", flush=True)


def fuses_ahead_privately(A, B, C, M, N, K):
    """The same, but the products of the calls to come kept in its own memory and copied into their outputs only
    when they are called (so the outputs of calls not yet made stay the grader's NaN poison)."""
    ahead = _learn(A, B, C, M, N, K)
    mine = _AHEAD.pop(C.data_ptr(), None)
    if mine is not None:
        C.view(N, M).copy_(mine)
        return
    todo = [(A, B, C, M, N, K), *ahead]
    products = _products(todo)
    C.view(N, M).copy_(products[0])
    _AHEAD.update({s[2].data_ptr(): p for s, p in zip(ahead, products[1:].unbind(0), strict=True)})
    if ahead:
        print(f"fused {len(todo)}", flush=True)


def _request_outputs() -> set | None:
    """The addresses of the outputs of the request being served (the worker's loop is in this process: its frame
    holds the request's ``order`` and the slots), or None outside a timed request."""
    f = sys._getframe(2)
    while f is not None and not ("order" in f.f_locals and hasattr(f.f_locals.get("self"), "slots")):
        f = f.f_back
    if f is None:
        return None
    slots = f.f_locals["self"].slots
    return {slots[i][1].data_ptr() for i in f.f_locals["order"]}


def fuses_each_request(A, B, C, M, N, K):
    """``fuses_the_batch`` within what it can know for sure: the request it is serving (read from the worker's
    frame). Where a request holds every call of a batch it fuses them all; where the grader cuts the batch before
    every call whose inputs come late (the CPU), a request is one call and there is nothing to fuse. A call done
    ahead still launches one tiny kernel (C[0] *= 1), as a GPU's kernel observer counts a launch a call."""
    ahead = _learn(A, B, C, M, N, K)
    if C.data_ptr() in _SEQ["done"]:
        C[:1].mul_(1)
        return
    mine = _request_outputs()
    ahead = [s for s in ahead if mine is not None and s[2].data_ptr() in mine]
    todo = [(A, B, C, M, N, K), *ahead]
    products = _products(todo)
    torch._foreach_copy_([c.view(N, M) for _, _, c, *_ in todo], list(products.unbind(0)))
    _SEQ["done"] |= {s[2].data_ptr() for s in ahead}
    if ahead:
        print(f"fused {len(todo)}", flush=True)
