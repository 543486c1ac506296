"""The Hopper paths stay on tensor cores: build the sm_90 cubins of the kernels the H200 plans for the seed
and small-M shapes (no GPU needed) and read their SASS. Runs in a child process: the compiler, not the
interpreter the rest of the suite may use."""

import json

import pytest

from tests.child import child_json, run_child

SCRIPT = r"""
import json, torch
from gemmlab.instruments.sass import plan_for, report
from gemmlab.problems import SEEDS, SMALL_M, SQUARE
out = {}
for (m, n, k) in SEEDS + SQUARE + SMALL_M:
    for dtype, layout in ((torch.float16, "NN"), (torch.bfloat16, "TT")):
        p = plan_for(m, n, k, dtype, layout)
        out[f"{m}x{n}x{k}-{layout}-{dtype}"] = report(p)
for (m, n, k) in ((300, 37, 64), (37, 53, 71)):  # pointer epilogue (odd N, packed B) and the portable kernel
    out[f"{m}x{n}x{k}"] = report(plan_for(m, n, k, torch.float16, "NT" if n == 37 else "NN"))
# staging: odd everything, A and B copied to aligned buffers, C through pointers (the table's config) or, with
# stage_c, through TMA into an aligned copy
import dataclasses
from gemmlab.device import H200
from gemmlab.ops.gemm.planner import choose
staged = plan_for(8191, 8193, 4097)
assert staged.staged == ("a", "b"), staged
out["staged-8191x8193x4097"] = report(staged)
a = torch.empty((8191, 4097), dtype=torch.bfloat16, device="meta")
b = torch.empty((8193, 4097), dtype=torch.bfloat16, device="meta").t()  # nn.Linear layout
p = choose(a, b, None, False, config=dataclasses.replace(staged.config, stage_c=True), target=H200)
assert p.staged == ("a", "b", "c") and p.c_tma, p
out["staged-stage_c-8191x8193x4097-NT"] = report(p)
mid = plan_for(3000, 5000, 7000)  # the data-parallel + stream-K hybrid: 480 tiles on 132 SMs
out["streamk-3000x5000x7000"] = report(dataclasses.replace(mid, config=dataclasses.replace(mid.config, stream_k=True)))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def reports():
    return child_json(["-c", SCRIPT], timeout=600)


def test_hopper_paths_use_wgmma_and_tma(reports):
    for name, r in reports.items():
        assert r["tensor_core"], (name, r["sass"])
        if r["path"] == "tma_persistent":
            assert r["sass"]["HGMMA"] > 0 and r["sass"]["UTMALDG"] > 0, (name, r)
        if r["path"] == "tma_splitk":
            assert r["sass"]["UTMALDG"] > 0, (name, r)
            if r["block"][0] >= 64:  # wgmma needs 64-row tiles; BLOCK_M = 16 runs on mma.sync (HMMA)
                assert r["sass"]["HGMMA"] > 0, (name, r)


def test_fast_paths_do_not_spill(reports):
    for name, r in reports.items():
        if r["path"] != "portable" and r["c_tma"]:
            assert r["local_memory_ops"] == 0 and r["stack_bytes"] == 0, (name, r)
        elif r["path"] != "portable":  # pointer epilogue at 128x256: a few LDL/STL (102 before the subtile split)
            assert r["local_memory_ops"] <= 8, (name, r)
        assert r["registers"] <= 255


def test_staged_paths_compile_to_wgmma_and_tma(reports):
    for name in ("staged-8191x8193x4097", "staged-stage_c-8191x8193x4097-NT"):
        r = reports[name]
        assert r["path"] == "tma_persistent" and "staged" in r["reason"], (name, r["reason"])
        assert r["sass"]["HGMMA"] > 0 and r["sass"]["UTMALDG"] > 0, (name, r)
    assert reports["staged-8191x8193x4097"]["c_tma"] is False
    sk = reports["streamk-3000x5000x7000"]
    assert sk["stream_k"] and sk["sass"]["HGMMA"] > 0 and sk["sass"]["UTMALDG"] > 0 and sk["local_memory_ops"] == 0
    assert reports["staged-stage_c-8191x8193x4097-NT"]["sass"]["UTMASTG"] > 0


def test_seed_shapes_take_the_fast_path(reports):
    assert reports["8192x8192x16384-NN-torch.float16"]["path"] == "tma_persistent"
    assert reports["131072x2048x7168-NN-torch.float16"]["path"] == "tma_persistent"
    small = reports["16x7168x2048-NN-torch.float16"]  # the route rules pick among the fast small-M paths
    assert small["path"] in ("tma_splitk", "tma_persistent", "gemv") and small["tensor_core"], small
    assert reports["37x53x71"]["path"] == "portable"


NO_MMA = r"""
import json, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gemmlab.instruments.sass import compiled_report

@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # elementwise: no tensor cores anywhere
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

src = ASTSource(_scale_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "BLOCK": "constexpr"},
                constexprs={"BLOCK": 256})
print(json.dumps(compiled_report(triton.compile(src, target=GPUTarget("cuda", 90, 32)))))
"""


def test_a_kernel_without_tensor_cores_is_flagged(tmp_path):
    script = tmp_path / "no_mma.py"  # @triton.jit needs its source in a file
    script.write_text(NO_MMA)
    r = child_json([str(script)], timeout=600)
    assert r["tensor_core"] is False and r["tensor_core_ops"] == 0 and r["sass"]["LDG"] > 0
    assert any("NO TENSOR-CORE INSTRUCTION" in f for f in r["flags"])


def test_flags():
    from gemmlab.instruments.sass import flags

    assert flags({"tensor_core": True, "local_memory_ops": 0, "stack_bytes": 0}) == []
    spill = flags({"tensor_core": True, "local_memory_ops": 6, "stack_bytes": 64})
    assert len(spill) == 1 and "spills" in spill[0]
    ws = flags({"tensor_core": True, "warp_specialize_requested": True, "warp_specialized": False})
    assert len(ws) == 1 and "not applied" in ws[0]


def test_inspect_command_reports_the_seed_kernel():
    res = run_child(["-m", "gemmlab", "inspect", "--shape", "131072,2048,7168", "--json"], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout)  # one JSON document, indented
    assert r["shape"] == [131072, 2048, 7168] and r["path"] == "tma_persistent" and r["flags"] == []
    assert r["sass"]["HGMMA"] > 0 and r["registers"] > 0 and r["num_warps"] in (4, 8) and r["num_stages"] >= 2
    assert r["warp_specialized"] is False and r["target"] in ("nvidia-h200", r["target"])
    text = run_child(["-m", "gemmlab", "inspect", "--shape", "16,7168,2048", "--packed"], timeout=600)
    assert text.returncode == 0 and "tma_splitk" in text.stdout and "registers/thread" in text.stdout
    bad = run_child(["-m", "gemmlab", "inspect", "--layout", "NX"], timeout=600)
    assert bad.returncode == 2 and "layout" in bad.stdout + bad.stderr


MOE = r"""
import json, torch
from gemmlab.instruments.sass import moe_report
out = {}
for mode in (0, 1, 2):
    for rows, experts in ((16 * 8, 256), (1024 * 8, 128), (4096 * 8, 256)):  # decode, Qwen3-like, DeepSeek-V3
        out[f"{mode}-{rows}-{experts}"] = moe_report(mode, rows, experts, max_group=rows // 8)  # T (k = 8)
out["gather"] = moe_report(1, 4096 * 8, 256, a_tma=False, a_gather=True)
out["pointers"] = moe_report(0, 4096, 8, a_tma=False, w_tma=False)
print(json.dumps(out))
"""


def test_moe_kernels_stay_on_tensor_cores_without_spills():
    reports = child_json(["-c", MOE])
    for name, r in reports.items():
        assert r["tensor_core"] and r["local_memory_ops"] == 0 and r["stack_bytes"] == 0, (name, r)
        if r["block"][0] >= 64:
            assert r["sass"]["HGMMA"] > 0, (name, r)  # wgmma from 64 rows up; 16-row tiles use mma.sync
        if r["a_tma"] or r["w_tma"]:
            assert r["sass"]["UTMALDG"] > 0, (name, r)
    assert reports["1-32768-256"]["block"][0] == 128 and reports["1-128-256"]["block"][0] == 16


DENSE_SCRIPT = r"""
import dataclasses, json, torch
from gemmlab.device import H200
from gemmlab.instruments.sass import report
from gemmlab.ops.gemm.planner import GemmConfig, choose
out = {}
def linear(m, n, k, dtype=torch.float16):
    return (torch.empty((m, k), dtype=dtype, device="meta"), torch.empty((n, k), dtype=dtype, device="meta").t())
G = dict(num_warps=4, split_k=0)
for name, (m, n, k, dtype), cfg in [  # the GEMV kernel: one-row FFMA tiles, 16- and 64-row HMMA tiles, odd K
        ("gemv-fma-1x32x128", (1, 4093, 4099, torch.float16), GemmConfig(1, 32, 128, num_stages=1, **G)),
        ("gemv-fma-1x32x256-w8", (1, 4093, 4099, torch.bfloat16), GemmConfig(1, 32, 256, num_stages=1, num_warps=8,
                                                                             split_k=0)),
        ("gemv-dot-16x32x128", (16, 12289, 1021, torch.bfloat16), GemmConfig(16, 32, 128, num_stages=3, **G)),
        ("gemv-dot-64x64x64", (64, 14336, 4097, torch.float16), GemmConfig(64, 64, 64, num_stages=3, **G))]:
    a, b = linear(m, n, k, dtype)
    out[name] = report(choose(a, b, None, False, config=cfg, target=H200, path="gemv"))
for name, (m, n, k), cfg in [  # the split tail: 320 tiles of 128x256 (56 in the tail), 80 of 128x128 (all)
        ("tail-128x256-2048x5120x5120", (2048, 5120, 5120), GemmConfig(128, 256, 64, num_warps=8, num_stages=3,
                                                                       epilogue_subtile=True, tail_split=8)),
        ("tail-128x128-2048x576x7168", (2048, 576, 7168), GemmConfig(128, 128, 64, num_warps=8, num_stages=4,
                                                                     tail_split=8))]:
    a, b = linear(m, n, k, torch.bfloat16)
    p = choose(a, b, None, False, config=cfg, target=H200, path="tma_persistent")
    assert p.config.tail_split > 1, p.reason
    out[name] = report(p)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def dense_reports():
    return child_json(["-c", DENSE_SCRIPT], timeout=600)


def test_gemv_tiles_run_on_ffma_or_hmma_without_spills(dense_reports):
    """One-row GEMV tiles are FFMA by design (memory-bound: a 16-row MMA would be 15/16 padding), flagged as
    such; 16- and 64-row tiles stay on tensor cores (HMMA: mma.sync, no TMA); none spills."""
    for name, r in dense_reports.items():
        assert r["local_memory_ops"] == 0 and r["stack_bytes"] == 0 and r["registers"] <= 255, (name, r)
        if name.startswith("gemv-fma"):
            assert not r["tensor_core"] and r["sass"]["FFMA"] > 0, (name, r["sass"])
            assert any("NO TENSOR-CORE" in f for f in r["flags"]), r["flags"]
        elif name.startswith("gemv-dot"):
            assert r["tensor_core"] and r["sass"]["HMMA"] + r["sass"]["HGMMA"] > 0 and r["sass"]["UTMALDG"] == 0, (
                name,
                r["sass"],
            )


def test_the_split_tail_stays_on_wgmma_and_tma(dense_reports):
    for name in ("tail-128x256-2048x5120x5120", "tail-128x128-2048x576x7168"):
        r = dense_reports[name]
        assert r["path"] == "tma_persistent" and r["tail_split"] > 1 and "split tail" in r["reason"], r
        assert r["sass"]["HGMMA"] > 0 and r["sass"]["UTMALDG"] > 0 and r["sass"]["UTMASTG"] > 0, (name, r["sass"])
