"""The candidate's containment, owned by the grader (and used by ``bench gemm --backend``): ``box`` is the owner's
side (``Sandbox``: what each guard enforces, and where, is listed there), ``serve`` the child's server, ``keeper``
the child's first process, ``contain`` the owner's view of the child's processes (cgroup freezer, /proc,
scheduling), ``wire`` the JSON channel between them, ``replies`` what the owner accepts on it, ``share`` the tensors
they share (``slot_memory``: where shared CUDA tensors must be allocated), ``candidate`` loads and calls a candidate
kernel."""

from gemmlab.sandbox.box import CandidateError, Sandbox, WorkerFailure
from gemmlab.sandbox.share import slot_memory

__all__ = ["CandidateError", "Sandbox", "WorkerFailure", "slot_memory"]
