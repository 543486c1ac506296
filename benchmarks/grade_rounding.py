"""Calibrate the grader's honest-arithmetic rule (gemmlab/grade/rounding.py) on this GPU and run the cheap-arithmetic
kernels here; then plan the timed batches of every shipped case file (protocol step 0).

Honest: cuBLAS (torch.mm, as torch calls it and with fp32 reductions), every gemmlab path (persistent, split-K,
stream-K, portable, staged) and several Triton configs of each. Cheap: an int8 tensor-core product of the
competition inputs' integers (torch._int_mm: the issue's 1.22x kernel), inputs rounded to bf16 or fp8, or one
mantissa bit dropped; fp16 accumulation across K slices, a truncated (13-bit) accumulator; the sum rounded toward
zero; an honest product with a tenth of its small outputs moved by one ulp. For each on each case: max |err| over
the tolerance (<= 1 passes the max-error check), the share of sampled outputs not correctly rounded and more than
one ulp off, the vendor's share, the rule's limit, and whether the rule passes. Honest rows must pass; cheap rows
must fail (the table's last column says whether each row did what it should).

    PYTHONPATH=src python -m benchmarks grade-rounding [--out DIR] [--seeds 2]

Writes DIR/<gpu>-grade-rounding.json (env, every row, the batch plans); prints the table last. About 3 minutes
on an H200 (Triton compiles each config once)."""

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

import gemmlab
from gemmlab.device import gpu_slug
from gemmlab.grade import cases, make_op, rounding
from gemmlab.grade.batches import plan_batches
from gemmlab.grade.inputs import operands, reference
from gemmlab.instruments.timing import env_info
from gemmlab.ops import gemm as gemm_ops

# (name, M, N, K, dtype, layout, distributions): the shipped case files' timed and listed shapes
CASES = [
    ("competition 8k", 8192, 8192, 16384, torch.float16, "colmajor", ("competition", "uniform")),
    ("competition medium", 1024, 1024, 2048, torch.float16, "colmajor", ("competition", "uniform")),
    ("llm decode_64", 64, 4096, 4096, torch.bfloat16, "rowmajor", ("normal", "uniform")),
    ("llm prefill_4k", 4096, 4096, 4096, torch.bfloat16, "rowmajor", ("normal",)),
    ("llm odd_1000", 1000, 1000, 1000, torch.bfloat16, "rowmajor", ("normal",)),
    ("moe_small", 4096, 2048, 7168, torch.float16, "rowmajor", ("uniform",)),
]
CONFIGS = {  # several Triton configs per path (fields of GemmConfig), besides each shape's default
    "tma_persistent": [
        dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
        dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4),
        dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, epilogue_subtile=True),
        dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4, stream_k=True),
    ],
    "tma_splitk": [
        dict(block_m=64, block_n=64, block_k=128, split_k=1),
        dict(block_m=64, block_n=128, block_k=64, split_k=4),
        dict(block_m=16, block_n=64, block_k=128, split_k=8),
    ],
}


def gemmlab_variants(a, b, out):
    """(name, fn) for gemmlab's default plan, every other path pinned (``plan(path=)``), and each config above on
    its path."""
    base = gemmlab.plan(a, b, out=out)
    plans = [(f"gemmlab {base.path} default", base)]
    for path in gemmlab.paths():
        if path in ("empty", base.path) or (path == "gemv" and a.shape[0] > 256):  # the GEMV kernel: few rows
            continue
        try:
            plans.append((f"gemmlab {path} pinned", gemmlab.plan(a, b, out=out, path=path)))
        except ValueError as e:
            print(f"  skip path {path}: {e}", file=sys.stderr)
    for p0 in [p for _, p in plans]:
        for cfg in CONFIGS.get(p0.path, []):
            try:
                p = gemmlab.plan(a, b, out=out, path=p0.path, config=dataclasses.replace(p0.config, **cfg))
            except (ValueError, TypeError) as e:
                print(f"  skip {cfg}: {e}", file=sys.stderr)
                continue
            plans.append((f"gemmlab {p.path} " + ",".join(f"{k}={v}" for k, v in cfg.items()), p))
    return [(name, (lambda p=p: gemm_ops.run(p, a, b, out=out))) for name, p in plans]


ODD = (1000, 1024, 1001)  # odd K: A cannot be described by TMA as it is


def odd_variants(dtype, device):
    """Operands TMA cannot describe as they are: odd K (staged A), and the same refused staging (portable)."""
    m, n, k = ODD
    a, b = operands(m, n, k, "normal", 5, dtype, device, "rowmajor")
    out = torch.empty((m, n), dtype=dtype, device=device)
    staged, portable = gemmlab.plan(a, b, out=out), gemmlab.plan(a, b, out=out, stage=False)
    return (
        a,
        b,
        out,
        [
            (f"gemmlab {staged.path} staged={staged.staged}", lambda: gemm_ops.run(staged, a, b, out=out)),
            (f"gemmlab {portable.path} (staging refused)", lambda: gemm_ops.run(portable, a, b, out=out)),
        ],
    )


# ------------------------------------------------------------------------------------------ cheap kernels


def int8_integers(a, b):
    """The competition inputs as their integers k (fp16(k / 100)): an int8 tensor-core product, / 10^4."""
    ka, kb = ((t.float() * 100).round().to(torch.int8) for t in (a, b))
    return (torch._int_mm(ka.contiguous(), kb.t().contiguous().t()).double() / 1e4).to(a.dtype)


def rounded_inputs(dtype):
    return lambda a, b: torch.mm(a.to(dtype).to(a.dtype), b.to(dtype).to(a.dtype))


def one_bit_dropped(a, b):
    def drop(t):
        bits = t.contiguous().view(torch.int16)
        return (bits & ~1).view(t.dtype)

    return torch.mm(drop(a), drop(b))


def sliced(a, b, step: int, combine):
    acc = None
    for k0 in range(0, a.shape[1], step):
        part = torch.mm(a[:, k0 : k0 + step].float(), b[k0 : k0 + step].float())
        acc = part if acc is None else combine(acc, part)
    return acc


def fp16_accumulation(a, b):
    return sliced(a, b, 256, lambda acc, p: acc.to(a.dtype).float() + p).to(a.dtype)


def truncated_accumulator(a, b):
    def trunc(x):
        return (x.view(torch.int32) & ~((1 << 10) - 1)).view(torch.float32)

    return sliced(a, b, 64, lambda acc, p: trunc(acc + p)).to(a.dtype)


def toward_zero(a, b):
    s = a.float() @ b.float()
    step = rounding.spacing(s.double(), a.dtype)
    return (torch.trunc(s.double() / step) * step).to(a.dtype)


def perturbed(a, b):
    c = torch.mm(a, b)
    moved = (torch.rand(c.shape, device=c.device) < 0.1) & (c.abs() < 2)
    return torch.where(moved, torch.nextafter(c, torch.full_like(c, 60000.0)), c)


CHEAP = [  # (name, fn(a, b) -> c, where it is cheaper arithmetic: (dist, dtype) -> bool)
    ("int8 integers (competition only)", int8_integers, lambda dist, dt: dist == "competition"),
    ("bf16 inputs", rounded_inputs(torch.bfloat16), lambda dist, dt: dt == torch.float16),
    ("fp8 e4m3 inputs", rounded_inputs(torch.float8_e4m3fn), lambda dist, dt: True),
    ("one mantissa bit dropped", one_bit_dropped, lambda dist, dt: True),
    ("fp16/bf16 accumulation over K slices", fp16_accumulation, lambda dist, dt: True),
    ("13-bit truncated accumulator", truncated_accumulator, lambda dist, dt: True),
    ("rounded toward zero", toward_zero, lambda dist, dt: True),
    ("a tenth of small outputs moved 1 ulp", perturbed, lambda dist, dt: True),
]


def honest_kernels(a, b, out, all_variants: bool):
    """(name, fn() -> C or None when it wrote ``out``): cuBLAS twice, gemmlab's default (and every variant)."""
    kernels = [
        ("cuBLAS torch.mm", lambda: torch.mm(a, b)),
        ("cuBLAS fp32 reductions", lambda: rounding.vendor_product(a, b)),
    ]
    if all_variants:
        return kernels + gemmlab_variants(a, b, out)
    return kernels + [("gemmlab default", lambda: gemmlab.gemm(a, b, out=out))]


# ------------------------------------------------------------------------------------------------ rows


def judge_row(name, kind, case, dist, out, a, b, tol_base=0.01, ref_k=512):
    ref = reference(a, b, dist, out.dtype, tol_base, ref_k)
    err = (out.double() - ref["c_ref"].double()).abs().max().item()
    cand, vendor = rounding.check(out, a, b, ref["vendor"], torch.Generator().manual_seed(0))
    verdict = rounding.judge(cand, vendor)
    ok = verdict is None if kind == "honest" else verdict is not None
    return {
        "case": case,
        "dist": dist,
        "kernel": name,
        "kind": kind,
        "err_over_tol": err / ref["tol"],
        "candidate": cand.as_dict(),
        "vendor": vendor.as_dict(),
        "limit_not_rounded": rounding.limit(vendor.not_rounded),
        "limit_beyond": rounding.limit(vendor.beyond),
        "rule_passes": verdict is None,
        "as_expected": ok,
        "reason": verdict,
    }


def calibrate(seeds: int, dev: str = "cuda", shapes=CASES) -> list[dict]:
    rows = []
    for case, m, n, k, dtype, layout, dists in shapes:
        for dist in dists:
            for seed in range(seeds):
                t0 = time.time()
                a, b = operands(m, n, k, dist, 100 + seed, dtype, dev, layout)
                out = torch.empty((n, m) if layout == "colmajor" else (m, n), dtype=dtype, device=dev)
                out = out.t() if layout == "colmajor" else out
                for name, fn in honest_kernels(a, b, out, seed == 0):
                    try:
                        res = fn()
                        rows.append(judge_row(name, "honest", case, dist, out if res is None else res, a, b))
                    except Exception as e:
                        rows.append(
                            {
                                "case": case,
                                "dist": dist,
                                "kernel": name,
                                "kind": "honest",
                                "error": repr(e),
                                "as_expected": False,
                            }
                        )
                if seed == 0:
                    for name, fn, applies in CHEAP:
                        if not applies(dist, dtype):
                            continue
                        try:
                            rows.append(judge_row(name, "cheap", case, dist, fn(a, b), a, b))
                        except Exception as e:
                            rows.append(
                                {
                                    "case": case,
                                    "dist": dist,
                                    "kernel": name,
                                    "kind": "cheap",
                                    "error": f"{type(e).__name__}: {str(e)[:120]}",
                                    "as_expected": None,
                                }
                            )
                print(f"  {case} {dist} seed {seed}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
                del a, b, out
                if dev == "cuda":
                    torch.cuda.empty_cache()
    for dtype in (torch.float16, torch.bfloat16):
        a, b, out, variants = odd_variants(dtype, dev)
        for name, fn in variants:
            fn()
            rows.append(
                judge_row(name, "honest", f"odd K {'x'.join(map(str, ODD))} {str(dtype)[6:]}", "normal", out, a, b)
            )
    return rows


def batch_plans() -> list[dict]:
    out = []
    for path in sorted(cases.CASES_DIR.glob("*.json")):
        cf = cases.load(str(path))
        if cf.performance is None:
            continue
        try:
            p = plan_batches(make_op(cf), cf.performance, torch.device("cuda", torch.cuda.current_device()))
            out.append({"cases": path.stem, **dataclasses.asdict(p), "batch_ms": p.calls * p.call_ms})
        except Exception as e:
            out.append({"cases": path.stem, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    try:
        rows = calibrate(args.seeds)
    except Exception:
        traceback.print_exc()
        rows = []
    plans = batch_plans()
    path = Path(args.out) / f"{gpu_slug(torch.cuda.get_device_name())}-grade-rounding.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"env": env_info(), "rows": rows, "batch_plans": plans, "seconds": time.time() - t0}, indent=1, default=str
        )
    )
    print(f"wrote {path}")
    print(
        f"{'case':26} {'dist':11} {'kernel':58} {'err/tol':>7} {'notCR%':>7} {'vendor%':>7} {'limit%':>7} "
        f"{'>1ulp':>6} {'rule':>5} ok"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['case']:26} {r['dist']:11} {r['kernel'][:58]:58} error: {r['error'][:60]}")
            continue
        c, v = r["candidate"], r["vendor"]
        pct = lambda x, of: f"{100 * x / max(of, 1):.3f}"  # noqa: E731
        print(
            f"{r['case']:26} {r['dist']:11} {r['kernel'][:58]:58} {r['err_over_tol']:7.3f} "
            f"{pct(c['not_rounded'], c['judged']):>7} {pct(v['not_rounded'], v['judged']):>7} "
            f"{pct(r['limit_not_rounded'], c['judged']):>7} {c['beyond']:6d} "
            f"{'pass' if r['rule_passes'] else 'FAIL':>5} {'yes' if r['as_expected'] else 'NO'}"
        )
    print(f"\n{'cases':22} {'calls':>6} {'call ms':>9} {'batch ms':>9} {'bounded by':>10}")
    for p in plans:
        if "error" in p:
            print(f"{p['cases']:22} error: {p['error'][:80]}")
        else:
            print(f"{p['cases']:22} {p['calls']:6d} {p['call_ms']:9.4f} {p['batch_ms']:9.2f} {p['bounded_by']:>10}")
    bad = [r for r in rows if r.get("as_expected") is False]
    shares = [
        r["candidate"]["not_rounded"] / max(r["candidate"]["judged"], 1)
        for r in rows
        if r["kind"] == "honest" and "candidate" in r
    ]
    print(
        f"\n{len(rows)} rows, {len(bad)} not as expected; the honest kernels' worst not-rounded share "
        f"{max(shares, default=math.nan):.3%}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
