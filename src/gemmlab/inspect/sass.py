"""What the compiler made of a plan's kernel, without a GPU: build the sm_90 cubin with ``triton.compile``
and read it with the ``cuobjdump`` that ships inside Triton's wheel.

    report(plan) -> {"registers", "stack_bytes", "local_memory_ops", "shared_bytes",
                     "sass": {opcode: count}, "tensor_core", "warp_specialized", ...}

Needs Triton's compiler, not its interpreter: call it in a process without TRITON_INTERPRET=1.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from gemmlab.ops.gemm import KERNELS, constexprs
from gemmlab.ops.plan import Plan, Target, choose

TENSOR_CORE_OPS = ("HGMMA", "HMMA", "QGMMA", "IMMA")
WATCHED_OPS = TENSOR_CORE_OPS + ("UTMALDG", "UTMASTG", "UBLKCP", "LDGSTS", "LDG", "STG", "BAR", "SYNCS",
                                 "WARPGROUP", "LDL", "STL")


H200 = Target("nvidia-h200", (9, 0), 132)


def plan_for(m: int, n: int, k: int, dtype: torch.dtype = torch.float16, layout: str = "NN",
             target: Target = H200) -> Plan:
    """The plan ``gemm`` makes on ``target`` for contiguous operands of this shape (A stored transposed if
    layout[0] == "T", B if layout[1] == "T"), without a GPU: operands are "meta" tensors."""
    a = torch.empty((m, k) if layout[0] == "N" else (k, m), dtype=dtype, device="meta")
    b = torch.empty((k, n) if layout[1] == "N" else (n, k), dtype=dtype, device="meta")
    a = a if layout[0] == "N" else a.t()
    b = b if layout[1] == "N" else b.t()
    return choose(a, b, None, False, target=target)


def _cuobjdump() -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def _tl_dtype(plan: Plan) -> str:
    return {"torch.float16": "fp16", "torch.bfloat16": "bf16"}[str(plan.dtype)]


def signature(plan: Plan) -> dict[str, str]:
    """Triton types of the plan's runtime (non-constexpr) kernel arguments, as the launcher passes them."""
    dt, cfg = _tl_dtype(plan), plan.config
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if plan.path == "portable":
        ints = ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
        return {"a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "c_ptr": f"*{dt}", **{n: "i32" for n in ints}}
    a = [bm, bk] if plan.a_kmajor else [bk, bm]
    b = [bn, bk] if plan.b_kmajor else [bk, bn]
    c = f"tensordesc<{dt}[{bm}, {bn // 2 if cfg.epilogue_subtile else bn}]>" if plan.c_tma else f"*{dt}"
    sig = {"a_desc": f"tensordesc<{dt}[{a[0]}, {a[1]}]>", "b_desc": f"tensordesc<{dt}[{b[0]}, {b[1]}]>",
           "c": c}
    if plan.path == "tma_splitk":
        sig.update(ws_ptr="*fp32", count_ptr="*i32")
    sig.update(M="i32", N="i32", K="i32", stride_cm="i32")
    if plan.path == "tma_splitk":
        sig["K_TILES_PER_SPLIT"] = "i32"
    return sig


def compile_plan(plan: Plan, arch: int = 90):
    """triton.compile the plan's kernel for sm_<arch>; returns Triton's CompiledKernel (asm: ttgir, ptx,
    cubin)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("inspect needs Triton's compiler: run without TRITON_INTERPRET=1")
    if plan.path not in KERNELS:
        raise ValueError(f"path {plan.path!r} launches no kernel")
    fn = KERNELS[plan.path]
    consts = constexprs(plan)
    sig = {**signature(plan), **{name: "constexpr" for name in consts}}
    sig = {name: sig[name] for name in fn.arg_names}  # kernel argument order
    src = ASTSource(fn, sig, constexprs=consts)
    options = {"num_warps": plan.config.num_warps, "num_stages": plan.config.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def sass_histogram(cubin: bytes) -> tuple[collections.Counter, dict]:
    """Opcode counts of a cubin's SASS, and its resource usage (registers, stack, shared memory)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([_cuobjdump(), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    usage = {}
    for key, pat in (("registers", r"REG:(\d+)"), ("stack_bytes", r"STACK:(\d+)"), ("shared_bytes", r"SHARED:(\d+)")):
        m = re.search(pat, res)
        usage[key] = int(m.group(1)) if m else None
    return ops, usage


def report(plan: Plan, arch: int = 90) -> dict:
    """Compiler report for the kernel ``plan`` would launch: resources, SASS histogram, tensor cores, WS."""
    kernel = compile_plan(plan, arch)
    ops, usage = sass_histogram(kernel.asm["cubin"])
    cfg = plan.config
    return {
        "kernel": KERNELS[plan.path].fn.__name__,
        "arch": f"sm_{arch}",
        "path": plan.path,
        "block": [cfg.block_m, cfg.block_n, cfg.block_k],
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
        **usage,
        "local_memory_ops": ops.get("LDL", 0) + ops.get("STL", 0),  # spills or a stack-resident array
        "triton_shared_bytes": kernel.metadata.shared,
        "sass": {op: ops.get(op, 0) for op in WATCHED_OPS},
        "sass_total": sum(ops.values()),
        "tensor_core": any(ops.get(op, 0) for op in TENSOR_CORE_OPS),
        "warp_specialized": "ttg.warp_specialize" in kernel.asm["ttgir"],
    }
