#!/usr/bin/env bash
# One device call: run the named steps in order, each under its own time limit, logs and results under $OUT.
#   GEMMLAB_GIT_SHA=$(git rev-parse HEAD) bash benchmarks/h200_session.sh STEP...
# Steps: the names of the case statement below, each with a comment where it is not obvious. Prints a one-line
# summary per step last; results tarred into $OUT/results.tgz.
# Liger steps: liger_quick (a plumbing check, Liger pinned to one config), liger_warm (compile Liger's kernels in
# parallel and autotune them into .triton-cache), liger (fwd eager + graph, then fwd+bwd at T >= 1024; after
# liger_warm). LIGER_ARGS (e.g. "--model qwen3-30b-a3b --model olmoe-1b-7b") and LIGER_WARM_ARGS (e.g.
# "--models qwen3-30b-a3b,olmoe-1b-7b") narrow them. Liger needs its wheel: start the call with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
# (carry .whl); /tmp/site joins PYTHONPATH here when it exists.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
if [ -d /tmp/site ]; then export PYTHONPATH=src:/tmp/site; fi
# Liger's kernels and autotuning results persist between steps and calls (an ignored folder of the tree is kept)
LIGER_ENV="TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.triton-cache} TRITON_CACHE_AUTOTUNING=1"
OUT=${OUT:-/tmp/gemmlab-out}
RES=${RES:-/tmp/gemmlab-results}  # RES=$OUT/res: results come back even if the call is cut short
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
      tests/test_preload_gpu.py tests/test_nn.py tests/test_distributed.py tests/test_bench_model.py tests/test_grade.py tests/test_grade_moe.py ;;
    host) step host 200 python3 benchmarks/host_cost.py --quick --out "$RES" ;;
    model) step model 300 python3 -m gemmlab bench model --model mixtral,qwen3-moe,deepseek-v3 --tokens 4096,1,8,64 \
      --modes eager,graph --output-dir "$RES/nvidia-h200-model" ;;
    compile) step compile 300 python3 -m gemmlab bench model --model qwen3-moe --tokens 4096,8 --modes compile \
      --output-dir "$RES/nvidia-h200-model" ;;
    tune_moe) step tune_moe 150 python3 -m gemmlab tune --op moe --model qwen3-30b-a3b --tokens 1024 --moe-mode down \
      --budget-minutes 1 --ledger /tmp/moe.db --configs-dir /tmp/moe-cfg --output-dir "$RES/tune-moe" ;;
    ep1) step ep1 240 torchrun --nproc-per-node 1 -m gemmlab bench moe-ep --model qwen3-30b-a3b --model mixtral-8x7b \
      --tokens 4096 --chunks 1 --chunks 2 --chunks 4 --rounds 6 --output-dir "$RES/nvidia-h200-moe-ep-1gpu" ;;
    ws) step ws 160 python3 benchmarks/ws_probe.py --timeout 45 --out "$RES/nvidia-h200-ws-probe.jsonl" ;;
    moe_host) step moe_host 90 python3 benchmarks/moe_host_profile.py --out "$RES/nvidia-h200-moe-host-profile.txt" ;;
    # 55 cases; no case starts after --budget-s, so the JSON is written inside the step's limit (not_run lists the rest)
    broad) step broad 560 python3 -m gemmlab bench gemm --suite broad --backend gemmlab --backend inductor \
      --rounds 5 --reps 3 --warmup-s 0.2 --inductor-autotune-rep-ms 10 --budget-s 500 \
      --output-dir "$RES/nvidia-h200-broad" ;;
    broad_gputest) step broad_gputest 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bench_broad.py ;;
    broad_quick) step broad_quick 240 python3 -m gemmlab bench gemm --suite broad-quick --backend gemmlab \
      --backend inductor --rounds 6 --reps 5 --warmup-s 0.3 --inductor-autotune-rep-ms 25 --budget-s 180 \
      --output-dir "$RES/nvidia-h200-broad-quick" ;;
    moe_small) step moe_small 230 python3 benchmarks/sweep_moe_small.py --budget 200 --out "$RES/nvidia-h200-moe-small.jsonl" ;;
    profile) step profile 240 bash -c 'D=$1; command -v ncu || ls /usr/local/cuda*/bin/ncu
        python3 -m gemmlab profile --shape 8192,8192,16384 --dtype float16 --output-dir "$D" &&
        python3 -m gemmlab profile --shape 777,3333,1024 --output-dir "$D" &&
        python3 -m gemmlab profile --diff "$D/profile-8192x8192x16384-float16-row.json" \
          "$D/profile-777x3333x1024-float16-row.json"
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_profile_gpu.py' _ "$RES/nvidia-h200-profile" ;;
    gpunew) step gpunew 220 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_moe_backward_gpu.py \
      tests/test_bench_broad.py tests/test_distributed.py tests/test_moe_small.py ;;
    staged_tests) step staged_tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_staged.py \
      tests/test_gemm_streamk.py tests/test_gemm_gpu.py ;;
    broad_paths) step broad_paths 240 python3 benchmarks/sweep_broad_paths.py --max-variants 4 \
      --out "$RES/nvidia-h200-broad-paths.jsonl" --rules "$RES/nvidia-h200-broad-rules.json" ;;
    # the broad suite's losses of call 4: unaligned small M (portable vs staging) and narrow N with long K (stream-K)
    broad_paths2) step broad_paths2 50 python3 benchmarks/sweep_broad_paths.py --max-variants 3 --shapes \
      1,4093,4099:fp16:linear 13,12289,1021:bf16:linear 64,14336,4097:fp16:linear 127,4099,8191:bf16:nn \
      2048,576,7168:fp16:linear 8192,576,7168:bf16:linear 2048,5120,8192:bf16:linear \
      --out "$RES/nvidia-h200-broad-paths2.jsonl" --rules "$RES/nvidia-h200-broad-rules2.json" ;;
    moe_host2) step moe_host2 75 python3 benchmarks/moe_host_profile.py --compare --rounds 15 \
      --json "$RES/nvidia-h200-moe-host.json" ;;
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
    # the last call of 2026-12-01 (495 s of device time left): small experts only, tight limits
    liger_final) LIGER_WARM_ARGS="--models qwen3-30b-a3b,olmoe-1b-7b"
      step liger_warm 140 env $LIGER_ENV python3 benchmarks/liger_warm.py --workers 16 --time-limit-s 130 \
        --out "$RES/nvidia-h200-moe-liger" $LIGER_WARM_ARGS
      step liger_fwd 125 env $LIGER_ENV python3 -m gemmlab bench moe --baseline liger --mode eager --mode graph \
        --part fwd --rounds 4 --reps 4 --warmup-s 0.1 --time-limit-s 110 --output-dir "$RES/nvidia-h200-moe-liger" \
        --model qwen3-30b-a3b --model olmoe-1b-7b
      step liger_bwd 60 env $LIGER_ENV python3 -m gemmlab bench moe --baseline liger --mode eager --part fwd+bwd \
        --tokens 1024 --tokens 4096 --routing uniform --rounds 4 --reps 3 --warmup-s 0.1 --time-limit-s 45 \
        --output-dir "$RES/nvidia-h200-moe-liger" --model qwen3-30b-a3b --model olmoe-1b-7b ;;
    # issue 23: the GEMV kernel and the split tail on the GPU first (a hang or a wrong result stops there), the sweep
    # whose JSONL benchmarks/dense_rules.py turns into rules (on the CPU, afterwards), the dense suite with its targets
    dense_gputest) step dense_gputest 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_gemv.py \
      tests/test_gemm_streamk.py ;;
    dense_sweep) step dense_sweep 300 python3 benchmarks/sweep_dense.py --out "$RES/dense-sweep" --budget-s 230 ;;
    dense) step dense 300 python3 -m gemmlab bench gemm --suite dense --backend gemmlab --rounds 5 --reps 3 \
      --warmup-s 0.2 --budget-s 265 --output-dir "$RES/nvidia-h200-dense" ;;
    *) echo "unknown step $s" >>"$SUMMARY" ;;
  esac
done
tar -czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null
cat "$SUMMARY"
