"""The FP8 grouped kernel stays on Hopper's tensor cores with e4m3 operands: build the sm_90 cubin of every config
the H200 launches (the bundled "moe_fp8" tables of nvidia-h200.json, each rule with its mode) from a signature (no GPU
needed: ``triton.compile`` for GPUTarget("cuda", 90, 32)), and read its SASS as tests/fp8/test_inspect_fp8.py does:
QGMMA on E4M3 operands, no fp16/bf16 upcast (HGMMA, HMMA), TMA loads, no spills. Runs in a child process: the
compiler, not the interpreter the rest of the suite may use."""

import pytest

from tests.child import child_json

SCRIPT = r"""
import json, re, math
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gemmlab.instruments.sass import compiled_report, sass_text
from gemmlab.kernels.moe_fp8 import moe_fp8_grouped_kernel
from gemmlab.ops.moe.config import Mode
from gemmlab.ops import configs
from gemmlab.ops.fp8.moe_launch import MoEFp8Config

out = {}
for mode in Mode:
    for i, rule in enumerate(configs.rules("nvidia-h200", "moe_fp8", mode.table, MoEFp8Config.from_dict)):
        cfg, name = rule.config, f"{mode.table}[{i}]"
        sig = {"a_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {cfg.block_k}]>", "a_scale": "*fp32",
               "w_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {cfg.block_k}]>", "w_scale": "*fp32", "out": "*bf16",
               "scale": "*fp32", "offsets": "*i32", "tile_offsets": "*i32"}
        sig.update({n: "i32" for n in ("N", "K", "E", "stride_sa", "stride_om")})
        consts = dict(MODE=int(mode), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                      GROUP_M=cfg.group_m, NUM_PROGRAMS=132, LOG2_E=9)
        sig.update({n: "constexpr" for n in consts})
        sig = {n: sig[n] for n in moe_fp8_grouped_kernel.arg_names}
        kernel = triton.compile(ASTSource(moe_fp8_grouped_kernel, sig, constexprs=consts),
                                target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
        r = compiled_report(kernel)
        sass, _ = sass_text(kernel.asm["cubin"])
        r["gmma_e4m3"] = len(re.findall(r"QGMMA\.[^ ;]*E4M3", sass))
        r["gmma_lines"] = sorted({w for line in sass.splitlines() for w in line.split()
                                  if w.startswith(("QGMMA", "HGMMA"))})
        out[name] = r
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def reports():
    return child_json(["-c", SCRIPT])


def test_fp8_grouped_kernel_runs_e4m3_wgmma_without_spills(reports):
    assert len(reports) == 6  # three modes, a rule for decode sizes and one for the rest each
    for name, r in reports.items():
        assert r["tensor_core"] and r["gmma_e4m3"] > 0, (name, r["gmma_lines"], r["sass"])
        assert not r["sass"]["HMMA"] and not r["sass"]["HGMMA"], (name, r["gmma_lines"])  # no fp16/bf16 upcast
        assert r["sass"]["UTMALDG"] > 0, (name, r["sass"])
        assert r["local_memory_ops"] == 0 and not r["stack_bytes"], (name, r)
