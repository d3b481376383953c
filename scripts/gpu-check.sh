#!/usr/bin/env bash
# Every GPU check in one go, on the GPU machine (H200, sm_90a): the CUDA backend against the CPU
# reference (tiny checkpoint and the real-dimension variant, bit for bit), the memory plan's
# refusal, device sampling against the host's (cuda_backend_tests: CudaSampling.*), the engine on
# the GPU, the conversation cache's resume on the GPU (resume_cuda_tests), and `run --gpus 0`
# against `run --cpu` on the same prompt, greedy and sampled. When build/bin/ (built on the dev
# machine: the GPU machine cannot build src/cluster or serve) and .gpu-libs/ were carried too, also
# the cache with the real store and transfer (cluster_cuda_tests) and serve --gpus 0 against
# serve --cpu, turn 2 from the host store included (scripts/serve-gpu-check.sh).
#
#   scripts/gpu-check.sh --prepare   (on a Debian dev machine) copy the header-only JSON library and
#                                    GoogleTest's source into .deps/ so the GPU machine can build,
#                                    and the shared libraries build/bin/serve and
#                                    build/bin/cluster_cuda_tests link into .gpu-libs/
#   scripts/gpu-check.sh --bundle    (on the dev machine, after --prepare) pack .gpu-libs/, build/bin/serve,
#                                    build/bin/cluster_cuda_tests and build-gpu/bin/* into build-gpu/bundle.tar.xz
#                                    (~16 MB: the device tool carries at most 64 MiB, the loose files are ~90 MB);
#                                    on the GPU machine `scripts/gpu-check.sh --unbundle` unpacks it
#   scripts/gpu-check.sh --build     (on the GPU machine) configure + build build-gpu/ there with only
#                                    the CUDA toolkit, CMake/ninja and .deps/, then run the checks
#   scripts/gpu-check.sh             run the checks with binaries already in build-gpu/bin
#
# Logs go to $OUT (the device tool's output folder) or /tmp/dsuf-gpu-check.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${DSUF_GPU_BUILD:-build-gpu}
LOG=${OUT:-/tmp/dsuf-gpu-check}
mkdir -p "$LOG"

if [ "${1:-}" = "--prepare" ]; then
  mkdir -p .deps/include
  cp -r /usr/include/nlohmann .deps/include/
  rm -rf .deps/googletest && cp -r /usr/src/googletest .deps/googletest
  # Debian's shared libraries the dev-built programs need (ICU, PCRE2, hiredis, xxHash, OpenSSL,
  # UCX), without the C/C++ runtime and the CUDA runtime, which the GPU machine has.
  mkdir -p .gpu-libs
  for bin in build/bin/serve build/bin/cluster_cuda_tests; do
    [ -x "$bin" ] || continue
    ldd "$bin" | awk '$3 ~ /^\// {print $3}' |
      grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64|libcudart)\.so' |
      xargs -r cp -L -t .gpu-libs/
  done
  # redis-server and ucx_perftest for bench/cluster_bench.py on the GPU machine, with their libraries.
  mkdir -p .gpu-libs/bin
  for bin in /usr/bin/redis-server /usr/bin/ucx_perftest; do
    [ -x "$bin" ] || continue
    cp "$bin" .gpu-libs/bin/
    ldd "$bin" | awk '$3 ~ /^\// {print $3}' |
      grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64)\.so' |
      xargs -r cp -L -n -t .gpu-libs/
  done
  # The device tool carries at most 64 MiB: ICU's 31 MB data library travels compressed (7 MB).
  for big in .gpu-libs/libicudata.so.*; do [ "${big%.xz}" = "$big" ] && xz -f -9 "$big"; done
  echo "prepared .deps/ and .gpu-libs/ (carry them, and build/bin/serve, build/bin/cluster_cuda_tests, to the GPU machine)"
  exit 0
fi
if [ "${1:-}" = "--bundle" ]; then
  files=(.gpu-libs)
  for f in build/bin/serve build/bin/cluster_cuda_tests build-gpu/bin/*; do [ -x "$f" ] && files+=("$f"); done
  tar -cJf build-gpu/bundle.tar.xz "${files[@]}"
  ls -la build-gpu/bundle.tar.xz
  echo "carry build-gpu/bundle.tar.xz; first on the GPU machine: scripts/gpu-check.sh --unbundle"
  exit 0
fi
if [ "${1:-}" = "--unbundle" ]; then  # python's tarfile: the GPU machine may lack xz
  python3 -c 'import tarfile; tarfile.open("build-gpu/bundle.tar.xz").extractall(".")'
  shift
  [ $# -eq 0 ] && exit 0
fi
if [ "${1:-}" = "--build" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSUF_TEXT=OFF -DDSUF_SERVER=OFF \
    -DDSUF_JSON_INCLUDE="$PWD/.deps/include" -DDSUF_GTEST_SOURCE="$PWD/.deps/googletest" > "$LOG/configure.log"
  cmake --build "$B" --target run dsuf cuda_backend_tests engine_cuda_tests resume_cuda_tests bench_decode > "$LOG/build.log"
fi

# Unpack what --prepare compressed (python's lzma: the GPU machine may lack xz).
for f in .gpu-libs/*.xz; do
  [ -e "$f" ] && python3 -c 'import lzma,sys; open(sys.argv[1][:-3],"wb").write(lzma.open(sys.argv[1]).read())' "$f"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$LOG/gpu.txt"
export DSUF_SOURCE_DIR=$PWD
status=0
"$B/bin/cuda_backend_tests" 2>&1 | grep -v '^  token' | tee "$LOG/cuda_backend_tests.log" | grep -E '^\[ *(OK|FAILED) ' || true
grep -q '^\[  PASSED  \]' "$LOG/cuda_backend_tests.log" && ! grep -q '^\[  FAILED  \]' "$LOG/cuda_backend_tests.log" || status=1

# The engine on the CUDA backend (continuous batching through the real scheduler).
if [ -x "$B/bin/engine_cuda_tests" ]; then
  "$B/bin/engine_cuda_tests" 2>&1 | tee "$LOG/engine_cuda_tests.log" | grep -E '^\[ *(OK|FAILED) ' || true
  grep -q '^\[  PASSED  \]' "$LOG/engine_cuda_tests.log" && ! grep -q '^\[  FAILED  \]' "$LOG/engine_cuda_tests.log" || status=1
fi

# The conversation cache's resume on the GPU: a handed-out state resumes like a full prefill, states
# move between the CPU and the GPU, and a restored state never runs on stale device pools.
if [ -x "$B/bin/resume_cuda_tests" ]; then
  "$B/bin/resume_cuda_tests" 2>&1 | tee "$LOG/resume_cuda_tests.log" | grep -E '^\[ *(OK|FAILED) ' || true
  grep -q '^\[  PASSED  \]' "$LOG/resume_cuda_tests.log" && ! grep -q '^\[  FAILED  \]' "$LOG/resume_cuda_tests.log" || status=1
fi
# The same with the real host store and a pull from a peer over TCP (built on the dev machine).
if [ -x build/bin/cluster_cuda_tests ] && [ -d .gpu-libs ]; then
  LD_LIBRARY_PATH=$PWD/.gpu-libs:${LD_LIBRARY_PATH:-} build/bin/cluster_cuda_tests 2>&1 |
    tee "$LOG/cluster_cuda_tests.log" | grep -E '^\[ *(OK|FAILED) ' || true
  grep -q '^\[  PASSED  \]' "$LOG/cluster_cuda_tests.log" && ! grep -q '^\[  FAILED  \]' "$LOG/cluster_cuda_tests.log" || status=1
fi

# The programs themselves: run --gpus 0 must print the same tokens as run --cpu.
CK=/tmp/dsuf-tiny-ckpt-seed1
[ -f $CK/config.json ] || "$B/bin/dsuf" make-tiny --out $CK --seed 1 > /dev/null
PROMPT=0,19923,11,1204,344,6621,16,4017,1380,128000,3,77,5091
"$B/bin/run" --ckpt $CK --cpu --prompt-ids $PROMPT --max-tokens 64 --ignore-eos --print-ids > "$LOG/run_cpu.txt" 2> "$LOG/run_cpu.err"
"$B/bin/run" --ckpt $CK --gpus 0 --prompt-ids $PROMPT --max-tokens 64 --ignore-eos --print-ids > "$LOG/run_gpu.txt" 2> "$LOG/run_gpu.err"
cat "$LOG/run_cpu.err" "$LOG/run_gpu.err"
if cmp -s "$LOG/run_cpu.txt" "$LOG/run_gpu.txt"; then echo "run: --gpus 0 and --cpu print the same 64 tokens"; else echo "run: --gpus 0 and --cpu differ"; status=1; fi
# Sampled: the GPU samples on the device, the CPU on the host; the tokens must still be the same.
SAMPLE="--temperature 0.8 --top-p 0.9 --top-k 40 --seed 5"
"$B/bin/run" --ckpt $CK --cpu --prompt-ids $PROMPT --max-tokens 64 --ignore-eos --print-ids $SAMPLE > "$LOG/run_cpu_sampled.txt" 2> "$LOG/run_cpu_sampled.err"
"$B/bin/run" --ckpt $CK --gpus 0 --prompt-ids $PROMPT --max-tokens 64 --ignore-eos --print-ids $SAMPLE > "$LOG/run_gpu_sampled.txt" 2> "$LOG/run_gpu_sampled.err"
if cmp -s "$LOG/run_cpu_sampled.txt" "$LOG/run_gpu_sampled.txt"; then echo "run (sampled): --gpus 0 and --cpu print the same 64 tokens"; else echo "run (sampled): --gpus 0 and --cpu differ"; status=1; fi

# serve --gpus 0 against serve --cpu, turn 2 resumed from the GPU server's host store included.
if [ -x build/bin/serve ] && [ -d .gpu-libs ]; then
  OUT=$LOG scripts/serve-gpu-check.sh || status=1
fi
exit $status
