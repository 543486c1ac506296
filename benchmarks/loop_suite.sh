#!/usr/bin/env bash
# The optimization loop's measurements (about 7 minutes on an H200; the tuner uses every visible GPU):
#   PYTHONPATH=src python -m benchmarks loop-suite OUT_DIR [BUDGET_MINUTES] [PROFILE.json]
# OUT_DIR/home/device-<gpu>.json  gemmlab probe (GEMMLAB_HOME=OUT_DIR/home), or PROFILE.json copied there:
#                                 then the health check compares this machine with a profile recorded before
# OUT_DIR/tune/tune-report.json   gemmlab tune on the seed and small-M shapes; every attempt in
# OUT_DIR/ledger.db               the ledger; confirmed winners in OUT_DIR/configs/<gpu>.json
# OUT_DIR/health.log              gemmlab probe --check against the profile just recorded
# OUT_DIR/roofline.png            the last committed bench results on the measured roofline
set -uo pipefail
out=${1:?usage: loop_suite.sh OUT_DIR [BUDGET_MINUTES]}
budget=${2:-4}
profile=${3:-}
mkdir -p "$out/home" "$out/configs"
export GEMMLAB_HOME="$out/home" GEMMLAB_LEDGER="$out/ledger.db"
py() { timeout "$1" python3 "${@:2}"; echo "exit $? : ${*:2}"; }
nvidia-smi -L
if [ -n "$profile" ]; then cp "$profile" "$out/home/"; else py 180 -m gemmlab probe; fi
py $((budget * 60 + 180)) -m gemmlab tune --suite seeds --suite small-m --budget-minutes "$budget" \
   --configs-dir "$out/configs" --output-dir "$out/tune" --record "tune seeds + small-m"
py 120 -m gemmlab probe --check 2>&1 | tee "$out/health.log"
py 60 -m gemmlab probe --roofline benchmarks/results/nvidia-h200-bench/bench-all-graph/gemm-bench.json \
   --plot "$out/roofline.png"
py 60 -m gemmlab ledger history --shape 8192,8192,16384 --plot "$out/history-8192x8192x16384.png"
