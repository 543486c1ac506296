"""The kernel observer on the GPU (H200). First kernel_observer.so alone in a child that runs, one after the
other, the ways a candidate reaches a vendor GEMM (torch.mm, torch._grouped_mm's CUTLASS, a CUDA graph
replaying cuBLAS, cublasGemmEx through ctypes, torch's profiler taking CUPTI) and the ways it switches the
observer off (tracing disabled around a graph, cuptiFinalize), each answer checked as it comes; Triton and
gemmlab run clean. Then whole grades: each vendor GEMM passed off as the candidate's own FAILs the `vendor`
rule (and passes with --allow-vendor), gemmlab's kernel and a Triton candidate PASS.
With $OUT set, a summary lands in $OUT/observer_gpu.json; `-s` prints a table at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemmlab.grade import cases, make_op, observer
from gemmlab.grade.grader import Grader
from gemmlab.grade.preload import channel, cupti
from tests.paths import BAD_KERNELS, CASES

pytestmark = pytest.mark.gpu

TINY_BF16 = str(CASES / "tiny-bf16.json")
MOE_SMALL = str(CASES / "moe-small.json")
MOE_ALIGNED = str(CASES / "moe-aligned.json")  # strides torch._grouped_mm accepts, for --allow-vendor
VENDOR = BAD_KERNELS / "vendor_kernels.py"
NOOP = BAD_KERNELS / "profiler_noop.py"
SUMMARY: list[dict] = []

CHILD = textwrap.dedent("""
    import ctypes, sys
    import torch, triton, triton.language as tl
    import gemmlab

    @triton.jit
    def observed_add_kernel(x, y, n, B: tl.constexpr):
        o = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)

    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    graphs = []

    def libcupti():  # the copy in this process, through dlsym on its handle
        return ctypes.CDLL(next(w for w in open("/proc/self/maps").read().split() if "/libcupti.so" in w))

    def run(cmd):
        if cmd == "mm":
            torch.mm(a, a)
        elif cmd == "grouped":
            x = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(4, 128, 64, device="cuda", dtype=torch.bfloat16)
            torch._grouped_mm(x, w, offs=torch.tensor([64, 128, 192, 256], device="cuda", dtype=torch.int32))
        elif cmd == "graph":
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                torch.mm(a, a)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                torch.mm(a, a)
            graphs.append(g)
            for _ in range(3):
                g.replay()
        elif cmd == "triton":
            observed_add_kernel[(a.numel() // 1024,)](a, torch.empty_like(a), a.numel(), B=1024)
        elif cmd == "gemmlab":
            gemmlab.gemm(a, a)
        elif cmd == "ctypes":
            lib = ctypes.CDLL(next(w for w in open("/proc/self/maps").read().split() if "/libcublas.so" in w))
            h, one, zero = ctypes.c_void_p(), ctypes.c_float(1.0), ctypes.c_float(0.0)
            assert lib.cublasCreate_v2(ctypes.byref(h)) == 0
            c = torch.empty_like(a)
            p = lambda t: ctypes.c_void_p(t.data_ptr())
            assert lib.cublasGemmEx(h, 0, 0, 256, 256, 256, ctypes.byref(one), p(a), 2, 256, p(a), 2, 256,
                                    ctypes.byref(zero), p(c), 2, 256, 68, -1) == 0
        elif cmd == "profiler":
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts):
                torch.mm(a, a)
                torch.cuda.synchronize()
        elif cmd == "disable-graph":
            lib = libcupti()
            lib.cuptiActivityDisable(10)  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
            graphs[0].replay()
            torch.cuda.synchronize()
            lib.cuptiActivityEnable(10)
        elif cmd == "finalize":
            libcupti().cuptiFinalize()
            torch.mm(a, a)
        torch.cuda.synchronize()

    print("ok", flush=True)
    for line in sys.stdin:
        run(line.strip())
        print("ok", flush=True)
""")


@pytest.fixture(scope="module", autouse=True)
def summary():
    yield SUMMARY
    rows = [f"{r['test'][:44]:44s} {r['verdict']:9s} {r['detail'][:110]}" for r in SUMMARY]
    print("\n" + "\n".join(["kernel observer on the GPU", *rows]))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "observer_gpu.json").write_text(json.dumps(SUMMARY, indent=1))


@pytest.fixture(scope="module")
def lib():
    try:
        return cupti.build_observer()
    except Exception as e:
        pytest.fail(f"kernel_observer.so cannot be built on this GPU machine: {e}")


def test_each_way_to_a_vendor_gemm_is_seen_and_each_way_to_switch_the_observer_off_is_caught(lib, tmp_path):
    src = tmp_path / "child.py"
    src.write_text(CHILD)
    ch = channel.Channel(tmp_path / "obs")
    env = {**os.environ, **ch.env(lib, cupti.cupti_library()), "LD_PRELOAD": str(lib)}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.Popen(
        [sys.executable, str(src)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    triton = observer.triton_names([src, *observer.source_files(None)])

    def step(cmd: str | None, may_die: bool = False):
        if cmd:
            proc.stdin.write(cmd + "\n")
            proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ok" or may_die, f"the child died at {cmd!r}"
        ep = ch.epoch(proc.pid, timeout=30)
        vendor, problems, unknown = observer.assess(ep, 1, triton)
        SUMMARY.append(
            {
                "test": f"child: {cmd or 'start'}",
                "verdict": "problems" if problems else "clean",
                "detail": "; ".join(problems or vendor or sorted(ep.names))[:400],
                "names": ep.names,
                "totals": ep.totals,
                "refused": ep.refused,
            }
        )
        return ep, vendor, problems, unknown

    try:
        ep, _, problems, _ = step(None)
        hello = ch.hello
        assert all(hello[k] == 0 for k in ("register", "kernel", "subscribe", "callbacks")), hello
        assert problems == [], problems
        for cmd, family in (("mm", ""), ("grouped", "CUTLASS"), ("ctypes", "")):
            ep, vendor, problems, _ = step(cmd)
            assert vendor and problems == [] and family in " ".join(vendor), (cmd, ep)
        ep, vendor, problems, _ = step("graph")
        assert vendor and problems == [], ep
        assert ep.totals["graph_launches"] >= 3 and ep.totals["unmatched"] == 0
        assert any(g >= 3 for _, g, _ in ep.names.values()), ep.names  # the replays' kernels, in graphs
        ep, vendor, problems, unknown = step("triton")
        assert ep.names.get("observed_add_kernel", (0,))[0] == 1 and not vendor and not problems, ep
        ep, vendor, problems, _ = step("gemmlab")
        assert ep.names and not vendor and not problems, ep
        assert all(observer.classify(n, triton)[0] in ("triton", "allowed") for n in ep.names), ep.names
        ep, vendor, problems, _ = step("profiler")  # torch's profiler asks CUPTI for everything
        assert ep.refused and vendor and problems == [], ep
        ep, vendor, problems, _ = step("mm")  # and the observer still sees it all
        assert vendor and problems == [], ep
        ep, _, problems, _ = step("disable-graph")
        assert ep.totals["unmatched"] >= 1 and any("switched off around them" in p for p in problems), ep
        ep, _, problems, _ = step("finalize", may_die=True)  # CUPTI detached under the process: silence
        assert problems, ep
    finally:
        proc.kill()
        proc.wait()
        ch.close()


def _grade(case_file: str, kernel: str | None, allow_vendor: bool = False, signature: str | None = None) -> dict:
    cf = cases.load(case_file)
    return Grader(make_op(cf, signature), cf, kernel, allow_vendor, rounds=2, heat_s=0.0).run()


def _record(name: str, r: dict) -> None:
    detail = "; ".join(f"[{f['rule']}] {f['reason']}" for f in r["failures"]) or r["vendor_check"]
    SUMMARY.append(
        {
            "test": name,
            "verdict": r["verdict"],
            "detail": detail[:400],
            "kernels": r["observers"]["kernels"],
            "words": r["vendor_check"],
        }
    )


@pytest.mark.parametrize(
    "kernel,case_file",
    [
        (f"{VENDOR}:grouped_mm", TINY_BF16),  # CUTLASS in libtorch: no cuBLAS call at all
        ("builtin:composite", MOE_ALIGNED),  # the MoE baseline itself, on torch._grouped_mm
        (f"{NOOP}:mm", TINY_BF16),  # torch.profiler replaced by a no-op
        (f"{VENDOR}:mm_when_timed", TINY_BF16),  # torch.mm inside timed calls only
        (f"{VENDOR}:graph_mm", TINY_BF16),  # a CUDA graph replaying cuBLAS
        (f"{VENDOR}:ctypes_mm", TINY_BF16),  # cublasGemmEx through ctypes
    ],
    ids=["grouped_mm", "composite_moe", "profiler_noop", "mm_when_timed", "graph_mm", "ctypes_mm"],
)
def test_a_vendor_gemm_passed_off_as_the_candidates_own_fails_the_vendor_rule(kernel, case_file):
    r = _grade(case_file, kernel)
    _record(f"grade {kernel.rpartition('/')[2]}", r)
    assert r["verdict"] == "FAIL" and {f["rule"] for f in r["failures"]} == {"vendor"}, r["failures"]
    seen = [k for k in r["observers"]["kernels"] if k["category"] == "vendor"]
    assert seen, "the kernel observer itself saw no vendor kernel"  # not only the cuBLAS interposer
    assert r["vendor_check"].startswith("enforced")


@pytest.mark.parametrize(
    "kernel,case_file",
    [(f"{VENDOR}:grouped_mm", TINY_BF16), ("builtin:composite", MOE_ALIGNED), (f"{VENDOR}:graph_mm", TINY_BF16)],
    ids=["grouped_mm", "composite_moe", "graph_mm"],
)
def test_the_same_vendor_gemm_passes_with_allow_vendor(kernel, case_file):
    r = _grade(case_file, kernel, allow_vendor=True)
    _record(f"grade {kernel.rpartition('/')[2]} --allow-vendor", r)
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]  # every rule passed
    assert r["vendor_check"] == "off (--allow-vendor)"


@pytest.mark.parametrize("kernel", [None, f"{VENDOR}:triton_matmul"], ids=["gemmlab", "triton_matmul"])
def test_gemmlab_and_a_triton_candidate_pass_under_the_observer(kernel):
    r = _grade(TINY_BF16, kernel)
    _record(f"grade {(kernel or 'gemmlab').rpartition('/')[2]}", r)
    assert r["verdict"] in ("PASS", "INCONCLUSIVE") and not r["failures"], r["failures"]  # every rule passed
    kinds = {k["category"] for k in r["observers"]["kernels"]}
    assert "triton" in kinds and "vendor" not in kinds, r["observers"]["kernels"]
    assert r["performance"]["timed_kernels"], "no kernel name reached the report from the timed batches"
