#!/usr/bin/env bash
# Tensor parallelism checks on a machine with 2 or more GPUs (issue 8, docs/tp.md), in one go:
#   1. cuda_tp_tests, one test per process (a hang or crash in one does not hide the others): TP=1
#      against the CPU reference, TP=2 against TP=1 bit for bit (tiny and real-dimension
#      checkpoints, synthetic weights; prefill layer by layer, 64 greedy decode steps, chunked
#      prefill, batches; with and without CUDA graphs);
#      the engine's GPU tests (continuous batching, cancellation) on TP=2;
#   2. `run --gpus 0,1` against `run --gpus 0` and `run --cpu` (64 greedy tokens, tiny checkpoint);
#   3. bench_decode at TP=1 and TP=2 (batch-1 and batch-4 decode step time, tok/s, % of the bound);
#      then TP=2 with 352 experts per layer (close to the real model's 384, which need 140 GiB per
#      GPU at TP=2: more than an H200 has);
#   4. the real-dimension checkpoint (written once, ~2 min) and TP=2 against TP=1 on it;
#   5. cuda_backend_tests (the single-GPU suite: TP=1 is the same code path).
# Every step has a time limit and the script goes on after a failure; the whole run keeps inside
# $TP_CHECK_BUDGET seconds (default 570: the device tool's 10-minute call). Logs and a summary go to
# $OUT (the device tool's output folder) or /tmp/dsuf-tp-check.
#
#   scripts/tp-check.sh [STAGE...]   stages: tests run bench realdims single (default: all, in that
#                                    order, as far as the budget goes); binaries from build-gpu/bin
#   scripts/tp-check.sh --build [...]                  configure + build build-gpu/ here first
#                                                      (needs .deps/ from scripts/gpu-check.sh --prepare)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${DSUF_GPU_BUILD:-build-gpu}
LOG=${OUT:-/tmp/dsuf-tp-check}
BUDGET=${TP_CHECK_BUDGET:-570}
mkdir -p "$LOG"
SUMMARY="$LOG/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

# NCCL: the binaries dlopen libnccl.so.2. On the GPU machine it may exist only in the pip package
# nvidia-nccl-cu13 (PyTorch's dependency): point the loader there.
NCCL_DIR=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0]))" 2>/dev/null || true)
if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/lib/libnccl.so.2" ]; then
  export LD_LIBRARY_PATH="$NCCL_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export DSUF_NCCL_LIB="$NCCL_DIR/lib/libnccl.so.2"
fi
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # never NVLink multicast
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export DSUF_SOURCE_DIR=$PWD

if [ "${1:-}" = "--build" ]; then
  shift
  NCCL_INC=""
  [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/include/nccl.h" ] && NCCL_INC="-DDSUF_NCCL_INCLUDE=$NCCL_DIR/include"
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSUF_TEXT=OFF -DDSUF_SERVER=OFF $NCCL_INC \
    -DDSUF_JSON_INCLUDE="$PWD/.deps/include" -DDSUF_GTEST_SOURCE="$PWD/.deps/googletest" > "$LOG/configure.log" 2>&1 \
    || note "configure FAILED (see configure.log)"
  grep -i "tensor parallelism\|nccl" "$LOG/configure.log" | tee -a "$SUMMARY"
  cmake --build "$B" --target run dsuf cuda_backend_tests cuda_tp_tests engine_cuda_tests bench_decode > "$LOG/build.log" 2>&1 \
    || note "build FAILED (see build.log)"
fi
STAGES=" ${*:-all} "
want() { [[ "$STAGES" == *" all "* || "$STAGES" == *" $1 "* ]]; }

tp_summary() {  # tp_summary STEP...: the lines of the test logs that say what was compared
  for n in "$@"; do
    f="$LOG/$n.log"
    [ -f "$f" ] || continue
    grep -hE "^\[  (PASSED|FAILED|SKIPPED) |tokens (identical|DIFFER)|weights on the device|identical at TP|: max \|diff\| [^0]|Failure|rror" "$f" \
      | grep -vE "listed below|^\[  SKIPPED \] [A-Za-z]+\.[A-Za-z]+$" | head -20 | sed "s|^|    $n: |" >> "$SUMMARY"
  done
}

# Runs a step with a limit (its own, cut to what is left of the budget); records its outcome.
status=0
step() {  # step NAME MAX_SECONDS command...
  local name=$1 max=$2
  shift 2
  local left=$((BUDGET - SECONDS - 5))
  if [ $left -lt 15 ]; then
    note "SKIP  $name (out of time: ${SECONDS}s of ${BUDGET}s used)"
    return
  fi
  local lim=$((max < left ? max : left)) t0=$SECONDS
  timeout -k 10 $lim "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  local dt=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then
    note "PASS  $name (${dt}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    note "TIME  $name (killed after ${lim}s; a hang? see $name.log)"
    status=1
  else
    note "FAIL  $name (rc $rc, ${dt}s; see $name.log)"
    status=1
  fi
  if [ $rc -ne 0 ]; then  # the end of the log, so the summary alone says what went wrong
    grep -v "^\[ RUN\|^\[       OK\|NCCL INFO" "$LOG/$name.log" | tail -12 | cut -c1-300 | sed 's/^/      | /' >> "$SUMMARY"
  fi
}

{
  date -u
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  nvidia-smi topo -m
  echo "NCCL: DSUF_NCCL_LIB=${DSUF_NCCL_LIB:-<unset: libnccl.so.2 from the loader path>} NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
  git log --oneline -1 2>/dev/null
} > "$LOG/machine.txt" 2>&1
head -3 "$LOG/machine.txt" | tee -a "$SUMMARY"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
note "GPUs visible: $NGPU; NCCL: ${DSUF_NCCL_LIB:-loader path}"
for bin in cuda_tp_tests run bench_decode cuda_backend_tests; do
  [ -x "$B/bin/$bin" ] || note "MISSING $B/bin/$bin (build with --build, or carry $B/bin)"
done

if want tests; then
  T="$B/bin/cuda_tp_tests"
  step tp_plan 60 "$T" --gtest_filter='TpMemoryPlan.*'
  step tp1_tiny_vs_cpu 120 "$T" --gtest_filter='TpTiny.OneGpuEqualsCpu'
  # The first TP run logs NCCL's setup (transports, rings) too.
  step tp2_tiny_nographs 120 env NCCL_DEBUG=INFO "$T" --gtest_filter='TpTiny.TwoGpusWithoutGraphsEqualOne'
  step tp2_tiny 120 "$T" --gtest_filter='TpTiny.TwoGpusEqualOne'
  step tp2_synthetic 120 "$T" --gtest_filter='TpSynthetic.*'
  step tp_more_gpus 60 "$T" --gtest_filter='TpTiny.MoreGpusThanOutputGroupsRefused'
  # The engine (continuous batching, cancellation) on TP=2 against the CPU reference alone.
  [ -x "$B/bin/engine_cuda_tests" ] && step tp2_engine 120 env DSUF_TEST_GPUS=0,1 "$B/bin/engine_cuda_tests"
  tp_summary tp_plan tp1_tiny_vs_cpu tp2_tiny_nographs tp2_tiny tp2_synthetic tp_more_gpus tp2_engine
fi

if want run; then
  CK=/tmp/dsuf-tiny-ckpt-seed1
  [ -f $CK/config.json ] || "$B/bin/dsuf" make-tiny --out $CK --seed 1 > "$LOG/make_tiny.log" 2>&1
  PROMPT=0,19923,11,1204,344,6621,16,4017,1380,128000,3,77,5091
  for g in cpu 0 0,1; do
    flag="--gpus $g"
    [ $g = cpu ] && flag=--cpu
    # stdout (the ids and text) to run_G.out; stderr (stats, NCCL lines) to the step's log.
    step "run_${g/,/_}" 90 bash -c "'$B/bin/run' --ckpt $CK $flag --prompt-ids $PROMPT --max-tokens 64 --ignore-eos --print-ids > '$LOG/run_${g/,/_}.out'"
  done
  # NCCL prints its version line on stdout when NCCL_DEBUG is set: compare the token lines only.
  for f in run_cpu run_0 run_0_1; do grep -v '^NCCL version' "$LOG/$f.out" > "$LOG/$f.ids"; done
  if cmp -s "$LOG/run_0.ids" "$LOG/run_0_1.ids" && cmp -s "$LOG/run_cpu.ids" "$LOG/run_0_1.ids"; then
    note "PASS  run: --gpus 0,1, --gpus 0 and --cpu print the same 64 tokens"
  else
    note "FAIL  run: outputs differ (diff run_0.ids run_0_1.ids)"
    status=1
  fi
  grep -h "tok/s" "$LOG"/run_*.log | sed 's/^/    /' >> "$SUMMARY"
fi

if want bench; then
  BD="$B/bin/bench_decode"
  COMMON=(--contexts 8192 --batches 1,4 --steps 8 --warmup 2 --engram-vocab 200000)
  step bench_tp1 120 "$BD" --gpus 0 --experts 96 "${COMMON[@]}"
  step bench_tp2 150 "$BD" --gpus 0,1 --experts 96 "${COMMON[@]}"
  # Near the real model: 352 of its 384 experts per layer, 129 GiB per GPU at TP=2 (384: 140 GiB).
  step bench_tp2_352 200 "$BD" --gpus 0,1 --experts 352 --contexts 8192 --batches 1 --steps 8 --warmup 2 \
    --engram-vocab 200000
  for f in bench_tp1 bench_tp2 bench_tp2_352; do
    [ -f "$LOG/$f.log" ] && grep -E "^ +[0-9]+ +[0-9]+ |bandwidth|error|^plan: context|^setup:| filled " "$LOG/$f.log" \
      | sed "s|^|    $f: |" >> "$SUMMARY"
  done
fi

if want realdims; then
  RD=${DSUF_REAL_DIMS_CKPT:-/tmp/dsuf-real-dims-seed1}
  export DSUF_REAL_DIMS_CKPT=$RD
  [ -f "$RD/config.json" ] || step make_real_dims 200 "$B/bin/dsuf" make-tiny --out "$RD" --seed 1 --variant real-dims
  step tp2_real_dims 180 "$B/bin/cuda_tp_tests" --gtest_filter='TpRealDims.*'
  tp_summary tp2_real_dims
fi

if want single; then
  step cuda_backend_tests 240 "$B/bin/cuda_backend_tests"
  grep -hE "^\[  (PASSED|FAILED) " "$LOG/cuda_backend_tests.log" 2>/dev/null | sed 's/^/    /' >> "$SUMMARY"
fi

note "total ${SECONDS}s; logs in $LOG"
echo "==== summary ===="
cat "$SUMMARY"
exit $status
