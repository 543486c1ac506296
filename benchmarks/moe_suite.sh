#!/usr/bin/env bash
# The MoE measurements of issue 6 (not yet run; sized for one 10-minute device call on an H200):
#   PYTHONPATH=src benchmarks/moe_suite.sh OUT_DIR
# OUT_DIR/pytest-moe-gpu.log       the GPU MoE tests (correctness at real sizes, SASS of the launched kernel)
# OUT_DIR/<model>/moe-bench.json   gemmlab bench moe: grouped (first GEMM) and forward, uniform and zipf
# OUT_DIR/table-defaults/          gemmlab table with the fused MoE row
# OUT_DIR/grade-moe/               gemmlab grade --cases moe-layer
set -uo pipefail
out=${1:?usage: moe_suite.sh OUT_DIR}
mkdir -p "$out"
py() { timeout "$1" python3 "${@:2}"; echo "exit $? : ${*:2}"; }
py 240 -m pytest -q tests/test_moe_gpu.py tests/test_moe.py > "$out/pytest-moe-gpu.log" 2>&1
for m in deepseek-v3 qwen3-30b-a3b mixtral-8x7b; do
  py 300 -m gemmlab bench moe --model "$m" --tokens 16 --tokens 128 --tokens 1024 --tokens 4096 --tokens 16384 \
     --routing uniform --routing zipf --rounds 6 --reps 3 --output-dir "$out/$m"
done
py 300 -m gemmlab table --output-dir "$out/table-defaults"
py 400 -m gemmlab grade --cases moe-layer --output-dir "$out/grade-moe"
