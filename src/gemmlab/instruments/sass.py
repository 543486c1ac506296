"""What the compiler made of a plan's kernel, without a GPU: build the sm_90 cubin with ``triton.compile``
and read it with the ``cuobjdump`` that ships inside Triton's wheel.

    report(plan) -> {"registers", "stack_bytes", "local_memory_ops", "shared_bytes",
                     "sass": {opcode: count}, "tensor_core", "warp_specialized", "flags", ...}
    inspect_shape(M, N, K, dtype, layout, packed) -> the report for the plan ``gemm`` makes at that shape

Needs Triton's compiler, not its interpreter: ``report`` refuses to run under TRITON_INTERPRET=1, and
``inspect_shape`` then runs itself in a child process without it.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from gemmlab.device import H200, Target, target_for
from gemmlab.ops.gemm import Plan
from gemmlab.ops.introspect import KERNELS, choose, constexprs, launch_options, padded_k

if TYPE_CHECKING:
    from gemmlab.ops.moe import MoEConfig

TENSOR_CORE_OPS = ("HGMMA", "HMMA", "QGMMA", "IMMA")
WATCHED_OPS = TENSOR_CORE_OPS + (
    "FFMA",
    "UTMALDG",
    "UTMASTG",
    "UBLKCP",
    "LDGSTS",
    "LDG",
    "STG",
    "LDS",
    "STS",
    "BAR",
    "SYNCS",
    "WARPGROUP",
    "LDL",
    "STL",
)


def plan_for(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype = torch.float16,
    layout: str = "NN",
    target: Target = H200,
    packed: bool = False,
) -> Plan:
    """The plan ``gemm`` makes on ``target`` for contiguous operands of this shape (A stored transposed if
    layout[0] == "T", B if layout[1] == "T"; ``packed``: B as ``pack_b`` stores it, K-major with rows
    padded to 16 bytes), without a GPU: operands are "meta" tensors."""
    _check_layout(layout)
    a = torch.empty((m, k) if layout[0] == "N" else (k, m), dtype=dtype, device="meta")
    a = a if layout[0] == "N" else a.t()
    if packed:
        b = torch.empty((n, padded_k(k)), dtype=dtype, device="meta")[:, :k].t()
    else:
        b = torch.empty((k, n) if layout[1] == "N" else (n, k), dtype=dtype, device="meta")
        b = b if layout[1] == "N" else b.t()
    return choose(a, b, None, False, target=target)


def _check_layout(layout: str) -> None:
    if len(layout) != 2 or set(layout) - {"N", "T"}:
        raise ValueError(f"layout {layout!r}: two letters of N/T (A then B), e.g. NN or NT")


def _cuobjdump() -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def _tl_dtype(plan: Plan) -> str:
    return {"torch.float16": "fp16", "torch.bfloat16": "bf16"}[str(plan.dtype)]


def signature(plan: Plan) -> dict[str, str]:
    """Triton types of the plan's runtime (non-constexpr) kernel arguments, as the launcher passes them."""
    dt, cfg = _tl_dtype(plan), plan.config
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if plan.path in ("portable", "gemv"):
        ints = ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
        sig = {"a_ptr": f"*{dt}", "b_ptr": f"*{dt}", "c_ptr": f"*{dt}"}
        if plan.path == "gemv":
            sig.update(ws_ptr="*fp32", count_ptr="*i32")
        sig.update({n: "i32" for n in ints})
        if plan.path == "gemv":
            sig["K_TILES_PER_SPLIT"] = "i32"
        return sig
    a = [bm, bk] if plan.a_kmajor else [bk, bm]
    b = [bn, bk] if plan.b_kmajor else [bk, bn]
    c = f"tensordesc<{dt}[{bm}, {bn // 2 if cfg.epilogue_subtile else bn}]>" if plan.c_tma else f"*{dt}"
    sig = {"a_desc": f"tensordesc<{dt}[{a[0]}, {a[1]}]>", "b_desc": f"tensordesc<{dt}[{b[0]}, {b[1]}]>", "c": c}
    sig.update(ws_ptr="*fp32", count_ptr="*i32")
    sig.update(M="i32", N="i32", K="i32", stride_cm="i32")
    if plan.path == "tma_splitk":
        sig["K_TILES_PER_SPLIT"] = "i32"
    else:
        sig["SK_TILES"] = "i32"
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
    options = launch_options(plan.config)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def sass_text(cubin: bytes) -> tuple[str, str]:
    """A cubin's SASS listing and its resource usage, as ``cuobjdump -sass`` and ``-res-usage`` print them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([_cuobjdump(), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return sass, res


def sass_histogram(cubin: bytes) -> tuple[collections.Counter, dict]:
    """Opcode counts of a cubin's SASS, and its resource usage (registers, stack, shared memory)."""
    sass, res = sass_text(cubin)
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


def compiled_report(kernel) -> dict:
    """Resources and SASS of any compiled Triton kernel (``triton.compile`` result or a launched kernel)."""
    ops, usage = sass_histogram(kernel.asm["cubin"])
    r = {
        **usage,
        "local_memory_ops": ops.get("LDL", 0) + ops.get("STL", 0),  # spills or a stack-resident array
        "spill_stores": ops.get("STL", 0),
        "triton_shared_bytes": kernel.metadata.shared,
        "sass": {op: ops.get(op, 0) for op in WATCHED_OPS},
        "sass_total": sum(ops.values()),
        "tensor_core": any(ops.get(op, 0) for op in TENSOR_CORE_OPS),
        "tensor_core_ops": sum(ops.get(op, 0) for op in TENSOR_CORE_OPS),
        "warp_specialized": "ttg.warp_specialize" in kernel.asm.get("ttgir", ""),
    }
    r["flags"] = flags(r)
    return r


def flags(r: dict) -> list[str]:
    """What a kernel engineer must look at: no tensor-core instruction (the seed's "generated code still has
    MMA" check), local-memory traffic (spills), warp specialization requested but not applied."""
    out = []
    if not r.get("tensor_core"):
        out.append("NO TENSOR-CORE INSTRUCTION (no HGMMA/HMMA in the SASS): this GEMM runs on CUDA cores")
    if r.get("local_memory_ops") or r.get("stack_bytes"):
        out.append(f"local memory: {r.get('local_memory_ops')} LDL/STL, {r.get('stack_bytes')} stack bytes (spills)")
    if r.get("warp_specialize_requested") and not r.get("warp_specialized"):
        out.append("warp specialization requested but not applied (no ttg.warp_specialize in the TTGIR)")
    return out


def report(plan: Plan, arch: int = 90) -> dict:
    """Compiler report for the kernel ``plan`` would launch: resources, SASS histogram, tensor cores, WS."""
    kernel = compile_plan(plan, arch)
    cfg = plan.config
    r = {
        "kernel": KERNELS[plan.path].fn.__name__,
        "arch": f"sm_{arch}",
        "path": plan.path,
        "reason": plan.reason,
        "block": [cfg.block_m, cfg.block_n, cfg.block_k],
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
        "group_m": cfg.group_m,
        "split_k": cfg.split_k,
        "stream_k": cfg.stream_k,
        "tail_split": cfg.tail_split,
        "epilogue_subtile": cfg.epilogue_subtile,
        "warp_specialize_requested": cfg.warp_specialize,
        "max_nreg": cfg.max_nreg,
        "c_tma": plan.c_tma,
    }
    r.update(compiled_report(kernel))
    r["flags"] = flags(r)
    return r


def inspect_shape(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype = torch.float16,
    layout: str = "NN",
    packed: bool = False,
    target: Target | None = None,
    arch: int | None = None,
) -> dict:
    """The compiler report of the kernel ``gemm`` launches for this shape on ``target`` (default: this
    process's GPU, or the H200 without one). Under the interpreter it runs in a child process."""
    _check_layout(layout)
    if min(m, n, k) < 0:
        raise ValueError(f"shape {m}x{n}x{k}: sizes must be >= 0")
    if os.environ.get("TRITON_INTERPRET") == "1":
        env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
        code = (
            "import json, sys, torch; from gemmlab.instruments.sass import inspect_shape; "
            "a = json.loads(sys.argv[1]); a['dtype'] = getattr(torch, a['dtype']); "
            "print(json.dumps(inspect_shape(**a)))"
        )
        args = {
            "m": m,
            "n": n,
            "k": k,
            "dtype": str(dtype).removeprefix("torch."),
            "layout": layout,
            "packed": packed,
            "arch": arch,
        }
        if target is not None:
            raise ValueError("inspect_shape: pass target only outside the interpreter")
        p = subprocess.run(
            [sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, env=env, timeout=600
        )
        if p.returncode != 0:
            raise RuntimeError(f"inspect child failed: {p.stderr[-2000:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])
    if target is None:
        target = target_for(torch.device("cuda")) if torch.cuda.is_available() else H200
    arch = arch or target.capability[0] * 10 + target.capability[1]
    p = plan_for(m, n, k, dtype, layout, target, packed)
    if p.path not in KERNELS:
        return {
            "path": p.path,
            "reason": p.reason,
            "target": target.name,
            "kernel": None,
            "flags": ["no kernel is launched for this shape"],
        }
    return {
        "shape": [m, n, k],
        "dtype": str(dtype).removeprefix("torch."),
        "layout": layout,
        "packed_b": packed,
        "target": target.name,
        **report(p, arch),
    }


def moe_report(
    mode: int,
    rows: int,
    experts: int,
    dtype: torch.dtype = torch.bfloat16,
    a_tma: bool = True,
    a_gather: bool = False,
    w_tma: bool = True,
    target: Target = H200,
    arch: int = 90,
    config: MoEConfig | None = None,
    max_group: int = 0,
) -> dict:
    """Compiler report of ``moe_grouped_kernel`` as ``ops.moe`` configures it for ``rows`` routed rows
    over ``experts`` experts (mode 0 grouped, 1 gate/up + SiLU, 2 down + weight) on ``target``; ``config``
    instead of ``moe_config``'s choice (``max_group``: its bound on the largest group, as ``moe_forward`` passes
    T). The output is taken as 16-byte aligned (as ``moe_forward``'s are)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("inspect needs Triton's compiler: run without TRITON_INTERPRET=1")
    from gemmlab.ops.introspect import epilogue_flags, launch_config, moe_config
    from gemmlab.ops.introspect import grouped_kernel as moe_grouped_kernel

    cfg = launch_config(
        config or moe_config(target, rows, experts, mode, dtype.itemsize, dtype=dtype, max_group=max_group),
        a_tma,
        a_gather,
        w_tma,
    )
    warps, stages = cfg.num_warps, cfg.num_stages
    dt = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    clip, out_tma = epilogue_flags(cfg, a_tma, w_tma, True)
    sig = {
        "a": f"tensordesc<{dt}[{bm}, {bk}]>" if a_tma and not clip else f"*{dt}",
        "a_rows": "*i32",
        "w": f"tensordesc<{dt}[{bn}, {bk}]>" if w_tma else f"*{dt}",
        "out": f"*{dt}",
        "out_desc": f"tensordesc<{dt}[{bm}, {bn // 2}]>" if out_tma else f"*{dt}",
        "scale": "*fp32",
        "pre": f"*{dt}",
        "offsets": "*i32",
        "tile_offsets": "*i32",
        "N": "i32",
        "K": "i32",
        "E": "i32",
        "stride_am": "i32",
        "stride_wn": "i32",
        "stride_om": "i32",
        "stride_pre": "i32",
    }
    consts = dict(
        MODE=mode,
        A_TMA=a_tma,
        A_GATHER=a_gather,
        W_TMA=w_tma,
        CLIP=clip,
        OUT_TMA=out_tma,
        SAVE_PRE=False,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=cfg.group_m,
        NUM_PROGRAMS=target.num_sms * cfg.programs_per_sm,
        LOG2_E=max(1, (experts - 1).bit_length()) + 1,
        DOT_UPCAST=False,
    )
    sig = {name: sig.get(name, "constexpr") for name in moe_grouped_kernel.arg_names}
    kernel = triton.compile(
        ASTSource(moe_grouped_kernel, sig, constexprs=consts),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": warps, "num_stages": stages},
    )
    r = {
        "kernel": "moe_grouped_kernel",
        "mode": mode,
        "block": [bm, bn, bk],
        "num_warps": warps,
        "num_stages": stages,
        "a_tma": a_tma,
        "a_gather": a_gather,
        "w_tma": w_tma,
        "clip": clip,
        "out_tma": out_tma,
    }
    r.update(compiled_report(kernel))
    return r


def summary(r: dict, label: str) -> list[str]:
    """``gemmlab inspect``'s printed lines (rich markup) for an ``inspect_shape`` report."""
    lines = [f"[bold]{label} on {r.get('target')}: path {r.get('path')} ({r.get('reason')})"]
    if r.get("kernel"):
        lines += [
            f"kernel {r['kernel']} {r['arch']}: block {r['block']}, {r['num_warps']} warps, "
            f"{r['num_stages']} stages, group_m {r['group_m']}, split_k {r['split_k']}, "
            f"epilogue subtile {r['epilogue_subtile']}, C via {'TMA' if r['c_tma'] else 'pointers'}",
            f"registers/thread {r['registers']}, stack {r['stack_bytes']} B, spill stores {r['spill_stores']}, "
            f"local memory ops {r['local_memory_ops']}, shared {r['triton_shared_bytes']} B (dynamic) + "
            f"{r['shared_bytes']} B (static), warp specialized {r['warp_specialized']}",
            "SASS: "
            + ", ".join(f"{op} {cnt}" for op, cnt in r["sass"].items() if cnt)
            + f" (of {r['sass_total']} instructions)",
        ]
    return lines + [f"[red]FLAG: {f}" for f in r.get("flags", [])]
