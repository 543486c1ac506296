#!/usr/bin/env bash
# One device call: run the named steps in order, each under its own time limit, logs and results under $OUT.
#   GEMMLAB_GIT_SHA=$(git rev-parse HEAD) bash benchmarks/h200_session.sh STEP...
# Steps: grade (the grader's protocol at both seed shapes), grade_cli (the same through `gemmlab grade`, recorded), gputests (every gpu-marked test of the new paths),
# host (host cost per call, quick), model (bench model, eager + graph), compile (bench model, torch.compile),
# tune_moe (tune --op moe smoke), liger_quick (bench moe --baseline liger, a handful of cases, Liger pinned to one
# config: a plumbing check), liger_warm (compile Liger's kernels for the suite in parallel and autotune them, into
# .triton-cache), liger (the suite against Liger: fwd eager + graph, then fwd+bwd at T >= 1024; run liger_warm
# first, in this call or an earlier one on the same machine). Narrow them with LIGER_ARGS (e.g. "--model qwen3-30b-a3b
# --model olmoe-1b-7b", appended to both liger benches) and LIGER_WARM_ARGS (e.g. "--models qwen3-30b-a3b,olmoe-1b-7b").
# Liger needs its wheel: start the call with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# (carry .whl); /tmp/site joins PYTHONPATH here when it exists.
# Prints a one-line summary per step last; results tarred into $OUT/results.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
if [ -d /tmp/site ]; then export PYTHONPATH=src:/tmp/site; fi
# Liger's kernels and autotuning results persist between steps and calls (an ignored folder of the tree is kept)
LIGER_ENV="TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.triton-cache} TRITON_CACHE_AUTOTUNING=1"
OUT=${OUT:-/tmp/gemmlab-out}
RES=/tmp/gemmlab-results
mkdir -p "$OUT" "$RES"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,driver_version --format=csv >>"$SUMMARY" 2>&1
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" >>"$SUMMARY"
  tail -n 12 "$OUT/$name.log" | sed "s/^/  $name| /" >>"$SUMMARY"
}
for s in "$@"; do
  case $s in
    grade) step grade 330 python3 benchmarks/grade_protocol.py --cases competition moe --out "$RES/grade-h200-protocol" ;;
    grade_cli) for c in competition moe; do
        step "grade_cli_$c" 200 python3 -m gemmlab grade --cases "$c" --output-dir "$RES/grade-h200-cli-$c" \
          --record "grade $c: the grader's clock protocol" --ledger "$RES/ledger-grade.db"
      done ;;
    gputests) step gputests 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_host_gpu.py \
      tests/test_custom_ops.py tests/test_autograd.py tests/test_gemm_gpu.py tests/test_moe_gpu.py tests/test_moe.py \
      tests/test_preload_gpu.py tests/test_nn.py tests/test_bench_model.py tests/test_grade.py tests/test_grade_moe.py ;;
    host) step host 200 python3 benchmarks/host_cost.py --quick --out "$RES" ;;
    model) step model 300 python3 -m gemmlab bench model --model mixtral,qwen3-moe,deepseek-v3 --tokens 4096,1,8,64 \
      --modes eager,graph --output-dir "$RES/nvidia-h200-model" ;;
    compile) step compile 300 python3 -m gemmlab bench model --model qwen3-moe --tokens 4096,8 --modes compile \
      --output-dir "$RES/nvidia-h200-model" ;;
    tune_moe) step tune_moe 150 python3 -m gemmlab tune --op moe --model qwen3-30b-a3b --tokens 1024 --moe-mode down \
      --budget-minutes 1 --ledger /tmp/moe.db --configs-dir /tmp/moe-cfg --output-dir "$RES/tune-moe" ;;
    liger_quick) step liger_quick 150 env $LIGER_ENV LIGER_FUSED_MOE_AUTOTUNE=0 python3 -m gemmlab bench moe \
      --baseline liger --model qwen3-30b-a3b --model mixtral-8x7b --tokens 16 --tokens 4096 --routing uniform \
      --mode eager --mode graph --part fwd --part fwd+bwd --rounds 4 --reps 5 --warmup-s 0.2 --time-limit-s 110 \
      --output-dir "$RES/nvidia-h200-moe-liger-quick" ;;
    liger_warm) step liger_warm 420 env $LIGER_ENV python3 benchmarks/liger_warm.py --workers 16 --time-limit-s 400 \
      --out "$RES/nvidia-h200-moe-liger" ${LIGER_WARM_ARGS:-} ;;
    liger) step liger_fwd 250 env $LIGER_ENV python3 -m gemmlab bench moe --baseline liger --mode eager --mode graph \
        --part fwd --rounds 5 --reps 5 --warmup-s 0.2 --time-limit-s 225 --output-dir "$RES/nvidia-h200-moe-liger" \
        ${LIGER_ARGS:-}
      step liger_bwd 170 env $LIGER_ENV python3 -m gemmlab bench moe --baseline liger --mode eager --part fwd+bwd \
        --tokens 1024 --tokens 4096 --tokens 16384 --rounds 4 --reps 3 --warmup-s 0.2 --time-limit-s 140 \
        --output-dir "$RES/nvidia-h200-moe-liger" ${LIGER_ARGS:-} ;;
    *) echo "unknown step $s" >>"$SUMMARY" ;;
  esac
done
tar -czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null
cat "$SUMMARY"
