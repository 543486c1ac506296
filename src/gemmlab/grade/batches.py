"""How many calls a timed batch has (protocol step 0) and where its slots live (step 1).

``plan_batches`` runs before any candidate process exists: the grader times the baseline's function in its own
process at the timed shape (back to back over four input sets, so the inputs are mostly cold) and reads the free
device memory. The calls per batch N are as many as last ``BATCH_MS`` at the baseline's speed (long enough
that the protocol's own cost per batch, a few milliseconds on a GPU with the late calls' round trips, stays a small
share of it), within ``MEMORY_SHARE``
of the free memory (a slot holds the inputs drawn per call and the output; the grader's private copies are
regenerated from their seeds, not stored) and ``MAX_CALLS``. Nothing the candidate does moves N.

``own_memory``: the slots are allocated apart from everything else the grader holds, so that CUDA IPC (which
maps the whole allocation a tensor lives in) and shared CPU memory expose slots only.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import torch

from gemmlab.instruments.timing import sync
from gemmlab.sandbox.candidate import invoke, load_kernel

try:  # the sandbox's own slot memory, where it has one
    from gemmlab.sandbox.share import slot_memory
except ImportError:
    slot_memory = None

BATCH_MS = {"cuda": 200.0, "cpu": 20.0}  # a batch's length at the baseline's speed
MAX_CALLS = {"cuda": 8192, "cpu": 2}  # the CPU's candidates run in Triton's interpreter: seconds a call
# of the free device memory, for the slots: where memory rather than time bounds N (decode-sized calls, each
# with its own weights), what the workers and the references need besides is small
MEMORY_SHARE = 0.7


@dataclass(frozen=True)
class BatchPlan:
    calls: int  # N, the calls of every timed batch
    call_ms: float  # the baseline's time per call, measured in the grader's process
    bytes_per_call: int  # one slot: inputs drawn per call and the output
    free_bytes: int | None  # free device memory when it was planned (None on the CPU)
    bounded_by: str  # "time", "memory" or "cap"


_POOLS: dict[int, object] = {}  # device index -> the CUDA memory pool of the slots (kept: tensors outlive a block)


@contextlib.contextmanager
def own_memory(device: torch.device):
    """Allocations for the slots only (step 1): the sandbox's slot memory where it has one, else a CUDA memory
    pool of the grader's slots; on the CPU every tensor has a storage of its own anyway."""
    if slot_memory is not None:
        with slot_memory(device):
            yield
    elif device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in _POOLS:
            _POOLS[index] = torch.cuda.MemPool()
        pool = _POOLS[index]
        with torch.cuda.use_mem_pool(pool, device=torch.device("cuda", index)):
            yield
    else:
        yield


def _bytes(tensors, which) -> int:
    return sum(x.numel() * x.element_size() for j, x in enumerate(tensors) if which(j))


def _baseline_call_ms(op, case, device: torch.device) -> tuple[float, int, int]:
    """(ms a call of the baseline's function, in this process, back to back over four input sets; bytes a slot;
    bytes of the inputs all calls share)."""
    first = op.fresh(case, op.timed_kind, 1, device)
    probe = [first] + [op.fresh(case, op.timed_kind, s, device, first) for s in (2, 3, 4)]  # MoE weights shared
    outs = [torch.empty(op.out_numel(case), dtype=op.dtype, device=device) for _ in probe]
    fn = load_kernel(op.baseline, op.baseline_signature)

    def calls(k: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        for i in range(k):
            invoke(fn, op.baseline_signature, op.layout, probe[i % len(probe)], outs[i % len(probe)])
        sync(device)
        return (time.perf_counter() - t0) * 1e3 / k

    calls(2)  # library initialization, first launches
    k = 4
    while (ms := calls(k)) * k < 20.0 and k < 4096:
        k *= 4
    per_call = _bytes(first, lambda j: j not in op.fixed) + op.out_numel(case) * op.dtype.itemsize
    return ms, per_call, _bytes(first, lambda j: j in op.fixed)


def plan_batches(op, case, device: torch.device) -> BatchPlan:
    """Step 0: the calls per batch, from the case and the baseline timed in this process (before any candidate)."""
    ms, per_call, fixed = _baseline_call_ms(op, case, device)
    cap, free, by = MAX_CALLS[device.type], None, "cap"
    if device.type == "cuda":
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info(device)[0]
        if (MEMORY_SHARE * free - fixed) // per_call < cap:
            cap, by = max(2, int((MEMORY_SHARE * free - fixed) // per_call)), "memory"
    want = max(2, math.ceil(BATCH_MS[device.type] / max(ms, 1e-6)))
    return BatchPlan(min(want, cap), ms, per_call, free, "time" if want <= cap else by)
