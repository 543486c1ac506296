#!/usr/bin/env bash
# One device call: run the named steps in order, each under its own time limit, logs and results under $OUT.
#   GEMMLAB_GIT_SHA=$(git rev-parse HEAD) python -m benchmarks session STEP...   (or: bash benchmarks/session.sh)
# Steps: the names of the case statement below, each with a comment where it is not obvious (and of parts()). Prints a one-line
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
WHERE_HUNG="-o faulthandler_timeout=100"  # a test past 100 s prints every thread's stack (and goes on)
: >"$SUMMARY"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit,driver_version --format=csv >>"$SUMMARY" 2>&1
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  # SIGINT first: pytest then prints where it hung and the failures so far; SIGKILL 20 s later
  timeout -s INT -k 20 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" >>"$SUMMARY"
  tail -n 12 "$OUT/$name.log" | sed "s/^/  $name| /" >>"$SUMMARY"
}
# a compound name runs its parts in order; each part is a step of its own name too
parts() {
  case $1 in
    sandbox_cuda) echo isolation_cuda probe_cuda ;;
    sandbox_cuda2) echo cuda_mounts cuda_rest grade_default ;;
    *) echo "$1" ;;
  esac
}
for s in $(for a in "$@"; do parts "$a"; done); do
  case $s in
    grade) for c in competition moe; do
        step "grade_$c" 200 python3 -m gemmlab grade --cases "$c" --output-dir "$RES/grade-h200-cli-$c" \
          --record "grade $c: the grader's clock protocol" --ledger "$RES/ledger-grade.db"
      done ;;
    # issue 29: cuBLAS graded against itself GRADE_SELF_RUNS (10) times (within +-3% in 10 of 10), and gemmlab's
    # kernel at the seed shape (8192x8192x16384 fp16) GRADE_SEED_RUNS (10) times (the same verdict each time); the
    # timed protocol as graded, the first listed correctness case only; no grade starts after 470 s of a step (the
    # JSON's not_run lists the rest: run the step again with GRADE_FIRST_SEED past the last seed that ran).
    grade_self) step grade_self 560 python3 -m benchmarks grade-repeat --cases competition \
      --kernel "builtin:cublas=${GRADE_SELF_RUNS:-10}" --first-seed "${GRADE_FIRST_SEED:-0}" --quick-correctness \
      --time-limit-s "${GRADE_TIME_S:-470}" --out "$RES/grade-repeat-h200-self" ;;
    grade_seed) step grade_seed 560 python3 -m benchmarks grade-repeat --cases competition \
      --kernel "gemmlab=${GRADE_SEED_RUNS:-10}" --first-seed "${GRADE_FIRST_SEED:-0}" --quick-correctness \
      --time-limit-s "${GRADE_TIME_S:-470}" --out "$RES/grade-repeat-h200-seed" ;;
    # issue 29 item 8: a timed batch fused into one call (tests/bad_kernels/batch_kernels.py) at 64x64x64 fp16, its
    # ratio against cuBLAS without the late calls (the gain before) and its FAIL with them; ratios in the log (-s)
    batch_hole) step batch_hole 560 python3 -m pytest -q -s -m gpu -p no:cacheprovider \
      tests/grade/test_batch_hole.py tests/grade/test_fp8_redteam.py::test_experts_doing_the_whole_batch_on_the_gpu ;;
    # the grader on CUDA with the sandbox's isolation (seccomp, hidden terminals) and its secret trials: the isolation
    # and NaN GPU tests, then one competition grade (the seed shapes against cuBLAS)
    isolation) step isolation_gpu 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/sandbox/test_isolation.py
      step nan_gpu 60 python3 -m pytest -q -p no:cacheprovider tests/fp8/test_fp8_nan.py
      step grade_competition 200 python3 -m gemmlab grade --cases competition \
        --output-dir "$RES/grade-h200-cli-competition" ;;
    # issue 29, the sandbox's layers with CUDA (two steps, 500 s at most): each layer the probe decides, the PID
    # namespace and the uid, alone (test_isolation_with_cuda: every probed switch set, so no probe), /proc with CUDA
    # (test_cuda_proc), Landlock's reach; then the probe's own GPU test (it prints what it decided) and root in the
    # sandbox against the host with CUDA (test_host_reach), each switch set probed afresh
    isolation_cuda) step isolation_cuda 250 python3 -m pytest -v -s -m gpu -p no:cacheprovider -rfE $WHERE_HUNG \
        tests/sandbox/test_isolation.py::test_isolation_with_cuda tests/sandbox/test_cuda_proc.py \
        tests/sandbox/test_sandbox.py::test_landlock_with_cuda ;;
    probe_cuda) step probe_cuda 250 python3 -m pytest -v -s -m gpu -p no:cacheprovider -rfE $WHERE_HUNG \
        tests/grade/test_probe.py \
        tests/sandbox/test_host_reach.py ;;
    # then: which mounts cuInit writes (cuda-mounts, and its netns trial), the TF32 competition reference, bubblewrap
    # with CUDA, and one default grade (the probe decides its layers; no false FAIL; report.json's isolation.probe)
    cuda_mounts) step cuda_mounts 120 python3 -m benchmarks cuda-mounts --out "$RES/cuda-mounts" ;;
    cuda_rest) step cuda_rest 180 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
        tests/grade/test_tf32_reference.py tests/sandbox/test_tool.py ;;
    grade_default) step grade_default 200 python3 -m gemmlab grade --cases competition --output-dir "$RES/grade-h200-default" ;;
    # issue 29 on the GPU: every gpu-marked grader and sandbox test (the known-bad kernels of each hole), slowest listed
    gradetests) step gradetests "${GRADETESTS_S:-520}" python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
      --durations=25 tests/grade tests/sandbox ;;
    gputests) step gputests 540 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ ;;
    host) step host 200 python3 -m benchmarks host-cost --quick --out "$RES" ;;
    # issue 30: host cost before the ops skeleton (ebfdc86's src, made here with
    #   mkdir -p .before && git archive ebfdc86 src | tar -x -C .before   and carried: carry [".before"])
    # and after it, each against torch in its own run
    host_ab) step host_before 200 env PYTHONPATH=.before/src python3 -m benchmarks host-cost --quick \
        --out "$RES/host-before"
      step host_after 200 python3 -m benchmarks host-cost --quick --out "$RES/host-after" ;;
    model) step model 300 python3 -m gemmlab bench layer --model mixtral,qwen3-moe,deepseek-v3 --tokens 4096,1,8,64 \
      --modes eager,graph --output-dir "$RES/nvidia-h200-model" ;;
    compile) step compile 300 python3 -m gemmlab bench layer --model qwen3-moe --tokens 4096,8 --modes compile \
      --output-dir "$RES/nvidia-h200-model" ;;
    # whole models (bench model): its own per-model steps and time limits, about 8 minutes; see the script
    models) step models 520 python3 -m benchmarks model-suite --out "$RES/nvidia-h200-models" ;;
    tune_moe) step tune_moe 150 python3 -m gemmlab tune --op moe --model qwen3-30b-a3b --tokens 1024 --moe-mode down \
      --budget-minutes 1 --ledger /tmp/moe.db --configs-dir /tmp/moe-cfg --output-dir "$RES/tune-moe" ;;
    ep1) step ep1 240 torchrun --nproc-per-node 1 -m gemmlab bench moe-ep --model qwen3-30b-a3b --model mixtral-8x7b \
      --tokens 4096 --chunks 1 --chunks 2 --chunks 4 --rounds 6 --output-dir "$RES/nvidia-h200-moe-ep-1gpu" ;;
    # 55 cases; no case starts after --budget-s, so the JSON is written inside the step's limit (not_run lists the rest)
    broad) step broad 560 python3 -m gemmlab bench gemm --suite broad --backend gemmlab --backend inductor \
      --rounds 5 --reps 3 --warmup-s 0.2 --inductor-autotune-rep-ms 10 --budget-s 500 \
      --output-dir "$RES/nvidia-h200-broad" ;;
    broad_quick) step broad_quick 240 python3 -m gemmlab bench gemm --suite broad-quick --backend gemmlab \
      --backend inductor --rounds 6 --reps 5 --warmup-s 0.3 --inductor-autotune-rep-ms 25 --budget-s 180 \
      --output-dir "$RES/nvidia-h200-broad-quick" ;;
    profile) step profile 240 bash -c 'D=$1; command -v ncu || ls /usr/local/cuda*/bin/ncu
        python3 -m gemmlab profile --shape 8192,8192,16384 --dtype float16 --output-dir "$D" &&
        python3 -m gemmlab profile --shape 777,3333,1024 --output-dir "$D" &&
        python3 -m gemmlab profile --diff "$D/profile-8192x8192x16384-float16-row.json" \
          "$D/profile-777x3333x1024-float16-row.json"' _ "$RES/nvidia-h200-profile" ;;
    moe_backward) step moe_backward 300 python3 -m benchmarks moe-backward --out "$RES/nvidia-h200-moe-backward.json" ;;
    liger_quick) step liger_quick 150 env $LIGER_ENV LIGER_FUSED_MOE_AUTOTUNE=0 python3 -m gemmlab bench moe \
      --baseline liger --model qwen3-30b-a3b --model mixtral-8x7b --tokens 16 --tokens 4096 --routing uniform \
      --mode eager --mode graph --part fwd --part fwd+bwd --rounds 4 --reps 5 --warmup-s 0.2 --time-limit-s 110 \
      --output-dir "$RES/nvidia-h200-moe-liger-quick" ;;
    liger_warm) step liger_warm 420 env $LIGER_ENV python3 -m benchmarks liger-warm --workers 16 --time-limit-s 400 \
      --out "$RES/nvidia-h200-moe-liger" ${LIGER_WARM_ARGS:-} ;;
    liger) step liger_fwd 250 env $LIGER_ENV python3 -m gemmlab bench moe --baseline liger --mode eager --mode graph \
        --part fwd --rounds 5 --reps 5 --warmup-s 0.2 --time-limit-s 225 --output-dir "$RES/nvidia-h200-moe-liger" \
        ${LIGER_ARGS:-}
      step liger_bwd 170 env $LIGER_ENV python3 -m gemmlab bench moe --baseline liger --mode eager --part fwd+bwd \
        --tokens 1024 --tokens 4096 --tokens 16384 --rounds 4 --reps 3 --warmup-s 0.2 --time-limit-s 140 \
        --output-dir "$RES/nvidia-h200-moe-liger" ${LIGER_ARGS:-} ;;
    # MoE training (issue 24): capture and sync GPU tests, then fwd+bwd against Liger for two models (eager and
    # graph, peak memory; after liger_warm with LIGER_WARM_ARGS="--models qwen3-30b-a3b,olmoe-1b-7b --parts fwd+bwd")
    moe_train) step moe_train_tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/moe/test_moe_train_gpu.py \
        tests/moe/test_moe_backward_gpu.py
      step moe_train_bench 230 env $LIGER_ENV python3 -m gemmlab bench moe --baseline liger --mode eager --mode graph \
        --part fwd+bwd --model qwen3-30b-a3b --model olmoe-1b-7b --tokens 1024 --tokens 4096 --routing uniform \
        --rounds 4 --reps 3 --warmup-s 0.2 --time-limit-s 200 --output-dir "$RES/nvidia-h200-moe-liger-train" ;;
    # the same for the other models the suite knows (liger_warm for them first)
    moe_train_rest) step moe_train_rest 300 env $LIGER_ENV python3 -m gemmlab bench moe --baseline liger --mode eager \
        --part fwd+bwd --model deepseek-v3 --model mixtral-8x7b --model gpt-oss-120b-like --tokens 1024 \
        --tokens 4096 --routing uniform --rounds 4 --reps 3 --warmup-s 0.2 --time-limit-s 270 \
        --output-dir "$RES/nvidia-h200-moe-liger-train-rest" ;;
    # where the fwd+bwd time goes, kernel by kernel, gemmlab's two trades and Liger
    moe_train_profile) step moe_train_profile 200 env $LIGER_ENV python3 -m benchmarks moe-backward --profile \
        --baseline liger --models qwen3-30b-a3b,olmoe-1b-7b --tokens 1024,4096 \
        --out "$RES/nvidia-h200-moe-backward-profile.json" ;;
    # the backward alone under other tiles (one factor at a time; prints a suggested "moe_backward" rule per case)
    moe_train_sweep) step moe_train_sweep 420 python3 -m benchmarks moe-backward --sweep \
        --models qwen3-30b-a3b,olmoe-1b-7b --tokens 1024,4096 --out "$RES/nvidia-h200-moe-backward-sweep.json" ;;
    # issue 23: the sweep whose JSONL benchmarks/dense_rules.py turns into rules (on the CPU, afterwards); the GEMV
    # kernel and the split tail's GPU tests (determinism, CUDA-graph capture); the dense suite with its targets, its
    # kernels compiled in parallel first
    dense_sweep) step dense_sweep 260 python3 benchmarks/sweep_dense.py --out "$RES/dense-sweep" --budget-s 200 ;;
    dense_gputest) step dense_gputest 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gemm/test_gemm_gemv.py \
      tests/gemm/test_gemm_streamk.py ;;
    dense) step dense_compile 80 python3 benchmarks/sweep_dense.py --grid dense-suite --compile-only --out "$RES"
      step dense 220 python3 -m gemmlab bench gemm --suite dense --backend gemmlab --rounds 5 --reps 3 \
        --warmup-s 0.2 --budget-s 190 --output-dir "$RES/nvidia-h200-dense" ;;
    # the dense suite under the table in $RULES (a folder holding nvidia-h200.json: `dense-rules --write`), then under
    # the bundled one, each compiled in parallel first; dense-ab lines the two runs up, case by case
    dense_ab) if [ -z "${RULES:-}" ]; then echo "dense_ab rc=2: set RULES to the folder of the table to try" >>"$SUMMARY"; continue; fi
      step dense_after_compile 90 env GEMMLAB_CONFIGS="$RULES" python3 benchmarks/sweep_dense.py \
        --grid dense-suite --compile-only --out "$RES/dense-ab-compile"
      step dense_after 200 env GEMMLAB_CONFIGS="$RULES" python3 -m gemmlab bench gemm --suite dense --backend gemmlab \
        --rounds 5 --reps 3 --warmup-s 0.2 --budget-s 175 --output-dir "$RES/nvidia-h200-dense-after"
      step dense_before_compile 60 python3 benchmarks/sweep_dense.py --grid dense-suite --compile-only \
        --out "$RES/dense-ab-compile"
      step dense_before 200 python3 -m gemmlab bench gemm --suite dense --backend gemmlab --rounds 5 --reps 3 \
        --warmup-s 0.2 --budget-s 175 --output-dir "$RES/nvidia-h200-dense-before"
      step dense_ab 20 python3 benchmarks/dense_ab.py "$RES/nvidia-h200-dense-before/gemm-bench.json" \
        "$RES/nvidia-h200-dense-after/gemm-bench.json" --out "$RES/dense-ab.json" ;;
    # issue 25: the FP8 GPU tests (dense, experts, grading, shared memory), then the FP8 bench rows (dense against
    # torch._scaled_mm and gemmlab bf16, experts against gemmlab bf16; eager and graph) and the fp8 grades
    fp8_tests) step fp8_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/fp8 tests/grade/test_fp8_grade.py \
      tests/grade/test_fp8_moe_grade.py tests/sandbox/test_share_fp8.py tests/bench/test_bench_fp8.py ;;
    fp8_bench) step fp8_dense 300 python3 -m benchmarks fp8-dense --out "$RES"
      step fp8_moe 300 python3 -m benchmarks fp8-moe --out "$RES" ;;
    fp8_grade) step fp8_grade 400 python3 -m gemmlab grade --cases fp8 --kernel builtin:gemmlab_fp8 \
      --output-dir "$RES/grade-h200-cli-fp8" --record "grade fp8: gemm_fp8 against torch._scaled_mm" \
      --ledger "$RES/ledger-grade.db" ;;
    # issue 31: the FP8 kernel variants against cuBLASLt (block and per-tensor scales, graph replay) and the FP8 MMA's
    # accumulation error (the constant of ref.FP8_MMA_UNIT); then the GPU test the bound's MMA term is for
    fp8_variants) step fp8_variants "${FP8_VARIANTS_S:-400}" python3 benchmarks/fp8_variants.py --out "$RES" \
        ${FP8_VARIANTS_ARGS:-} ;;
    # issue 31's small M: the decode path against torch._scaled_mm at M 1..64 (eager and graph replay, the fraction of
    # the HBM copy bandwidth); its GPU tests (a step of its own)
    fp8_decode) step fp8_decode 400 python3 benchmarks/fp8_decode.py --out "$RES" ${FP8_DECODE_ARGS:-} ;;
    fp8_decode_tests) step fp8_decode_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/fp8/test_gemm_fp8_decode_gpu.py tests/fp8/test_gemm_fp8_gpu.py tests/ops/test_fp8_launch.py ;;
    # the GPU tests of the fixes made after the 2026-12-05 calls: gpt-oss's fp16 bias gradients, the FP8 variants
    # (two programs per SM among them) and gemm_fp8 under the H200 table (b_scale_scalar, the 16-row decode at M = 1)
    fix_checks) step fix_checks 300 python3 -m pytest -v -m gpu -p no:cacheprovider -rfE $WHERE_HUNG \
        tests/moe/test_moe_oai_gpu.py tests/nn/test_nn_gpt_oss.py tests/fp8/test_fp8_variants.py \
        tests/fp8/test_gemm_fp8_gpu.py tests/fp8/test_gemm_fp8_decode_gpu.py ;;
    fp8_bound) step fp8_bound 180 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/grade/test_fp8_grade.py::test_gemmlab_fp8_against_scaled_mm_on_the_gpu tests/fp8/test_fp8_variants.py ;;
    *) echo "unknown step $s" >>"$SUMMARY" ;;
  esac
done
tar -czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null
cat "$SUMMARY"
