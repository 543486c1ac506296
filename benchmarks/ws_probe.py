"""Probe Triton 3.6's Hopper warp specialization on the persistent kernel, one config per child process
under a timeout (an earlier 128x128 num_warps=4 attempt hung: benchmarks/results/nvidia-h200-ws-probe-timeout.log).

    PYTHONPATH=src python3 benchmarks/ws_probe.py [--timeout 45] [--shape 4096,4096,4096] [--out FILE.jsonl]

Each child: fresh random fp16 A, B; plan with the pinned config (GEMMLAB_ALLOW_WS=1); one call into a
NaN-poisoned C checked against the float32 reference; then cuBLAS and the config timed interleaved
(CUDA-graph replay, L2 flushed); prints one JSON line. A hang or crash is recorded as such.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CANDIDATES = [  # (block_m, block_n, block_k, num_warps, num_stages)
    (128, 256, 64, 8, 3),
    (128, 128, 64, 4, 3),
    (256, 128, 64, 8, 3),
]


def child(shape: str, cand: str) -> None:
    import torch

    from gemmlab.instruments.timing import ClockSampler, interleave, ratio_summary, summarize
    from gemmlab.ops.gemm import GemmConfig, plan, run
    from gemmlab.problems import parse_shape
    from gemmlab.ref import gemm_check

    m, n, k = parse_shape(shape)
    bm, bn, bk, w, s = (int(v) for v in cand.split(","))
    cfg = GemmConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s, warp_specialize=True)
    a = torch.rand((m, k), device="cuda", dtype=torch.float16) - 0.5
    b = torch.rand((k, n), device="cuda", dtype=torch.float16) - 0.5
    p = plan(a, b, config=cfg)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    run(p, a, b, out=out)
    torch.cuda.synchronize()
    chk = gemm_check(out, a, b)
    row = {"shape": [m, n, k], "config": cfg.__dict__, "path": p.path, "ok": bool(chk["ok"]),
           "max_abs_err": chk["max_abs_err"]}
    if chk["ok"]:
        c2 = torch.empty_like(out)
        with ClockSampler() as clocks:
            times = interleave({"cublas": lambda: torch.mm(a, b, out=c2), "ws": lambda: run(p, a, b, out=out)},
                               rounds=6, reps=3, warmup_s=0.3, graph=True)
        row.update(ws=summarize([t for r in times["ws"] for t in r]),
                   cublas=summarize([t for r in times["cublas"] for t in r]),
                   vs_cublas=ratio_summary(times["ws"], times["cublas"]), clocks=clocks.summary())
    print("RESULT " + json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=45)
    ap.add_argument("--shape", default="4096,4096,4096")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.shape, args.child)
    env = dict(os.environ, GEMMLAB_ALLOW_WS="1")
    rows = []
    for cand in CANDIDATES:
        spec = ",".join(map(str, cand))
        try:
            r = subprocess.run([sys.executable, __file__, "--shape", args.shape, "--child", spec], env=env,
                               capture_output=True, text=True, timeout=args.timeout)
            got = [ln[7:] for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
            row = json.loads(got[0]) if got else {"shape": args.shape, "config": spec, "error": f"exit "
                                                  f"{r.returncode}: "
                                                  + (r.stderr.strip().splitlines() or ["?"])[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"shape": args.shape, "config": spec, "error": f"timed out after {args.timeout:.0f} s (hang)"}
        rows.append(row)
        v = row.get("vs_cublas", {})
        print(f"{spec:22s} ok={row.get('ok')} ratio={v.get('ratio', float('nan')):.3f} {row.get('error', '')}",
              flush=True)
    if args.out:
        from gemmlab.instruments.timing import env_info

        with open(args.out, "a") as f:  # an env line per run: benchmarks/ledger_sweeps.py takes provenance from it
            f.write(json.dumps({"env": env_info(), "args": vars(args)}, default=str) + "\n")
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
