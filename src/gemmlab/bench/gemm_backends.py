"""``bench gemm``'s backends (``bench.gemm`` times them): ``make_backend(name, ...)`` -> a callable (a (M, K),
b (K, N)) -> C (M, N) for "gemmlab", "gemmlab-packed", "cublas", "inductor", or ``FILE.py:FN`` /
``package.module:FN`` run in a process of its own (``Isolated``: a crash, a hang or a change to its inputs fails
its row only).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable

import torch

from gemmlab.bench import inductor
from gemmlab.instruments import timing


def make_backend(
    name: str, a: torch.Tensor, b: torch.Tensor, timeout: float = 120.0, inductor_opts: dict | None = None
) -> tuple[Callable[[], torch.Tensor], dict]:
    """A no-argument call computing C = A @ B with backend ``name``, and facts about it (path, pack_ms,
    compile_s). ``inductor_opts``: ``bench.inductor.make``'s search_space / autotune_rep_ms."""
    import gemmlab

    if name == "inductor":
        return inductor.make(a, b, **(inductor_opts or {}))

    m, n = a.shape[0], b.shape[1]
    if name == "cublas":
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        vendor = "cuBLAS" if a.is_cuda else "CPU BLAS"
        return (lambda: torch.mm(a, b, out=out)), {"path": f"torch.mm ({vendor})"}
    if name == "gemmlab":
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        p = gemmlab.plan(a, b, out=out)
        return (lambda: gemmlab.gemm(a, b, out=out)), {"path": p.path, "config": _cfg(p)}
    if name == "gemmlab-packed":
        packed = gemmlab.pack_b(b)  # the first call also allocates and launches cold; time warm ones
        pack_ms = sorted(timing.time_calls(lambda: gemmlab.pack_b(b), 3, a.device))[1]
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        p = gemmlab.plan(a, packed, out=out)
        return (lambda: gemmlab.gemm(a, packed, out=out)), {"path": p.path, "config": _cfg(p), "pack_ms": pack_ms}
    return Isolated(name, a, b, timeout), {"path": name, "isolated": "own process"}


class Isolated:
    """A user backend ``FILE.py:FN`` / ``package.module:FN`` in a sandboxed process of its own (as the
    grader runs candidates), on its own shared copies of A and B: a crash, a hang past ``timeout`` or a
    change to its inputs ends this backend only, with the reason in ``error``; it never raises. After a
    failure its output reads NaN and its times NaN, so ``compare_many`` neither trusts nor times it."""

    def __init__(self, spec: str, a: torch.Tensor, b: torch.Tensor, timeout: float):
        from gemmlab.sandbox import Sandbox, slot_memory

        self.a0, self.b0 = a, b
        with slot_memory(a.device):  # shared with the backend's process (CUDA IPC maps these segments only)
            self.a, self.b = a.clone(), b.clone()
            self.out = torch.full((a.shape[0] * b.shape[1],), float("nan"), dtype=a.dtype, device=a.device)
        self.box = Sandbox(spec, "rowmajor", "rowmajor", timeout, a.device.type == "cpu", name="backend")
        self.error: str | None = None
        self._ask("bind", slots=[((self.a, self.b), self.out)])

    def _ask(self, op: str, **req) -> dict | None:
        from gemmlab.sandbox.box import CandidateError, WorkerFailure

        if self.error:
            return None
        try:
            reply = self.box.request(op, **req)
        except CandidateError as e:
            self.error = f"raised {e}"
        except WorkerFailure as e:
            self.error = str(e)
        else:
            if not (torch.equal(self.a, self.a0) and torch.equal(self.b, self.b0)):
                self.error = "modified its inputs (A or B differs from the saved copy)"
            elif reply.get("problem"):
                self.error = reply["problem"]
            else:
                return reply
        self.out.fill_(float("nan"))
        self.close()
        return None

    def __call__(self) -> torch.Tensor:
        self._ask("call", slot=0)
        return self.out.view(self.a.shape[0], self.b.shape[1])

    def time_calls(self, reps: int) -> list[float]:
        """``reps`` calls timed in the backend's process (L2 flushed before each)."""
        reply = self._ask("run", order=[0] * reps, flush=True)
        return reply["ms"] if reply else [math.nan] * reps

    def close(self) -> None:
        from gemmlab.sandbox.box import WorkerFailure

        try:
            self.box.close()
        except WorkerFailure as e:
            self.error = self.error or str(e)
        shutil.rmtree(self.box.log_dir, ignore_errors=True)


def _cfg(p) -> dict | None:
    return None if p.config is None else dict(p.config.__dict__)
