#!/usr/bin/env bash
# The MoE measurements of issue 6, in two parts that each fit one 10-minute device call on an H200:
#   PYTHONPATH=src benchmarks/moe_suite.sh OUT_DIR bench   # GPU tests + gemmlab bench moe, three models
#   PYTHONPATH=src benchmarks/moe_suite.sh OUT_DIR rest    # table, grader, eager timing, config sweep
# OUT_DIR/pytest-moe-gpu.log        the MoE tests on the GPU (correctness at real sizes, SASS of the launched kernel)
# OUT_DIR/<model>/moe-bench.json    bench moe: grouped (first GEMM) and forward, T 16..16384, uniform and zipf,
#                                   CUDA-graph replays (device time), interleaved, verified first
# OUT_DIR/eager/moe-bench.json      the same at T=4096 timed eagerly (host launch overhead included)
# OUT_DIR/table-defaults/           gemmlab table with the fused MoE row
# OUT_DIR/grade-moe/                gemmlab grade --cases moe-layer
# OUT_DIR/*-moe-sweep.json          benchmarks/sweep_moe_configs.py on the bar shapes
set -uo pipefail
out=${1:?usage: moe_suite.sh OUT_DIR bench|rest}
part=${2:-bench}
mkdir -p "$out"
py() { timeout "$1" python3 "${@:2}"; echo "exit $? : ${*:2}"; }
if [ "$part" = bench ]; then
  py 120 -m pytest -q tests/test_moe_gpu.py tests/test_moe.py > "$out/pytest-moe-gpu.log" 2>&1
  for m in deepseek-v3 qwen3-30b-a3b mixtral-8x7b; do
    py 150 -m gemmlab bench moe --model "$m" --tokens 16 --tokens 128 --tokens 1024 --tokens 4096 --tokens 16384 \
       --routing uniform --routing zipf --rounds 6 --reps 3 --warmup-s 0.3 --graph --output-dir "$out/$m"
  done
else
  py 60 -m gemmlab table --output-dir "$out/table-defaults"
  py 150 -m gemmlab grade --cases moe-layer --output-dir "$out/grade-moe"
  py 90 -m gemmlab bench moe --model deepseek-v3 --model qwen3-30b-a3b --model mixtral-8x7b --tokens 4096 \
     --part forward --rounds 6 --reps 3 --warmup-s 0.3 --output-dir "$out/eager"
  py 150 benchmarks/sweep_moe_configs.py --out "$out" --cases deepseek-v3:4096:grouped deepseek-v3:4096:forward \
     mixtral-8x7b:4096:grouped mixtral-8x7b:16384:grouped qwen3-30b-a3b:1024:grouped mixtral-8x7b:4096:forward
fi
