"""Root in the sandbox (the grader's uid, with CUDA by default) may not load a kernel module or a kernel: the seccomp
filter denies ``init_module``, ``finit_module``, ``delete_module``, ``kexec_load`` and ``kexec_file_load``. Played
live with an empty module image, which the kernel refuses as no module (ENOEXEC; ENOSYS on a kernel without modules)
where nothing else stops it: nothing is loaded either way."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from gemmlab.sandbox import seccomp

PROBE = textwrap.dedent(
    """
    import ctypes, errno, os, sys
    sys.path.insert(0, os.path.dirname(sys.argv[1]))
    import seccomp

    if sys.argv[2] == "1":
        assert seccomp.install(os.getppid(), os.getpgid(os.getppid())) == []
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 175, "aarch64": 105}[seccomp.platform.machine()]  # init_module
    rc = libc.syscall(nr, None, ctypes.c_ulong(0), b"")  # an empty image: never a module
    print(errno.errorcode.get(ctypes.get_errno(), "?") if rc != 0 else "loaded")
    """
)


def _init_module(filtered: bool) -> str:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, seccomp.__file__, "1" if filtered else "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip()


def test_root_in_the_sandbox_cannot_load_a_kernel_module():
    if platform.machine() not in seccomp.AUDIT_ARCH:
        pytest.skip(f"no seccomp filter for {platform.machine()}")
    if os.geteuid() != 0:
        pytest.skip("shown as root, who may load modules where no filter stops it")
    unfiltered = _init_module(False)
    assert unfiltered != "loaded"
    if unfiltered == "EPERM":
        pytest.skip("this host refuses modules to root already (modules_disabled or a lockdown)")
    # the kernel looked at the image, or has no modules at all (ENOSYS: built without them)
    assert unfiltered in ("ENOEXEC", "EINVAL", "EFAULT", "ENOSYS"), unfiltered
    assert _init_module(True) == "EPERM"  # the filter refused before the kernel looked
