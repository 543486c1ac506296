"""The FP8 kernel stays on Hopper's tensor cores with e4m3 operands: build the sm_90 cubin of the kernel the H200
plans for a large shape and for M = 256 (the table's small-tile TMA rule), every scale granularity and both B
layouts (no GPU needed: "meta" tensors and ``triton.compile`` for GPUTarget("cuda", 90, 32)), and read its SASS:
wgmma on e4m3 operands (SASS spells it QGMMA.<shape>.F32.E4M3.E4M3; HGMMA is the fp16/bf16 form), TMA loads, no
spills. Runs in a child process: the compiler, not the interpreter the rest of the suite may use."""

import pytest

from tests.child import child_json

SCRIPT = r"""
import json, re, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gemmlab.device import H200
from gemmlab.instruments.sass import compiled_report, sass_text
from gemmlab.kernels.gemm_fp8 import gemm_fp8_tma_kernel
from gemmlab.ops.fp8.plan import constexprs_fp8, launch_options_fp8, plan_fp8

TL = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
def meta(shape, dtype=torch.float8_e4m3fn):
    return torch.empty(shape, dtype=dtype, device="meta")
out = {}
for (m, n, k) in ((8192, 8192, 8192), (256, 7168, 2048)):  # (M <= 64: the decode path, test_inspect_decode_fp8)
    for mode in (0, 1, 2):
        for kmajor in (True, False):
            a = meta((m, k))
            b = meta((n, k)).t() if kmajor else meta((k, n))
            sa, sb = [((), ()), ((m, 1), (1, n)), ((m, -(-k // 128)), (-(-k // 128), -(-n // 128)))][mode]
            p = plan_fp8(a, b, meta(sa, torch.float32), meta(sb, torch.float32), target=H200)
            cfg, dt = p.config, TL[torch.bfloat16]
            bdesc = [cfg.block_n, cfg.block_k] if p.b_kmajor else [cfg.block_k, cfg.block_n]
            cblk = [cfg.block_m, cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n]
            sig = {"a_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {cfg.block_k}]>",
                   "b_desc": f"tensordesc<fp8e4nv[{bdesc[0]}, {bdesc[1]}]>",
                   "c": f"tensordesc<{dt}[{cblk[0]}, {cblk[1]}]>" if p.c_tma else f"*{dt}",
                   "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32"}
            sig.update({name: "i32" for name in ("M", "N", "K", "stride_cm", "stride_sam", "stride_sak",
                                                 "stride_sbk", "stride_sbn")})
            consts = constexprs_fp8(p)
            sig.update({name: "constexpr" for name in consts})
            sig = {name: sig[name] for name in gemm_fp8_tma_kernel.arg_names}
            kernel = triton.compile(ASTSource(gemm_fp8_tma_kernel, sig, constexprs=consts),
                                    target=GPUTarget("cuda", 90, 32), options=launch_options_fp8(cfg))
            r = compiled_report(kernel)
            sass, _ = sass_text(kernel.asm["cubin"])
            r["gmma_e4m3"] = len(re.findall(r"QGMMA\.[^ ;]*E4M3", sass))
            r["gmma_lines"] = sorted({w for line in sass.splitlines() for w in line.split()
                                      if w.startswith(("QGMMA", "HGMMA"))})
            r["reason"] = p.reason
            out[f"{m}x{n}x{k}-scale{mode}-{'K' if kmajor else 'N'}major"] = r
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def reports():
    return child_json(["-c", SCRIPT])


def test_fp8_kernel_runs_e4m3_wgmma_without_spills(reports):
    assert len(reports) == 12
    for name, r in reports.items():
        assert r["tensor_core"] and r["gmma_e4m3"] > 0, (name, r["gmma_lines"], r["sass"])
        assert not r["sass"]["HMMA"] and not r["sass"]["HGMMA"], (name, r["gmma_lines"])  # no fp16/bf16 upcast
        assert r["sass"]["UTMALDG"] > 0, (name, r["sass"])
        assert r["local_memory_ops"] == 0 and not r["stack_bytes"], (name, r)
