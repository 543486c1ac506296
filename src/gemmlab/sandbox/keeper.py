"""The sandbox's first process, run by path (``python .../keeper.py FD [--cgroup PROCS_FILE] [--wrap ARGV_JSON
--tool NAME [--tool-pidns] [--tool-netns] | --tool-why WHY] [--writable DIR]... [--read-only [--file FILE]...]
[--landlock] [--no-ptrace [--undumpable] [--trusted] [--every]] [--uid UID | --uid-why WHY] [--seccomp OWNER PGID]
[--pidns] [--netns] [--hide-terminals] [--cuda]``; ``sandbox.isolate`` builds it)
so that nothing is imported before it forks (no CUDA, no gemmlab). Before any candidate code exists it, in order,
- writes its own pid into PROCS_FILE (the sandbox's freezer cgroup, ``sandbox.contain.Freezer``), so every process
  of the sandbox is born inside;
- with ``--wrap``, execs bubblewrap (``sandbox.tool``), which runs this file again inside it (``wrap``): the steps
  below then happen in there, bubblewrap's session, ``/dev`` and PID namespace standing for the keeper's own;
- closes any inherited descriptor that is a terminal (``no_terminal``; it has no controlling terminal: the owner
  started it in a session of its own);
- where it is root, enters a mount namespace of its own where the terminals are hidden (an empty /dev/pts,
  /dev/null over the consoles: ``mounts.namespaces``) and, with ``--pidns``, a PID namespace whose first process mounts
  a /proc of its own (``mounts.proc_mount``) and reaps its orphans;
- in that mount namespace, hides the host's Unix sockets bound to a path (``sandbox/sockets.py``);
- with ``--netns``, enters a network namespace of its own, loopback only (``sockets.own_network``): the host's
  listeners and abstract sockets out of reach; in a namespace of its own (this or bubblewrap's) it drops
  CAP_NET_ADMIN, which names any other network namespace by a pid (rtnetlink: a link made in the host's);
- with ``--read-only``, in that mount namespace, remounts every mount read-only but the ``--writable`` directories,
  ``/dev/shm`` and the ``--file`` files (``mounts.read_only_host``: Landlock's file rules where there is no Landlock);
  with ``--cuda`` /proc stays writable (CUDA writes its threads' names there), its system files not;
- with ``--landlock``, enters a Landlock domain of its own, root or not:
  - files (ABI 1+, Linux 5.13+): no file can be written, created, removed, renamed, linked or truncated by path but
    below the ``--writable`` directories (the sandbox's scratch directory), ``/dev/shm``, and ``/dev/null`` and the
    GPU's device files (and appended to vendor_guard's log and counter files, the observer's own evidence; with
    ``--cuda`` the files below /proc too, as ``mounts.PROC_READ_ONLY`` says); no device node made anywhere (root's
    mknod of a disk's numbers in its scratch directory would write the disk). So
    nothing the grader or the baseline reads after the candidate started can be the
    candidate's: not a module, ``.pth``, ``sitecustomize`` or ``.pyc`` of theirs (the baseline's worker starts after
    the candidate's first call), not the preloaded observers' libraries or logs, not the grader's log directory,
    not ``/proc/PID/autogroup`` or ``oom_score_adj`` of another process, not a cgroup's files (the baseline's
    ``cpu.max``), not the shared Triton cache. A descriptor opened before (its stdout, the slots) still works.
  - signals and sockets (ABI 6, Linux 6.12+: ``LANDLOCK_SCOPE_SIGNAL`` and ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET``):
    no process of the sandbox can signal, ptrace (nor read /proc/PID/mem of) or connect to an abstract socket of
    any process outside the domain (the grader, the other sandbox); inside it (the keeper, the candidate's own
    processes) all of that still works.
- with ``--no-ptrace`` (the undumpable grader, and the read-only host, which ``/proc/PID/root`` of the grader would
  bypass), drops CAP_SYS_PTRACE for good, so no process of it reaches the memory, root or descriptors of an
  undumpable one (the grader while it grades) or of one with capabilities it lacks, and with ``--undumpable`` (the
  baseline) is undumpable itself; without ``--trusted`` (the candidate's) drops ``UNTRUSTED_DROPS`` too, and with
  ``--every`` (the undumpable layer's candidate) and without ``--uid`` every capability (``no_ptrace``);
- with ``--uid``, becomes that uid, keeping only CAP_DAC_READ_SEARCH (``own_uid``);
- with ``--seccomp``, drops ``HOST_DROPS`` (the host's clock rate, reboot, audit: no namespace covers them) and
  installs the filter of ``sandbox/seccomp.py`` (loaded by path), naming the owner's pid and process group;
- sends its first message on the channel: what isolation is in force (``tell``; ``Sandbox.isolation``).
Then it forks: the parent half is the keeper, which only waits (reaping) and exits with the candidate's status; the
child half serves the candidate (``sandbox.serve``). What it could not do it says on stderr (the sandbox's log) and
in that message."""

import errno
import glob
import os
import sys

sys.path.pop(0)  # this file's directory: its siblings must not shadow top-level modules
HERE = os.path.dirname(os.path.abspath(__file__))

LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # x86_64 and aarch64 alike
LANDLOCK_RULE_PATH_BENEATH = 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
PR_SET_NO_NEW_PRIVS = 38
# LANDLOCK_ACCESS_FS_*: every right that changes the file system (reading and executing stay unrestricted)
WRITE_FILE, TRUNCATE = 1 << 1, 1 << 14
MAKE_DEVICE = 1 << 6 | 1 << 11  # MAKE_CHAR, MAKE_BLOCK: handled, granted nowhere (a node of its own opens any device)
FS_WRITES = {
    1: WRITE_FILE | sum(1 << b for b in (4, 5, 6, 7, 8, 9, 10, 11, 12)),  # remove, make (dir, reg, ...)
    2: 1 << 13,  # REFER (links and renames across directories)
    3: TRUNCATE,
}
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


def landlock(writable: list[str], cuda: bool = False) -> list[str]:
    """Enter a Landlock domain: file writes below ``writable`` (and the devices) only, where the ABI has them (1+);
    signals and abstract Unix sockets scoped (6+); with ``cuda`` files below /proc written too
    (``mounts.PROC_READ_ONLY`` says why; a process outside the domain is still out of reach there, its ptrace rights
    being scoped). Returns what could not be had ([] : all of it)."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # the ABI version
    if abi < 1:
        return [f"no Landlock here ({os.strerror(ctypes.get_errno())})"]
    fs = sum(bits for v, bits in FS_WRITES.items() if abi >= v)
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, 0, scoped)[: 24 if abi >= 6 else 16 if abi >= 4 else 8]
    ruleset = libc.syscall(
        LANDLOCK_CREATE_RULESET,
        ctypes.create_string_buffer(attr, len(attr)),
        ctypes.c_size_t(len(attr)),
        ctypes.c_uint32(0),
    )
    if ruleset < 0:
        return [f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"]
    missing = [] if scoped else [f"Landlock ABI {abi} here: signals and ptrace not scoped (6 needed: Linux 6.12+)"]
    rules = [(d, fs & ~MAKE_DEVICE) for d in [*writable, "/dev/shm"] if os.path.isdir(d)]
    rules += [
        (f, fs & (WRITE_FILE | TRUNCATE))
        for f in sorted({f for p in DEVICES for f in glob.glob(p)})
        if not os.path.isdir(f)
    ]
    # vendor_guard's log and counter files, which a process the candidate starts opens again by path to log into
    # (appending or mapped: no truncation by path)
    rules += [
        (f, WRITE_FILE)
        for f in (os.environ.get(v) for v in ("GEMMLAB_VENDOR_LOG", "GEMMLAB_VENDOR_COUNTS"))
        if f and os.path.isfile(f)
    ]
    rules += [("/proc", fs & (WRITE_FILE | TRUNCATE))] if cuda else []
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


PR_SET_KEEPCAPS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH = 8, 47, 2, 2
PR_SET_DUMPABLE, PR_CAPBSET_READ, PR_CAPBSET_DROP, CAP_SYS_PTRACE, CAP_NET_ADMIN = 4, 23, 24, 19, 12
PR_SET_NO_NEW_PRIVS = 38
# dropped by an untrusted sandbox alone (``no_ptrace``): CAP_SYS_MODULE, CAP_SYS_RAWIO (/proc/kcore), CAP_SYSLOG
UNTRUSTED_DROPS = (16, 17, 34)
# dropped with the seccomp filter, by every sandbox: host-wide kernel settings that no namespace covers (CAP_SYS_BOOT:
# reboot; CAP_SYS_TIME: ``adjtimex``'s tick, how fast CLOCK_MONOTONIC, the grader's clock, runs; CAP_AUDIT_*: the
# kernel's audit, its failure mode a panic; CAP_MAC_*: the security module's policy)
HOST_DROPS = {"CAP_SYS_BOOT": 22, "CAP_SYS_TIME": 25, "CAP_AUDIT_WRITE": 29, "CAP_AUDIT_CONTROL": 30}
HOST_DROPS |= {"CAP_MAC_OVERRIDE": 32, "CAP_MAC_ADMIN": 33, "CAP_AUDIT_READ": 37}
UNTRUSTED_WHY = " (nor CAP_SYS_MODULE, CAP_SYS_RAWIO, CAP_SYSLOG: the trusted sandbox's helpers out of reach)"
EVERY_WHY = " (nor any other capability but CAP_DAC_READ_SEARCH: root without powers, reading as the grader can)"


def _load(name: str):
    """A sibling module of this file, by path (importing ``gemmlab`` here would import torch before the fork)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_gemmlab_keeper_{name}", os.path.join(HERE, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def no_terminal() -> str:
    """Close every inherited descriptor that is a terminal; the process has no controlling terminal (a new session's
    leader never opened one). Returns what was found ("none": nothing to close)."""
    closed = []
    for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
        try:
            if os.isatty(fd):
                os.close(fd)
                closed.append(fd)
        except OSError:
            pass
    with open("/proc/self/stat") as f:
        tty_nr = int(f.read().rsplit(")", 1)[1].split()[4])
    return ("none" if not closed else f"closed inherited terminal descriptors {closed}") + (
        "" if tty_nr == 0 else f"; a controlling terminal ({tty_nr}) remains"
    )


def own_uid(uid: int) -> str:
    """Become ``uid`` (its own group too, no supplementary groups), keeping only CAP_DAC_READ_SEARCH (reading and
    searching any file), also across exec (an ambient capability). Returns what the report says."""
    import ctypes
    import platform
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except OSError as e:
        return f"the grader's (setuid {uid}: {e.strerror})"
    keep = 1 << CAP_DAC_READ_SEARCH
    head = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0), 8)  # _LINUX_CAPABILITY_VERSION_3
    data = ctypes.create_string_buffer(struct.pack("=6I", keep, keep, keep, 0, 0, 0), 24)
    nr = {"x86_64": 126, "aarch64": 91}.get(platform.machine())
    if (
        nr is None
        or libc.syscall(nr, head, data) != 0
        or libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0) != 0
    ):
        return f"{uid} (its own; reading files the grader's user alone may read: not kept)"
    return f"{uid} (its own; reads files as the grader can, writes only its own)"


def drop_caps(caps) -> str | None:
    """Drop ``caps`` for good: the bounding set (those still in it), then the effective, permitted and inheritable
    sets. A capability the process does not hold, whose bounding bit it may not clear (a grader that is not root has
    no CAP_SETPCAP), stays out of reach by no_new_privs (no exec can grant it). None when done, else why not."""
    import ctypes
    import platform
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": (125, 126), "aarch64": (90, 91)}.get(platform.machine())  # capget, capset
    head = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0), 8)  # _LINUX_CAPABILITY_VERSION_3
    data = ctypes.create_string_buffer(24)
    if nr is None or libc.syscall(nr[0], head, data) != 0:
        return "capabilities not read here"
    sets = list(struct.unpack("=6I", data.raw))  # (effective, permitted, inheritable) of 0-31, then of 32-63
    for cap in caps:
        if libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) != 1:  # gone already (or unknown to this kernel)
            continue
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 or ctypes.get_errno() == errno.EINVAL:
            continue
        err = ctypes.get_errno()
        held = sets[1 + 3 * (cap // 32)] >> (cap % 32) & 1
        if held or err != errno.EPERM or libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"capability {cap} kept: {os.strerror(err)}"
    for cap in caps:
        sets = [c & ~(1 << cap % 32) if i // 3 == cap // 32 else c for i, c in enumerate(sets)]
    if libc.syscall(nr[1], head, ctypes.create_string_buffer(struct.pack("=6I", *sets), 24)) != 0:
        return f"capset: {os.strerror(ctypes.get_errno())}"
    return None


def no_ptrace(undumpable: bool, trusted: bool | None = None, every: bool = False) -> str:
    """Drop CAP_SYS_PTRACE for good: no process of the sandbox, root or not, can then ptrace, read or write the memory
    of (``/proc/PID/mem``, ``process_vm_*``), or open ``/proc/PID/root``, ``cwd`` or ``fd/`` of, a process that is
    not dumpable, such as the grader while it grades (``owner.dumpable``), nor a dumpable one of its uid whose
    capabilities are not all its own (the grader, the host's root processes: the read-only host, which their
    ``/proc/PID/root`` would bypass, needs this too); with ``undumpable`` (a trusted sandbox: the baseline), this one
    is not dumpable itself. An untrusted sandbox (``trusted`` False; default: not ``undumpable``) also drops
    ``UNTRUSTED_DROPS``: the kernel lets a process reach another's memory only where its capabilities include all of
    the other's, so no process the trusted sandbox starts by exec (which makes a process dumpable again: a compiler,
    Triton's ``ldconfig``), root with those, is within the candidate's reach. With ``every`` (the candidate's under
    the undumpable layer, where it keeps the grader's uid: root with CUDA) every capability goes: root without a uid
    of its own then has no power over the host (no reboot, clock setting, device node, port I/O, swap, raw socket,
    module) nor over another process but by uid; it keeps CAP_DAC_READ_SEARCH, as a uid of its own does, so it reads
    what the grader's root can (a kernel in a directory of another user's). Returns what the report says."""
    import ctypes

    trusted = undumpable if trusted is None else trusted
    libc = ctypes.CDLL(None, use_errno=True)
    if undumpable and libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return f"off (not made undumpable: {os.strerror(ctypes.get_errno())})"
    every_cap = [c for c in range(last_cap() + 1) if c != CAP_DAC_READ_SEARCH]  # reading stays (a kernel in 0700)
    why = drop_caps([CAP_SYS_PTRACE, *(() if trusted else every_cap if every else UNTRUSTED_DROPS)])
    if why is not None:
        return f"off ({why})"
    return "no CAP_SYS_PTRACE" + (
        "; this sandbox undumpable" if undumpable else "" if trusted else EVERY_WHY if every else UNTRUSTED_WHY
    )


def last_cap() -> int:
    """The kernel's highest capability number (``/proc/sys/kernel/cap_last_cap``; where it cannot be read, 63: one the
    kernel does not know is refused as EINVAL by ``PR_CAPBSET_DROP``, which ``no_ptrace`` passes over)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def tell(fd: int, isolation: dict) -> None:
    """The first message on the channel, before any candidate code exists: what isolation is in force (the
    framing of ``sandbox.wire``)."""
    import json
    import struct

    body = json.dumps({"isolation": isolation}).encode()
    os.write(fd, struct.pack("<I", len(body)) + body)


def serve_in_child(fd: int) -> None:
    """Fork: the parent half waits (reaping every orphan, as a PID namespace's first process must) and exits with
    the candidate's status; the child half serves the candidate (``sandbox.serve``)."""
    pid = os.fork()
    if pid:
        os.close(fd)
        while True:
            try:
                done, status = os.wait()
            except ChildProcessError:
                os._exit(0)
            if done == pid:
                os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    try:
        from gemmlab.sandbox.serve import serve

        serve(fd)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # no atexit handlers of a candidate's making


def _without(args: list[str], flag: str) -> list[str]:
    """``args`` less ``flag`` and the value after it."""
    if flag not in args:
        return args
    i = args.index(flag)
    return args[:i] + args[i + 2 :]


def wrap(fd: int, args: list[str]) -> None:
    """Exec the tool's command line (``--wrap``, JSON: ``sandbox.tool``) running this file again inside it, with
    the same arguments less the cgroup (joined already: the tool's processes are inside it) and the wrapping."""
    import json

    argv = json.loads(args[args.index("--wrap") + 1])
    inner = _without(_without(args, "--wrap"), "--cgroup")
    os.execv(argv[0], [*argv, "--", sys.executable, os.path.abspath(__file__), str(fd), *inner])


def main() -> None:
    mounts = _load("mounts")
    fd, args = int(sys.argv[1]), sys.argv[2:]
    isolation = {"session": "own (no controlling terminal)"}
    if "--cgroup" in args:
        try:
            with open(args[args.index("--cgroup") + 1], "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:  # no permission to move: the owner stops this sandbox by signals instead
            print(f"keeper: not in the sandbox's cgroup ({e})", file=sys.stderr)
    if "--wrap" in args:
        wrap(fd, args)  # returns only if the exec failed: the owner sees the keeper's start fail
        return
    isolation["tool"] = (
        args[args.index("--tool") + 1]
        if "--tool" in args
        else "hand-written" + (f" ({args[args.index('--tool-why') + 1]})" if "--tool-why" in args else "")
    )
    isolation["terminal_fds"] = no_terminal()
    pidns = "--pidns" in args
    if "--tool" in args:  # its session, /dev (its own /dev/pts, no console) and PID namespace are the tool's
        isolation["terminals"] = f"hidden ({isolation['tool']}: a /dev of its own)"
        isolation["hostname"] = f"own ({isolation['tool']}: UTS namespace)"
        isolation["pid_namespace"] = "on" if "--tool-pidns" in args else "off"
    elif "--hide-terminals" in args or pidns:
        uts, ipc = os.readlink("/proc/self/ns/uts"), os.readlink("/proc/self/ns/ipc")
        isolation["terminals"], isolation["pid_namespace"] = mounts.namespaces(pidns, "--cuda" not in args)
        isolation["hostname"] = "own (UTS namespace)" if os.readlink("/proc/self/ns/uts") != uts else "the host's"
        isolation["sysv_ipc"] = "own (IPC namespace)" if os.readlink("/proc/self/ns/ipc") != ipc else "the host's"
    else:
        isolation["terminals"], isolation["pid_namespace"] = "not hidden (off: GEMMLAB_SANDBOX_TERMINALS)", "off"
    if isolation["pid_namespace"] == "on" and "--tool" not in args:  # this process stays outside; its first child
        # is the namespace's init
        child = os.fork()
        if child:
            os.close(fd)
            _, status = os.waitpid(child, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        isolation["pid_namespace"] = mounts.proc_mount()
    writable = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--writable"]
    if isolation["terminals"].startswith("hidden (/dev/pts"):  # the host's Unix sockets: a tmux server's, D-Bus's
        isolation["host_sockets"] = _load("sockets").hide({os.environ.get("GEMMLAB_OBSERVER_SOCK", "")})
    elif "--tool" in args:
        isolation["host_sockets"] = f"hidden ({isolation['tool']}: /dev/null bound over each)"
    if isolation["terminals"].startswith("hidden (/dev/pts"):  # in the keeper's mount namespace, under every layer
        isolation["shm"] = "nodev" if not (left := mounts.nodev(["/dev/shm"])) else f"devices open ({left[0]})"
    if "--tool-netns" in args:  # after the sockets above were listed: /proc/net/unix is the network namespace's
        isolation["network"] = f"own ({isolation['tool']}: loopback only)"
    elif "--netns" in args:
        isolation["network"] = _load("sockets").own_network()
    if isolation.get("network", "").startswith("own ("):  # CAP_NET_ADMIN reaches every network namespace by pid
        why = drop_caps([CAP_NET_ADMIN])
        isolation["network"] += "; no CAP_NET_ADMIN" if why is None else f"; CAP_NET_ADMIN kept ({why})"
    if "--cuda" in args and isolation["terminals"].startswith("hidden (/dev/pts"):
        isolation["proc"] = mounts.proc_system_read_only("--landlock" in args)
    if "--read-only" in args:  # in the mount namespace above (hidden terminals), after the PID namespace's /proc
        if isolation["terminals"].startswith("hidden (/dev/pts"):
            files = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--file"]
            isolation["host_files"] = mounts.read_only_host(writable, files, "--cuda" in args)
        else:
            isolation["host_files"] = "writable (no mount namespace of its own)"
    isolation["landlock"] = "off"
    if "--landlock" in args:
        missing = landlock(writable, "--cuda" in args)
        for why in missing:
            print(f"keeper: Landlock: {why}", file=sys.stderr)
        isolation["landlock"] = "on" if not missing else "partial: " + "; ".join(missing)
        if any(m.startswith(("no Landlock", "landlock_create", "no domain")) for m in missing):
            isolation["landlock"] = "off: " + "; ".join(missing)
    isolation["ptrace"] = "off"
    if "--no-ptrace" in args:  # the undumpable layer's candidate of the grader's uid drops every capability (its own
        # uid keeps one)
        every = "--every" in args and "--uid" not in args
        isolation["ptrace"] = no_ptrace("--undumpable" in args, "--trusted" in args, every)
    isolation["uid"] = f"{os.getuid()} (the grader's" + (
        f": {args[args.index('--uid-why') + 1]})" if "--uid-why" in args else ")"
    )
    if "--seccomp" in args:  # before a uid of its own, which could not drop them from its bounding set
        why = drop_caps(list(HOST_DROPS.values()))
        isolation["host_caps"] = "dropped " + ", ".join(HOST_DROPS) if why is None else f"kept ({why})"
    if "--uid" in args:
        isolation["uid"] = own_uid(int(args[args.index("--uid") + 1]))
    isolation["seccomp"] = "off"
    if "--seccomp" in args:
        i = args.index("--seccomp")
        missing = _load("seccomp").install(int(args[i + 1]), int(args[i + 2]))
        for why in missing:
            print(f"keeper: seccomp: {why}", file=sys.stderr)
        isolation["seccomp"] = "on" if not missing else "off: " + "; ".join(missing)
    tell(fd, isolation)
    serve_in_child(fd)


if __name__ == "__main__":
    main()
