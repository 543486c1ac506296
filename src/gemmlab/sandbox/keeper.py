"""The sandbox's first process, run by path (``python .../keeper.py FD [--cgroup PROCS_FILE] [--landlock]
[--writable DIR]...``) so that nothing is imported before it forks (no CUDA, no gemmlab). Before any candidate code
exists it
- writes its own pid into PROCS_FILE (the sandbox's freezer cgroup, ``sandbox.contain.Freezer``), so every process
  of the sandbox is born inside;
- with ``--landlock``, enters a Landlock domain of its own, root or not:
  - files (ABI 1+, Linux 5.13+): no file can be written, created, removed, renamed, linked or truncated by path but
    below the ``--writable`` directories (the sandbox's scratch directory), ``/dev/shm``, and ``/dev/null`` and the
    GPU's device files (and appended to vendor_guard's log and counter files, the observer's own evidence). So
    nothing the grader or the baseline reads after the candidate started can be the
    candidate's: not a module, ``.pth``, ``sitecustomize`` or ``.pyc`` of theirs (the baseline's worker starts after
    the candidate's first call), not the preloaded observers' libraries or logs, not the grader's log directory,
    not ``/proc/PID/autogroup`` or ``oom_score_adj`` of another process, not a cgroup's files (the baseline's
    ``cpu.max``), not the shared Triton cache. A descriptor opened before (its stdout, the slots) still works.
  - signals and sockets (ABI 6, Linux 6.12+: ``LANDLOCK_SCOPE_SIGNAL`` and ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET``):
    no process of the sandbox can signal, ptrace (nor read /proc/PID/mem of) or connect to an abstract socket of
    any process outside the domain (the grader, the other sandbox); inside it (the keeper, the candidate's own
    processes) all of that still works.
Then it forks: the parent half is the keeper, which only waits and exits with the candidate's status; the child half
serves the candidate (``sandbox.serve``). What it could not do it says on stderr (the sandbox's log)."""

import glob
import os
import sys

sys.path.pop(0)  # this file's directory: its siblings must not shadow top-level modules

LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # x86_64 and aarch64 alike
LANDLOCK_RULE_PATH_BENEATH = 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
PR_SET_NO_NEW_PRIVS = 38
# LANDLOCK_ACCESS_FS_*: every right that changes the file system (reading and executing stay unrestricted)
WRITE_FILE, TRUNCATE = 1 << 1, 1 << 14
FS_WRITES = {1: WRITE_FILE | sum(1 << b for b in (4, 5, 6, 7, 8, 9, 10, 11, 12)),  # remove, make (dir, reg, ...)
             2: 1 << 13,  # REFER (links and renames across directories)
             3: TRUNCATE}
DEVICES = ("/dev/null", "/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*")  # written by path: files only


def _rule(libc, ruleset: int, path: str, access: int) -> None:
    import ctypes
    import struct

    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        if libc.syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(fd)


def landlock(writable: list[str]) -> list[str]:
    """Enter a Landlock domain: file writes below ``writable`` (and the devices) only, where the ABI has them (1+);
    signals and abstract Unix sockets scoped (6+). Returns what could not be had ([] : all of it)."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # the ABI version
    if abi < 1:
        return [f"no Landlock here ({os.strerror(ctypes.get_errno())})"]
    fs = sum(bits for v, bits in FS_WRITES.items() if abi >= v)
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, 0, scoped)[:24 if abi >= 6 else 16 if abi >= 4 else 8]
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.create_string_buffer(attr, len(attr)),
                           ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return [f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"]
    missing = [] if scoped else [f"Landlock ABI {abi} here: signals and ptrace not scoped (6 needed: Linux 6.12+)"]
    rules = [(d, fs) for d in [*writable, "/dev/shm"] if os.path.isdir(d)]
    rules += [(f, fs & (WRITE_FILE | TRUNCATE)) for f in sorted({f for p in DEVICES for f in glob.glob(p)})
              if not os.path.isdir(f)]
    # vendor_guard's log and counter files, which a process the candidate starts opens again by path to log into
    # (appending or mapped: no truncation by path)
    rules += [(f, WRITE_FILE) for f in (os.environ.get(v) for v in ("GEMMLAB_VENDOR_LOG", "GEMMLAB_VENDOR_COUNTS"))
              if f and os.path.isfile(f)]
    try:
        for path, access in rules:
            try:
                _rule(libc, ruleset, path, access)
            except OSError as e:  # that path stays unwritable; the domain holds
                missing.append(f"{path} not writable ({e.strerror})")
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return [f"no domain: landlock_restrict_self: {os.strerror(ctypes.get_errno())}"]
    finally:
        os.close(ruleset)
    return missing


def main() -> None:
    fd, args = int(sys.argv[1]), sys.argv[2:]
    if "--cgroup" in args:
        try:
            with open(args[args.index("--cgroup") + 1], "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:  # no permission to move: the owner stops this sandbox by signals instead
            print(f"keeper: not in the sandbox's cgroup ({e})", file=sys.stderr)
    if "--landlock" in args:
        writable = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--writable"]
        for why in landlock(writable):
            print(f"keeper: Landlock: {why}", file=sys.stderr)
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
