#!/usr/bin/env bash
# The GEMM measurements of docs/results/gemm.md, in one go (about 6 minutes on an H200):
#   PYTHONPATH=src python -m benchmarks bench-suite OUT_DIR
# OUT_DIR/table-defaults       gemmlab table with the seed's defaults (M=131072 N=2048 K=7168)
# OUT_DIR/bench-all-eager      gemmlab bench gemm --suite all, launched from Python one call at a time
# OUT_DIR/bench-all-graph      the same as CUDA-graph replays (device time)
# OUT_DIR/<gpu>-clock-order.json   back-to-back vs interleaved (python -m benchmarks clock-order)
# OUT_DIR/stable-8k            gemmlab bench stable at 8192x8192x16384, 4 fresh processes
# OUT_DIR/inspect-*.json       gemmlab inspect for the seed shapes
set -uo pipefail
out=${1:?usage: bench_suite.sh OUT_DIR}
mkdir -p "$out"
py() { timeout "$1" python3 "${@:2}"; echo "exit $? : ${*:2}"; }
py 120 -m gemmlab inspect --shape 8192,8192,16384 --json > "$out/inspect-8192x8192x16384.json"
py 120 -m gemmlab inspect --shape 131072,2048,7168 --packed --json > "$out/inspect-131072x2048x7168-packed.json"
py 300 -m gemmlab table --output-dir "$out/table-defaults"
py 600 -m gemmlab bench gemm --suite all --backend gemmlab --backend gemmlab-packed --output-dir "$out/bench-all-eager"
py 600 -m gemmlab bench gemm --suite all --backend gemmlab --backend gemmlab-packed --graph \
   --output-dir "$out/bench-all-graph"
py 300 -m benchmarks clock-order --out "$out"
py 400 -m gemmlab bench stable --shape 8192,8192,16384 --processes 4 --backend gemmlab --output-dir "$out/stable-8k"
