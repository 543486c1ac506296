"""The sandbox's first process, run by path (``python .../keeper.py FD [CGROUP_PROCS]``) so that nothing is
imported before it forks (no CUDA, no gemmlab). Before any candidate code exists, it writes its own pid into
CGROUP_PROCS (the sandbox's freezer cgroup, ``sandbox.contain.Freezer``), so every process of the sandbox is born
inside. Then it forks: the parent half is the keeper, which only waits and exits with the candidate's status; the
child half serves the candidate (``sandbox.serve``)."""

import os
import sys

sys.path.pop(0)  # this file's directory: its siblings must not shadow top-level modules


def main() -> None:
    fd = int(sys.argv[1])
    if len(sys.argv) > 2:
        try:
            with open(sys.argv[2], "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:  # no permission to move: the owner stops this sandbox by signals instead
            print(f"keeper: not in the sandbox's cgroup ({e})", file=sys.stderr)
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
