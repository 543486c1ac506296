#!/usr/bin/env bash
# The MoE measurements of docs/results/moe.md, in two parts that each fit one 10-minute device call on an H200:
#   PYTHONPATH=src python -m benchmarks moe-suite OUT_DIR bench   # GPU tests + gemmlab bench moe, three models
#   PYTHONPATH=src python -m benchmarks moe-suite OUT_DIR rest    # table, grader, eager timing, MoE tuning
# OUT_DIR/pytest-moe-gpu.log        the MoE tests on the GPU (correctness at real sizes, SASS of the launched kernel)
# OUT_DIR/<model>/moe-bench.json    bench moe: grouped (first GEMM) and forward, T 16..16384, uniform and zipf,
#                                   CUDA-graph replays (device time), interleaved, verified first
# OUT_DIR/eager/moe-bench.json      the same at T=4096 timed eagerly (host launch overhead included)
# OUT_DIR/table-defaults/           gemmlab table with the fused MoE row
# OUT_DIR/grade-moe/                gemmlab grade --cases moe-layer
# OUT_DIR/tune-moe/                 gemmlab tune --op moe: DeepSeek-V3's grouped GEMMs at T = 4096
set -uo pipefail
out=${1:?usage: moe_suite.sh OUT_DIR bench|rest}
part=${2:-bench}
mkdir -p "$out"
py() { timeout "$1" python3 "${@:2}"; echo "exit $? : ${*:2}"; }
if [ "$part" = bench ]; then
  py 120 -m pytest -q tests/moe/test_moe.py > "$out/pytest-moe-gpu.log" 2>&1
  for m in deepseek-v3 qwen3-30b-a3b mixtral-8x7b; do
    py 150 -m gemmlab bench moe --model "$m" --tokens 16 --tokens 128 --tokens 1024 --tokens 4096 --tokens 16384 \
       --routing uniform --routing zipf --rounds 6 --reps 3 --warmup-s 0.3 --graph --output-dir "$out/$m"
  done
else
  py 60 -m gemmlab table --output-dir "$out/table-defaults"
  py 150 -m gemmlab grade --cases moe-layer --output-dir "$out/grade-moe"
  py 90 -m gemmlab bench moe --model deepseek-v3 --model qwen3-30b-a3b --model mixtral-8x7b --tokens 4096 \
     --part forward --rounds 6 --reps 3 --warmup-s 0.3 --output-dir "$out/eager"
  py 180 -m gemmlab tune --op moe --model deepseek-v3 --tokens 4096 --budget-minutes 2 \
     --ledger "$out/ledger.db" --configs-dir "$out/configs" --output-dir "$out/tune-moe"
fi
