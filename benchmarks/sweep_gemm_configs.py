"""Sweep candidate GemmConfigs per shape against cuBLAS, interleaved, each verified at the shape first.

    PYTHONPATH=src python3 benchmarks/sweep_gemm_configs.py [--suite all] [--out DIR]

For every shape: random fp16 A, B in [-0.5, 0.5); the float64 reference; each candidate config of the
path ``plan`` picks is run once into a NaN-poisoned C and checked (a wrong config is recorded and never
timed); then cuBLAS (torch.mm) and all correct candidates are timed interleaved with L2 flushes, and each
candidate's speed ratio to cuBLAS is the median over rounds of the per-round ratios. Writes
``<out>/<gpu>-gemm-sweep.json`` and prints the best config per shape. This is how the configs in
``src/gemmlab/configs/<gpu>.json`` were chosen; ``gemmlab tune`` will automate it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from gemmlab.device import gpu_slug
from gemmlab.instruments.timing import ClockSampler, env_info, interleave, ratio_summary, summarize
from gemmlab.ops.gemm import GemmConfig, plan, run
from gemmlab.problems import parse_shape, suite
from gemmlab.ref import gemm_check, gemm_ref


def C(bm, bn, bk, w, s, *, g=8, split=0, sub=False, ws=False) -> GemmConfig:
    return GemmConfig(block_m=bm, block_n=bn, block_k=bk, group_m=g, num_warps=w, num_stages=s, split_k=split,
                      epilogue_subtile=sub, warp_specialize=ws)


# Candidate spaces, as data: path -> bucket -> configs. split=0 lets the plan choose split-K.
CANDIDATES = {
    "tma_persistent": [
        C(128, 256, 64, 8, 3, sub=True), C(128, 256, 64, 8, 4, sub=True), C(128, 256, 64, 8, 3),
        C(128, 256, 64, 8, 3, sub=True, g=16), C(128, 128, 64, 4, 4), C(128, 128, 64, 8, 4),
        C(256, 128, 64, 8, 3, sub=True), C(128, 128, 128, 8, 3),
        C(128, 256, 64, 8, 3, sub=True, g=4), C(128, 256, 64, 8, 3, sub=True, g=1),
        C(128, 256, 128, 8, 2, sub=True), C(64, 256, 64, 4, 4, sub=True), C(256, 128, 64, 8, 4, sub=True),
        C(128, 128, 64, 4, 4, ws=True), C(128, 256, 64, 4, 3, ws=True),  # last: Hopper WS is experimental
    ],
    "tma_splitk": {
        16: [C(16, 64, 128, 4, 6), C(16, 32, 128, 4, 8), C(16, 64, 256, 4, 4), C(16, 128, 128, 4, 5),
             C(16, 64, 128, 4, 6, split=1), C(16, 32, 256, 4, 4), C(16, 64, 128, 4, 6, split=2),
             C(16, 128, 64, 4, 8), C(16, 64, 128, 4, 6, split=4)],
        64: [C(64, 64, 128, 4, 5), C(64, 64, 128, 4, 6, split=2), C(64, 64, 256, 4, 3, split=2),
             C(64, 32, 128, 4, 6, split=1), C(64, 64, 64, 4, 8, split=2), C(64, 128, 64, 4, 6, split=1),
             C(64, 32, 256, 4, 4, split=1), C(64, 64, 128, 8, 5), C(64, 32, 128, 4, 8, split=2)],
        256: [C(128, 128, 64, 4, 5, split=1), C(128, 64, 64, 4, 6, split=1), C(128, 64, 128, 4, 4, split=1),
              C(128, 64, 64, 8, 6, split=1), C(64, 128, 64, 4, 6, split=1), C(64, 128, 64, 8, 6, split=1),
              C(128, 128, 64, 4, 6, split=1), C(64, 64, 128, 4, 5, split=1), C(128, 64, 64, 4, 6, split=2),
              C(64, 256, 64, 8, 4, split=1)],
    },
}


def candidates(path: str, m: int) -> list[GemmConfig]:
    space = CANDIDATES.get(path, [])
    if isinstance(space, dict):
        return space[min(b for b in space if b >= m)]
    return space


def sweep_shape(m: int, n: int, k: int, rounds: int, reps: int, ws: str = "both", graph: bool = True) -> dict:
    g = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k)
    a = torch.rand((m, k), device="cuda", dtype=torch.float16, generator=g) - 0.5
    b = torch.rand((k, n), device="cuda", dtype=torch.float16, generator=g) - 0.5
    ref = gemm_ref(a, b)
    default = plan(a, b)
    c_base = torch.empty((m, n), device="cuda", dtype=torch.float16)
    fns = {"cublas": lambda: torch.mm(a, b, out=c_base)}
    rows = []
    cands = [c for c in candidates(default.path, m) if ws == "both" or (ws == "only") == c.warp_specialize]
    for i, cfg in enumerate(cands):
        print(f"  [{i}] {cfg}", flush=True)
        p = plan(a, b, config=cfg)
        row = {"config": p.config.__dict__, "path": p.path, "c_tma": p.c_tma}
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        try:
            t0 = time.perf_counter()
            run(p, a, b, out=out)
            torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - t0
        except Exception as e:  # out of shared memory, compile failure: recorded, not timed
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            rows.append(row)
            continue
        chk = gemm_check(out, a, b, ref)
        row["check"] = {k_: chk[k_] for k_ in ("ok", "max_abs_err", "worst")}
        if chk["ok"]:
            name = f"cfg{len(rows)}"
            row["name"] = name
            fns[name] = (lambda p=p, out=out: run(p, a, b, out=out))
        rows.append(row)
    with ClockSampler() as clocks:
        times = interleave(fns, rounds=rounds, reps=reps, warmup_s=0.5, graph=graph)
    flops = 2.0 * m * n * k
    base = summarize([t for r in times["cublas"] for t in r])
    for row in rows:
        if "name" in row:
            s = summarize([t for r in times[row["name"]] for t in r])
            row.update(s, tflops=flops / (s["median_ms"] * 1e-3) / 1e12,
                       vs_cublas=ratio_summary(times[row["name"]], times["cublas"]))
    del ref
    torch.cuda.empty_cache()
    return {"shape": [m, n, k], "timing": "cuda-graph replay" if graph else "eager", "default_plan": default.path,
            "cublas": dict(base, tflops=flops / (base["median_ms"] * 1e-3) / 1e12), "clocks": clocks.summary(),
            "candidates": rows}


def print_table(path: Path) -> None:
    results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print("\nshape                 path            cublasTF  best  ratio  config")
    for r in results:
        ok = [c for c in r["candidates"] if "vs_cublas" in c]
        for c in sorted(ok, key=lambda c: -c["vs_cublas"]["ratio"])[:3]:
            cf = c["config"]
            print(f"{'x'.join(map(str, r['shape'])):21s} {r['default_plan']:15s} {r['cublas']['tflops']:7.0f} "
                  f"{c['tflops']:6.0f} {c['vs_cublas']['ratio']:6.3f}  {cf['block_m']}x{cf['block_n']}x{cf['block_k']}"
                  f" w{cf['num_warps']} s{cf['num_stages']} k{cf['split_k']} sub{int(cf['epilogue_subtile'])}"
                  f" ws{int(cf['warp_specialize'])} g{cf['group_m']}")
        for c in r["candidates"]:
            if "vs_cublas" not in c:
                print(f"{'':21s} rejected {c['config']}: {c.get('error') or c.get('check')}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="all")
    ap.add_argument("--shapes", nargs="*", default=None)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--ws", default="both", choices=["both", "skip", "only"], help="warp-specialized configs")
    ap.add_argument("--eager", action="store_true", help="time eager calls (host launch cost included) "
                    "instead of CUDA-graph replays")
    ap.add_argument("--table", default=None, help="only print the table of a JSONL file written before")
    args = ap.parse_args()
    if args.table:
        print_table(Path(args.table))
        return
    shapes = [parse_shape(s) for s in args.shapes] if args.shapes else suite(args.suite)
    info = env_info()
    slug = gpu_slug(info.get("gpu", "cpu"))
    path = Path(args.out) / f"{slug}-gemm-sweep.jsonl"  # one line per shape, appended as each finishes
    path.parent.mkdir(parents=True, exist_ok=True)
    for m, n, k in shapes:
        print(f"{m}x{n}x{k}", flush=True)
        t0 = time.perf_counter()
        r = sweep_shape(m, n, k, args.rounds, args.reps, args.ws, not args.eager)
        r.update(seconds=time.perf_counter() - t0, env=info)
        with path.open("a") as f:
            f.write(json.dumps(r) + "\n")
    print_table(path)


if __name__ == "__main__":
    main()
