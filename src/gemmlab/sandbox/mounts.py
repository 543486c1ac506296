"""The keeper's mount and PID namespaces (standard library only: ``keeper.py`` loads this file by path, before
anything of the candidate's exists): the terminals hidden (``namespaces``), a /proc of a PID namespace's own
(``proc_mount``), the host read-only (``read_only_host``) and, with CUDA, /proc's system files read-only while /proc
stays writable (``proc_system_read_only``).

    namespaces(pidns)                      a mount namespace (and PID namespace) of the keeper's own, terminals hidden
    proc_mount()                           in a new PID namespace's first process: its own /proc
    proc_system_read_only(driver)          with CUDA: ``PROC_READ_ONLY`` (``PROC_DRIVER``) bound read-only
    read_only_host(writable, files, cuda)  every mount read-only but the sandbox's own paths (with CUDA, /proc's
                                           ``PROC_DRIVER`` too)
"""

from __future__ import annotations

import glob
import os

# with CUDA, /proc stays writable: cuInit names its threads by writing /proc/PID/task/TID/comm, and fails with
# error 304 (CUDA_ERROR_OPERATING_SYSTEM) where it cannot (read-only, or outside a Landlock domain's rules); these
# stay read-only all the same (a fresh /proc of a PID namespace has no container's masks on them), the host's
# hardware files too (root writes /proc/mtrr's memory types, /proc/scsi/scsi removes a disk, /proc/acpi/wakeup)
PROC_READ_ONLY = (
    *("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"),
    *("/proc/mtrr", "/proc/scsi", "/proc/acpi", "/proc/asound"),
)
# with CUDA, under the read-only host (a layer the grader probes with CUDA, ``grade.probe``): the GPU driver's files
# (NVIDIA's ``suspend``, which root may write), which CUDA only reads
PROC_DRIVER = ("/proc/driver",)
# under the read-only host, the device nodes left as they are: the GPU's and the harmless ones; every other (a disk,
# /dev/kvm, /dev/uinput, /dev/mem, a loop device) is /dev/null there, since a read-only mount refuses writes to files,
# directories and links, not to devices; the writable paths are mounted nodev (no node of the candidate's opens)
DEVICES_KEPT = (
    *("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx"),
    *("/dev/nvidia*", "/dev/nvidia*/*", "/dev/dri/*"),  # nvidia-caps/, nvidia-caps-imex-channels/ too
)
TERMINALS = ("/dev/console", "/dev/tty[0-9]*", "/dev/ttyS*", "/dev/vcs*")  # hidden behind /dev/null
CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x20000000, 0x04000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def namespaces(pidns: bool, ipc: bool = False) -> tuple[str, str]:
    """A mount namespace of its own (root only) where the terminals are hidden: an empty /dev/pts (no other
    session's pseudo-terminal can be opened by path) and /dev/null over the consoles; a UTS namespace too (root's
    ``sethostname`` renames only the sandbox) and, with ``ipc`` (without CUDA, whose IPC across one is unverified), an
    IPC namespace (root reads and writes every SysV shared-memory segment and message queue of the host's otherwise);
    with ``pidns`` a PID namespace too (its /proc is mounted by its first process, ``proc_mount``). Returns
    (terminals, pid namespace) as said in the report."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS | (CLONE_NEWPID if pidns else 0)) != 0:
        why = os.strerror(ctypes.get_errno())
        return f"not hidden (no mount namespace: {why})", f"off (unshare: {why})" if pidns else "off"
    for extra in (CLONE_NEWUTS, CLONE_NEWIPC if ipc else 0):  # each on its own: one refused costs only itself (the
        if extra:  # report's hostname and sysv_ipc say which held)
            libc.unshare(extra)
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # else a mount here would reach the host's
        return (
            f"not hidden (mounts not private: {os.strerror(ctypes.get_errno())})",
            "off" if not pidns else "on, but /proc still the grader's",
        )
    hidden = []
    if libc.mount(b"none", b"/dev/pts", b"tmpfs", MS_NOSUID | MS_NOEXEC, b"mode=755,size=4k") == 0:
        hidden.append("/dev/pts")
    for path in sorted({f for p in TERMINALS for f in glob.glob(p)}):
        if libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None) == 0:
            hidden.append(path)
    terminals = "hidden (/dev/pts empty, consoles /dev/null)" if "/dev/pts" in hidden else "not hidden"
    return terminals, "on" if pidns else "off"


def read_only_host(writable: list[str], files: list[str], cuda: bool = False) -> str:
    """In the keeper's own mount namespace (root): every mount read-only but ``writable`` (the scratch directory
    first), ``/dev/shm`` and ``files`` (the observers' logs it appends to), each bound on itself first; with ``cuda``
    the /proc mount itself stays writable (``proc_system_read_only`` keeps the rest of it read-only). Device
    nodes still open for writing (a read-only mount refuses writes to files, directories and links only), so the GPU
    works. Returns what the report says."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    kept = []
    left = []
    for path in [*writable, "/dev/shm", *files]:
        if not path or not os.path.exists(path):
            continue
        if libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None) == 0:
            kept.append(os.path.realpath(path))
            flags = MS_REMOUNT | MS_BIND | MS_NODEV | mount_flags(path)
            if libc.mount(None, path.encode(), None, flags, None) != 0:
                left.append(f"{path} not nodev ({os.strerror(ctypes.get_errno())})")
    devices = hide_devices()
    left += devices[1]
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4].replace("\\040", " ") for line in f]
    except OSError as e:
        return f"writable (mountinfo: {e.strerror})"
    for point in points:
        if any(point == k or point.startswith(k.rstrip("/") + "/") for k in kept) or (cuda and point == "/proc"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | mount_flags(point)
        if libc.mount(None, point.encode(), None, flags, None) != 0:
            left.append(f"{point} ({os.strerror(ctypes.get_errno())})")
    if cuda:
        left += bind_read_only(PROC_DRIVER)
    if left:
        return "partly read-only: still writable " + ", ".join(left[:4]) + (" ..." if len(left) > 4 else "")
    return (
        f"read-only but for {len(kept)} paths (the scratch directory, /dev/shm, the observers' files; nodev), "
        f"{devices[0]} device nodes /dev/null" + ("; /proc as said, /proc/driver read-only" if cuda else "")
    )


def nodev(paths) -> list[str]:
    """Each of ``paths`` that exists bound on itself ``nodev`` (no device node there opens: one another process left
    in the host's /dev/shm, where the sandbox may write under Landlock too); those that could not be, with why."""
    return bind_with(paths, MS_NODEV, MS_REC)


def hide_devices() -> tuple[int, list[str]]:
    """Every device node below /dev (its own file system: not /dev/shm, /dev/pts) but ``DEVICES_KEPT`` and those
    hidden already, with /dev/null bound over it; (how many, those that could not be, with why)."""
    import ctypes
    import stat

    libc = ctypes.CDLL(None, use_errno=True)
    kept = {f for p in DEVICES_KEPT for f in glob.glob(p)}
    try:
        top, null = os.stat("/dev").st_dev, os.stat("/dev/null").st_rdev
    except OSError as e:
        return 0, [f"/dev ({e.strerror})"]
    hidden, left = 0, []
    for d, dirs, names in os.walk("/dev"):
        dirs[:] = [x for x in dirs if _device_of(os.path.join(d, x)) == top]
        for name in names:
            path = os.path.join(d, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) or path in kept or st.st_rdev == null:
                continue
            if libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None) == 0:
                hidden += 1
            else:
                left.append(f"{path} ({os.strerror(ctypes.get_errno())})")
    return hidden, left


def _device_of(path: str) -> int | None:
    """The file system ``path`` lies on (lstat), None where it is gone meanwhile."""
    try:
        return os.lstat(path).st_dev
    except OSError:
        return None


def bind_read_only(paths) -> list[str]:
    """Each of ``paths`` that exists bound on itself read-only; those that could not be, with why."""
    return bind_with(paths, MS_RDONLY)


def bind_with(paths, flag: int, rec: int = 0) -> list[str]:
    """Each of ``paths`` that exists bound on itself (``rec``: MS_REC, its submounts too), then remounted with
    ``flag`` (MS_RDONLY, MS_NODEV) beside the flags it has; those that could not be, with why."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    left = []
    for path in paths:
        if not os.path.exists(path):
            continue
        flags = MS_REMOUNT | MS_BIND | flag | mount_flags(path)
        if (
            libc.mount(path.encode(), path.encode(), None, MS_BIND | rec, None) != 0
            or libc.mount(None, path.encode(), None, flags, None) != 0
        ):
            left.append(f"{path} ({os.strerror(ctypes.get_errno())})")
    return left


def proc_system_read_only(driver: bool = False) -> str:
    """In the keeper's own mount namespace (root), where /proc stays writable for CUDA: ``PROC_READ_ONLY`` bound on
    themselves read-only, and with ``driver`` (Landlock with CUDA, whose rules let /proc be written: a layer the grader
    probes, as the read-only host that binds it too) ``PROC_DRIVER``. Returns what the report says."""
    paths = (*PROC_READ_ONLY, *(PROC_DRIVER if driver else ()))
    left = bind_read_only(paths)
    return "writable (CUDA names its threads there), " + (
        f"but for {', '.join(p.removeprefix('/proc/') for p in paths)}" if not left else f"{', '.join(left)} too"
    )


def mount_flags(point: str) -> int:
    """The nosuid/nodev/noexec flags a mount has (a bind remount must repeat them)."""
    try:
        st = os.statvfs(point)
    except OSError:
        return 0
    return (
        (MS_NOSUID if st.f_flag & os.ST_NOSUID else 0)
        | (MS_NODEV if st.f_flag & os.ST_NODEV else 0)
        | (MS_NOEXEC if st.f_flag & os.ST_NOEXEC else 0)
    )


def proc_mount() -> str:
    """In a new PID namespace's first process: a /proc of that namespace (the grader's processes are not in it)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        return f"on, but /proc still the grader's ({os.strerror(ctypes.get_errno())})"
    return "on"
