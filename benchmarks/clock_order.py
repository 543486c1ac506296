"""Why interleave: back-to-back timing (all of A, then all of B) against interleaved timing (ABAB...).

    PYTHONPATH=src python -m benchmarks clock-order [--shape 8192,8192,16384] [--out DIR]

On a power-capped GPU the SM clock falls once a large GEMM has run for a while, so in a back-to-back
measurement whichever candidate runs first gets the higher clock. Two pairs, each measured three ways
after the GPU has idled for ``--idle-s`` seconds (the state a naive benchmark starts from):
  - cuBLAS against itself (identical work into two buffers): the true ratio is 1.000;
  - gemmlab against cuBLAS.
Ways: back-to-back A then B, back-to-back B then A, interleaved (``compare_many``, rounds alternating).
Every output is verified against float64 first. Prints a table with each candidate's mean SM clock and
writes ``<out>/<gpu>-clock-order.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import gemmlab
from gemmlab.device import gpu_slug
from gemmlab.instruments.compare import compare_many
from gemmlab.instruments.timing import env_info
from gemmlab.problems import gemm_operands, parse_shape
from gemmlab.ref import gemm_check, gemm_ref


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192,8192,16384")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--idle-s", type=float, default=4.0)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    m, n, k = parse_shape(args.shape)
    a, b = gemm_operands(m, n, k, torch.float16, torch.device("cuda"))
    ref = gemm_ref(a, b)
    bufs = [torch.empty((m, n), dtype=a.dtype, device="cuda") for _ in range(3)]
    calls = {
        "cublas": lambda: torch.mm(a, b, out=bufs[0]),
        "cublas-again": lambda: torch.mm(a, b, out=bufs[1]),
        "gemmlab": lambda: gemmlab.gemm(a, b, out=bufs[2]),
    }

    def check(out) -> dict:
        c = gemm_check(out, a, b, ref)
        return {key: c[key] for key in ("ok", "max_abs_err", "worst")}

    pairs = [("cublas-again", "cublas"), ("gemmlab", "cublas")]
    results = []
    for cand, base in pairs:
        for way, order in (
            ("back-to-back", (cand, base)),
            ("back-to-back", (base, cand)),
            ("interleaved", (cand, base)),
        ):
            time.sleep(args.idle_s)  # let the GPU cool and clock up, as it is before any benchmark
            fns = {name: calls[name] for name in order}
            r = compare_many(
                fns,
                base,
                check=check,
                flops=2.0 * m * n * k,
                rounds=args.rounds,
                reps=args.reps,
                warmup_s=0.0 if way == "back-to-back" else 1.0,
                mode=way,
            )
            c, bb = r["candidates"][cand], r["candidates"][base]
            results.append(
                {
                    "pair": f"{cand} vs {base}",
                    "way": way,
                    "order": list(order),
                    "ratio": c["vs_baseline"]["ratio"],
                    "ci95": c["vs_baseline"]["ci95"],
                    "verdict": c["vs_baseline"]["verdict"],
                    "cand_ms": c["median_ms"],
                    "base_ms": bb["median_ms"],
                    "cand_mhz": c["clocks"].get("sm_clock_mhz_mean"),
                    "base_mhz": bb["clocks"].get("sm_clock_mhz_mean"),
                    "ok": all(x["check"]["ok"] and x.get("check_after") for x in (c, bb)),
                    "raw": r,
                }
            )
            x = results[-1]
            print(
                f"{x['pair']:24s} {way:12s} {'>'.join(order):22s} ratio {x['ratio']:.3f} "
                f"[{x['ci95'][0]:.3f},{x['ci95'][1]:.3f}] {x['verdict']:12s} MHz {x['cand_mhz'] or 0:.0f}/"
                f"{x['base_mhz'] or 0:.0f}",
                flush=True,
            )
    env = env_info()
    path = Path(args.out) / f"{gpu_slug(env.get('gpu') or 'cpu')}-clock-order.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"env": env, "shape": [m, n, k], "args": vars(args), "results": results}, indent=1, default=str)
    )
    print(f"\n{env.get('gpu')} fp16 {m}x{n}x{k}, git {env['git_sha'][:12]}; ratio = base time / candidate time")
    print(
        f"{'pair':24s} {'way':12s} {'order (first>second)':22s} {'ratio':>6s} {'95% CI':>15s} {'verdict':12s} "
        f"{'cand/base MHz':>14s} ok"
    )
    for x in results:
        print(
            f"{x['pair']:24s} {x['way']:12s} {'>'.join(x['order']):22s} {x['ratio']:6.3f} "
            f"[{x['ci95'][0]:.3f},{x['ci95'][1]:.3f}] {x['verdict']:12s} "
            f"{x['cand_mhz'] or 0:6.0f}/{x['base_mhz'] or 0:<6.0f} {'ok' if x['ok'] else 'WRONG'}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
