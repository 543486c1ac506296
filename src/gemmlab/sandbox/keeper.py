"""The sandbox's first process, run by path (``python .../keeper.py FD [--cgroup PROCS_FILE] [--landlock]``) so
that nothing is imported before it forks (no CUDA, no gemmlab). Before any candidate code exists it
- writes its own pid into PROCS_FILE (the sandbox's freezer cgroup, ``sandbox.contain.Freezer``), so every process
  of the sandbox is born inside;
- with ``--landlock``, enters a Landlock domain of its own (Linux 6.12+, ABI 6: ``LANDLOCK_SCOPE_SIGNAL`` and
  ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET``): from then on no process of the sandbox can signal, ptrace (nor read
  /proc/PID/mem of) or connect to an abstract socket of any process outside the domain (the grader, the other
  sandbox), root or not; inside it (the keeper, the candidate's own processes) all of that still works.
Then it forks: the parent half is the keeper, which only waits and exits with the candidate's status; the child half
serves the candidate (``sandbox.serve``). What it could not do it says on stderr (the sandbox's log)."""

import os
import sys

sys.path.pop(0)  # this file's directory: its siblings must not shadow top-level modules

LANDLOCK_CREATE_RULESET, LANDLOCK_RESTRICT_SELF = 444, 446  # the same numbers on x86_64 and aarch64
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
PR_SET_NO_NEW_PRIVS = 38


def landlock() -> str | None:
    """Enter a Landlock domain scoped for signals and abstract Unix sockets; None, or why not."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # the ABI version
    if abi < 6:
        return f"Landlock ABI {abi} here (6 needed: Linux 6.12+)"
    attr = ctypes.create_string_buffer(struct.pack("QQQ", 0, 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL), 24)
    fd = libc.syscall(LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(24), ctypes.c_uint32(0))
    if fd < 0:
        return f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
            return f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(fd)
    return None


def main() -> None:
    fd, args = int(sys.argv[1]), sys.argv[2:]
    if "--cgroup" in args:
        try:
            with open(args[args.index("--cgroup") + 1], "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:  # no permission to move: the owner stops this sandbox by signals instead
            print(f"keeper: not in the sandbox's cgroup ({e})", file=sys.stderr)
    if "--landlock" in args:
        why = landlock()
        if why:
            print(f"keeper: no Landlock domain ({why})", file=sys.stderr)
    pid = os.fork()
    if pid:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    try:
        from gemmlab.sandbox.serve import serve

        serve(fd)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no atexit handlers of a candidate's making


main()
