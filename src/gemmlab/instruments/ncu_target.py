"""The process ``gemmlab profile`` runs under ncu: one verified call of one backend, and nothing else profiled.

    python -m gemmlab.instruments.ncu_target --backend gemmlab|cublas --shape M,N,K [--dtype float16]
        [--layout row|linear] [--config JSON] [--seed S] --result OUT.json

Fresh random inputs (``problems.gemm_operands``: uniform in [-0.5, 0.5), seeded by the shape): A (M, K); B (K, N)
row-major ("row") or B = W^T with W (N, K) row-major ("linear", nn.Linear's layout). Three warm-up calls
(compilation, cuBLAS's heuristics), each output checked; then the output is poisoned (NaN), the one profiled call
runs between cudaProfilerStart and cudaProfilerStop (ncu runs with --profile-from-start off), and its output is
checked against ``gemmlab.ref.gemm_check`` (float64 reference, derived tolerance). Writes {"backend", "path",
"config", "reason", "check"} to OUT.json. Exit 0: checked ok; 1: wrong output; 2: bad arguments or no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

WARMUP_CALLS = 3


def call(backend: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: dict | None):
    """(the no-argument call writing ``out``, what it runs: path, config, reason)."""
    if backend == "cublas":
        return (lambda: torch.mm(a, b, out=out)), {"path": "torch.mm (cuBLAS)", "config": None, "reason": None}
    import gemmlab
    from gemmlab.ops.gemm import GemmConfig, run

    p = gemmlab.plan(a, b, out=out, config=GemmConfig.from_dict(config) if config else None)
    fn = (lambda: run(p, a, b, out=out)) if config else (lambda: gemmlab.gemm(a, b, out=out))
    return fn, {"path": p.path, "config": dataclasses.asdict(p.config) if p.config else None, "reason": p.reason}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gemmlab.instruments.ncu_target")
    ap.add_argument("--backend", choices=("gemmlab", "cublas"), required=True)
    ap.add_argument("--shape", required=True)
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--layout", choices=("row", "linear"), default="row")
    ap.add_argument("--config", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--result", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_target: no CUDA GPU", file=sys.stderr)
        return 2
    from gemmlab.problems import gemm_operands, parse_shape
    from gemmlab.ref import gemm_check, gemm_ref

    m, n, k = parse_shape(args.shape)
    a, b = gemm_operands(m, n, k, getattr(torch, args.dtype), "cuda", args.seed, layout=args.layout)
    out = torch.empty((m, n), dtype=a.dtype, device="cuda")
    fn, facts = call(args.backend, a, b, out, json.loads(args.config) if args.config else None)
    ref = gemm_ref(a, b)

    def checked() -> dict:
        r = gemm_check(out, a, b, ref)
        return {key: r[key] for key in ("ok", "max_abs_err", "worst")}

    for _ in range(WARMUP_CALLS):
        out.fill_(float("nan"))
        fn()
        warm = checked()
        if not warm["ok"]:
            break
    else:
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # less memory for ncu to save and restore around each replay pass
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        warm = checked()
    with open(args.result, "w") as f:
        json.dump({"backend": args.backend, **facts, "check": warm}, f)
    return 0 if warm["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
