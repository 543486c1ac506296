"""The sandbox's seccomp filter: a classic BPF program, written by hand, that the keeper installs before any candidate
code exists (``keeper.py`` loads this file by path: standard library only). It is inherited by every process and
thread the candidate starts and cannot be removed. Unlike Landlock it works with CUDA: ``ioctl`` stays open but for
the terminal's requests below, so the driver's device ioctls pass.

    program(arch, owner, owner_pgid)   the filter's instructions ((code, jt, jf, k) tuples), or ValueError
    install(owner, owner_pgid)         no_new_privs, then the filter on this thread; returns what could not be had

Denied with EPERM (x86_64 and aarch64; any other architecture refuses, and the keeper says so):
- ``ptrace``, ``process_vm_readv``/``process_vm_writev``, ``kcmp``, ``pidfd_open``, ``pidfd_getfd``,
  ``pidfd_send_signal``: no reading, writing or stopping another process, nor taking its descriptors;
- ``ioctl`` with TIOCSTI, TIOCLINUX (typing into a terminal), TIOCSCTTY (stealing a terminal as the controlling
  one), TIOCCONS (redirecting the console), TIOCSETD (a line discipline): the request is an ``unsigned int``, so only
  the argument's low 32 bits are compared (the kernel drops the high ones too);
- ``prlimit64`` on any process but the caller (pid 0): no SIGXCPU for the grader by a CPU limit;
- ``perf_event_open`` on any process but the caller;
- ``kill``/``tkill``/``tgkill``/``rt_sigqueueinfo``/``rt_tgsigqueueinfo`` aimed at the owner's pid or at one of its
  threads' ids (those it had when the filter was built, up to ``MAX_TIDS``), ``kill`` of the owner's process group
  and of -1 (every process); a thread the owner starts later is not named (a PID namespace, another uid or
  Landlock's signal scope close that too);
- ``setns``, ``unshare``, ``clone`` with a CLONE_NEW* flag, and the mount calls (``mount``, ``umount2``,
  ``pivot_root``, ``open_tree``, ``move_mount``, ``fsopen``, ``fsmount``, ``fspick``, ``mount_setattr``): the
  candidate neither leaves nor rearranges its namespaces (e.g. unmounts the PID namespace's /proc);
- ``open_by_handle_at``: a file by its handle, past the mount namespace (with CAP_DAC_READ_SEARCH, which a sandbox
  of its own uid keeps: ``sandbox.isolate``);
- ``bpf``, ``userfaultfd``, ``keyctl``/``add_key``/``request_key``: kernel attack surface no kernel needs;
- ``fanotify_init``, ``fanotify_mark``: root's permission marks hold every open of a file (or a whole file system)
  by any process on the machine, whatever its namespaces, until the mark's owner answers (deny, or never while
  frozen): the grader's own files and libraries included;
- ``init_module``, ``finit_module``, ``delete_module``, ``kexec_load``, ``kexec_file_load``: root in the sandbox (the
  grader's uid, with CUDA by default) would otherwise load a kernel module of its own (any memory, the grader's
  included) or replace the host's kernel.
``clone3`` fails with ENOSYS, so glibc falls back to ``clone``, which has no CLONE_INTO_CGROUP: no process of the
sandbox is born outside its cgroup. A system call of another ABI (i386 or x32 on x86_64, arm32 on aarch64) fails with
EPERM, so the numbers above cannot be dodged.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0x400000B7}
X32_SYSCALL_BIT = 0x40000000
# system call numbers: x86_64, aarch64 (asm-generic)
NR = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "ioctl": (16, 29),
    "prlimit64": (302, 261),
    "kcmp": (312, 272),
    "pidfd_getfd": (438, 438),
    "pidfd_open": (434, 434),
    "pidfd_send_signal": (424, 424),
    "perf_event_open": (298, 241),
    "clone3": (435, 435),
    "clone": (56, 220),
    "setns": (308, 268),
    "unshare": (272, 97),
    "kill": (62, 129),
    "tkill": (200, 130),
    "tgkill": (234, 131),
    "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "open_by_handle_at": (304, 265),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "fanotify_init": (300, 262),
    "fanotify_mark": (301, 263),
}
DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "setns",
    "unshare",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsmount",
    "fspick",
    "mount_setattr",
    "bpf",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "open_by_handle_at",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "fanotify_init",
    "fanotify_mark",
)
TTY_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C, "TIOCSCTTY": 0x540E, "TIOCCONS": 0x541D, "TIOCSETD": 0x5423}
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000  # NS..NET

# classic BPF
LD_W_ABS, JA, JEQ, JGE, JSET, RET = 0x20, 0x05, 0x15, 0x35, 0x45, 0x06
MAX_TIDS = 250  # of the owner's threads named in the filter (a conditional jump reaches 255 ahead)
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def _arg(i: int) -> int:
    """Offset of the low 32 bits of argument ``i`` in ``struct seccomp_data`` (little-endian)."""
    return 16 + 8 * i


def program(arch: str, owner: int, owner_pgid: int, tids=()) -> list[tuple[int, int, int, int]]:
    """The filter for ``arch`` (``platform.machine()``), naming ``owner`` (the grader's pid), its process group and
    its threads' ids ``tids`` (the first ``MAX_TIDS``); ValueError for an architecture it has no numbers for."""
    if arch not in AUDIT_ARCH:
        raise ValueError(f"no seccomp filter for the {arch} architecture (x86_64 and aarch64 only)")
    col = 0 if arch == "x86_64" else 1
    eperm = ERRNO | errno.EPERM
    me = lambda v: v & 0xFFFFFFFF  # noqa: E731 (a pid_t as the filter sees its low word)
    # (syscall, argument, values that deny) for calls judged by one argument; the rest of each allowed
    by_arg = [("ioctl", 1, list(TTY_IOCTLS.values())), ("kill", 0, [me(-owner_pgid), me(-1)])]
    signals = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # then: the owner's ids
    ids = sorted({owner, *tids} - {0})[:MAX_TIDS]
    code: list = [("ld", 4), ("jeq", AUDIT_ARCH[arch], None, "foreign"), ("ld", 0)]
    if arch == "x86_64":
        code.append(("jge", X32_SYSCALL_BIT, "foreign", None))
    code += [("jeq", NR[n][col], "deny", None) for n in DENIED]
    code += [("jeq", NR["clone3"][col], "enosys", None)]
    code += [("jeq", NR[n][col], n, None) for n in ("prlimit64", "perf_event_open", "clone")]
    code += [("jeq", NR[n][col], n, None) for n in ("ioctl", *signals)]
    code += [("ret", ALLOW)]
    for n, i, values in by_arg:
        code += [("label", n), ("ld", _arg(i))] + [("jeq", v, "deny", None) for v in values]
        code += [("ja", "owner")] if n == "kill" else [("ret", ALLOW)]
    for n in signals[1:]:
        code += [("label", n), ("ld", _arg(0)), ("ja", "owner")]
    pid = {"prlimit64": 0, "perf_event_open": 1}
    for n, i in pid.items():  # only the caller itself (pid 0)
        code += [("label", n), ("ld", _arg(i)), ("jeq", 0, None, "deny"), ("ret", ALLOW)]
    code += [("label", "clone"), ("ld", _arg(0)), ("jset", CLONE_NEW, "deny", None), ("ret", ALLOW)]
    code += [
        ("label", "deny"),
        ("ret", eperm),
        ("label", "foreign"),
        ("ret", eperm),
        ("label", "enosys"),
        ("ret", ERRNO | errno.ENOSYS),
    ]
    # last, reached by "ja" alone (no conditional jump passes over it)
    code += [("label", "owner")] + [("jeq", v, "deny_id", None) for v in ids]
    code += [("ret", ALLOW), ("label", "deny_id"), ("ret", eperm)]
    return _assemble(code)


def _assemble(code: list) -> list[tuple[int, int, int, int]]:
    """Resolve labels: a jump's target None is the next instruction; forward jumps of at most 255 only."""
    at, n = {}, 0
    for ins in code:
        if ins[0] == "label":
            at[ins[1]] = n
        else:
            n += 1
    out, n = [], 0
    for ins in code:
        op = ins[0]
        if op == "label":
            continue
        if op == "ld":
            out.append((LD_W_ABS, 0, 0, ins[1]))
        elif op == "ret":
            out.append((RET, 0, 0, ins[1]))
        elif op == "ja":  # unconditional: a 32-bit offset
            out.append((JA, 0, 0, at[ins[1]] - n - 1))
        else:
            jt, jf = (0 if t is None else at[t] - n - 1 for t in ins[2:4])
            if not (0 <= jt <= 255 and 0 <= jf <= 255):
                raise ValueError(f"seccomp program: a jump out of range at {n}")
            out.append(({"jeq": JEQ, "jge": JGE, "jset": JSET}[op], jt, jf, ins[1]))
        n += 1
    return out


def run(prog: list[tuple[int, int, int, int]], nr: int, args=(), arch: str = "x86_64") -> int:
    """What ``prog`` returns for a system call (an interpreter of the instructions above, for tests)."""
    words = struct.pack("<iIQ6Q", nr, AUDIT_ARCH.get(arch, 0), 0, *(list(args) + [0] * 6)[:6])
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == RET:
            return k
        if code == JA:
            pc += 1 + k
            continue
        if code == LD_W_ABS:
            acc = struct.unpack_from("<I", words, k)[0]
            pc += 1
            continue
        hit = {JEQ: acc == k, JGE: acc >= k, JSET: bool(acc & k)}[code]
        pc += 1 + (jt if hit else jf)


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def install(owner: int, owner_pgid: int) -> list[str]:
    """Set no_new_privs and install the filter on the calling thread (inherited by its children); returns what could
    not be had ([]: the filter is in force)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{owner}/task")]
    except (OSError, ValueError):
        tids = []
    try:
        prog = program(platform.machine(), owner, owner_pgid, tids)
    except ValueError as e:
        return [str(e)]
    libc = ctypes.CDLL(None, use_errno=True)
    insns = (_Filter * len(prog))(*[_Filter(*i) for i in prog])
    fprog = _Prog(len(prog), insns)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return [f"no_new_privs: {os.strerror(ctypes.get_errno())}"]
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return [f"no filter: {os.strerror(ctypes.get_errno())}"]
    return []
