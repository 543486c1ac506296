"""The candidate's containment, owned by the grader (and used by ``bench gemm --backend``): ``box`` is the owner's
side (``Sandbox``) and the child's server, ``keeper`` the child's first process, ``candidate`` loads and calls a
candidate kernel."""

from gemmlab.sandbox.box import CandidateError, Sandbox, WorkerFailure

__all__ = ["CandidateError", "Sandbox", "WorkerFailure"]
