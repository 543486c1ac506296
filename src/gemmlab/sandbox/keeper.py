"""The sandbox's first process, run by path (``python .../keeper.py FD``) so that nothing is imported
before it forks (no CUDA, no gemmlab): the parent half is the keeper, which only waits and exits with the
candidate's status; the child half serves the candidate (``sandbox.box.serve``)."""

import os
import sys

sys.path.pop(0)  # this file's directory: its siblings must not shadow top-level modules


def main() -> None:
    fd = int(sys.argv[1])
    pid = os.fork()
    if pid:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    try:
        from gemmlab.sandbox.box import serve

        serve(fd)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no atexit handlers of a candidate's making


main()
