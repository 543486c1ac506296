"""Print the README's GEMM table (markdown) from a results file of gemm_vs_cublas.py.

    python3 benchmarks/readme_table.py benchmarks/results/nvidia-h200-gemm.json
"""

import json
import sys


def main(path: str) -> None:
    d = json.load(open(path))
    env = d["env"]
    print(f"{env['gpu']}, {d['results'][0]['dtype']}, {env['date'][:10]}, torch {env['torch']}, "
          f"triton {env['triton']}, driver {env.get('driver')}, git {env['git_sha'][:12]}\n")
    print("| M x N x K | path | cuBLAS TFLOPS | gemmlab TFLOPS | ratio (device) | 95% CI | packed B | "
          "ratio (eager) | mean SM MHz | bar |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in d["results"]:
        v = r["gemmlab_vs_cublas"]
        bar = r["bar"]
        ok = "" if bar is None else (" ✓" if v["ratio"] >= bar else " ✗")
        print(f"| {'x'.join(map(str, r['shape']))} | {r['plan']['raw_b']['path']} | {r['cublas']['tflops']:.0f} | "
              f"{r['gemmlab']['tflops']:.0f} | {v['ratio']:.3f} | [{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}] | "
              f"{r['gemmlab_packed_vs_cublas']['ratio']:.3f} | {r['gemmlab_vs_cublas_eager']['ratio']:.3f} | "
              f"{r['clocks'].get('sm_clock_mhz_mean', 0):.0f} | {bar if bar else '-'}{ok} |")


if __name__ == "__main__":
    main(sys.argv[1])
