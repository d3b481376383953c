// How fast the step's one-row FP8 linear kernels consume their weights when the weights sit in L2
// against when they come from DRAM (session 28; docs/perf.md v41). Each shape is launched back to
// back (programmatic launches, as in the step) `reps` times per timing, either on one weight copy
// (the same bytes every launch: L2-resident when they fit, ≤ ~24 MB here) or rotating over enough
// copies that every launch reads DRAM; the median of `rounds` timings, in µs a launch and GB/s of
// weight bytes. If a kernel is as slow from L2 as from DRAM, its own shape (latency chains, issue)
// bounds it, not the memory: prefetching its weights into L2 cannot help it.
//
// Usage: linear_probe [--reps 100] [--rounds 5] [--cold-mb 512]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.cuh"

namespace {

using namespace dsuf;

struct Shape {
  const char* what;
  int64_t out, K;
  int groups;     // > 1: fp8_linear_groups (out a group), as wo_a
  int64_t pair;   // > 0: a second linear of `pair` outputs on the same input (wq_a+wkv, w1+w3)
  bool quantize;  // the input quantized (E4M3 ×2^64 + scales), as every linear but wo_a
  bool sink;      // groups: the output laid out as the next linear's input (wo_a → wo_b)
};

template <typename T>
T* dev_alloc(size_t n) {
  void* p = nullptr;
  DSUF_CUDA(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 100, rounds = 5;
  int64_t cold_mb = 512;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto v = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "linear_probe: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--reps") reps = int(v());
    else if (a == "--rounds") rounds = int(v());
    else if (a == "--cold-mb") cold_mb = v();
    else {
      std::fprintf(stderr, "usage: linear_probe [--reps 100] [--rounds 5] [--cold-mb 512]\n");
      return 2;
    }
  }
  if (reps < 1 || rounds < 1 || cold_mb < 64) {
    std::fprintf(stderr, "linear_probe: --reps and --rounds ≥ 1, --cold-mb ≥ 64\n");
    return 2;
  }
  cudaDeviceProp prop{};
  DSUF_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("linear_probe: %s, L2 %.0f MB; %d launches back to back a timing, median of %d; cold: copies "
              "rotating over ≥ %lld MB\n",
              prop.name, prop.l2CacheSize / 1e6, reps, rounds, static_cast<long long>(cold_mb));
  // The step's one-row FP8 linears at V4.1-Flash's dimensions: wq_b and wo_b also halved (the same
  // kernels and per-warp work, half the rows), so that their "L2" column is all from L2.
  const Shape shapes[] = {
      {"wq_b half (tiles<4>)", 16384, 1280, 1, 0, true, false},
      {"wo_b half (tiles<8>)", 2560, 8192, 1, 0, true, false},
      {"shared w2 (tiles<8>)", 5120, 2304, 1, 0, true, false},
      {"shared w1+w3 (pair)", 2304, 5120, 1, 2304, true, false},
      {"wq_a+wkv (pair)", 1280, 5120, 1, 512, true, false},
      {"wo_a (8 groups, sink)", 1024, 4096, 8, 0, false, true},
      {"wq_b (tiles<4>)", 32768, 1280, 1, 0, true, false},
      {"wo_b (tiles<8>)", 5120, 8192, 1, 0, true, false},
  };
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  DSUF_CUDA(cudaEventCreate(&e0));
  DSUF_CUDA(cudaEventCreate(&e1));
  std::mt19937 rng(28);
  std::printf("%-28s %8s %10s %10s %10s %10s %7s\n", "linear", "MB", "L2 µs", "L2 GB/s", "DRAM µs", "DRAM GB/s",
              "ratio");
  for (const Shape& sh : shapes) {
    const int64_t rows_w = sh.out * sh.groups, nb = sh.K / 32;
    const int64_t wbytes = rows_w * sh.K + sh.pair * sh.K, sbytes = (rows_w + 31) / 32 * nb + (sh.pair + 31) / 32 * nb;
    const int copies = int(std::max<int64_t>(2, (cold_mb << 20) / (wbytes + sbytes) + 1));
    // One allocation a copy: weights, then the pair's, then the scale codes.
    std::vector<uint8_t*> mem(static_cast<size_t>(copies));
    {
      std::vector<uint8_t> h(static_cast<size_t>(wbytes + sbytes));
      std::uniform_int_distribution<int> byte(0, 255), code(120, 130);
      for (int64_t i = 0; i < wbytes; ++i) {
        uint8_t w = uint8_t(byte(rng));
        h[size_t(i)] = (w & 0x7f) == 0x7f ? uint8_t(w ^ 1) : w;  // no NaN codes
      }
      for (int64_t i = wbytes; i < wbytes + sbytes; ++i) h[size_t(i)] = uint8_t(code(rng));
      for (auto& m : mem) {
        m = dev_alloc<uint8_t>(size_t(wbytes + sbytes));
        DSUF_CUDA(cudaMemcpy(m, h.data(), h.size(), cudaMemcpyHostToDevice));
      }
    }
    // The input row (random, a few outliers), laid out (and quantized) once.
    const int64_t Kall = sh.K * sh.groups;
    std::vector<float> x(static_cast<size_t>(Kall));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
    float* dx = dev_alloc<float>(size_t(Kall));
    DSUF_CUDA(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    const int64_t kp = cuda::interleaved_k(sh.K);
    float* xq = dev_alloc<float>(size_t(kp * sh.groups));
    float* xs = dev_alloc<float>(size_t(kp / 32 * sh.groups));
    const cuda::LinearInput in = cuda::linear_input(dx, Kall, 1, sh.K, sh.quantize, xq, xs, s, sh.groups);
    float* y = dev_alloc<float>(size_t(rows_w + sh.pair));
    float* y2 = y + rows_w;
    const int64_t kn = cuda::interleaved_k(rows_w);
    float* sq = dev_alloc<float>(size_t(kn));
    float* ss = dev_alloc<float>(size_t(kn / 32));
    auto launch = [&](int c) {
      const uint8_t* W = mem[size_t(c)];
      const uint8_t* Ws = W + wbytes;
      if (sh.groups > 1) {
        const cuda::InputSink sink{sh.sink ? sq : nullptr, sh.sink ? ss : nullptr, true};
        cuda::fp8_linear_groups(W, Ws, sh.groups, sh.out, sh.K, in, 1, y, rows_w, false, s, sink);
      } else if (sh.pair > 0) {
        cuda::fp8_linear(W, Ws, sh.out, sh.K, in, 1, y, sh.out, false, s,
                         {.W = W + rows_w * sh.K, .Ws = Ws + (rows_w + 31) / 32 * nb, .out = sh.pair, .y = y2,
                          .y_stride = sh.pair});
      } else {
        cuda::fp8_linear(W, Ws, sh.out, sh.K, in, 1, y, sh.out, false, s);
      }
    };
    auto time = [&](bool cold) {
      std::vector<float> us;
      for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < 3; ++i) launch(cold ? i % copies : 0);  // warm-up (and L2 filled when warm)
        DSUF_CUDA(cudaEventRecord(e0, s));
        for (int i = 0; i < reps; ++i) launch(cold ? (i + 3) % copies : 0);
        DSUF_CUDA(cudaEventRecord(e1, s));
        DSUF_CUDA(cudaEventSynchronize(e1));
        float ms = 0.0f;
        DSUF_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        us.push_back(1e3f * ms / float(reps));
      }
      std::sort(us.begin(), us.end());
      return double(us[us.size() / 2]);
    };
    const double warm = time(false), cold = time(true);
    const double mb = double(wbytes + sbytes) / 1e6;
    std::printf("%-28s %8.1f %10.2f %10.0f %10.2f %10.0f %7.2f\n", sh.what, mb, warm, mb * 1e3 / warm, cold,
                mb * 1e3 / cold, cold / warm);
    for (auto* m : mem) cudaFree(m);
    cudaFree(dx), cudaFree(xq), cudaFree(xs), cudaFree(y), cudaFree(sq), cudaFree(ss);
  }
  // The reference on the same machine: a device-to-device copy of 1 GB (read + write), once per round.
  {
    const size_t n = size_t(1) << 30;
    uint8_t *a = dev_alloc<uint8_t>(n), *b = dev_alloc<uint8_t>(n);
    DSUF_CUDA(cudaMemsetAsync(a, 1, n, s));
    std::vector<float> ms_v;
    for (int r = 0; r < rounds; ++r) {
      DSUF_CUDA(cudaEventRecord(e0, s));
      DSUF_CUDA(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s));
      DSUF_CUDA(cudaEventRecord(e1, s));
      DSUF_CUDA(cudaEventSynchronize(e1));
      float ms = 0.0f;
      DSUF_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      ms_v.push_back(ms);
    }
    std::sort(ms_v.begin(), ms_v.end());
    std::printf("device copy of 1 GB: %.0f GB/s read + written (median of %d)\n", 2.0 * n / 1e6 / ms_v[ms_v.size() / 2],
                rounds);
    cudaFree(a), cudaFree(b);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaStreamDestroy(s);
  return 0;
}
