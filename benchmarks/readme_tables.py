"""Print the README's measured tables (markdown) from the files benchmarks/bench_suite.sh writes.

    python3 benchmarks/readme_tables.py benchmarks/results/nvidia-h200-bench
    python3 benchmarks/readme_tables.py --broad benchmarks/results/.../nvidia-h200-broad/gemm-bench.json
"""

import json
import sys
from pathlib import Path

from gemmlab import provenance


def gemm_table(d: Path) -> None:
    graph = json.loads((d / "bench-all-graph" / "gemm-bench.json").read_text())
    eager = json.loads((d / "bench-all-eager" / "gemm-bench.json").read_text())
    env = graph["env"]
    print(f"{env['gpu']}, {graph['args']['dtype']}, {env['date'][:10]}, torch {env['torch']}, triton {env['triton']}, "
          f"driver {env.get('driver')}, {provenance.label(env)}\n")
    print("| M x N x K | path | cuBLAS TFLOPS | gemmlab TFLOPS | ratio (device) | 95% CI | verdict | packed B | "
          "mean SM MHz | efficiency | ratio (eager) |")
    print("|---|---|---:|---:|---:|---|---|---:|---:|---:|---:|")
    for g, e in zip(graph["results"], eager["results"], strict=True):
        c, gl, gp = g["candidates"]["cublas"], g["candidates"]["gemmlab"], g["candidates"]["gemmlab-packed"]
        v = gl["vs_baseline"]
        print(f"| {'x'.join(map(str, g['shape']))} | {gl['path']} | {c['tflops']:.0f} | {gl['tflops']:.0f} | "
              f"{v['ratio']:.3f} | [{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}] | {v['verdict']} | "
              f"{gp['vs_baseline']['ratio']:.3f} | {gl['clocks']['sm_clock_mhz_mean']:.0f} | {gl['efficiency']:.1%} | "
              f"{e['candidates']['gemmlab']['vs_baseline']['ratio']:.3f} |")


def clock_order(d: Path) -> None:
    r = json.loads(next(d.glob("*-clock-order.json")).read_text())
    print(f"\n{r['env']['gpu']}, fp16 {'x'.join(map(str, r['shape']))}, {provenance.label(r['env'])}\n")
    print("| pair (candidate vs baseline) | timing | order | ratio | 95% CI | verdict | "
          "mean SM MHz candidate / baseline |")
    print("|---|---|---|---:|---|---|---|")
    for x in r["results"]:
        print(f"| {x['pair']} | {x['way']} | {' then '.join(x['order']) if x['way'] != 'interleaved' else 'ABAB...'} | "
              f"{x['ratio']:.3f} | [{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}] | {x['verdict']} | "
              f"{x['cand_mhz']:.0f} / {x['base_mhz']:.0f} |")

def broad_table(path: Path) -> None:
    """The broad suite (``bench gemm --suite broad``): one row per case, device (graph) ratio, eager ratio and
    the ratio to inductor, then the summary the targets are read from."""
    from gemmlab.bench.gemm import rows

    rep = json.loads(path.read_text())
    env = rep["env"]
    print(f"{env['gpu']}, {env['date'][:10]}, torch {env['torch']}, triton {env['triton']}, "
          f"driver {env.get('driver')}, {provenance.label(env)}\n")
    print("| case | gemmlab path | vs cuBLAS (graph) | vs cuBLAS (eager) | vs inductor (graph) | SM MHz |")
    print("|---|---|---:|---:|---:|---:|")

    def num(v):
        return "-" if v is None else f"{v:.3f}"

    skipped = {c["label"]: c["candidates"]["gemmlab"].get("skipped") for c in rep["results"]}
    for r in rows(rep):
        if r["backend"] != "gemmlab":
            continue
        why = "" if r["ratio"] is not None else f" (not timed: {r.get('error') or skipped.get(r['case'])})"
        print(f"| {r['case']}{why} | {r['path']} | {num(r['ratio'])} | {num(r['eager_ratio'])} | "
              f"{num(r['inductor_ratio'])} | {r['sm_clock_mhz'] or 0:.0f} |")
    s = rep["summary"]["backends"]["gemmlab"]
    for key in ("device", "eager", "vs_inductor"):
        v = s[key]
        print(f"\n- {key}: geomean {v['geomean']:.3f} over {v['n']} cases, min {v['min']:.3f} ({v['min_case']}), "
              f"{v['below']} below {v['floor']}")
    print(f"- seeds: {', '.join(f'{k} {x:.3f}' for k, x in s['seeds'].items())}")


if __name__ == "__main__":
    if sys.argv[1] == "--broad":  # readme_tables.py --broad .../gemm-bench.json
        broad_table(Path(sys.argv[2]))
    else:
        gemm_table(Path(sys.argv[1]))
        clock_order(Path(sys.argv[1]))
