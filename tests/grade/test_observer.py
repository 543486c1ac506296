"""The kernel observer on the CPU: the policy table, the names Triton kernels have, the channel's MACs, and
kernel_observer.so itself in a child process against a fake libcupti (tests/grade/fake_cupti.c plays the driver:
launches, graph launches, copies, and a candidate's tampering through dlsym). Every silence, bypass and
forgery the grader must catch is fed in and seen caught; the words the CPU's verdict line prints are checked
on a graded kernel that calls torch.mm only inside timed calls."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemmlab.grade import observer
from gemmlab.grade.preload import Unavailable, channel, cupti
from tests.paths import BAD_KERNELS, CASES

HERE = Path(__file__).resolve().parent  # fake_cupti.c


def _headers():
    try:
        return cupti.include_dirs()
    except Unavailable:
        return None


needs_build = pytest.mark.skipif(
    shutil.which("cc") is None or _headers() is None, reason="needs a C compiler and CUPTI headers"
)

# ------------------------------------------------------------------------------------------- policy

NVJET = "nvjet_sm90_hsh_64x48_64x15_2x4_h_bz_NNT"
CUTLASS = (
    "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6kernel13GemmUniversal"
    "INS5_16GroupProblemShapeEEEEEvNT_6ParamsE"
)
ELEMENTWISE = (
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIN3c104HalfEEESt5arrayIPcLm1EEEEviT0_T1_"
)


@pytest.mark.parametrize(
    "name,category,family",
    [
        (NVJET, "vendor", "cuBLAS (nvjet)"),
        (CUTLASS, "vendor", "CUTLASS"),
        (
            "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
            "vendor",
            "cuBLAS/cuDNN (xmma)",
        ),
        ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "vendor", "cuBLAS"),
        ("_Z15gemv2T_kernel_valIii6__halfS0_fLi128ELi16ELi4ELi4ELb0ELb0EEvT4_", "vendor", "cuBLAS"),
        ("_Z19splitKreduce_kernelILi32ELi16EiffffLb1ELb0EEv", "vendor", "cuBLAS"),
        ("_ZN5cudnn19engines_precompiled16nchwToNhwcKernelIfEEvT_", "vendor", "cuDNN"),
        ("_ZN13pytorch_flash15flash_fwd_kernelI23Flash_fwd_kernel_traits", "vendor", "flash attention"),
        ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "vendor", "CUTLASS"),
        ("_ZN2at4cuda6detail25prepare_grouped_gemm_dataIN7cutlass10bfloat16_t", "vendor", "CUTLASS"),
        ("_ZN2at4cuda6detail25prepare_grouped_gemm_dataIfEEvPT_", "vendor", "GEMM-class name not compiled by Triton"),
        (ELEMENTWISE, "allowed", "torch elementwise"),
        ("_ZN2at6native21index_elementwise_kernelILi128ELi4EZNS0_16gpu_index_kernel", "allowed", "torch elementwise"),
        ("_ZN2at6native18radixSortKVInPlaceILin2ELin1ELi16ELi2EfljEEvNS_4cuda6detail", "allowed", "torch sort"),
        ("_ZN14at_cuda_detail3cub30DeviceRadixSortOnesweepKernelINS0_", "allowed", "torch sort"),
        ("_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_7MeanOps", "allowed", "torch reduce"),
        (
            "_ZN2at6native27indexSelectLargeIndexIN3c104HalfElljLi2ELi2ELin2ELb1EEEvNS_4cuda6detail",
            "allowed",
            "torch index",
        ),
        ("_gemm_tma_splitk_kernel", "triton", "Triton"),
        ("my_own_cuda_kernel", "unknown", "unknown"),
        ("my_gemm", "vendor", "GEMM-class name not compiled by Triton"),
        ("_ZN2at6native27upsample_bilinear2d_out_frame", "unknown", "unknown"),
    ],
)
def test_policy_sorts_kernel_names(name, category, family):
    triton = {"_gemm_tma_splitk_kernel", "add", "nvjet_sm90_hsh_64x48_64x15_2x4_h_bz_NNT"}
    assert observer.classify(name, triton) == (category, family)


def test_a_triton_kernel_named_like_a_vendor_kernel_stays_vendor():
    """A candidate cannot whitelist cuBLAS's kernels by defining a Triton function of the same name."""
    assert observer.classify(NVJET, {NVJET})[0] == "vendor"
    assert observer.classify("matmul_kernel", {"matmul_kernel"}) == ("triton", "Triton")
    assert observer.classify("matmul_kernel", set())[0] == "vendor"


def test_triton_names_are_read_from_source_without_running_it(tmp_path):
    src = tmp_path / "cand.py"
    src.write_text(
        textwrap.dedent("""
        import triton, triton.language as tl
        from triton import jit
        raise SystemExit("never run")
        @triton.jit
        def matmul_kernel(a): pass
        @triton.autotune(configs=[], key=[])
        @triton.jit(do_not_specialize=["n"])
        def tuned(a, n): pass
        @jit
        def plain(a): pass
        def not_a_kernel(a): pass
    """)
    )
    (tmp_path / "helper.py").write_text("import triton\n@triton.jit\ndef helper_kernel(x): pass\n")
    (tmp_path / "broken.py").write_text("def (:\n")
    files = observer.source_files(f"{src}:fn")
    names = observer.triton_names(files)
    assert {"matmul_kernel", "tuned", "plain", "helper_kernel"} <= names and "not_a_kernel" not in names
    assert any("gemm" in n and n.endswith("_kernel") for n in names)  # gemmlab's own kernels are always known
    assert observer.source_files("builtin:cublas:x") == observer.source_files(None)


def test_kernels_of_triton_libraries_are_known_from_triton_s_cache(tmp_path, monkeypatch):
    (tmp_path / "abc123").mkdir()
    (tmp_path / "abc123" / "_matmul_ogs_NNT_bf16xbf16.cubin").write_bytes(b"")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    names = ["_matmul_ogs_NNT_bf16xbf16", "my_gemm", "../x", "a*"]
    assert observer.compiled_by_triton(names) == {"_matmul_ogs_NNT_bf16xbf16"}


def test_assess_finds_vendor_silence_and_unknown_names():
    ep = channel.Epoch(
        names={NVJET: (2, 0, 2), "mine": (2, 0, 2), ELEMENTWISE: (1, 0, 1)}, totals={"kernels": 5, "callbacks": 1}
    )
    vendor, problems, unknown = observer.assess(ep, 5, set())
    assert vendor == [f"cuBLAS (nvjet): {NVJET}"] and problems == [] and unknown == ["mine"]
    quiet = channel.Epoch(names={}, totals={"kernels": 0, "memcpy": 1, "callbacks": 1})
    assert "switched off or bypassed" in observer.assess(quiet, 4, set())[1][0]
    for totals, words in (
        ({"unmatched": 1}, "graph launch"),
        ({"dropped": 3}, "lost records"),
        ({"callbacks": 0}, "callbacks were switched off"),
    ):
        ep = channel.Epoch(totals={"kernels": 9, "callbacks": 1, **totals})
        assert words in " ".join(observer.assess(ep, 1, set())[1]), totals
    assert observer.assess(channel.Epoch(problems=["no answer"]), 1, set())[1] == ["no answer"]


def test_the_cpu_says_the_vendor_check_cannot_be_enforced(tmp_path):
    w = observer.Watch(str(tmp_path), "cpu")
    assert w.words().startswith("not enforceable on the CPU") and not w.channels
    assert observer.Watch(str(tmp_path), "cpu", allow_vendor=True).words() == "off (--allow-vendor)"


# ------------------------------------------------------------------------------------------ channel


def _block(key: bytes, chain: int, text: str) -> tuple[bytes, int]:
    body = text.encode()
    mac = channel.siphash24(key, chain.to_bytes(8, "little") + body)
    return body + f"mac {mac:016x}\n".encode(), mac


def test_siphash_matches_the_reference_vectors():
    key = bytes(range(16))
    assert channel.siphash24(key, b"") == 0x726FDB47DD0E0E31
    assert channel.siphash24(key, bytes(range(15))) == 0xA129CA6149BE45E5
    assert channel.siphash24(key, bytes(range(8))) == 0x93F5F5799A932462


def test_reader_takes_chained_blocks_in_any_pieces_and_refuses_a_forged_one():
    key = os.urandom(16)
    one, mac = _block(key, 0, "loaded 7\n")
    two, mac = _block(key, mac, "epoch 1 7 ab\nk 1 0 0 x\n")
    r = channel.Reader(key)
    stream = one + two
    got = [b for i in range(len(stream)) for b in r.feed(stream[i : i + 1])]
    assert got == [["loaded 7"], ["epoch 1 7 ab", "k 1 0 0 x"]] and r.failed is None
    forged, _ = _block(os.urandom(16), mac, "epoch 2 7 cd\n")  # the right chain, the wrong key
    assert r.feed(forged) == [] and "MAC does not verify" in r.failed
    replay = channel.Reader(key)
    assert replay.feed(two) == [] and replay.failed  # a block out of its place in the chain


# ------------------------------------------------------------------------ the library, in a child

CHILD = textwrap.dedent("""
    import ctypes, json, os, sys
    obs, fake = ctypes.CDLL(sys.argv[1]), ctypes.CDLL(sys.argv[2])
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "init":            # what the driver does at cuInit
            obs.InitializeInjection()
        elif cmd == "launch":
            fake.fake_launch(args[0].encode())
        elif cmd == "graph":
            fake.fake_graph(args[0].encode(), int(args[1]))
        elif cmd == "memcpy":
            fake.fake_memcpy()
        elif cmd == "drop":
            fake.fake_drop(ctypes.c_size_t(int(args[0])))
        elif cmd == "disable":       # CUPTI's own entry point, by dlsym on its handle
            fake.cuptiActivityDisable(10)
        elif cmd == "finalize":
            fake.cuptiFinalize()
        elif cmd == "plt":           # what torch's profiler or a C extension reaches by symbol resolution
            glob = ctypes.CDLL(None)
            glob.cuptiActivityDisable(10), glob.cuptiFinalize(), glob.cuptiActivityRegisterCallbacks(None, None)
        elif cmd == "forge":         # write on the observer's socket
            fd = next(int(f) for f in os.listdir("/proc/self/fd")
                      if os.readlink(f"/proc/self/fd/{f}").startswith("socket:"))
            os.write(fd, b"epoch 9 1 00\\nk 1 0 0 fine\\nmac 0123456789abcdef\\n")
        elif cmd == "close":
            for f in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{f}").startswith("socket:"):
                        os.close(int(f))
                except OSError:
                    pass
        elif cmd == "environ":
            print(json.dumps([os.environ.get("GEMMLAB_OBSERVER_TOKEN"),
                              b"GEMMLAB_OBSERVER_TOKEN=x" in open("/proc/self/environ", "rb").read()]))
        print("ok", flush=True)
""")


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if shutil.which("cc") is None or _headers() is None:
        pytest.skip("needs a C compiler and CUPTI headers")
    d = tmp_path_factory.mktemp("observer")
    fake = d / "libcupti.so.13"
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-O2",
            *(f"-I{p}" for p in _headers()),
            "-Wl,-soname,libcupti.so.13",
            "-o",
            str(fake),
            str(HERE / "fake_cupti.c"),
        ],
        check=True,
    )
    return {"observer": cupti.build_observer(d / "cache"), "fake": fake}


class Child:
    def __init__(self, libs, tmp_path, preload=True):
        self.ch = channel.Channel(tmp_path / "obs")
        env = {**os.environ, **self.ch.env(libs["observer"], str(libs["fake"]))}
        if preload:
            env["LD_PRELOAD"] = str(libs["observer"])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(libs["observer"]), str(libs["fake"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def __call__(self, *cmds: str) -> str:
        out = ""
        for cmd in cmds:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
            while (line := self.proc.stdout.readline()) and line.strip() != "ok":
                out += line
            assert line, f"the child died at {cmd!r}"
        return out

    def epoch(self, timeout=5.0):
        return self.ch.epoch(self.proc.pid, timeout)

    def close(self):
        self.proc.kill()
        self.proc.wait()
        self.ch.close()


@pytest.fixture
def child(libs, tmp_path):
    c = Child(libs, tmp_path)
    yield c
    c.close()


@needs_build
def test_build_is_cached_and_exports_only_the_injection_and_the_refused_entry_points(libs):
    assert cupti.build_observer(libs["observer"].parent) == libs["observer"]
    names = subprocess.run(["nm", "-D", "--defined-only", str(libs["observer"])], capture_output=True, text=True)
    exported = {line.split()[-1] for line in names.stdout.splitlines() if " T " in line}
    assert "InitializeInjection" in exported and "cuptiFinalize" in exported and "cuptiActivityDisable" in exported
    assert all(n == "InitializeInjection" or n.startswith("cupti") for n in exported), exported


def test_build_says_why_the_library_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv(cupti.PREBUILT_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(Unavailable, match="no such file"):
        cupti.build_observer(tmp_path)
    monkeypatch.delenv(cupti.PREBUILT_ENV)
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(Unavailable, match="no C compiler"):
        cupti.build_observer(tmp_path)


def test_every_kernel_is_reported_by_name_each_epoch(child):
    child("init", f"launch {NVJET}", "launch _gemm_tma_splitk_kernel", "launch _gemm_tma_splitk_kernel", "memcpy")
    ep = child.epoch()
    assert ep.problems == [] and ep.seq == 1 and ep.pid == child.proc.pid
    assert ep.names == {NVJET: (1, 0, 1), "_gemm_tma_splitk_kernel": (2, 0, 2)}
    assert ep.totals["kernels"] == 3 and ep.totals["memcpy"] == 1 and ep.totals["callbacks"] == 1
    assert child.ch.hello["register"] == 0 and child.ch.hello["subscribe"] == 0 and child.ch.loaded == child.proc.pid
    vendor, problems, _ = observer.assess(ep, 2, {"_gemm_tma_splitk_kernel"})
    assert vendor == [f"cuBLAS (nvjet): {NVJET}"] and problems == []
    child("launch add")
    ep = child.epoch()
    assert ep.seq == 2 and ep.names == {"add": (1, 0, 1)} and ep.totals["kernels"] == 1  # counts since the last


def test_graph_launches_are_matched_by_either_correlation_id(child):
    child("init", f"graph {NVJET} 0", f"graph {NVJET} 1")
    ep = child.epoch()
    assert ep.names == {NVJET: (2, 2, 0)} and ep.totals["graph_launches"] == 2 and ep.totals["unmatched"] == 0
    assert ep.totals["graph_records"] == 2


def test_tracing_switched_off_around_a_graph_is_caught(child):
    """Activity disabled through dlsym on libcupti, a graph replayed (no launch callback names its kernels),
    activity back on: the graph launch never meets a record."""
    child("init", "launch add", "disable", f"graph {NVJET} 0")
    ep = child.epoch()
    assert ep.totals["unmatched"] == 1 and NVJET not in ep.names
    assert "switched off around them" in " ".join(observer.assess(ep, 1, set())[1])


def test_a_kernel_launched_with_tracing_off_is_still_seen_by_its_launch(child):
    child("init", "disable", f"launch {NVJET}", "launch add")
    ep = child.epoch()
    assert ep.names[NVJET] == (0, 0, 1)  # never ran as far as activity knows; launched all the same
    assert observer.assess(ep, 1, set())[0] == [f"cuBLAS (nvjet): {NVJET}"]
    assert "switched off or bypassed" in observer.assess(ep, 1, set())[1][0]  # and no records at all


def test_cupti_finalized_through_dlsym_leaves_silence(child):
    child("init", "launch add")
    assert child.epoch().problems == []
    child("finalize", f"launch {NVJET}", f"launch {NVJET}")
    ep = child.epoch()
    _, problems, _ = observer.assess(ep, 2, set())
    assert ep.names == {} and any("bypassed" in p for p in problems) and any("callbacks" in p for p in problems)


def test_cupti_calls_by_symbol_resolution_are_refused_and_reported(child):
    """torch's profiler or a C extension reaching cuptiActivityDisable / cuptiFinalize / a second
    registration gets CUPTI_SUCCESS and changes nothing."""
    child("init", "plt", f"launch {NVJET}", "init")
    ep = child.epoch()
    assert ep.refused == {"cuptiActivityDisable": 1, "cuptiFinalize": 1, "cuptiActivityRegisterCallbacks": 1}
    assert ep.names == {NVJET: (1, 0, 1)} and ep.totals["reinit"] == 1
    assert observer.assess(ep, 1, set())[1] == []


def test_dropped_records_are_a_problem(child):
    child("init", "launch add", "drop 3")
    assert "lost records (dropped 3)" in observer.assess(child.epoch(), 1, set())[1][0]


def test_a_forged_answer_fails_the_channel_for_good(child):
    child("init", "launch add", "forge")
    ep = child.epoch()
    assert ep.problems and "did not write" in ep.problems[0]
    child("launch add")
    assert child.epoch().problems == ep.problems


def test_a_closed_channel_is_silence(child):
    child("init", "close")
    assert "closed" in child.epoch().problems[0]


def test_an_observer_that_cuda_never_started_is_silence(libs, tmp_path):
    c = Child(libs, tmp_path)
    try:
        c("launch add")  # no InitializeInjection: e.g. CUDA_INJECTION64_PATH removed before cuInit
        assert "never started" in c.epoch(timeout=1.0).problems[0]
    finally:
        c.close()


def test_a_process_without_the_library_never_connects(libs, tmp_path):
    ch = channel.Channel(tmp_path / "obs")
    env = {**os.environ, **ch.env(libs["observer"], str(libs["fake"]))}
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env)
    try:
        assert "never connected" in ch.epoch(proc.pid, timeout=1.0).problems[0]
    finally:
        proc.kill()
        proc.wait()
        ch.close()


def test_processes_that_inherit_the_library_never_wait_on_the_grader(libs, tmp_path):
    """Every process that inherits the child's environment loads the library (the compiler and ptxas that
    Triton runs on a first call, say). The grader accepts only after the request in flight, so past the
    listener's queue a blocking connect in their constructors would wait forever, and the compile with them:
    twenty such processes, started before the grader accepts anything, must all finish at once."""
    ch = channel.Channel(tmp_path / "obs")
    env = {**os.environ, **ch.env(libs["observer"], str(libs["fake"])), "LD_PRELOAD": str(libs["observer"])}
    try:
        procs = [subprocess.Popen(["true"], env=env) for _ in range(20)]
        codes = [p.wait(timeout=20) for p in procs]  # a blocked constructor: TimeoutExpired
        assert codes == [0] * 20
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        ch.close()


def test_the_token_is_wiped_and_a_stranger_is_not_taken_for_the_child(libs, tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    ch_path = d / "obs"
    c = Child.__new__(Child)
    c.ch = channel.Channel(ch_path)
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect(str(ch_path))  # first in the queue, from this process
    env = {**os.environ, **c.ch.env(libs["observer"], str(libs["fake"])), "LD_PRELOAD": str(libs["observer"])}
    c.proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(libs["observer"]), str(libs["fake"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        token, in_proc_environ = json.loads(c("environ").strip())
        assert set(token) == {"x"} and in_proc_environ
        c("init", "launch add")
        ep = c.epoch()
        assert ep.problems == [] and ep.names == {"add": (1, 0, 1)} and c.ch.strangers == [os.getpid()]
    finally:
        stranger.close()
        c.close()


# ------------------------------------------------------------------------------------ the verdict line


@pytest.mark.cpu_only("on a GPU the observers see it: tests/grade/test_observer_gpu.py")
def test_torch_mm_only_in_timed_calls_is_unseen_on_the_cpu_and_the_verdict_line_says_so():
    """The CPU's BLAS is linked into libtorch_cpu: nothing outside the candidate's Python can see it, so the
    grade cannot fail it; the verdict line says that the check is not enforced, and why."""

    from gemmlab.grade import grade, view

    r = grade(
        str(CASES / "tiny.json"),
        kernel=f"{BAD_KERNELS / 'vendor_kernels.py'}:mm_when_timed",
        signature="rowmajor",
        rounds=2,
    )
    line = view.summary_line(r)
    assert "vendor check: not enforceable on the CPU (torch's CPU BLAS is linked into libtorch_cpu" in line, line
    assert not r["failures"] and r["performance"]["status"] in ("PASS", "INCONCLUSIVE"), r["failures"]
    assert r["observers"]["kernel_observer"] == "not used without CUDA" and "vendor check" in view.markdown(r)


def test_the_watch_turns_answers_into_findings_for_the_rules(libs, tmp_path):
    """The grader's side as the grader uses it (device "cuda"), against the fake libcupti: a vendor kernel
    and a silenced observer become findings; names reach the summary with their categories."""
    w = observer.Watch(str(tmp_path), "cuda", kernel=f"{BAD_KERNELS / 'vendor_kernels.py'}:triton_matmul")
    assert w.observer.startswith("active") and w.words().startswith("enforced")
    env = {**os.environ, **w.env("candidate"), "GEMMLAB_OBSERVER_CUPTI": str(libs["fake"])}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, env["CUDA_INJECTION64_PATH"], str(libs["fake"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    c = Child.__new__(Child)
    c.proc, c.ch = proc, w.channels["candidate"]
    try:
        c("init", "launch matmul_kernel", "launch matmul_kernel")
        assert w.answer("candidate", proc.pid, 2) == ["matmul_kernel"] and w.recorded(proc.pid) == []
        c(f"launch {NVJET}", "launch my_own_cuda_kernel")
        w.answer("candidate", proc.pid, 1)
        assert w.recorded(proc.pid) == [f"cuBLAS (nvjet): {NVJET}"]  # the unknown name is no finding
        assert "1 kernel name(s) of no known family" in w.words()
        assert w.summary()["unknown_kernels"] == ["my_own_cuda_kernel"]
        c("finalize", "launch matmul_kernel")
        w.answer("candidate", proc.pid, 1)
        assert any("switched off or bypassed" in f for f in w.recorded(proc.pid))
        kinds = {k["name"]: k["category"] for k in w.summary()["kernels"]}
        assert kinds == {"matmul_kernel": "triton", NVJET: "vendor", "my_own_cuda_kernel": "unknown"}
        assert w.answer("baseline", None, 1) == []  # its sandbox never started: nothing, and no finding
        assert len(w.recorded(proc.pid)) == 3  # the vendor kernel, no records, the callbacks off
    finally:
        proc.kill()
        proc.wait()
        w.close()


def test_a_pid_namespace_of_the_sandbox_is_followed_to_its_processes():
    """With a PID namespace of the sandbox's own (GEMMLAB_SANDBOX_PIDNS), the observer's hello names the worker by its
    number inside the namespace (on the H200: pid 2, the grandchild of the keeper); the channel maps it through the
    keeper's descendants' NSpid and takes it, and still refuses a pid that is none of them."""
    import time

    from gemmlab.grade.preload.channel import in_sandbox

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a PID namespace")
    keeper = subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", "sleep 60 & wait"])
    try:
        deadline = time.monotonic() + 30
        while not in_sandbox(2, keeper.pid) and time.monotonic() < deadline and keeper.poll() is None:
            time.sleep(0.05)
        if keeper.poll() is not None:
            pytest.skip("no PID namespace here (unshare failed)")
        assert in_sandbox(2, keeper.pid)  # the worker: sh's child, pid 2 inside
        assert in_sandbox(1, keeper.pid)  # the namespace's first process
        assert in_sandbox(keeper.pid, keeper.pid)
        assert not in_sandbox(7, keeper.pid)
        assert not in_sandbox(os.getpid(), keeper.pid)
    finally:
        keeper.kill()
        keeper.wait()
