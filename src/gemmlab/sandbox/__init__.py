"""The candidate's containment, owned by the grader (and used by ``bench gemm --backend``): ``box`` is the owner's
side (``Sandbox``), ``serve`` the child's server, ``keeper`` the child's first process, ``contain`` the owner's view
of the child's processes (cgroup freezer, /proc), ``sched`` their threads' scheduling, ``wire`` the JSON channel
between them, ``replies`` what the owner accepts on it, ``share`` the tensors they share (``slot_memory``: where
shared CUDA tensors must be allocated), ``candidate`` loads and calls a candidate kernel.
The guards below are ``Sandbox``'s methods.

What each guard enforces (Linux; CPU and GPU alike unless said):
- Process: the child is ``python .../sandbox/keeper.py``, started in a new session (no controlling terminal; stdin
  /dev/null, stdout and stderr to ``log``, no other descriptor but its channel). The keeper joins the sandbox's freezer
  cgroup (``contain.Freezer``), then, where bubblewrap is in force (``tool``), execs it, which runs the keeper again
  inside its namespaces; then the keeper puts in force what ``sandbox.isolate`` says (the owner's
  ``GEMMLAB_SANDBOX_*``): the terminals and the host's Unix sockets hidden in a mount namespace of its own (root), a PID
  namespace (opt-in), a network namespace (root; on by default on the CPU: ``sockets``), a Landlock domain (``keeper``:
  no signal, ptrace or /proc/PID/mem access outside it, Linux 6.12+; no file written by path outside the scratch
  directory, ``/dev/shm`` and the devices, Linux 5.13+; on by default on the CPU), a uid of its own (root; on by default
  on the CPU), the seccomp filter (``seccomp``; on by default), and says what it got in its first message
  (``isolation``, for the report); then it forks: it only waits, the candidate runs in its child (``serve``).
  ``os.kill(os.getppid(), 9)`` kills the keeper (outside a PID namespace), which the owner notices (``WorkerFailure``).
  The cwd and ``$TMPDIR`` are the scratch directory (with Landlock or a uid also ``$TRITON_CACHE_DIR``: a cache of its
  own, so the shared one is never the candidate's).
- Membership (``members``): the cgroup's processes, every process of the child's session, every descendant of
  the keeper and, for an untrusted sandbox, every child of the owner it did not start itself (the owner is a child
  subreaper, so an orphan of the candidate becomes the owner's child, not init's) outside the owner's session (the
  keeper starts a session of its own and no process can join another one, so the owner's own children, such as
  a compile worker pool, are never claimed, frozen or killed). A trusted sandbox (a builtin or
  gemmlab's own kernel: the baseline) claims no orphan, so waking the baseline never wakes the candidate's.
- Freeze (``freeze``): the cgroup freezer where one could be made (every member at once, forks in flight
  included); else, and for any member outside the cgroup, SIGSTOP, re-scanning until two scans in a row find
  every member stopped. A sandbox that cannot be frozen within ``FREEZE_S`` fails (``WorkerFailure``).
- While a sandbox is frozen, from its freeze to its ``ready`` and across the others' windows, it may use no CPU
  (``hold``: cgroup v2 ``cpu.stat``, else /proc times; exited threads counted either way): a process of it
  that ran anyway fails it. The report says which count held (``isolation``'s ``freeze_accounting``).
- Scheduling: ``freeze`` records every thread's policy, nice value, cgroups and autogroup (``/proc/PID/autogroup``,
  which any process of the owner's user can write where no Landlock domain stops it), and fails a sandbox that
  raised its own priority (a real-time policy, a nice value below the owner's); ``thaw`` fails it if any of them changed
  while it was held (a held process cannot change itself: another process did; before its first freeze, against
  the owner's values), then gives every thread the owner's policy, nice value and CPU affinity back (and every
  process the owner's autogroup nice value). A trusted sandbox, which never sets its own autogroup, also fails at any
  freeze or ``ready`` (and ``check_held``, after the other side's last window) where its autogroup nice value is not
  the owner's. So a baseline set to SCHED_IDLE or nice 19 by the candidate FAILs the candidate.
  The owner's own thread too (``owner``): its policy, nice value, affinity, timer slack and autogroup nice value
  are compared before every window with what they were when the sandbox was made; a change fails the sandbox.
- Thaw (``thaw`` = ``ready``, ``wake``, ``running``): ``ready`` does every check and restore while the sandbox is
  still frozen; ``wake`` only sends SIGCONT (first: it drops a SIGSTOP queued while frozen) and thaws the cgroup, so
  a timed window opens between the two and holds the whole wake-up (nothing of the sandbox runs before t0: a thread
  of it that worked while the owner was still busy waking it, before t0, was timed at a fraction of its work);
  ``running`` returns once no member is stopped.
- Progress: a trusted sandbox reports how long its main thread was neither running nor runnable during a timed
  batch; more than ``HELD_MS`` + ``HELD_SHARE`` of the batch means something stopped it (``held_off``; the
  grader's protocol retries such a batch, and fails on several in a row).
- Channel (``wire``): JSON both ways over a socketpair, descriptors of shared CPU memory beside it
  (SCM_RIGHTS). The child holds no secret the owner trusts (no authkey is sent, no multiprocessing listener runs
  in the owner); the owner unpickles nothing. Every reply field the owner reads is checked for type and range in
  one place (``replies``): a malformed reply fails the sandbox with one line, never a traceback.
- CUDA IPC (``share``): only tensors allocated under ``slot_memory`` can be bound, so the segments the
  child maps hold slots and nothing else of the owner's.
"""

from gemmlab.sandbox.box import CandidateError, Sandbox, WorkerFailure
from gemmlab.sandbox.share import slot_memory

__all__ = ["CandidateError", "Sandbox", "WorkerFailure", "slot_memory"]
