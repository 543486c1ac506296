"""Where the grader's gap to cuBLAS at the competition shape comes from: the same two GEMMs (gemmlab.gemm and
torch.mm into a preallocated C) timed by the benchmark's protocol (CUDA events, L2 flushed, interleaved, clocks
sampled) on the competition's discrete inputs and on uniform ones, with row-major and column-major operands.
If the ratio moves with the inputs and not with the layout, the grader's figure is the kernels', not its protocol's.

    PYTHONPATH=src python -m benchmarks grade-gap [--shape 8192,8192,16384] [--out benchmarks/results]

TFLOPS = 2*M*N*K / median time. Writes <out>/<gpu>-grade-gap.json (GPU, clocks, versions, git SHA)."""

import argparse
import json
from pathlib import Path

import torch

import gemmlab
from gemmlab.device import gpu_slug
from gemmlab.instruments import timing
from gemmlab.instruments.compare import compare
from gemmlab.problems import generator, matrix
from gemmlab.ref import gemm_check


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192,8192,16384")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    m, n, k = (int(v) for v in args.shape.split(","))
    rows = []
    for dist in ("competition", "uniform"):
        for layout in ("rowmajor", "colmajor"):
            col = layout == "colmajor"
            a = matrix(m, k, dist, generator(11, "cuda"), torch.float16, colmajor=col)  # (M, K), strides per layout
            b = matrix(k, n, dist, generator(12, "cuda"), torch.float16, colmajor=col)  # (K, N)
            c = torch.empty((n, m) if col else (m, n), dtype=torch.float16, device="cuda")
            c = c.t() if col else c  # (M, N)
            c2 = torch.empty_like(c)
            res = compare(
                lambda a=a, b=b, c=c: gemmlab.gemm(a, b, out=c),
                lambda a=a, b=b, c2=c2: torch.mm(a, b, out=c2),
                check=lambda out, a=a, b=b: gemm_check(out, a, b),
                flops=2 * m * n * k,
                inputs={"a": a, "b": b},
                rounds=args.rounds,
            )
            cand, base = res["candidates"]["candidate"], res["candidates"]["baseline"]
            vs = cand.get("vs_baseline") or {}
            rows.append(
                {
                    "dist": dist,
                    "layout": layout,
                    "ok": cand["check"]["ok"] and base["check"]["ok"],
                    "gemmlab_tflops": cand.get("tflops"),
                    "cublas_tflops": base.get("tflops"),
                    "ratio": vs.get("ratio"),
                    "ci95": vs.get("ci95"),
                    "gemmlab_mhz": (cand.get("clocks") or {}).get("sm_clock_mhz_mean"),
                    "cublas_mhz": (base.get("clocks") or {}).get("sm_clock_mhz_mean"),
                    "gemmlab_w": (cand.get("clocks") or {}).get("power_w_mean"),
                    "cublas_w": (base.get("clocks") or {}).get("power_w_mean"),
                    "raw": res,
                }
            )
            del a, b, c, c2
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{gpu_slug(torch.cuda.get_device_name())}-grade-gap.json"
    path.write_text(
        json.dumps(
            {"env": timing.env_info(), "shape": [m, n, k], "dtype": "float16", "rows": rows}, indent=1, default=str
        )
    )
    print(f"wrote {path}")
    print(
        f"{'inputs':12} {'layout':9} {'gemmlab':>8} {'cuBLAS':>8} {'ratio':>6} {'CI95':>16} {'MHz g/c':>11} "
        f"{'W g/c':>9} ok"
    )
    for r in rows:
        ci = "-" if not r["ci95"] else f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
        print(
            f"{r['dist']:12} {r['layout']:9} {r['gemmlab_tflops'] or 0:8.1f} {r['cublas_tflops'] or 0:8.1f} "
            f"{r['ratio'] or 0:6.3f} {ci:>16} {r['gemmlab_mhz'] or 0:5.0f}/{r['cublas_mhz'] or 0:<5.0f} "
            f"{r['gemmlab_w'] or 0:4.0f}/{r['cublas_w'] or 0:<4.0f} {r['ok']}"
        )


if __name__ == "__main__":
    main()
