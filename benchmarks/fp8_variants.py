"""FP8 dense kernel variants (issue 31) against cuBLASLt on a GPU, and the error of the FP8 tensor cores' accumulation.

Legend: M, N, K as for gemm; D = |A * a_scale| @ |B * b_scale| (float64), the sum of the magnitudes of the products.

Part "variants": per shape and scale mode, each variant of ``VARIANTS`` (``Fp8Config`` fields over the H200 table's
rule, pinned through ``gemmlab.ops.gemm_fp8.plan_fp8(config=...)``, launched by ``execute_fp8``) and cuBLASLt:
block scales (A 1x128, B 128x128) against ``torch.nn.functional.scaled_mm(.., BlockWise1x128, .., BlockWise128x128)``
(A's scales (M, K/128) outer-dim-major, B's (K/128, N/128); the same tensors go to gemmlab), per-tensor scales
against ``torch._scaled_mm`` (use_fast_accum False, the promoted one; and True, the unpromoted ceiling). Every output
is verified first against ``ref.gemm_fp8_ref`` under ``ref.gemm_fp8_bound`` (worst error / bound; also the worst
against the bound without its tensor-core term, ``ref.fp8_mma_gamma``), then all are timed interleaved in CUDA-graph
replay (``instruments.compare.compare_many``: L2 flushed, the order alternating, checked again after timing). A
baseline counts as verified within 4x the bound (it is recorded, not graded); the DIAGNOSTIC candidates (unpromoted)
are timed whatever their error. TFLOPS = 2*M*N*K / t; ratios are
speeds against the shape's cuBLASLt (> 1: the variant is faster). Registers and spills: the launched kernel's
``n_regs`` and ``n_spills``. The kernels are compiled first, in parallel child processes (Triton's disk cache).

Part "mma": the raw FP8 MMA. Random e4m3 operands (``problems.fp8_operands``: uniform, normal, full-mantissa), unit
scales, fp32 C, M and N random multiples of 16 in [64, 512], K = 32..512: gemm_fp8 with promote off (the tensor
cores accumulate the whole K) and on (an fp32 add every 128 of K), and torch._scaled_mm (fp32 out, use_fast_accum
False and True).
Per K the max over elements and draws of |C - ref| / D; the fit of ``ref.fp8_mma_gamma``'s model is
u = max over K of that / cdiv(min(K, window), 32) (window: K unpromoted, 128 promoted), and the constant to put in
``ref.FP8_MMA_UNIT`` is the promoted fit times 2, rounded up to a power of two.

The mma part runs while the children compile. A variant whose compile child failed or did not finish
(``--compile-limit-s``) is not run in the timing process. The JSON is rewritten after each part and row.
Writes <out>/<gpu>-fp8-variants.json (GPU, clocks, versions, git SHA) and prints the tables last. Sized for under
7 minutes on an H200 with compilation (--quick: square-8192 only, fewer draws).

    PYTHONPATH=src python -m benchmarks fp8-variants [--quick] [--part variants,mma] [--out benchmarks/results]
    PYTHONPATH=src python -m benchmarks fp8-variants --plan | --inspect all      (CPU: the plans; the sm_90 builds)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

import gemmlab
from gemmlab.ops.gemm_fp8 import Fp8Config, execute_fp8, plan_fp8
from gemmlab.ref import FP8_MMA_CHUNK, FP8_MMA_UNIT, FP8_MMA_WINDOW, fp8_mma_gamma, gemm_fp8_bound, gemm_fp8_ref

SHAPES = {  # name: ((M, N, K), scale modes timed)
    "square-8192": ((8192, 8192, 8192), ("block", "tensor")),
    "dsv3-4096x7168x2048": ((4096, 7168, 2048), ("block",)),
    "dsv3-16384x4096x7168": ((16384, 4096, 7168), ("block",)),
}
QUICK = ("square-8192",)
# name: (scale modes, Fp8Config fields over the table's rule); the prediction each was written for is in docs/fp8.md
VARIANTS = {
    "table": (("block", "tensor"), {}),
    "tile_scale": (("block",), {"b_scale_scalar": False}),  # B's scale as a (1, BLOCK_N) tile, not a scalar
    "sbs_s5": (("block",), {"b_scale_scalar": True, "num_stages": 5}),
    "sbs_s6": (("block",), {"b_scale_scalar": True, "num_stages": 6}),
    "ws": (("block", "tensor"), {"b_scale_scalar": True, "warp_specialize": True, "num_warps": 4}),
    "ws_s5": (("block", "tensor"), {"b_scale_scalar": True, "warp_specialize": True, "num_warps": 4, "num_stages": 5}),
    "sbs_g16": (("block",), {"b_scale_scalar": True, "group_m": 16}),
    "m64_2cta": (("block", "tensor"), {"block_m": 64, "num_warps": 4, "ctas_per_sm": 2, "num_stages": 3}),
    "m64_1cta": (("block", "tensor"), {"block_m": 64, "num_warps": 4, "num_stages": 3}),  # m64_2cta's control
    "flat": (("block", "tensor"), {"b_scale_scalar": True, "flatten": True}),
    "n256": (("tensor",), {"block_n": 256, "num_stages": 3}),
    "unpromoted": (("tensor",), {"promote": False}),
    "unpromoted_n256": (("tensor",), {"promote": False, "block_n": 256, "num_stages": 3}),
    "ws_unpromoted": (("tensor",), {"promote": False, "warp_specialize": True, "num_warps": 4}),
}
# not candidates: what the tensor cores do unpromoted (timed and recorded whatever their error; the bound covers only
# a promoted sum), beside cuBLASLt's own unpromoted use_fast_accum
DIAGNOSTIC = ("unpromoted", "unpromoted_n256", "ws_unpromoted", "cublas_fast")
MMA_KS = (32, 64, 96, 128, 160, 256, 384, 512)


def operands(m: int, n: int, k: int, mode: str, device: torch.device) -> tuple:
    """(qa (M, K), qb (K, N) K-major, sa, sb) for ``mode``: x and an nn.Linear weight w (N, K) from randn, quantized
    per tensor, or per 1x128 / 128x128 block (sa (M, K/128) outer-dim-major, sb (K/128, N/128))."""
    g = torch.Generator(device=device.type).manual_seed(m * 31 + n * 7 + k)
    x = torch.randn(m, k, generator=g, device=device)
    w = torch.randn(n, k, generator=g, device=device)
    if mode == "tensor":
        qa, sa = gemmlab.quantize_fp8(x, "tensor")
        qw, sw = gemmlab.quantize_fp8(w, "tensor")
        return qa, qw.t(), sa, sw
    qa, sa = gemmlab.quantize_fp8(x, "block", (1, 128))
    qw, sw = gemmlab.quantize_fp8(w, "block", (128, 128))
    return qa, qw.t(), sa.t().contiguous().t(), sw.t()


def variant_config(qa, qb, sa, sb, fields: dict) -> Fp8Config:
    import dataclasses

    return dataclasses.replace(plan_fp8(qa, qb, sa, sb).config, **fields)


def jobs(shapes: list[str]) -> list[tuple[str, str, str]]:
    return [
        (s, mode, v) for s in shapes for mode in SHAPES[s][1] for v, (modes, _) in VARIANTS.items() if mode in modes
    ]


def meta_plan(shape: tuple[int, int, int], mode: str, name: str):
    """The H200's plan of variant ``name`` at ``shape`` and ``mode``, on "meta" operands (no GPU, no allocation)."""
    import dataclasses

    from gemmlab.device import H200

    m, n, k = shape
    a, b = (
        torch.empty((m, k), dtype=torch.float8_e4m3fn, device="meta"),
        torch.empty((n, k), dtype=torch.float8_e4m3fn, device="meta").t(),
    )
    kb, nb = -(-k // 128), -(-n // 128)
    sa, sb = (
        (torch.empty((kb, m), device="meta").t(), torch.empty((nb, kb), device="meta").t())
        if mode == "block"
        else (torch.empty((), device="meta"), torch.empty((), device="meta"))
    )
    base = plan_fp8(a, b, sa, sb, target=H200).config
    return plan_fp8(a, b, sa, sb, target=H200, config=dataclasses.replace(base, **VARIANTS[name][1]))


def plan_all(shapes: list[str]) -> list[dict]:
    """--plan: every (shape, mode, variant) planned for the H200 (CPU): its config and the plan's reason."""
    return [
        {"job": [s, mode, name], "scale": p.scale, "c_tma": p.c_tma, "reason": p.reason}
        for s, mode, name in jobs(shapes)
        for p in [meta_plan(SHAPES[s][0], mode, name)]
    ]


def inspect(names: list[str]) -> dict:
    """--inspect: each variant's sm_90 build at 8192^3 (``triton.compile`` on the CPU, no GPU; run without
    TRITON_INTERPRET): SASS registers, local-memory ops (spills), warp specialization applied, tensor-core ops,
    wgmma waits per loop in the PTX, shared memory."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from gemmlab.instruments.sass import compiled_report
    from gemmlab.kernels.gemm_fp8 import gemm_fp8_tma_kernel as kernel
    from gemmlab.ops.fp8.plan import launch_options_fp8
    from gemmlab.ops.gemm_fp8 import constexprs_fp8

    out = {}
    for name, (modes, _) in VARIANTS.items():
        for mode in modes if name in names else ():
            p = meta_plan((8192, 8192, 8192), mode, name)
            cfg = p.config
            sig = {
                "a_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {cfg.block_k}]>",
                "b_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {cfg.block_k}]>",
                "c": (
                    f"tensordesc<bf16[{cfg.block_m}, {cfg.block_n // 2 if cfg.epilogue_subtile else cfg.block_n}]>"
                    if p.c_tma
                    else "*bf16"
                ),
                "a_scale_ptr": "*fp32",
                "b_scale_ptr": "*fp32",
            }
            sig.update(
                {x: "i32" for x in ("M", "N", "K", "stride_cm", "stride_sam", "stride_sak", "stride_sbk", "stride_sbn")}
            )
            consts = constexprs_fp8(p)
            sig.update({x: "constexpr" for x in consts})
            built = triton.compile(
                ASTSource(kernel, {x: sig[x] for x in kernel.arg_names}, constexprs=consts),
                target=GPUTarget("cuda", 90, 32),
                options=launch_options_fp8(cfg),
            )
            r = compiled_report(built)
            waits = re.findall(r"wgmma.wait_group.sync.aligned (\d+)", built.asm["ptx"])
            out[f"{mode}-{name}"] = {
                **{key: r[key] for key in ("registers", "local_memory_ops", "warp_specialized", "tensor_core_ops")},
                "shared": built.metadata.shared,
                "wgmma_waits": waits,
            }
    return out


def compile_child(todo: list[tuple[str, str, str]]) -> None:
    """Launch each (shape, mode, variant) once: its kernel lands in Triton's disk cache. One JSON line each."""
    device = torch.device("cuda")
    for shape, mode, name in todo:
        (m, n, k), _ = SHAPES[shape]
        t0 = time.perf_counter()
        try:
            qa, qb, sa, sb = operands(m, n, k, mode, device)
            p = plan_fp8(qa, qb, sa, sb, config=variant_config(qa, qb, sa, sb, VARIANTS[name][1]))
            execute_fp8(p, qa, qb, sa, sb, torch.empty((m, n), dtype=torch.bfloat16, device=device))
            torch.cuda.synchronize()
            print(json.dumps({"job": [shape, mode, name], "s": round(time.perf_counter() - t0, 1)}), flush=True)
        except Exception as e:  # recorded; the timed run says it again
            print(json.dumps({"job": [shape, mode, name], "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)


def start_compiles(todo: list, workers: int) -> list:
    """Start the compile children, each on every ``workers``-th job (every shape: Triton specializes on the integer
    arguments' divisibility by 16, which differs between shapes, e.g. B's scale stride K/128); a warp-specialized
    job gets a child of its own (on the H200 each hung at its first launch, and the jobs after it were lost)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    alone = [j for j in todo if VARIANTS[j[2]][1].get("warp_specialize")]
    rest = [j for j in todo if j not in alone]
    shares = [rest[i::workers] for i in range(min(workers, len(rest)))] + [[j] for j in alone]
    return [
        (
            subprocess.Popen(
                [sys.executable, __file__, "--compile-child", json.dumps(share)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            ),
            share,
        )
        for share in shares
    ]


def finish_compiles(children: list, deadline: float) -> list[dict]:
    """The children's lines; one still running at ``deadline`` (time.monotonic) is killed and its unfinished jobs
    are recorded as errors (a kernel that hangs is never timed)."""
    out = []
    for proc, share in children:
        try:
            stdout, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, _ = proc.communicate()
        done = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        seen = {tuple(r["job"]) for r in done}
        out += done + [
            {"job": list(j), "error": "not finished within --compile-limit-s (a hang?): not timed"}
            for j in share
            if tuple(j) not in seen
        ]
    return out


def checker(qa, qb, sa, sb, shape, limits: dict[str, float]):
    """A check routing each output to its writer (``tag``); worst error / bound with and without the MMA term. A
    candidate passes with worst <= its limit (1 unless ``limits`` says otherwise)."""
    ref = gemm_fp8_ref(qa, qb, sa, sb)
    bound = gemm_fp8_bound(qa, qb, sa, sb, torch.bfloat16, ref)
    old = bound
    if fp8_mma_gamma(qa.shape[1]):
        from gemmlab.ref import dequantize_fp8

        d = dequantize_fp8(qa, sa, (1, 128)).abs() @ dequantize_fp8(qb, sb, (128, 128)).abs()
        old = bound - fp8_mma_gamma(qa.shape[1]) * d * (1 + 2.0**-7)  # the bound before the MMA term
    owner: dict[int, str] = {}

    def check(out) -> dict:
        name = owner.get(out.data_ptr()) if isinstance(out, torch.Tensor) else None
        if name is None or tuple(out.shape) != shape:
            return {"ok": False, "error": "an output no candidate wrote, or of the wrong shape"}
        if not bool(torch.isfinite(out).all()):
            return {"ok": False, "worst": math.inf}
        err = (out.double() - ref).abs()
        worst = (err / bound).max().item()
        r = {"worst": worst, "worst_without_mma_term": (err / old).max().item()}
        return {"ok": worst <= limits.get(name, 1.0), **r}

    def tag(name, fn):
        def call():
            y = fn()
            owner[y.data_ptr()] = name
            return y

        return call

    return check, tag


def baselines(mode: str, qa, qb, sa, sb) -> tuple[dict, dict]:
    """cuBLASLt's calls for ``mode`` (each run once here) and why any cannot run. Block scales: the first of
    torch.nn.functional.scaled_mm and torch._scaled_mm, with B's scales (K/128, N/128) as given or contiguous, that
    runs (the same values either way)."""
    bf16, calls, problems = torch.bfloat16, {}, {}
    if mode == "block":
        tries = []
        for sb_layout in (sb, sb.contiguous()):
            try:
                import torch.nn.functional as F

                fn, st = F.scaled_mm, F.ScalingType
                tries.append(
                    lambda s=sb_layout, fn=fn, st=st: fn(
                        qa, qb, sa, st.BlockWise1x128, s, st.BlockWise128x128, output_dtype=bf16
                    )
                )
            except (AttributeError, ImportError):
                pass
            tries.append(lambda s=sb_layout: torch._scaled_mm(qa, qb, scale_a=sa, scale_b=s, out_dtype=bf16))
        errors = []
        for fn in tries:
            try:
                fn()
                torch.cuda.synchronize()
                calls["cublas"] = fn
                break
            except Exception as e:  # the next form
                errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__)
        if "cublas" not in calls:
            problems["cublas"] = " | ".join(errors)
        return calls, problems
    calls["cublas"] = lambda: torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=bf16)
    calls["cublas_fast"] = lambda: torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=bf16, use_fast_accum=True)
    for name, fn in list(calls.items()):
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:
            problems[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            del calls[name]
    return calls, problems


def variants_row(shape_name: str, mode: str, rounds: int, broken: dict[str, str], device=None) -> dict:
    from gemmlab.instruments.compare import compare_many

    device = device or torch.device("cuda")
    (m, n, k), _ = SHAPES[shape_name]
    qa, qb, sa, sb = operands(m, n, k, mode, device)
    base, problems = baselines(mode, qa, qb, sa, sb)
    limits = {**{name: 4.0 for name in base}, **{name: math.inf for name in DIAGNOSTIC}}
    check, tag = checker(qa, qb, sa, sb, (m, n), limits)
    fns, kernels = {name: tag(name, fn) for name, fn in base.items()}, {}
    for name, (modes, fields) in VARIANTS.items():
        if mode not in modes:
            continue
        if name in broken:
            problems[name] = broken[name]
            continue
        try:
            cfg = variant_config(qa, qb, sa, sb, fields)
            p = plan_fp8(qa, qb, sa, sb, config=cfg)
            out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
            kern = execute_fp8(p, qa, qb, sa, sb, out)
            kernels[name] = {
                "config": {f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
                "n_regs": getattr(kern, "n_regs", None),
                "n_spills": getattr(kern, "n_spills", None),
                "shared": getattr(getattr(kern, "metadata", None), "shared", None),
                "plan": p.reason,
            }
            fns[name] = tag(name, lambda p=p, out=out: (execute_fp8(p, qa, qb, sa, sb, out), out)[1])
        except Exception as e:
            problems[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    baseline = "cublas" if "cublas" in fns else "table"
    res = compare_many(
        fns,
        baseline,
        check=check,
        flops=2.0 * m * n * k,
        dtype="float8_e4m3fn",
        rounds=rounds,
        reps=3,
        warmup_s=0.1,
        graph=True,
    )
    cands = res["candidates"]
    ms = {c: v["median_ms"] for c, v in cands.items() if "median_ms" in v}
    return {
        "shape": shape_name,
        "m": m,
        "n": n,
        "k": k,
        "mode": mode,
        "baseline": baseline,
        "unavailable": problems,
        "kernels": kernels,
        "ms": ms,
        "tflops": {c: v["tflops"] for c, v in cands.items() if "tflops" in v},
        "vs_baseline": {c: ms[baseline] / t for c, t in ms.items() if baseline in ms},
        "checks": {c: v.get("check") for c, v in cands.items()},
        "compare": res,
    }


def mma_part(draws: int, seed: int = 0, device=None) -> dict:
    """Max |C - ref| / D per implementation and K (module docstring, part "mma")."""
    from gemmlab.problems import FP8_KINDS, fp8_operands

    device, rng = device or torch.device("cuda"), random.Random(seed)
    f32, worst = torch.float32, {}
    impls = {"gemmlab_unpromoted": Fp8Config(promote=False), "gemmlab_promoted": Fp8Config(promote=True)}
    for k in MMA_KS:
        for i in range(draws):
            # M, N multiples of 16 (one specialization of each kernel; cuBLASLt's FP8 needs N % 16 == 0)
            m, n, kind = rng.randrange(64, 513, 16), rng.randrange(64, 513, 16), FP8_KINDS[i % len(FP8_KINDS)]
            a, b_nk, _, _ = fp8_operands(m, n, k, kind, False, seed * 1000 + k + i, device)
            one = torch.ones((), dtype=f32, device=device)
            b = b_nk.t()
            ref = a.double() @ b.double()
            d = a.double().abs() @ b.double().abs()
            outs = {}
            for name, cfg in impls.items():
                c = torch.empty((m, n), dtype=f32, device=device)
                execute_fp8(plan_fp8(a, b, one, one, out_dtype=f32, out=c, config=cfg), a, b, one, one, c)
                outs[name] = c
            for fast in (False, True):
                try:
                    outs[f"scaled_mm{'_fast' if fast else ''}"] = torch._scaled_mm(
                        a, b, scale_a=one, scale_b=one, out_dtype=f32, use_fast_accum=fast
                    )
                except Exception:  # noqa: BLE001 (this torch cannot: the row says so by its absence)
                    pass
            for name, c in outs.items():
                r = ((c.double() - ref).abs() / d.clamp_min(1e-300)).max().item()
                key = (name, k)
                worst[key] = max(worst.get(key, 0.0), r)
    names = sorted({n for n, _ in worst})
    table = {name: {k: worst[(name, k)] for k in MMA_KS if (name, k) in worst} for name in names}
    fits = {}
    for name, per_k in table.items():
        window = FP8_MMA_WINDOW if name == "gemmlab_promoted" else None
        fits[name] = max(r / -(-min(k, window or k) // FP8_MMA_CHUNK) for k, r in per_k.items())
    u = fits.get("gemmlab_promoted", 0.0)
    suggested = 2.0 ** math.ceil(math.log2(2 * u)) if u > 0 else None
    return {
        "draws_per_k": draws,
        "max_err_over_d": table,
        "fit_unit": fits,
        "placeholder_unit": FP8_MMA_UNIT,
        "suggested_unit": suggested,
        "placeholder_covers": u <= FP8_MMA_UNIT,
    }


def print_tables(rows: list[dict], mma: dict | None) -> None:
    for row in rows:
        print(f"\n{row['shape']} {row['mode']} scales, graph replay, vs {row['baseline']}:")
        print(
            f"  {'candidate':<17} {'TFLOPS':>7} {'ratio':>6} {'regs':>5} {'spills':>6} {'worst/bound':>11} "
            f"{'w/o mma term':>12}"
        )
        for c, tf in sorted(row["tflops"].items(), key=lambda kv: -kv[1]):
            kern, chk = row["kernels"].get(c, {}), row["checks"].get(c) or {}
            ratio = row["vs_baseline"].get(c, float("nan"))
            print(
                f"  {c:<17} {tf:7.1f} {ratio:6.3f} {str(kern.get('n_regs', '-')):>5}"
                f" {str(kern.get('n_spills', '-')):>6} {chk.get('worst', float('nan')):11.3f}"
                f" {chk.get('worst_without_mma_term', float('nan')):12.3f}"
            )
        for c, why in row["unavailable"].items():
            print(f"  {c:<17} not run: {why}")
        for c, chk in row["checks"].items():
            if c not in row["tflops"]:
                print(f"  {c:<17} not timed: {json.dumps(chk)[:150]}")
    if mma:
        print("\nFP8 MMA: max |C - ref| / D over draws, per K (fp32 C, unit scales)")
        names = list(mma["max_err_over_d"])
        print(f"  {'K':>5} " + " ".join(f"{n:>19}" for n in names))
        for k in MMA_KS:
            print(f"  {k:>5} " + " ".join(f"{mma['max_err_over_d'][n].get(k, float('nan')):19.3e}" for n in names))
        print("  fit u (per 32-product add): " + ", ".join(f"{n} {u:.3e}" for n, u in mma["fit_unit"].items()))
        print(
            f"  ref.FP8_MMA_UNIT placeholder {mma['placeholder_unit']:.3e} covers the promoted fit: "
            f"{mma['placeholder_covers']}; suggested {mma['suggested_unit']}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}, fewer draws")
    ap.add_argument("--part", default="variants,mma", help="comma-separated: variants, mma")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--workers", type=int, default=12, help="compile children")
    ap.add_argument(
        "--compile-limit-s",
        type=float,
        default=150.0,
        help="how long the compile children may still run once the mma part is done",
    )
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--plan", action="store_true", help="no GPU: print every variant's H200 plan as JSON")
    ap.add_argument(
        "--inspect",
        metavar="NAMES",
        help="no GPU: the sm_90 builds of these variants (comma-separated, "
        "or all) as JSON: registers, spills, warp specialization, wgmma waits",
    )
    ap.add_argument("--compile-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile_child:
        compile_child([tuple(j) for j in json.loads(args.compile_child)])
        return 0
    if args.plan or args.inspect:
        names = list(VARIANTS) if args.inspect == "all" else (args.inspect or "").split(",")
        unknown = [x for x in names if args.inspect and x not in VARIANTS]
        if unknown:
            print(f"fp8_variants: unknown variant(s) {unknown}; known: {list(VARIANTS)}", file=sys.stderr)
            return 2
        print(json.dumps(plan_all(list(SHAPES)) if args.plan else inspect(names)))
        return 0
    parts = set(args.part.split(","))
    if not torch.cuda.is_available() or parts - {"variants", "mma"} or args.rounds < 2 or args.workers < 1:
        print(
            "fp8_variants: needs a CUDA GPU, --part from variants,mma, --rounds >= 2, --workers >= 1", file=sys.stderr
        )
        return 2
    from gemmlab.device import gpu_slug
    from gemmlab.instruments import timing

    t0 = time.perf_counter()
    shapes = [s for s in SHAPES if not args.quick or s in QUICK]
    report = {
        "env": timing.env_info(),
        "args": vars(args),
        "method": __doc__,
        "variants": VARIANTS,
        "rows": [],
        "mma": None,
    }
    rows = report["rows"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{gpu_slug(torch.cuda.get_device_name())}-fp8-variants{'-quick' if args.quick else ''}.json"

    def save() -> None:  # after each part and row: a run cut short keeps what it measured
        path.write_text(json.dumps(report, indent=1, default=str))

    children = start_compiles(jobs(shapes), args.workers) if "variants" in parts else []
    if "mma" in parts:  # while the children compile
        report["mma"] = mma_part(3 if args.quick else 9)
        print(f"mma part done ({time.perf_counter() - t0:.0f} s)", flush=True)
        save()
    if "variants" in parts:
        report["compile"] = finish_compiles(children, time.monotonic() + args.compile_limit_s)
        print(f"compiled {len(report['compile'])} kernels ({time.perf_counter() - t0:.0f} s)", flush=True)
        for r in report["compile"]:
            if "error" in r:
                print(f"  {' '.join(r['job'])}: {r['error'][:200]}", flush=True)
        for s in shapes:
            for mode in SHAPES[s][1]:
                broken = {
                    r["job"][2]: r["error"] for r in report["compile"] if "error" in r and r["job"][:2] == [s, mode]
                }  # (a CUDA error would poison the rest)
                rows.append(variants_row(s, mode, args.rounds, broken))
                print(
                    f"{s} {mode}: " + " ".join(f"{c} {v:.3f}" for c, v in rows[-1]["vs_baseline"].items()),
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
                save()
    save()
    print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    print_tables(rows, report["mma"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
