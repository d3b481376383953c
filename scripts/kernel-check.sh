#!/usr/bin/env bash
# The exactness checks and A/B timings of the linears' kernel variants, in one device call (the
# session-6 routine, docs/perf.md v14), with binaries already in build-gpu/bin (cuda_backend_tests,
# engine_cuda_tests, cuda_tp_tests, bench_decode; carry them, not the whole folder: 64 MiB):
#
#   scripts/kernel-check.sh verify   cuda_backend_tests with the defaults and with every linear forced
#                                    through the tiled kernels (DSUF_FP8_GEMM_ROWS=1, DSUF_MOE_GROUP_ROWS=1,
#                                    DSUF_FP4_MMA_ROWS=0) side by side on two GPUs (one after the other
#                                    on one), plus each extra setting in $EXTRA (e.g.
#                                    EXTRA="DSUF_FP8_GEMM_TILE=64x64"), forced too, and each setting in
#                                    $PLAIN with the defaults otherwise (the decode path's knobs, which
#                                    the forced tiled kernels would bypass; unset: the opt-in decode
#                                    kernels and the row-major experts' kernel: DSUF_FP4=dp4a|imma|mma,
#                                    DSUF_PV=tiles|cp|cpw|warps, DSUF_LOGITS_QT=off,
#                                    DSUF_FP8_BF16_FMA=off, DSUF_BF16_FMA=off, DSUF_ATT_STAGE=4, DSUF_PDL=0); engine_cuda_tests;
#                                    cuda_tp_tests forced, and with DSUF_FP4=dp4a (needs 2 GPUs for its
#                                    TP=2 cases)
#   scripts/kernel-check.sh time     prefill 2048 tokens and batches 1/16/64 at 8K, each $AB setting
#                                    (space-separated NAME=a|b|... lists, default the FP8 tile and the
#                                    grouped FP4 kernel) against its alternatives, interleaved
##   scripts/kernel-check.sh decode   batch 1 at 8K, each $AB setting (default: the decode step's
#                                    knobs) against its alternatives, $ROUNDS (3) rounds interleaved,
#                                    then the defaults' timeline (bench_decode --timeline, CSV to the
#                                    log folder). ~3.5 s a run (9 values × 3 rounds: ~2 minutes)
#
#   scripts/kernel-check.sh sets     batch 1 at 8K (or $BENCH's bench_decode arguments) for each setting
#                                    of $SETS (';'-separated; each a space-separated list of NAME=value,
#                                    empty for the defaults), $ROUNDS (3) rounds interleaved: settings
#                                    that combine several knobs, which `decode` cannot; then each
#                                    setting's mean against the first (scripts/sets_summary.py)
#   scripts/kernel-check.sh probe    bench/stream_probe: plain reads of the experts' bytes, one launch at
#                                    each linear's size, launch boundaries (~20 s)
#   scripts/kernel-check.sh pair A B two bench_decode binaries, batch 1 at 8K, $ROUNDS rounds interleaved
#   scripts/kernel-check.sh small    Nsight Compute on the step's latency-bound kernels (attention,
#                                    mHC, router, norms, top-k), a few launches each from the middle
#                                    layers, at the step's clocks and caches, with the warp stall
#                                    sampling's top locations (~1 minute)
#   scripts/kernel-check.sh step     Nsight Compute over every kernel of one batch-1 step at 8K, as a
#                                    per-kernel table (scripts/ncu_table.py; step.md in the log folder)
#   scripts/kernel-check.sh source   Nsight Compute's per-instruction view (SASS, warp-stall samples) of
#                                    one launch of each of $KERNELS
#
# Every result line says its settings. Logs go to $OUT (the device tool's folder) or /tmp. The
# device tool returns at most 8 files (verify writes ~10; step and source several): set OUT to a
# folder inside it and tar that at the end (as .next21/prep.sh does), or files come back missing.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export DSUF_SOURCE_DIR=$PWD
B=${DSUF_GPU_BUILD:-build-gpu}/bin
L=${OUT:-/tmp/dsuf-kernel-check}
mkdir -p "$L"
if python3 -c "import nvidia.nccl" 2>/dev/null; then  # NCCL from PyTorch's wheel, multicast off
  N=$(python3 -c "import nvidia.nccl;print(list(nvidia.nccl.__path__)[0])")
  export DSUF_NCCL_LIB=$N/lib/libnccl.so.2 LD_LIBRARY_PATH=$N/lib:${LD_LIBRARY_PATH:-}
fi
export NCCL_NVLS_ENABLE=0
FORCED="DSUF_FP8_GEMM_ROWS=1 DSUF_MOE_GROUP_ROWS=1 DSUF_FP4_MMA_ROWS=0 DSUF_TILED_MMA_ROWS=0"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
summary() { grep -h "PASSED\|FAILED\|rc=" "$@"; }

suite() {  # log name, GPU, settings...
  local name=$1 gpu=$2
  shift 2
  env CUDA_VISIBLE_DEVICES="$gpu" "$@" timeout 300 "$B/cuda_backend_tests" > "$L/$name.txt" 2>&1
  echo "$name ($*) rc=$?" >> "$L/$name.txt"
}

case "${1:-verify}" in
verify)
  # The real-dims test's CPU side (~90 s of a suite's ~130) computed once and read back by every run
  # below (tests/backend/cuda_backend_test.cc, DSUF_TEST_CPU_CACHE; keyed to this binary). Outside
  # $L: the file is tens of MB, and the device tool returns what is under its $OUT.
  export DSUF_TEST_CPU_CACHE=/tmp/dsuf-cpu-cache-$$
  rm -rf "$DSUF_TEST_CPU_CACHE"
  CUDA_VISIBLE_DEVICES=0 timeout 300 "$B/cuda_backend_tests" --gtest_filter='CudaVsCpuRealDims.*' > "$L/be_prime.txt" 2>&1
  echo "prime (CudaVsCpuRealDims, defaults) rc=$?" >> "$L/be_prime.txt"
  runs=("default|" "forced|$FORCED")
  # An item may join settings with '+' (one run with all of them: independent knobs, fewer runs).
  for x in ${EXTRA:-}; do runs+=("forced_${x//[^A-Za-z0-9]/_}|$FORCED ${x//+/ }"); done
  for x in ${PLAIN-DSUF_FP4=dp4a DSUF_FP4=imma DSUF_FP4=mma DSUF_PV=tiles DSUF_PV=cp DSUF_PV=cpw DSUF_PV=warps DSUF_LOGITS_QT=off DSUF_FP8_BF16_FMA=off DSUF_BF16_FMA=off DSUF_BF16_WIDE_LOOP=off DSUF_BF16_WIDE_LOOP=4 DSUF_ATT_STAGE=4 DSUF_PDL=0}; do runs+=("plain_${x//[^A-Za-z0-9]/_}|${x//+/ }"); done
  i=0
  for run in "${runs[@]}"; do
    name=${run%%|*}
    # shellcheck disable=SC2086
    suite "be_$name" $((i % (gpus > 1 ? 2 : 1))) ${run#*|} &
    i=$((i + 1))
    if [ "$gpus" -lt 2 ] || [ $((i % 2)) -eq 0 ]; then wait; fi
  done
  wait
  summary "$L"/be_*.txt
  rm -rf "$DSUF_TEST_CPU_CACHE"
  CUDA_VISIBLE_DEVICES=0 timeout 150 "$B/engine_cuda_tests" > "$L/engine.txt" 2>&1
  echo "engine rc=$?" >> "$L/engine.txt"
  # shellcheck disable=SC2086
  env $FORCED timeout 200 "$B/cuda_tp_tests" > "$L/tp.txt" 2>&1
  echo "tp forced rc=$?" >> "$L/tp.txt"
  # The experts' row-major layout on TP ranks (tiles are their default since v18).
  DSUF_FP4=dp4a timeout 200 "$B/cuda_tp_tests" > "$L/tp_rowmajor.txt" 2>&1
  echo "tp DSUF_FP4=dp4a rc=$?" >> "$L/tp_rowmajor.txt"
  summary "$L/engine.txt" "$L/tp.txt" "$L/tp_rowmajor.txt"
  ;;
time)
  export CUDA_VISIBLE_DEVICES=0
  bd() { timeout 150 "$B/bench_decode" --engram-vocab 100000 "$@" 2>&1 | grep -v '^model:\|^head:\|^routed experts'; }
  for spec in ${AB:-DSUF_FP8_GEMM_TILE=128x32|64x64 DSUF_FP4_ROWS=mma|dp4a}; do
    var=${spec%%=*}
    IFS='|' read -r -a vals <<< "${spec#*=}"
    for rep in 1 2; do
      for v in "${vals[@]}"; do
        echo "== $var=$v (round $rep): prefill 2048"
        (export "$var=$v"; bd --prefill 2048 | tail -1)
      done
    done
  done
  echo "== defaults: batches 1, 16, 64 at 8K"
  bd --contexts 8192 --batches 1,16,64 --steps 20 --warmup 3 | tail -3
  ;;
decode)
  export CUDA_VISIBLE_DEVICES=0
  bd() { timeout 150 "$B/bench_decode" --engram-vocab 100000 --contexts 8192 --batches 1 "$@" 2>&1 | grep -v '^model:\|^head:\|^routed experts'; }
  for spec in ${AB:-DSUF_GATHER=early|late DSUF_PDL=1|0}; do
    var=${spec%%=*}
    IFS='|' read -r -a vals <<< "${spec#*=}"
    for rep in $(seq "${ROUNDS:-3}"); do
      for v in "${vals[@]}"; do
        echo "== $var=$v (round $rep): batch 1 at 8K"
        (export "$var=$v"; bd --steps 30 --warmup 3 | tail -1)
      done
    done
  done
  echo "== defaults: timeline"
  bd --steps 10 --warmup 3 --timeline "$L/timeline" | tail -36
  ;;
sets)
  export CUDA_VISIBLE_DEVICES=0
  IFS=';' read -r -a sets <<< "${SETS:?SETS=';'-separated settings}"
  # shellcheck disable=SC2206
  args=(${BENCH:---contexts 8192 --batches 1 --steps 30 --warmup 3})
  for rep in $(seq "${ROUNDS:-3}"); do
    for set in "${sets[@]}"; do
      echo "== [${set:-defaults}] (round $rep): ${args[*]}"
      # shellcheck disable=SC2086
      env $set timeout 150 "$B/bench_decode" --engram-vocab 100000 "${args[@]}" 2>&1 |
        grep -v '^model:\|^head:\|^routed experts\|^setup:' | tail -n "${TAIL:-1}"
    done
  done | tee "$L/sets.log"
  python3 scripts/sets_summary.py "$L/sets.log"  # each setting's rounds, mean, and against the first
  ;;
pair)
  # Two bench_decode binaries (e.g. main's and a branch's) at batch 1 and 8K, $ROUNDS rounds
  # interleaved: scripts/kernel-check.sh pair A/bench_decode B/bench_decode
  export CUDA_VISIBLE_DEVICES=0
  for rep in $(seq "${ROUNDS:-3}"); do
    for bin in "${2:?two binaries}" "${3:?two binaries}"; do
      echo "== $bin (round $rep): batch 1 at 8K"
      timeout 150 "$bin" --engram-vocab 100000 --contexts 8192 --batches 1 --steps 30 --warmup 3 2>&1 | tail -1
    done
  done | tee "$L/pair.log"
  python3 scripts/sets_summary.py "$L/pair.log"
  ;;
probe)
  # What a plain read of the step's bytes achieves (bench/stream_probe), the per-kernel denominator.
  CUDA_VISIBLE_DEVICES=0 timeout 200 "$B/stream_probe" --experts 96 --reps 30 2>&1 | tee "$L/probe.txt"
  ;;
small)
  # Why a 1 MB attention takes 30 µs: speed of light, launch, occupancy, warp states per kernel.
  export CUDA_VISIBLE_DEVICES=0
  DSUF_CUDA_GRAPHS=0 timeout 400 ncu --clock-control none --cache-control none --section SpeedOfLight \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section SourceCounters \
    --kernel-name regex:'^k_(attention_pv|attention_logits|gather_keys|collapse_norm|hc_mix|route|rmsnorm|moe_sum_expand|top_k|bf16_linear|linear_input)' \
    --launch-skip 60 --launch-count 16 "$B/bench_decode" --engram-vocab 100000 --contexts 8192 --batches 1 \
    --steps 1 --warmup 0 --experts 16 > "$L/small.txt" 2>&1
  echo "ncu rc=$?"
  grep -E '^  k_|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Dynamic Shared|Grid Size|Block Size|Issued Warp|No Eligible|Stall' "$L/small.txt" | head -250
  ;;
step)
  # Nsight Compute over every kernel of one batch-1 decode step at 8K (graphs off, caches and clocks
  # as they are), summed per kernel by scripts/ncu_table.py: the per-kernel breakdown of issue 6.
  # Two metrics (duration, DRAM bytes read: one pass; the four percentages of session 11 took ~8
  # passes of ~55 s each, the whole program each time); ncu writes its CSV only at the end. The regex leaves out k_fp4_tile (~11,500
  # launches at load, the experts' re-layout) and k_bf16_exponents (the head's exponent scan at load,
  # ~0.74 ms: session 47's first table counted it). Application replay (the program run once per pass):
  # kernel replay saves and restores the device memory a kernel may write before each pass, and
  # here that is one 76 GiB allocation — ~0.1 s a launch, which ran past every limit (sessions 11-12).
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  DSUF_CUDA_GRAPHS=0 timeout "${NCU_LIMIT:-500}" ncu --clock-control none --cache-control none --csv --page details \
    --replay-mode application --app-replay-match grid \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --kernel-name regex:'^k_(embed|hc_|collapse|rmsnorm|fp8_gemv|fp4_(gemv|imma|mma)|bf16_(linear|stream|wide)|rope|fp8_fake|index_|pack_|gather_|attention|compress|update_p|candidate|top_k|mask_from|route|swiglu|moe_|engram|linear_input|group_rows|add_rows)' \
    --launch-count 1500 "$B/bench_decode" --engram-vocab 100000 --contexts 8192 --batches 1 \
    --steps 1 --warmup 0 > "$L/step.csv" 2> "$L/step.err"
  echo "ncu rc=$?"
  python3 scripts/ncu_table.py "$L/step.csv" > "$L/step.md"
  head -45 "$L/step.md"
  ;;
source)
  # Nsight Compute's per-instruction view (SASS with warp-stall samples, built with -lineinfo) of
  # one launch of each kernel named in $KERNELS (default: top_k, compress_emit, collapse_norm),
  # from a middle layer ($SKIP launches skipped, default 4; k_compress_emit runs about once a step:
  # SKIP=0 for it; EXPERTS routed experts a layer, default 16 — the router's rows, so EXPERTS=96 for
  # k_bf16_linear and k_route): $L/source-<kernel>.txt (scripts/ncu_source.py reads it: the
  # segments — loops, straight stretches — with the most stall samples).
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  for k in ${KERNELS:-k_top_k k_compress_emit k_collapse_norm}; do
    DSUF_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --cache-control none --section SourceCounters \
      --section WarpStateStats --page source --print-source sass --kernel-name "$k" --launch-skip "${SKIP:-4}" \
      --launch-count 1 "$B/bench_decode" --engram-vocab 100000 --contexts 8192 --batches 1 --steps 1 \
      --warmup 0 --experts "${EXPERTS:-16}" > "$L/source-$k.txt" 2>&1
    echo "$k: ncu rc=$? $(wc -l < "$L/source-$k.txt") lines"
  done
  ;;
*)
  echo "usage: scripts/kernel-check.sh verify|time|decode|sets|probe|pair A B|small|step|source" >&2
  exit 2
  ;;
esac
