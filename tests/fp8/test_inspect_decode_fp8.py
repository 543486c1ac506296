"""The FP8 decode kernel (small M, ``kernels.gemv_fp8``) as the H200 plans it: build the sm_90 cubin for each decode
rule of the bundled H200 table (M = 1, 16, 32, 64), and at M = 1 the one-row config (BLOCK_M 1, pinned), every scale
granularity and both B layouts (no GPU needed: "meta" tensors and ``triton.compile`` for GPUTarget("cuda", 90, 32),
with the 16-divisibility the JIT would see on these aligned operands), and read its SASS: the tensor-core rows
(BLOCK_M >= 16) multiply on the tensor cores, one row on FFMA, and no configuration spills. Runs in a child
process: the compiler, not the interpreter.

What Triton 3.6 makes of the e4m3 tl.dot on pointer-loaded tiles: at 64 rows wgmma on e4m3 operands (SASS
QGMMA.64xNx32.F32.E4M3.E4M3); at 16 and 32 rows mma.sync, which has no e4m3 form on sm_90 (QMMA is sm_89 and
sm_120 only), so Triton widens both operands to fp16 (exact: every e4m3 value is an fp16 value) and issues
HMMA.16816.F32 (fp16 products, fp32 sums). Never the bf16 form (.BF16), which would round nothing here either but
is not what the compiler picks."""

import re

import pytest

from tests.child import child_json

SCRIPT = r"""
import dataclasses, json, re, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from gemmlab.device import H200
from gemmlab.instruments.sass import compiled_report, sass_text
from gemmlab.kernels.gemv_fp8 import gemv_fp8_kernel
from gemmlab.ops.fp8.decode import decode_ints
from gemmlab.ops.fp8.plan import constexprs_fp8, launch_options_fp8, plan_fp8, scale_strides

def meta(shape, dtype=torch.float8_e4m3fn):
    return torch.empty(shape, dtype=dtype, device="meta")
out = {}
for (m, n, k, ffma) in ((1, 4096, 7168, False), (1, 4096, 7168, True), (16, 4096, 7168, False), (32, 7168, 2048, False),
                        (64, 7168, 2048, False)):
    for mode in (0, 1, 2):
        for kmajor in (True, False):
            a = meta((m, k))
            b = meta((n, k)).t() if kmajor else meta((k, n))
            sa, sb = [((), ()), ((m, 1), (1, n)), ((m, -(-k // 128)), (-(-k // 128), -(-n // 128)))][mode]
            sa, sb = meta(sa, torch.float32), meta(sb, torch.float32)
            p = plan_fp8(a, b, sa, sb, target=H200)
            if ffma:
                p = plan_fp8(a, b, sa, sb, config=dataclasses.replace(p.config, block_m=1), target=H200)
            assert p.path == "decode", p.reason
            cfg = p.config
            ptrs = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "a_scale_ptr": "*fp32",
                    "b_scale_ptr": "*fp32", "ws_ptr": "*fp32", "count_ptr": "*i32"}
            names = gemv_fp8_kernel.arg_names
            ints = dict(zip(names[len(ptrs):], decode_ints(cfg, a, b, (n, 1), scale_strides(sa), scale_strides(sb))))
            # what the JIT specializes on: an integer 1 is a constant (a K-major B's stride_bk), the pointers are
            # 16-byte aligned, integers divisible by 16 are marked so
            consts = {**constexprs_fp8(p), **{x: 1 for x, v in ints.items() if v == 1}}
            ints = {x: v for x, v in ints.items() if v != 1}
            sig = {**ptrs, **{name: "i32" for name in ints}, **{name: "constexpr" for name in consts}}
            sig = {name: sig[name] for name in names}
            attrs = {(names.index(x),): [["tt.divisibility", 16]] for x in ptrs}
            attrs.update({(names.index(x),): [["tt.divisibility", 16]] for x, v in ints.items() if v % 16 == 0})
            kernel = triton.compile(ASTSource(gemv_fp8_kernel, sig, constexprs=consts, attrs=attrs),
                                    target=GPUTarget("cuda", 90, 32), options=launch_options_fp8(cfg))
            r = compiled_report(kernel)
            sass, _ = sass_text(kernel.asm["cubin"])
            r["mma_lines"] = sorted({w for line in sass.splitlines() for w in line.split()
                                     if w.startswith(("QGMMA", "HGMMA", "HMMA"))})
            r["block_m"] = cfg.block_m
            r["reason"] = p.reason
            out[f"{m}x{n}x{k}-scale{mode}-{'K' if kmajor else 'N'}major{'-ffma' if ffma else ''}"] = r
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def reports():
    return child_json(["-c", SCRIPT])


def test_decode_kernel_uses_tensor_cores_from_16_rows_and_never_spills(reports):
    assert len(reports) == 30
    assert {r["block_m"] for name, r in reports.items() if name.endswith("-ffma")} == {1}
    assert {r["block_m"] for name, r in reports.items() if name.startswith("1x")} == {1, 16}  # the table: 16 at M = 1
    for name, r in reports.items():
        assert "decode kernel" in r["reason"] or name.endswith("-ffma"), (name, r["reason"])
        assert r["local_memory_ops"] == 0 and not r["stack_bytes"], (name, r["registers"], r["stack_bytes"])
        if r["block_m"] == 1:
            assert not r["tensor_core"] and r["sass"]["FFMA"] > 0, (name, r["mma_lines"])
        elif r["block_m"] >= 64:
            wgmma = [re.fullmatch(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3", w) for w in r["mma_lines"]]
            assert wgmma and all(wgmma), (name, r["mma_lines"])  # e4m3 wgmma
        else:
            assert r["mma_lines"] == ["HMMA.16816.F32"], (name, r["mma_lines"])  # fp16 operands, fp32 sums
