// Which pipe bounds the exact FP8 decode (docs/perf.md, session 36). bench/smem_probe found the one-row
// FP8 arithmetic at most ~12 weights a cycle an SM (~1 warp instruction a cycle an SM) even with its
// weights in shared memory. The decode there is cvt.rn.f16x2.e4m3x2 (F2FP, half an instruction a
// weight) + F16 → F32 (HADD2.F32, one a weight) + one FFMA a weight. If either conversion runs on a
// narrow pipe, that, not latency, bounds every FP8 linear. This probe times each instruction alone:
// every thread runs 8 independent dependency chains of one instruction (so latency is hidden at full
// occupancy), and the result is warp instructions a cycle an SM (clock64 on each block's first
// thread, the slowest block counted). Then the same for whole decodes of 4 E4M3 bytes with their 4
// FMAs: the cvt path, and a bit placement of a re-encoded byte (one shift a word, then a PRMT and an
// AND a weight: the F32 whose bits are the E4M3 value times 2^-120).
//
//   issue_probe [--iters 4096]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "issue_probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// (A chain of shifts is not measurable this way: ptxas folds consecutive shifts into one.)
enum Op { kFfma, kF2fp, kHadd2F32, kPrmt, kLop3, kImad, kDecCvt, kDecPlace, kOps };
const char* const kNames[kOps] = {"FFMA", "F2FP e4m3x2 -> f16x2", "HADD2.F32 (f16 -> f32)", "PRMT", "LOP3", "IMAD",
                                  "decode cvt + 4 FFMA (a word)", "decode place + 4 FFMA (a word)"};
// The word decodes (SASS: 2 F2FP + 4 HADD2.F32 + 4 FFMA + the XOR that changes the word, and
// 1 SHL + 4 PRMT + 4 LOP3 + 4 FFMA + the XOR) are reported as weights a cycle an SM: 4 a step.
const int kWeights[kOps] = {0, 0, 0, 0, 0, 0, 4, 4};

template <int OP>
__device__ __forceinline__ void step(uint32_t& x, float& acc, uint32_t k) {
  if constexpr (OP == kFfma) {
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(acc) : "f"(__uint_as_float(k)), "f"(1.0f));
  } else if constexpr (OP == kF2fp) {
    asm volatile("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %0;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "+r"(x));
  } else if constexpr (OP == kHadd2F32) {
    asm volatile("{\n .reg .b16 l, h;\n .reg .f32 f;\n mov.b32 {l, h}, %0;\n cvt.f32.f16 f, l;\n mov.b32 %0, f;\n}"
                 : "+r"(x));
  } else if constexpr (OP == kPrmt) {
    asm volatile("prmt.b32 %0, %0, %1, 0x2107;" : "+r"(x) : "r"(k));
  } else if constexpr (OP == kLop3) {
    asm volatile("lop3.b32 %0, %0, %1, 0x87F00000, 0x96;" : "+r"(x) : "r"(k));
  } else if constexpr (OP == kImad) {
    asm volatile("mad.lo.u32 %0, %0, %1, 7;" : "+r"(x) : "r"(k));
  } else if constexpr (OP == kDecCvt) {
    // x is the word of 4 E4M3 codes; the 4 FMAs chain through acc; x changes by an XOR a step so
    // that nothing is hoisted.
    uint32_t lo, hi;
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 q = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    acc = __fmaf_rn(p.x, 1.0f, acc);
    acc = __fmaf_rn(p.y, 1.0f, acc);
    acc = __fmaf_rn(q.x, 1.0f, acc);
    acc = __fmaf_rn(q.y, 1.0f, acc);
    x ^= k;
  } else if constexpr (OP == kDecPlace) {
    const uint32_t u = x << 1;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc = __fmaf_rn(__uint_as_float(__byte_perm(x, u, (e << 12) | ((4 + e) << 8)) & 0x87F00000u), 1.0f, acc);
    x ^= k;
  }
}

template <int OP>
__global__ void k_tput(int iters, uint32_t seed, unsigned long long* cycles, uint32_t* sink) {
  constexpr int kChains = 8;
  uint32_t x[kChains];
  float acc[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = seed * (threadIdx.x + 1) + c * 0x01010101u, acc[c] = float(c);
  const uint32_t k = seed ^ 0x3c3c3c3cu;
  __syncthreads();
  const unsigned long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) step<OP>(x[c], acc[c], k);
  }
  __syncthreads();
  const unsigned long long t1 = clock64();
  uint32_t s = 0;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s ^= x[c] ^ __float_as_uint(acc[c]);
  if (s == 0x12345678u) sink[threadIdx.x] = s;  // keeps the chains live
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int OP>
void run(int iters, int sms, int threads, int blocks_per_sm, unsigned long long* dc, uint32_t* ds) {
  const int blocks = sms * blocks_per_sm;
  std::vector<double> rates;
  for (int rep = 0; rep < 5; ++rep) {
    k_tput<OP><<<blocks, threads>>>(iters, 0x9e3779b9u + rep, dc, ds);
    check(cudaGetLastError(), "launch");
    check(cudaDeviceSynchronize(), "run");
    std::vector<unsigned long long> c(static_cast<size_t>(blocks));
    check(cudaMemcpy(c.data(), dc, c.size() * 8, cudaMemcpyDeviceToHost), "d2h");
    const double slowest = double(*std::max_element(c.begin(), c.end()));
    // Warp instructions of one SM's blocks over the slowest block's cycles.
    const double warp_steps = double(blocks_per_sm) * (threads / 32) * double(iters) * 8;
    rates.push_back(warp_steps / slowest);
  }
  std::sort(rates.begin(), rates.end());
  const double r = rates[rates.size() / 2];
  if (kWeights[OP])
    std::printf("%-34s %5.1f weights a cycle an SM\n", kNames[OP], r * 32 * kWeights[OP]);
  else
    std::printf("%-34s %5.2f warp instructions a cycle an SM\n", kNames[OP], r);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: issue_probe [--iters 4096]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const int sms = prop.multiProcessorCount;
  unsigned long long* dc = nullptr;
  uint32_t* ds = nullptr;
  check(cudaMalloc(&dc, size_t(sms) * 4 * 8), "malloc");
  check(cudaMalloc(&ds, 1024 * 4), "malloc");
  std::printf("device: %s, %d SMs; 2 blocks of 512 threads an SM, 8 chains a thread, median of 5\n", prop.name, sms);
  run<kFfma>(iters, sms, 512, 2, dc, ds);
  run<kF2fp>(iters, sms, 512, 2, dc, ds);
  run<kHadd2F32>(iters, sms, 512, 2, dc, ds);
  run<kPrmt>(iters, sms, 512, 2, dc, ds);
  run<kLop3>(iters, sms, 512, 2, dc, ds);
  run<kImad>(iters, sms, 512, 2, dc, ds);
  run<kDecCvt>(iters / 4, sms, 512, 2, dc, ds);
  run<kDecPlace>(iters / 4, sms, 512, 2, dc, ds);
  return 0;
}
