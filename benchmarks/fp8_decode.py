"""FP8 small-M (decode) GEMMs on a GPU (issue 31's small-M target): gemm_fp8's decode path against cuBLASLt
(torch._scaled_mm), in eager and in CUDA-graph replay, with the fraction of HBM bandwidth each reaches.

Legend: M tokens (1..64), N output features, K input features; B is an nn.Linear weight W (N, K) passed as W^T.

Shapes: M in {1, 8, 16, 32, 64} x (N, K) in {(4096, 7168), (7168, 2048), (2112, 7168), (28672, 8192)} (DeepSeek-V3's
q / o / kv projections and Llama-3-70B's up projection), per-tensor scales and block scales (A 1x128, B 128x128).
Candidates per row: "cublas" (torch._scaled_mm per tensor; block scales through
torch.nn.functional.scaled_mm(.., BlockWise1x128, .., BlockWise128x128) or torch._scaled_mm, the first that runs,
as benchmarks/fp8_variants.py calls them), "cublas_fast" (per tensor, use_fast_accum=True: diagnostic), "decode"
(gemmlab.gemm_fp8 itself: the table's plan, which is the decode path at these M), "tma" (the persistent TMA kernel
at the table's "tma" rule, pinned: what M <= 64 ran before) and, at M = 1 and 64, the decode variants of
``VARIANTS`` (``Fp8DecodeConfig`` fields over the table's rule: the other inner product, narrower tiles, the split
without its workspace cap), for the table's next rules. Each output is verified first against
``ref.gemm_fp8_ref`` under ``ref.gemm_fp8_bound`` (cuBLASLt within 4x: recorded, not graded), then all are timed
interleaved (``instruments.compare.compare_many``: L2 flushed, CUDA events), once in eager and once in graph replay.

    TFLOPS = 2*M*N*K / t
    bytes  = N*K + M*K (e4m3) + M*N*2 (bf16 C) + 4 * (a_scale and b_scale elements): each read or written once
    HBM fraction = (bytes / t) / copy bandwidth, the copy bandwidth a device-to-device copy of 1 GiB measured in
                   the same run (read + write bytes counted: ``gemmlab.bench.probe.hbm_copy_gbps``)

Ratios are speeds against cuBLASLt (> 1: faster), the median over rounds with its 95% interval. In eager, "decode" is
the public call (its kept kernel launched directly); "tma" and the variants go through ``execute_fp8`` (Triton's JIT
launch each call), so their eager times carry the JIT's host cost: compare those in graph replay. Writes
<out>/<gpu>-fp8-decode.json (GPU, clocks, versions, git SHA) after each row, and prints the table last. Sized for
about 5 minutes on an H200 with compilation (--budget-s: no row starts after it; --quick: M 1 and 64, two (N, K)).

    PYTHONPATH=src python benchmarks/fp8_decode.py [--quick] [--rounds 6] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script's operands, baselines and check
from fp8_variants import baselines, checker, operands  # noqa: E402

MS = (1, 8, 16, 32, 64)
NK = {  # name: (N, K)
    "q-4096x7168": (4096, 7168),
    "o-7168x2048": (7168, 2048),
    "kv-2112x7168": (2112, 7168),
    "up-28672x8192": (28672, 8192),
}
MODES = ("tensor", "block")
QUICK_MS, QUICK_NK = (1, 64), ("q-4096x7168", "o-7168x2048")
SCALE = {"tensor": 0, "block": 2}
VARIANTS = {  # M: {name: Fp8DecodeConfig fields over the table's decode rule (its split chosen again)}
    1: {"decode_ffma": {"block_m": 1}, "decode_n32": {"block_n": 32}},
    64: {"decode_m16": {"block_m": 16}, "decode_n32": {"block_n": 32}, "decode_uncapped": {"scratch_share": 64.0}},
}


def moved_bytes(m: int, n: int, k: int, sa: torch.Tensor, sb: torch.Tensor) -> int:
    return n * k + m * k + m * n * 2 + 4 * (sa.numel() + sb.numel())


def row(m: int, nk: str, mode: str, rounds: int, copy_gbps: float, device: torch.device) -> dict:
    import gemmlab
    from gemmlab.instruments.compare import compare_many
    from gemmlab.ops import configs
    from gemmlab.ops.gemm_fp8 import Fp8Config, execute_fp8, plan_fp8

    n, k = NK[nk]
    qa, qb, sa, sb = operands(m, n, k, mode, device)
    base, problems = baselines(mode, qa, qb, sa, sb)
    check, tag = checker(qa, qb, sa, sb, (m, n), {name: 4.0 for name in base} | {"cublas_fast": math.inf})
    fns = {name: tag(name, fn) for name, fn in base.items()}
    plans = {"decode": plan_fp8(qa, qb, sa, sb)}
    fns["decode"] = tag("decode", lambda: gemmlab.gemm_fp8(qa, qb, sa, sb))
    try:
        from gemmlab.device import target_for

        slug = target_for(device).name  # the table the GPU's plan reads
        tma_rule = configs.pick(
            slug, "gemm_fp8", "tma", Fp8Config.from_dict, "float8_e4m3fn", m=m, n=n, k=k, scale=SCALE[mode]
        )
        pinned = {"tma": tma_rule.config}
        for name, fields in VARIANTS.get(m, {}).items():
            pinned[name] = dataclasses.replace(plans["decode"].config, split_k=0, **fields)
        for name, cfg in pinned.items():
            p = plans[name] = plan_fp8(qa, qb, sa, sb, config=cfg)
            out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
            execute_fp8(p, qa, qb, sa, sb, out)  # compile before timing
            fns[name] = tag(name, lambda p=p, out=out: (execute_fp8(p, qa, qb, sa, sb, out), out)[1])
    except Exception as e:  # a pinned variant that cannot run is recorded, the rest timed
        problems["pinned"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    baseline = "cublas" if "cublas" in fns else "decode"
    nbytes = moved_bytes(m, n, k, sa, sb)
    out = {
        "m": m,
        "n": n,
        "k": k,
        "shape": nk,
        "mode": mode,
        "baseline": baseline,
        "bytes": nbytes,
        "plans": {c: p.reason for c, p in plans.items()},
        "unavailable": problems,
    }
    for graph in (False, True):
        res = compare_many(
            fns,
            baseline,
            check=check,
            flops=2.0 * m * n * k,
            dtype="float8_e4m3fn",
            rounds=rounds,
            reps=3,
            warmup_s=0.05,
            graph=graph,
            device=device,
        )
        cands, key = res["candidates"], "graph" if graph else "eager"
        ms = {c: v["median_ms"] for c, v in cands.items() if "median_ms" in v}
        out[key] = {
            "us": {c: t * 1e3 for c, t in ms.items()},
            "tflops": {c: v["tflops"] for c, v in cands.items() if "tflops" in v},
            "vs_cublas": {c: v["vs_baseline"] for c, v in cands.items() if "vs_baseline" in v},
            "hbm_fraction": {c: nbytes / (t * 1e-3) / (copy_gbps * 1e9) for c, t in ms.items()},
            "checks": {c: v.get("check") for c, v in cands.items()},
            "clocks": res.get("clocks"),
        }
    return out


def _ratio(r: dict, mode: str, c: str) -> str:
    v = r.get(mode, {}).get("vs_cublas", {}).get(c)
    return f"{v['ratio']:.2f}" if v else "-"


def print_table(rows: list[dict]) -> None:
    print(
        "\nFP8 small M: decode = gemm_fp8 (table), us in graph replay; x = speed vs cuBLASLt (> 1 faster); "
        "HBM = fraction of the copy bandwidth"
    )
    print(
        f"{'M':>3} {'shape':<14} {'scale':<6} {'decode us':>9} {'cublas us':>9} {'x eager':>7} {'x graph':>7} "
        f"{'HBM':>5} {'cublas HBM':>10} {'tma x':>6} checks; variants x graph"
    )
    for r in rows:
        g = r.get("graph", {})
        us, hbm = g.get("us", {}), g.get("hbm_fraction", {})
        bad = [c for c, chk in g.get("checks", {}).items() if not (chk or {}).get("ok")]
        print(
            f"{r['m']:>3} {r['shape']:<14} {r['mode']:<6} {us.get('decode', math.nan):9.1f} "
            f"{us.get('cublas', math.nan):9.1f} {_ratio(r, 'eager', 'decode'):>7} {_ratio(r, 'graph', 'decode'):>7} "
            f"{hbm.get('decode', math.nan):5.2f} {hbm.get('cublas', math.nan):10.2f} "
            f"{_ratio(r, 'graph', 'tma'):>6} {'ok' if not bad else 'FAILED ' + ','.join(bad)}"
            + "".join(f"; {c} {_ratio(r, 'graph', c)}" for c in VARIANTS.get(r["m"], {}))
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="M 1 and 64 at two (N, K)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=330.0, help="no row starts after this many seconds")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or args.rounds < 2:
        print("fp8_decode: needs a CUDA GPU and --rounds >= 2", file=sys.stderr)
        return 2
    from gemmlab.bench.probe import hbm_copy_gbps
    from gemmlab.device import gpu_slug
    from gemmlab.instruments import timing

    t0, device = time.perf_counter(), torch.device("cuda")
    copy = hbm_copy_gbps(1 << 30)
    print(f"device-to-device copy of 1 GiB: {copy['gbps']:.0f} GB/s (read + write)", flush=True)
    report = {"env": timing.env_info(), "args": vars(args), "method": __doc__, "copy": copy, "rows": []}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{gpu_slug(torch.cuda.get_device_name())}-fp8-decode{'-quick' if args.quick else ''}.json"
    jobs = [
        (m, nk, mode)
        for nk in (QUICK_NK if args.quick else NK)
        for mode in MODES
        for m in (QUICK_MS if args.quick else MS)
    ]
    for m, nk, mode in jobs:
        if time.perf_counter() - t0 > args.budget_s:
            report["cut"] = f"budget {args.budget_s} s reached before {m} {nk} {mode}"
            print(report["cut"], flush=True)
            break
        try:
            r = row(m, nk, mode, args.rounds, copy["gbps"], device)
        except Exception as e:  # a row that fails is recorded; the next one runs
            r = {"m": m, "shape": nk, "mode": mode, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        report["rows"].append(r)
        path.write_text(json.dumps(report, indent=1, default=str))
        g = r.get("graph", {})
        print(
            f"{m}x{nk} {mode}: "
            + (r.get("error") or " ".join(f"{c} {u:.1f}us" for c, u in g.get("us", {}).items()))
            + f" ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    print_table([r for r in report["rows"] if "error" not in r])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
