#!/usr/bin/env bash
# Decode-speed measurements on the GPU machine with binaries already in build-gpu/bin (docs/perf.md):
#   scripts/perf-check.sh [quick|full|ncu]
# quick: batch 1 and 64 at 8K and 128K with the per-component table; batch 1 at 8K with the
#        double-buffered GEMVs (DSUF_GEMV=pipe), with programmatic dependent launch on (DSUF_PDL=1)
#        and with one stream (DSUF_OVERLAP=0 DSUF_HC_FORK=0); batch 1 at ~1M tokens.
# full:  also batches 4 and 16 and the deep-prefetch GEMVs (DSUF_GEMV=deep).
# ncu:   a per-kernel Nsight Compute breakdown of one batch-1 step at 8K (bench/ncu_breakdown.py), at
#        the clocks and caches the step runs with (--clock-control none --cache-control none; Nsight's
#        default locks base clocks and flushes L2 before each kernel, which inflated the issue-bound
#        kernels by about 1.4× in session 3's tables).
# Each step is time-limited and the script goes on past a failing one; logs go to $OUT or /tmp.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${DSUF_GPU_BUILD:-build-gpu}/bin
LOG=${OUT:-/tmp/dsuf-perf-check}
mkdir -p "$LOG"
mode=${1:-quick}
bench() {  # name, timeout, args...
  local name=$1 limit=$2
  shift 2
  echo "== bench_decode $* ($name)"
  timeout "$limit" "$B/bench_decode" "$@" 2>&1 | tee "$LOG/bench_$name.txt" | grep -v '^model:\|^head:'
}
batches=1,64
[ "$mode" = full ] && batches=1,4,16,64
if [ "$mode" != ncu ]; then
  bench main 200 --contexts 8192,131072 --batches $batches --steps 10 --warmup 2 --components
  DSUF_GEMV=pipe bench gemv_pipe 60 --contexts 8192 --batches 1 --steps 10 --warmup 2
  DSUF_PDL=1 bench pdl_on 60 --contexts 8192 --batches 1 --steps 10 --warmup 2
  DSUF_OVERLAP=0 DSUF_HC_FORK=0 bench one_stream 60 --contexts 8192 --batches 1 --steps 10 --warmup 2
  [ "$mode" = full ] && DSUF_GEMV=deep bench gemv_deep 60 --contexts 8192 --batches 1 --steps 10 --warmup 2
  bench 1m 120 --contexts 1048000 --batches 1 --steps 5 --warmup 1 --components
fi
if [ "$mode" = ncu ] || [ "$mode" = full ]; then
  echo "== ncu"
  DSUF_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    --kernel-name regex:'^k_(?!fill)' --launch-count 4000 --csv --log-file "$LOG/ncu.csv" \
    "$B/bench_decode" --contexts 8192 --batches 1 --steps 1 --warmup 0 --experts 16 --engram-vocab 100000 \
    > "$LOG/ncu_stdout.txt" 2>&1
  bw=$(grep -o 'bandwidth (read+write): [0-9]*' "$LOG/ncu_stdout.txt" | grep -o '[0-9]*$')
  python3 bench/ncu_breakdown.py "$LOG/ncu.csv" --bw "${bw:-4250}" | tee "$LOG/ncu_breakdown.txt"
fi
