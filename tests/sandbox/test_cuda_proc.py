"""What a sandbox that runs CUDA needs of /proc, and what it still may not write there (``keeper --cuda``).

cuInit names its threads by writing ``/proc/PID/task/TID/comm``; where it cannot (a read-only /proc, or /proc outside
a Landlock domain's rules) it fails with error 304, as it did on the H200 under both (benchmarks/cuda_mounts.py finds
which mounts CUDA writes to). With ``--cuda`` the keeper keeps /proc writable and its system files (``/proc/sys``,
``/proc/sysrq-trigger``, ...) read-only, under the read-only host and under Landlock alike. Played here on the CPU,
in a process of the test's own: a thread's name written, a sysctl and a host file not."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.paths import REPO

PROBE = textwrap.dedent(
    """
    import ctypes, json, os, sys, tempfile, threading
    from gemmlab.sandbox import keeper, mounts

    mode, cuda, host_file = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    libc = ctypes.CDLL(None, use_errno=True)
    scratch = tempfile.mkdtemp()
    assert libc.unshare(mounts.CLONE_NEWNS) == 0
    assert libc.mount(None, b"/", None, mounts.MS_REC | mounts.MS_PRIVATE, None) == 0
    said = {"proc": mounts.proc_system_read_only(mode == "landlock") if cuda else None}
    if mode == "read-only":
        said["host"] = mounts.read_only_host([scratch], [], cuda)
    else:
        said["landlock"] = keeper.landlock([scratch], cuda)

    def write(path, text):
        try:
            with open(path, "w") as f:
                f.write(text)
            return "ok"
        except OSError as e:
            return e.strerror

    def opened(path):
        try:
            os.close(os.open(path, os.O_WRONLY))
            return "ok"
        except OSError as e:
            return e.strerror

    sysctl = "/proc/sys/kernel/domainname"
    t = threading.Thread(target=__import__("time").sleep, args=(0.3,))
    t.start()
    found = {
        "comm": write(f"/proc/self/task/{t.native_id}/comm", "named"),
        "sysctl": write(sysctl, open(sysctl).read().strip()),  # its own value back: nothing changes where it works
        "host": write(host_file, "x"),
        "scratch": write(scratch + "/f", "x"),
        "mtrr": opened("/proc/mtrr"),  # the memory types of the host's RAM: only opened, never written
        "driver_read_only": bool(os.statvfs("/proc/driver").f_flag & os.ST_RDONLY),  # the GPU driver's files
    }
    t.join()
    print(json.dumps({"said": said, "found": found}))
    """
)


def probe(mode: str, cuda: bool, host_file: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    cmd = [sys.executable, "-c", PROBE, mode, "1" if cuda else "0", host_file]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["read-only", "landlock"])
@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda"])
def test_with_cuda_proc_stays_writable_but_its_system_files(tmp_path, mode, cuda):
    if os.geteuid() != 0:
        pytest.skip("a mount namespace of the test's own needs root")
    host_file = tmp_path / "host"
    r = probe(mode, cuda, str(host_file))
    said, found = r["said"], r["found"]
    if mode == "landlock" and said["landlock"] and said["landlock"][0].startswith(("no Landlock", "landlock_")):
        pytest.skip(f"no Landlock here: {said['landlock']}")
    assert found["scratch"] == "ok" and found["host"] != "ok" and not host_file.exists(), r
    assert found["sysctl"] != "ok", r  # never writable, with CUDA or without
    assert found["mtrr"] != "ok", r  # nor the host's hardware files (here "No such file..." where it has none)
    assert (found["comm"] == "ok") == cuda, r  # a thread's name: only with CUDA, which needs it
    if cuda:
        assert said["proc"].startswith("writable (CUDA names its threads there), but for sys"), said
    if mode == "read-only":
        assert said["host"].startswith("read-only but for") and ("/proc as said" in said["host"]) == cuda, said
        assert found["driver_read_only"], r  # with CUDA its own bind; without, /proc itself is read-only
    elif cuda:  # Landlock lets CUDA write below /proc: the GPU driver's files are bound read-only all the same
        assert found["driver_read_only"] and said["proc"].endswith(", driver"), r
