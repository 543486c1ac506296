"""The grader's timing protocol on the GPU: grade gemmlab's own kernel at the seed shapes and print what
to look at (protocol overhead, calls a batch, ratio with its interval, clocks, advisory vs grader clock).

    PYTHONPATH=src python3 benchmarks/grade_protocol.py [--cases competition moe] [--out DIR]

Each grade's whole report goes to DIR/grade-<cases>.json (default benchmarks/results/)."""

import argparse
import json
import sys
import time
from pathlib import Path

from gemmlab.grade import grade


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["competition", "moe"])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    ok = True
    for name in args.cases:
        t0 = time.time()
        r = grade(name, rounds=args.rounds, progress=lambda m, t0=t0: print(f"  [{time.time() - t0:6.1f} s] {m}",
                                                                     file=sys.stderr))
        (Path(args.out) / f"grade-{Path(name).stem}.json").write_text(json.dumps(r, indent=1, default=str))
        p = r["performance"] or {}
        h = p.get("honest") or {}
        clk = (p.get("clocks") or {}).get("sm_clock_mhz_mean")
        print(f"{name}: verdict {r['verdict']} {r['failures']}")
        if "median_ms" in p:
            batch_ms = p["median_ms"] * p["calls_per_batch"]
            print(f"  {p['shape']}: {p['median_ms']:.4f} ms/call ({p['tflops']:.1f} TFLOPS), baseline "
                  f"{p.get('baseline_ms', float('nan')):.4f} ms (solo {p.get('baseline_solo_ms')}), ratio "
                  f"{p['ratio']:.4f}, per-round median {h.get('ratio')}, CI {h.get('ci95')}")
            print(f"  calls/batch {p['calls_per_batch']}, batch {batch_ms:.2f} ms, protocol overhead "
                  f"{p['protocol_overhead_ms']:.4f} ms/call ({p['protocol_overhead_ms'] / p['median_ms']:.2%} of a "
                  f"call), advisory {p['advisory_median_ms']:.4f} ms/call, samples checked "
                  f"{p['samples_checked']}, SM clock {clk}, preload {p.get('preload')}, {time.time() - t0:.0f} s")
        ok &= r["verdict"] == "PASS"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
