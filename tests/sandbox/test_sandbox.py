"""The sandbox's guards (gemmlab.sandbox), each shown on a known-bad kernel (tests/bad_kernels/containment.py): the
child holds nothing the grader trusts, a malformed reply is one line, a fork storm stays frozen, a disturbed baseline
fails the candidate, CUDA IPC maps only the slots. Sizes are tiny: the candidates are torch-op kernels."""

import json
import multiprocessing.resource_sharer
import subprocess
import sys
import time

import pytest
import torch

from gemmlab.grade import grade
from gemmlab.sandbox import box as sandbox_box
from gemmlab.sandbox import contain, sched, share
from gemmlab.sandbox.box import Sandbox
from gemmlab.sandbox.replies import checked
from tests.child import no_interpreter_env
from tests.grade.test_grade import TINY, _cli, failed_rules
from tests.paths import BAD_KERNELS

BOX = str(BAD_KERNELS / "containment.py")


def run_box(fn, **kw):
    return grade(TINY, kernel=f"{BOX}:{fn}", **kw)


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    """Where the bad kernels note what they did: writable for them (the owner's GEMMLAB_SANDBOX_WRITABLE)."""
    monkeypatch.setenv("BAD_KERNEL_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMLAB_SANDBOX_WRITABLE", str(tmp_path))
    return tmp_path


def test_the_child_holds_no_key_to_the_grader(out_dir):
    """A kernel that does no work tries to run code in the grader through multiprocessing (the resource sharer,
    with the authkey its process holds): no listener of the grader's exists, and its key opens nothing."""
    r = run_box("connects_to_owner")
    assert (out_dir / "tried").read_text() == "0"  # no listener accepted its key
    time.sleep(0.5)
    assert not (out_dir / "pwned").exists()
    assert multiprocessing.resource_sharer._resource_sharer._listener is None  # never started in the grader
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"poison-freshness"}, r["failures"]


def _landlock_abi() -> int:
    import ctypes

    return ctypes.CDLL(None, use_errno=True).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))


def test_the_sandbox_cannot_signal_or_read_the_grader(out_dir, monkeypatch):
    """In its Landlock domain the candidate can signal neither the grader nor the baseline (no kill, no SIGSTOP)
    and cannot open the grader's memory, though it runs as the same user (here: root)."""
    if _landlock_abi() < 6:
        pytest.skip("Landlock ABI 6 (Linux 6.12+) is not available here")
    monkeypatch.setenv("GEMMLAB_SANDBOX_LANDLOCK", "1")
    r = run_box("reaches_outside")
    reach = json.loads((out_dir / "reach.json").read_text())
    assert set(reach) == {"grader_signal", "baseline_signal", "grader_mem"}
    assert all(v is not True and v != "none" for v in reach.values()), reach
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]  # an honest kernel still
    # passes (INCONCLUSIVE: every rule passed, the timing could not score)


def test_a_pickle_frame_on_the_channel_is_never_loaded(out_dir):
    r = run_box("sends_pickle_frame")
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"isolation"} and "not JSON" in r["failures"][0]["reason"]
    assert not (out_dir / "pwned").exists()


@pytest.mark.parametrize(
    "forged,field",
    [
        ({"kernels": 5}, "kernels"),
        ({"path": [1]}, "path"),
        ({"problem": {"why": 1}}, "problem"),
        ({"problem": "x" * 100_000}, "problem"),
        ({"error": ["boom"]}, "error"),
        ({"ms": ["fast"]}, "ms"),  # only timed replies hold "ms": the forgery reaches the timed batches
    ],
)
def test_a_malformed_reply_fails_with_one_line(out_dir, monkeypatch, forged, field):
    monkeypatch.setenv("BAD_REPLY", json.dumps(forged))
    r = run_box("forges_replies")
    assert r["verdict"] == "FAIL", r
    first = r["failures"][0]
    assert first["rule"] == "isolation" and f"field {field!r}" in first["reason"], first
    assert "malformed reply" in first["reason"] and "\n" not in first["reason"]


def test_a_malformed_reply_through_the_cli_is_a_report_not_a_traceback(tmp_path):
    r = _cli(
        "--cases",
        TINY,
        "--kernel",
        f"{BOX}:forges_replies",
        "--output-dir",
        str(tmp_path / "out"),
        env={"BAD_REPLY": json.dumps({"ops": {"aten::mm": 1}}), "BAD_KERNEL_OUT_DIR": str(tmp_path)},
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "FAIL" and "field 'ops'" in report["failures"][0]["reason"]


def test_reply_checks():
    """One place checks every field the owner reads; a good reply passes whole, extras are dropped."""
    good = {"problem": None, "kernels": ["k"], "ops": [], "path": "portable", "extra": object()}
    assert checked("call", good, {}) == {"problem": None, "kernels": ["k"], "ops": [], "path": "portable"}
    run = {"ms": [0.1, 0.2], "problem": None, "held_ms": 0.0, "loop_ms": 0.4}
    assert checked("run", run, {"order": [0, 1]})["ms"] == [0.1, 0.2]
    for op, reply, req, words in (
        ("call", {**good, "kernels": "k"}, {}, "'kernels'"),
        ("call", {"problem": None, "kernels": [], "ops": []}, {}, "'path' is missing"),
        ("run", {**run, "ms": [0.1]}, {"order": [0, 1]}, "a list of 2 times"),
        ("run", {**run, "ms": [0.1, float("nan")]}, {"order": [0, 1]}, "'ms'"),
        ("run", {**run, "ms": [0.1, True]}, {"order": [0, 1]}, "'ms'"),
        ("run", {**run, "held_ms": -1}, {"order": [0, 1]}, "'held_ms'"),
        ("call", {"error": 3}, {}, "'error'"),
        ("hello", {"ok": "yes", "error": None}, {}, "'ok'"),
    ):
        with pytest.raises(ValueError, match=words):
            checked(op, reply, req)


# -------------------------------------------------------------------------------------------- freezing


def _beat(path):
    for _ in range(100):
        try:
            text = path.read_text()
            if text:
                return int(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.002)
    return None


@pytest.mark.parametrize("mode", ["cgroup", "signals"])
def test_a_fork_storm_stays_frozen_while_the_other_side_runs(out_dir, monkeypatch, mode, device):
    """A helper that forks and exits every millisecond: frozen, it must not run at all while the baseline's
    window is open (its heartbeat file stands still), in ten windows out of ten."""
    if mode == "signals":
        monkeypatch.setattr(contain.Freezer, "make", classmethod(lambda cls, tag: None))
    else:
        probe = contain.Freezer.make("probe")
        if probe is None:
            pytest.skip("no writable cgroup freezer here")
        probe.remove()
    monkeypatch.setenv("BAD_STORM_NOW", "1")
    cand = Sandbox(f"{BOX}:fork_storm", "colmajor", "colmajor", 30.0, device == "cpu", str(out_dir))
    base = Sandbox("builtin:cublas", "colmajor", "colmajor", 30.0, device == "cpu", str(out_dir), name="baseline")
    a, b = torch.rand(4, 4, dtype=torch.float16).t(), torch.rand(4, 4, dtype=torch.float16).t()
    slots = [((a, b), torch.full((16,), float("nan"), dtype=torch.float16))]
    try:
        for box in (cand, base):
            box.bind(slots)
        cand.request("call", slot=0)  # starts the storm
        assert _beat(out_dir / "heartbeat") is not None
        escapes = []
        for _ in range(10):
            time.sleep(0.02)  # the storm runs free for a while (the candidate's window)
            cand.freeze()
            base.thaw()
            before = _beat(out_dir / "heartbeat")
            base.request("run", order=[0] * 20)
            time.sleep(0.05)
            after = _beat(out_dir / "heartbeat")
            base.freeze()  # also checks that the frozen candidate used no CPU meanwhile
            escapes.append(after != before)
            cand.thaw()
        assert not any(escapes), escapes
    finally:
        cand.close()
        base.close()
    assert not cand.members()


def _zombie_with_threads(pid: int) -> bool:
    """Whether /proc reads ``pid`` as a zombie while a thread of it lives (read here, not through contain)."""
    import os

    def letter(path):
        try:
            text = open(path).read()
        except OSError:
            return ""
        return text[text.rfind(")") + 2]

    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return letter(f"/proc/{pid}/stat") == "Z" and any(letter(f"/proc/{pid}/task/{t}/stat") not in "ZX" for t in tasks)


@pytest.mark.parametrize("mode", ["cgroup", "signals"])
def test_a_helper_whose_main_thread_exited_stays_frozen(out_dir, mode):
    """A helper whose main thread exited reads as a zombie in /proc while its other thread works: a freeze by
    signals took it for held. Frozen, its heartbeat stands still, in five windows out of five."""
    import platform

    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the bad kernel exits its main thread by the x86_64 or aarch64 system call number")
    make = contain.Freezer.make
    cand = Sandbox(f"{BOX}:zombie_leader", "colmajor", "colmajor", 60.0, True, str(out_dir))
    a = torch.rand(4, 4, dtype=torch.float16).t()
    try:
        if mode == "signals":
            contain.Freezer.make = classmethod(lambda cls, tag: None)
        cand.bind([((a, a), torch.full((16,), float("nan"), dtype=torch.float16))])
        cand.request("call", slot=0)  # leaves the helper
        assert _beat(out_dir / "heartbeat") is not None
        deadline = time.monotonic() + 60
        while not any(_zombie_with_threads(p) for p in cand.members()):
            assert time.monotonic() < deadline, "the helper's main thread never exited"
            time.sleep(0.01)
        moved = []
        for _ in range(5):
            cand.freeze()
            before = _beat(out_dir / "heartbeat")
            time.sleep(0.1)
            moved.append(_beat(out_dir / "heartbeat") != before)
            cand.thaw()
            time.sleep(0.02)
        assert not any(moved), moved
    finally:
        contain.Freezer.make = make
        cand.close()
    assert not cand.members()


def test_a_fork_storm_cannot_hold_the_baseline(out_dir):
    """Graded, the storm's helper stops the baseline whenever it sees it use CPU: frozen through every baseline
    window, it never does (or the grade fails by isolation, or the held batches were run again)."""
    r = run_box("fork_storm")
    stops = out_dir / "stops"
    held = stops.read_text().split() if stops.exists() else []
    seen = (r["verdict"] == "FAIL" and failed_rules(r) == {"isolation"}) or (r.get("performance") or {}).get(
        "held_retries", 0
    ) > 0
    assert not held or seen, (held, r["failures"])
    assert (out_dir / "heartbeat").exists()  # the storm did run


@pytest.mark.parametrize("uid,undumpable", [("1", "1"), ("0", "1"), ("0", "0")])
def test_renicing_the_baseline_fails_the_candidate(out_dir, monkeypatch, uid, undumpable):
    """SCHED_IDLE and nice 19 for the baseline's threads: refused where each sandbox has a uid of its own, or root of
    the grader's uid has no capability (the undumpable layer; the kernel asks CAP_SYS_NICE of a caller whose
    capabilities do not include the target's): the grade passes, it gained nothing; where it lands (the grader not
    root, or root's capabilities kept), the grade fails."""
    monkeypatch.setenv("GEMMLAB_SANDBOX_UID", uid)
    monkeypatch.setenv("GEMMLAB_SANDBOX_UNDUMPABLE", undumpable)
    r = run_box("renices_baseline")
    assert (out_dir / "reniced").exists(), ("no timed call ran", r["verdict"], r["failures"])
    reniced = max(int(n) for n in (out_dir / "reniced").read_text().split())
    own_uid = r["isolation"]["candidate"]["uid"].split()[0] != "0"
    powerless = "nor any other capability" in r["isolation"]["candidate"]["ptrace"]
    if (uid == "1" and own_uid) or powerless:
        assert reniced == 0 and r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]
        return
    assert reniced > 0  # it reached the baseline
    assert r["verdict"] == "FAIL" and failed_rules(r) == {"isolation"}, r["failures"]
    reason = r["failures"][0]["reason"]
    assert "baseline" in reason and "scheduling" in reason and "SCHED_IDLE" in reason, reason


def test_a_stopped_baseline_is_seen(tmp_path, device):
    """The progress check: a trusted sandbox held off the CPU during its batch (here SIGSTOP from the test, as an
    escaped helper would send) fails, though its own clock and the grader's cannot tell a stop from slow work."""
    import os
    import signal
    import threading

    base = Sandbox("builtin:empty", "colmajor", "colmajor", 30.0, device == "cpu", str(tmp_path), name="baseline")
    a = torch.rand(4, 4, dtype=torch.float16)
    base.bind([((a, a), torch.full((16,), float("nan"), dtype=torch.float16))])
    table = contain.procs()
    members = base.members()  # the server: the one with no child (under bubblewrap, not the keeper's parent's child)
    server = next(p for p in members if not any(table[q][0] == p for q in members if q in table))

    def hold():
        deadline = time.monotonic() + 10
        while contain.state(server) != "R" and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # past decoding the request: inside the batch's loop
        os.kill(server, signal.SIGSTOP)
        time.sleep(2.0)
        os.kill(server, signal.SIGCONT)

    try:
        calm = base.request("run", order=[0] * 5, fn="empty")
        assert calm["held_ms"] <= sandbox_box.HELD_MS and base.held_off(calm) is None  # undisturbed
        threading.Thread(target=hold, daemon=True).start()
        held = base.request("run", order=[0] * 50_000)  # builtin:empty through the signature: 0.4 s or more
        assert "held off the CPU" in (base.held_off(held) or ""), held
        assert base.request("run", order=[0] * 5, fn="empty")["held_ms"] <= sandbox_box.HELD_MS  # still usable
    finally:
        base.close()


def _renice_group(box, nice: int) -> None:
    for pid in box.members():
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))


@pytest.mark.parametrize("when", ["in its window", "after its last window"])
def test_a_reniced_autogroup_of_the_baseline_is_seen(tmp_path, when):
    """The baseline never sets its own autogroup: one whose nice value is not the owner's fails, whenever the write
    landed: during the baseline's own window (so its freeze records it: comparing with that record alone misses
    it) or after its last window (no later ``ready`` would compare: ``check_held``, after the last round)."""
    if sched.autogroup_nice(sched.autogroup("self")) is None:
        pytest.skip("no autogroups here")
    base = Sandbox("builtin:empty", "colmajor", "colmajor", 30.0, True, str(tmp_path), name="baseline")
    a = torch.rand(4, 4, dtype=torch.float16)
    try:
        base.bind([((a, a), torch.full((16,), float("nan"), dtype=torch.float16))])
        base.freeze()
        base.check_held()  # undisturbed: nothing to see
        base.thaw()
        if when == "in its window":
            _renice_group(base, 19)
            with pytest.raises(sandbox_box.WorkerFailure, match="autogroup was reniced"):
                base.freeze()
        else:
            base.freeze()
            _renice_group(base, 19)
            with pytest.raises(sandbox_box.WorkerFailure, match="autogroup was reniced"):
                base.check_held()
    finally:
        base.close()


# -------------------------------------------------------------------------------------------- CUDA IPC


def test_shared_cpu_memory_crosses_as_descriptors_only():
    """CPU slots cross as file descriptors of their own storages: rebuilt, they alias the owner's memory."""
    import os

    a, out = torch.rand(3, 5), torch.full((7,), float("nan"))
    meta, fds = share.export([((a, a.t()), out)])
    assert [m["kind"] for m in meta["storages"]] == ["fd", "fd"] and len(fds) == 2
    json.dumps(meta)  # plain data
    (x, xt), y = share.rebuild(meta, [os.dup(fd) for fd in fds])[0]
    assert torch.equal(x, a) and torch.equal(xt, a.t())
    y.fill_(1.0)
    assert bool((out == 1).all())


@pytest.mark.gpu
def test_cuda_ipc_shares_only_the_slots():
    """A slot's IPC handle maps its whole allocator segment: that segment must hold slots and nothing of the
    grader's (private copies, references), and a tensor from outside slot_memory cannot be bound."""
    dev = torch.device("cuda", torch.cuda.current_device())
    private_big, private_small = torch.randn(1 << 20, device=dev), torch.randn(100, device=dev)
    with share.slot_memory(dev):
        slot_big, slot_small = torch.randn(1 << 20, device=dev), torch.randn(100, device=dev)
    private_after = torch.randn(100, device=dev)
    segments = share.pool_segments(dev)
    assert segments

    def inside(t):
        return any(a <= t.data_ptr() < a + n for a, n in segments)

    assert inside(slot_big) and inside(slot_small)
    assert not any(inside(t) for t in (private_big, private_small, private_after))
    snapshot = {s["address"]: s for s in torch.cuda.memory_snapshot()}
    for slot in (slot_big, slot_small):
        st = slot.untyped_storage()
        _, _, size, offset, *_ = st._share_cuda_()
        seg = snapshot[st.data_ptr() - offset]  # what the handle maps: the segment from its base
        assert (seg["address"], seg["total_size"]) in segments
        ours, addr = {slot_big.data_ptr(), slot_small.data_ptr()}, seg["address"]
        for blk in seg["blocks"]:  # in address order, from the segment's base
            assert blk["state"] != "active_allocated" or addr in ours, f"a block at {addr:#x} is not a slot"
            addr += blk["size"]
    with pytest.raises(ValueError, match="slot_memory"):
        share.export([((private_big,), slot_small)])


# -------------------------------------------------------------------------------------------- the report


def grade_cli(*args, env, timeout=300):
    """`gemmlab grade` in a subprocess; None if it hangs past ``timeout`` (killed)."""
    import subprocess
    import sys

    env = {**no_interpreter_env(), **env}
    try:
        return subprocess.run(
            [sys.executable, "-m", "gemmlab", "grade", *args], capture_output=True, text=True, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.parametrize(
    "mode,code,words",
    [
        ("fifo", 1, None),  # FIFOs at the old temporary names and a forged PASS report.json: no hang, our report
        ("tmp-symlink", 1, None),  # symlinks at the old temporary names: nothing written through them
        ("symlink", 2, "a symlink"),  # report.json a symlink: refused in one line, the target untouched
        ("fifo-report", 2, "not a plain file"),  # report.json a FIFO: refused, no hang
    ],
)
def test_the_report_is_never_written_through_what_the_candidate_placed(tmp_path, mode, code, words):
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    victim.write_text("precious")
    r = grade_cli(
        "--cases",
        TINY,
        "--kernel",
        f"{BOX}:sabotages_report",
        "--output-dir",
        str(out),
        env={
            "BAD_REPORT_DIR": str(out),
            "BAD_REPORT_MODE": mode,
            "BAD_VICTIM": str(victim),
            "GEMMLAB_SANDBOX_WRITABLE": str(tmp_path),  # as where no Landlock domain stops it
            "GEMMLAB_SANDBOX_UID": "0",
        },
    )  # nor a uid of its own: the writes must land to be tested
    assert r is not None, "the grader hung"
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert victim.read_text() == "precious"
    report = out / "report.json"
    if code == 1:
        assert report.is_file() and not report.is_symlink()
        written = json.loads(report.read_text())
        assert written["verdict"] == "FAIL" and "forged" not in written
        assert "FAIL" in r.stdout
    else:
        lines = r.stderr.strip().splitlines()  # the progress's plain lines on a pipe, then the refusal
        assert "Traceback" not in r.stderr and [x for x in lines if not x.startswith("grading ")] == lines[-1:]
        assert words in lines[-1] and "report.json" in lines[-1], r.stderr[-2000:]


def test_write_files_refuses_a_symlinked_directory(tmp_path):
    from gemmlab import output

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(output.ReportPathError, match="a symlink"):
        output.write_files(tmp_path / "link", {"r.json": "{}"})
    assert output.write_files(tmp_path / "real", {"r.json": "{}"}) == [tmp_path / "real" / "r.json"]
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == [output.MANIFEST, "r.json"]  # no temporary file


@pytest.mark.gpu
@pytest.mark.xfail(
    reason="open: under the opt-in Landlock domain the child's cudaGetDeviceCount() fails (error 304, "
    "cudaErrorOperatingSystem); the default keeps Landlock off with CUDA",
    strict=False,
)
def test_landlock_with_cuda(out_dir, monkeypatch):
    """GEMMLAB_SANDBOX_LANDLOCK=1 with CUDA: the children still open the slots' IPC handles and gemmlab's own kernel
    passes, and the candidate reaches nothing outside (what the default could turn on with CUDA once this passes)."""
    if _landlock_abi() < 6:
        pytest.skip("Landlock ABI 6 (Linux 6.12+) is not available here")
    monkeypatch.setenv("GEMMLAB_SANDBOX_LANDLOCK", "1")
    assert grade(TINY)["verdict"] in ("PASS", "INCONCLUSIVE")
    r = run_box("reaches_outside")
    reach = json.loads((out_dir / "reach.json").read_text())
    assert all(v is not True and v != "none" for v in reach.values()), reach
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]


def test_cpu_children_compute_on_one_thread(monkeypatch):
    """Without CUDA both sides get pools of one thread (a main thread waiting on a pool would read as held off the
    CPU); with CUDA the owner's settings pass through unchanged."""
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    cpu, gpu = sandbox_box.child_env(True), sandbox_box.child_env(False)
    assert all(cpu[v] == "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"))
    assert gpu["OMP_NUM_THREADS"] == "7" and "TRITON_INTERPRET" not in gpu
    code = "import torch; print(torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env=cpu, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "1", out.stderr
