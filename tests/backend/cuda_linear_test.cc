// The BF16 linear's every launch form against the canonical sum it implements (core/detmath.h:
// chunk_lane_sum<8> of the FP32 products, as the CPU reference's bf16_linear_f32), bit for bit, on
// fresh random weights and inputs: one row and several, few outputs and the head's many (the
// stream, k_bf16_wide at 4 and 8 rows and its persistent form, k_bf16_linear<1/4/8>), and K a
// multiple of 256 (the staged forms) or not (K = 320, 1,000: the unstaged path; the staging layout
// would place a shorter last round past the row — session 22). GPU machine only (label "gpu", in cuda_backend_tests).
// And the routed experts' several-rows-a-block form (k_fp4_imma<…, kRows>, session 23) against the
// row-at-a-time kernel on the same tiled weights and inputs, bit for bit. And the FP8 linear of one
// row and of several (k_fp8_gemv_tiles, k_fp8_gemv) against the reference's sum.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/check.h"
#include "cuda_buf.h"
#include "backend/cuda/kernels.cuh"
#include "core/detmath.h"
#include "core/fp4_dp4a.h"
#include "core/numerics.h"

namespace dsuf {
namespace {

using cuda_test::Buf;

// How many of y's rows × out values differ from the canonical sums of W [out][K] and x [rows][K]
// (the first three reported as failures).
int64_t bf16_misses(const std::vector<uint16_t>& W, const std::vector<float>& x, const std::vector<float>& y,
                    int64_t out, int64_t K, int64_t rows) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const uint16_t* wr = W.data() + o * K;
      const float* xr = x.data() + r * K;
      const float want = det::chunk_lane_sum<8>(K, [&](int64_t j) { return bf16_to_float(wr[j]) * xr[j]; });
      const float got = y[size_t(r * out + o)];
      if (f32_bits(got) != f32_bits(want) && bad++ < 3)
        ADD_FAILURE() << "out " << out << " K " << K << " rows " << rows << ": y[" << r << "][" << o << "] = " << got
                      << ", canonical " << want;
    }
  return bad;
}

TEST(CudaBf16Linear, EveryFormEqualsTheCanonicalSum) {
  std::mt19937 rng(20261201);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Shape {
    int64_t out, K, rows;
  };
  const Shape shapes[] = {{40, 320, 1},    {40, 320, 9},     {16384, 320, 3},  {40, 1000, 5},   {96, 1280, 1},
                          {96, 1280, 4},   {96, 1280, 9},    {16384, 1280, 1}, {16384, 1280, 4}, {16400, 1280, 11},
                          {16384, 5120, 2}, {16384, 5120, 8}, {200, 5120, 13},
                          // k_bf16_wide's persistent form (DSUF_BF16_WIDE_LOOP): several tiles a block,
                          // a partial last tile, two row blocks, a tile of 6 rounds (K = 1,536).
                          {16400, 5120, 5}, {40000, 5120, 3}, {16400, 1536, 3}, {40000, 5120, 9}};
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreate(&s));
  for (const Shape& sh : shapes) {
    std::vector<uint16_t> W(size_t(sh.out * sh.K));
    std::vector<float> x(size_t(sh.rows * sh.K));
    for (auto& w : W) w = bf16_from_float(0.05f * nd(rng));
    for (auto& v : x) v = nd(rng);
    Buf<uint16_t> dW(W.size());
    Buf<float> dx(x.size()), dy(size_t(sh.rows * sh.out));
    DSUF_CUDA(cudaMemcpy(dW.p, W.data(), W.size() * 2, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemset(dy.p, 0xff, size_t(sh.rows * sh.out) * 4));  // NaN where nothing is written
    cuda::bf16_linear(dW.p, sh.out, sh.K, dx.p, sh.K, sh.rows, dy.p, sh.out, false, s);
    DSUF_CUDA(cudaStreamSynchronize(s));
    std::vector<float> y(size_t(sh.rows * sh.out));
    DSUF_CUDA(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost));
    const int64_t bad = bf16_misses(W, x, y, sh.out, sh.K, sh.rows);
    std::printf("bf16_linear out %lld K %lld rows %lld: %lld of %lld differ\n", static_cast<long long>(sh.out),
                static_cast<long long>(sh.K), static_cast<long long>(sh.rows), static_cast<long long>(bad),
                static_cast<long long>(sh.rows * sh.out));
    EXPECT_EQ(bad, 0);
  }
  cudaStreamDestroy(s);
}


// The same forms with the weights' FMA limits (core/bf16_fma.h; DSUF_BF16_FMA): where the head's
// kernel takes 8 rows a block (k_bf16_wide<…, 8, …>: the head at batch ≥ 8; the other forms ignore
// the limits) each product and add of BF16 input rows (norm outputs) is one fmaf, which must give the
// canonical sum's bits; on rows that are not BF16 values, and on a row whose tiny inputs meet tiny
// weights so that a product underflows inexactly, the kernel must see it and take the plain
// products. Limits that wrongly admit that row (lo = 0) must change its output there: the check is
// what keeps the bits. Also bf16_fma_limits' device scan against the host's.
TEST(CudaBf16Linear, FmaLimitsKeepTheCanonicalSum) {
  const char* env = std::getenv("DSUF_BF16_FMA");
  const bool fma_on = !env || std::string(env) == "on";
  std::mt19937 rng(20261203);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Shape {
    int64_t out, K, rows;
    bool underflow;  // the last row the underflow row
  };
  // The stream (one row, ≥ 16,384 outputs), k_bf16_wide (4 and 8 rows), k_bf16_linear<1/4/8>.
  // A block of R rows takes the FMA only when all its rows qualify: the clean shapes and the first
  // block of 6 and 9 rows take it; the blocks with the underflow row, or with row 7 of non-BF16
  // values (from 10 rows: the first block of 8), do not.
  const Shape shapes[] = {{16384, 5120, 1, false}, {16384, 5120, 1, true}, {16384, 5120, 4, false},
                          {16384, 5120, 6, true},  {16384, 5120, 8, false}, {16384, 5120, 9, true},
                          {16400, 1280, 11, true},
                          {96, 5120, 1, false},    {96, 5120, 1, true},    {96, 1280, 4, false},
                          {96, 1280, 6, true},     {200, 5120, 9, true},   {200, 5120, 11, true},
                          {40, 1000, 3, true}};
  const float tiny_w = std::ldexp(1.0f, -75);
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreate(&s));
  for (const Shape& sh : shapes) {
    std::vector<uint16_t> W(size_t(sh.out * sh.K));
    for (auto& w : W) w = bf16_from_float(0.05f * nd(rng));
    W[0] = W[1] = bf16_from_float(tiny_w);  // output 0's first two weights: 2^-75
    // Row kinds: 0 BF16 values, 1 not BF16 values, 2 the underflow row: x₀ = 2^-74, x₁ = 1.5·2^-74
    // and zeros (output 0's products 2^-149 and 1.5·2^-149: its sum is 3·2^-149 unfused, 2·2^-149
    // fused).
    std::vector<float> x(size_t(sh.rows * sh.K));
    std::vector<int> kind(size_t(sh.rows), 0);
    if (sh.underflow && !kind.empty()) kind.back() = 2;
    if (sh.rows > 9) kind[7] = 1;
    for (int64_t r = 0; r < sh.rows; ++r)
      for (int64_t k = 0; k < sh.K; ++k) {
        const float v = nd(rng);
        x[size_t(r * sh.K + k)] = kind[size_t(r)] == 1 ? v : round_bf16(v);
      }
    if (sh.underflow) {
      float* u = x.data() + (sh.rows - 1) * sh.K;
      std::fill(u, u + sh.K, 0.0f);
      u[0] = std::ldexp(1.0f, -74), u[1] = std::ldexp(1.5f, -74);
    }
    Buf<uint16_t> dW(W.size());
    Buf<float> dx(x.size()), dy(size_t(sh.rows * sh.out));
    DSUF_CUDA(cudaMemcpy(dW.p, W.data(), W.size() * 2, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    // The device scan against the host's.
    int lo = 255, hi = 0;
    for (uint16_t b : W) {
      const int e = (b >> 7) & 0xff;
      if (b & 0x7fff) lo = std::min(lo, std::max(e, 1));
      hi = std::max(hi, e);
    }
    const Bf16FmaLimits want_l = fma_on ? bf16_fma_limits(lo, hi, hi == 255) : Bf16FmaLimits{};
    const Bf16FmaLimits l = cuda::bf16_fma_limits(dW.p, int64_t(W.size()), s);
    EXPECT_EQ(f32_bits(l.lo), f32_bits(want_l.lo));
    EXPECT_EQ(f32_bits(l.hi), f32_bits(want_l.hi));
    if (fma_on) {
      ASSERT_GT(l.lo, 0.0f);  // 2^-75 weights: the underflow row's inputs are below lo
    }
    auto run = [&](const Bf16FmaLimits& fl) {
      DSUF_CUDA(cudaMemset(dy.p, 0xff, size_t(sh.rows * sh.out) * 4));
      cuda::bf16_linear(dW.p, sh.out, sh.K, dx.p, sh.K, sh.rows, dy.p, sh.out, false, s, fl);
      DSUF_CUDA(cudaStreamSynchronize(s));
      std::vector<float> y(size_t(sh.rows * sh.out));
      DSUF_CUDA(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost));
      return y;
    };
    const std::vector<float> y = run(l);
    const int64_t bad = bf16_misses(W, x, y, sh.out, sh.K, sh.rows);
    std::printf("bf16_linear + FMA limits out %lld K %lld rows %lld%s: %lld of %lld differ\n",
                static_cast<long long>(sh.out), static_cast<long long>(sh.K), static_cast<long long>(sh.rows),
                sh.underflow ? " (last row: the underflow row)" : "", static_cast<long long>(bad),
                static_cast<long long>(sh.rows * sh.out));
    EXPECT_EQ(bad, 0);
    if (!sh.underflow) continue;
    const float unfused = y[size_t((sh.rows - 1) * sh.out)];
    EXPECT_EQ(unfused, std::ldexp(3.0f, -149));
    // Limits that admit the underflow row: its output 0 becomes the fused 2·2^-149 where the launch
    // fuses (k_bf16_wide at 8 rows a block: ≥ 16,384 outputs, ≥ 8 rows, K a multiple of 256).
    const std::vector<float> y_wrong = run({0.0f, std::numeric_limits<float>::infinity()});
    const float fused = y_wrong[size_t((sh.rows - 1) * sh.out)];
    const bool fuses = fma_on && sh.K % 256 == 0 && sh.out >= 16384 && sh.rows >= 8;
    EXPECT_EQ(fused, std::ldexp(fuses ? 2.0f : 3.0f, -149)) << "out " << sh.out << " rows " << sh.rows;
    std::printf("  the underflow row's output 0: %g with the limits, %g with limits that admit it\n", unfused,
                fused);
  }
  cudaStreamDestroy(s);
}


// Fresh random E4M3 weights (no NaN codes) and E8M0 scale codes near 1, one code a 32-row block and
// K-block.
void random_fp8(std::mt19937& rng, int64_t out, int64_t K, std::vector<uint8_t>& W, std::vector<uint8_t>& Ws) {
  std::uniform_int_distribution<int> byte(0, 255), code(120, 130);
  W.resize(size_t(out * K)), Ws.resize(size_t((out + 31) / 32 * (K / 32)));
  for (auto& w : W) {
    w = uint8_t(byte(rng));
    if ((w & 0x7f) == 0x7f) w ^= 1;
  }
  for (auto& c : Ws) c = uint8_t(code(rng));
}
// A random input row with a few outliers.
std::vector<float> random_row(std::mt19937& rng, int64_t K) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<float> x(static_cast<size_t>(K));
  for (auto& v : x) v = nd(rng) * (1.0f + 30.0f * float(byte(rng) < 8));
  return x;
}
// The row as BF16 values (an attention output, wo_a's input: LinearInput::bf16), with some tiny ones
// (BF16 subnormals and values near 2^-126), whose products with small E4M3 values are FP32 subnormals.
std::vector<float> bf16_row(std::mt19937& rng, int64_t K) {
  std::vector<float> x = random_row(rng, K);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& v : x) {
    const int b = byte(rng);
    if (b < 6) v *= b < 3 ? 1e-39f : 1e-37f;
    v = round_bf16(v);
  }
  return x;
}
// The reference's view of an input row of K: per-32 E4M3 values and scales (quantize), or the values
// as they are with scales 1.
void reference_input(const float* x, int64_t K, bool quantize, std::vector<float>& v, std::vector<float>& sa) {
  v.assign(x, x + K), sa.assign(size_t(K / 32), 1.0f);
  if (!quantize) return;
  for (int64_t b = 0; b < K / 32; ++b) {
    uint8_t q[32];
    sa[size_t(b)] = act_quant_fp8_block(x + 32 * b, 32, q);
    for (int k = 0; k < 32; ++k) v[size_t(32 * b + k)] = e4m3_to_float(q[k]);
  }
}
// The reference's one-row FP8 linear (the CPU backend's fp8_linear): per K-block the sequential FP32
// sum of the products, times s_act·s_w, lane_sum over the K-blocks, then BF16 when r.
std::vector<float> reference_fp8(const uint8_t* W, const uint8_t* Ws, int64_t out, int64_t K,
                                 const std::vector<float>& v, const std::vector<float>& sa, bool r) {
  const int64_t nb = K / 32;
  std::vector<float> want(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* wr = W + o * K;
    const float acc = det::lane_sum(nb, [&](int64_t kb) {
      float part = 0.0f;
      for (int k = 0; k < 32; ++k) part += v[size_t(kb * 32 + k)] * e4m3_to_float(wr[kb * 32 + k]);
      return part * (sa[size_t(kb)] * e8m0_to_float(Ws[size_t((o / 32) * nb + kb)]));
    });
    want[size_t(o)] = r ? round_bf16(acc) : acc;
  }
  return want;
}
// Outputs whose bits differ from want (the first three reported).
int64_t count_differ(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  int64_t bad = 0;
  for (size_t o = 0; o < want.size(); ++o)
    if (f32_bits(got[o]) != f32_bits(want[o]) && bad++ < 3)
      ADD_FAILURE() << what << ": [" << o << "] = " << got[o] << ", reference " << want[o];
  std::printf("%s: %lld of %zu differ\n", what.c_str(), static_cast<long long>(bad), want.size());
  return bad;
}
template <typename T>
std::vector<T> to_host(const T* p, size_t n) {
  std::vector<T> h(n);
  DSUF_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// The one-row FP8 linear against the reference's sum (reference_fp8), bit for bit, on fresh random
// E4M3 weights, scale codes and inputs, quantized (wq_b) and not, in the shapes of wq_b (K = 1,280; a
// partial last tile at 4,102 outputs), the shared expert's w2 (2,304), wo_b (8,192), Engram's wkv
// (6,144), K = 1,024 and 1,536 (no remainder, 16 K-blocks of it), 5,120 and one that k_fp8_gemv_tiles
// cannot take (K = 1,120: nb mod 4 ≠ 0). Which kernel takes which depends on DSUF_FP8_TILES (all,
// one, mid, off): the device runs check them all. Each also with fp8_linear's tile_sm = 1 and 3 (the
// tile kernel's grid capped: other warps take the tiles).
TEST(CudaFp8Linear, OneRowEqualsTheReferenceSum) {
  std::mt19937 rng(20261202);
  struct Shape {
    int64_t out, K;
  };
  const Shape shapes[] = {{32768, 1280}, {4102, 1280}, {5120, 2304}, {5120, 8192}, {3000, 6144},
                          {1000, 1024},  {5000, 1536}, {2304, 5120}, {600, 1120}};
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreate(&s));
  for (const Shape& sh : shapes)
    for (const bool quantize : {true, false})
      for (const bool r : {true, false}) {
        const int64_t nb = sh.K / 32;
        std::vector<uint8_t> W, Ws;
        random_fp8(rng, sh.out, sh.K, W, Ws);
        const std::vector<float> x = random_row(rng, sh.K);
        std::vector<float> v, sa;
        reference_input(x.data(), sh.K, quantize, v, sa);
        Buf<uint8_t> dW(W.size()), dWs(Ws.size());
        Buf<float> dx{x.size()}, dxq{size_t(cuda::interleaved_k(sh.K))}, dxs{size_t(nb)}, dy{size_t(sh.out)};
        DSUF_CUDA(cudaMemcpy(dW.p, W.data(), W.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dWs.p, Ws.data(), Ws.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        const std::vector<float> want = reference_fp8(W.data(), Ws.data(), sh.out, sh.K, v, sa, r);
        for (const int tile_sm : {0, 1, 3}) {
          DSUF_CUDA(cudaMemset(dy.p, 0xff, size_t(sh.out) * 4));  // NaN where nothing is written
          const cuda::LinearInput in = cuda::linear_input(dx.p, sh.K, 1, sh.K, quantize, dxq.p, dxs.p, s);
          cuda::fp8_linear(dW.p, dWs.p, sh.out, sh.K, in, 1, dy.p, sh.out, r, s, {}, tile_sm);
          DSUF_CUDA(cudaStreamSynchronize(s));
          const std::string what = "fp8_linear out " + std::to_string(sh.out) + " K " + std::to_string(sh.K) +
                                   " quantized " + std::to_string(quantize) + " bf16 " + std::to_string(r) +
                                   " tile_sm " + std::to_string(tile_sm);
          EXPECT_EQ(count_differ(to_host(dy.p, size_t(sh.out)), want, what), 0);
        }
      }
  cudaStreamDestroy(s);
}

// The grouped one-row FP8 linear (wo_a: 8 groups of 1,024 outputs over K = 4,096, and two smaller
// ones, one with a remainder) with and without its sink (wo_b's input laid out by k_fp8_gemv's sink
// blocks), and pairs (the shared expert's w1/w3; wq_a+wkv; odd sizes), against the reference's sums,
// bit for bit; the sink's layout against linear_input of the same outputs (floats and scales). The
// grouped ones also with BF16-valued inputs marked LinearInput::bf16 (wo_a's preload kernel, with the
// sink, takes the fmaf path then).
TEST(CudaFp8Linear, GroupsPairsAndSinkEqualTheReferenceSum) {
  std::mt19937 rng(20261203);
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreate(&s));
  struct Grouped {
    int groups;
    int64_t out, K;
  };
  // Inputs: 0 as they come, 1 quantized, 2 BF16 values marked as such (the fmaf path, fp8_bf16_fma).
  for (const Grouped& sh : {Grouped{8, 1024, 4096}, Grouped{4, 256, 1280}, Grouped{2, 512, 1536}})
    for (const int mode : {0, 1, 2})
      for (const bool r : {true, false}) {
        const bool quantize = mode == 1;
        const int G = sh.groups;
        const int64_t nb = sh.K / 32, N = G * sh.out, kp = cuda::interleaved_k(sh.K);
        std::vector<uint8_t> W, Ws;
        random_fp8(rng, N, sh.K, W, Ws);
        const std::vector<float> x = mode == 2 ? bf16_row(rng, G * sh.K) : random_row(rng, G * sh.K);
        std::vector<float> want;
        for (int g = 0; g < G; ++g) {
          std::vector<float> v, sa;
          reference_input(x.data() + g * sh.K, sh.K, quantize, v, sa);
          const auto wg = reference_fp8(W.data() + g * sh.out * sh.K, Ws.data() + g * (sh.out / 32) * nb, sh.out,
                                        sh.K, v, sa, r);
          want.insert(want.end(), wg.begin(), wg.end());
        }
        Buf<uint8_t> dW(W.size()), dWs(Ws.size());
        Buf<float> dx{x.size()}, dxq{size_t(G * kp)}, dxs{size_t(G * nb)}, dy{size_t(N)};
        Buf<float> zq{size_t(cuda::interleaved_k(N))}, zs{size_t(N / 32)}, lq{size_t(cuda::interleaved_k(N))},
            ls{size_t(N / 32)};
        DSUF_CUDA(cudaMemcpy(dW.p, W.data(), W.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dWs.p, Ws.data(), Ws.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        cuda::LinearInput in = cuda::linear_input(dx.p, G * sh.K, 1, sh.K, quantize, dxq.p, dxs.p, s, G);
        in.bf16 = mode == 2;
        for (const int form : {0, 1}) {  // without the sink, with it
          DSUF_CUDA(cudaMemsetAsync(dy.p, 0xff, size_t(N) * 4, s));
          DSUF_CUDA(cudaMemsetAsync(zq.p, 0xff, zq.n * 4, s));
          DSUF_CUDA(cudaMemsetAsync(zs.p, 0xff, zs.n * 4, s));
          const cuda::InputSink sink{.xq = form ? zq.p : nullptr, .xs = zs.p, .quantize = true};
          cuda::fp8_linear_groups(dW.p, dWs.p, G, sh.out, sh.K, in, 1, dy.p, N, r, s, sink);
          DSUF_CUDA(cudaStreamSynchronize(s));
          const std::string what = "fp8_linear_groups " + std::to_string(G) + " × " + std::to_string(sh.out) +
                                   " K " + std::to_string(sh.K) + " input " + std::to_string(mode) + " bf16 " +
                                   std::to_string(r) + " form " + std::to_string(form);
          EXPECT_EQ(count_differ(to_host(dy.p, size_t(N)), want, what), 0);
          if (!form) continue;
          cuda::linear_input(dy.p, N, 1, N, true, lq.p, ls.p, s);
          DSUF_CUDA(cudaStreamSynchronize(s));
          EXPECT_EQ(count_differ(to_host(zq.p, zq.n), to_host(lq.p, lq.n), what + " sink values"), 0);
          EXPECT_EQ(count_differ(to_host(zs.p, zs.n), to_host(ls.p, ls.n), what + " sink scales"), 0);
        }
      }
  struct Paired {
    int64_t out1, out2, K;
  };
  for (const Paired& sh : {Paired{2304, 2304, 5120}, Paired{1280, 512, 5120}, Paired{1000, 2600, 1280}})
    for (const bool quantize : {true, false})
      for (const bool r : {true, false}) {
        std::vector<uint8_t> W1, Ws1, W2, Ws2;
        random_fp8(rng, sh.out1, sh.K, W1, Ws1);
        random_fp8(rng, sh.out2, sh.K, W2, Ws2);
        const std::vector<float> x = random_row(rng, sh.K);
        std::vector<float> v, sa;
        reference_input(x.data(), sh.K, quantize, v, sa);
        Buf<uint8_t> dW1(W1.size()), dWs1(Ws1.size()), dW2(W2.size()), dWs2(Ws2.size());
        Buf<float> dx{x.size()}, dxq{size_t(cuda::interleaved_k(sh.K))}, dxs{size_t(sh.K / 32)}, dy1{size_t(sh.out1)},
            dy2{size_t(sh.out2)};
        DSUF_CUDA(cudaMemcpy(dW1.p, W1.data(), W1.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dWs1.p, Ws1.data(), Ws1.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dW2.p, W2.data(), W2.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dWs2.p, Ws2.data(), Ws2.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemset(dy1.p, 0xff, size_t(sh.out1) * 4));
        DSUF_CUDA(cudaMemset(dy2.p, 0xff, size_t(sh.out2) * 4));
        const cuda::LinearInput in = cuda::linear_input(dx.p, sh.K, 1, sh.K, quantize, dxq.p, dxs.p, s);
        cuda::fp8_linear(dW1.p, dWs1.p, sh.out1, sh.K, in, 1, dy1.p, sh.out1, r, s,
                         {.W = dW2.p, .Ws = dWs2.p, .out = sh.out2, .y = dy2.p, .y_stride = sh.out2});
        DSUF_CUDA(cudaStreamSynchronize(s));
        const std::string what = "fp8_linear pair " + std::to_string(sh.out1) + " + " + std::to_string(sh.out2) +
                                 " K " + std::to_string(sh.K) + " quantized " + std::to_string(quantize) + " bf16 " +
                                 std::to_string(r);
        EXPECT_EQ(count_differ(to_host(dy1.p, size_t(sh.out1)), reference_fp8(W1.data(), Ws1.data(), sh.out1, sh.K,
                                                                              v, sa, r), what + " first"), 0);
        EXPECT_EQ(count_differ(to_host(dy2.p, size_t(sh.out2)), reference_fp8(W2.data(), Ws2.data(), sh.out2, sh.K,
                                                                              v, sa, r), what + " second"), 0);
      }
  cudaStreamDestroy(s);
}

// The FP8 linear of several rows (batches 2–63: k_fp8_gemv_tiles<…, R> under DSUF_FP8_TILES_ROWS's
// default, k_fp8_gemv's R-row forms with it off; the device runs check both) against the reference's
// sum of each row, bit for bit: plain (wq_b, the shared expert's w2, wo_b's K = 8,192, whose 4 staged
// rows leave room for a 2-slot ring only; K = 1,120, which no tile form takes), grouped (wo_a's 8 ×
// 1,024 over K = 4,096; one with a remainder) and pairs (the shared w1/w3; wq_a+wkv; odd sizes), at
// 2 to 13 rows (full and partial row groups of 4), quantized inputs and not, BF16 rounding and not,
// and unquantized inputs that are BF16 values marked LinearInput::bf16 (the fmaf path: wo_a's).
TEST(CudaFp8Linear, SeveralRowsEqualTheReferenceSum) {
  std::mt19937 rng(20261204);
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreate(&s));
  struct Shape {
    int groups;
    int64_t out, out2, K;  // out2 > 0: a pair (groups 1)
    std::vector<int> rows;
  };
  const Shape shapes[] = {{1, 4102, 0, 1280, {2, 3, 4, 5, 13}}, {1, 5120, 0, 2304, {4}},     {1, 5120, 0, 8192, {4, 6}},
                          {1, 600, 0, 1120, {4}},                {8, 1024, 0, 4096, {3, 4}}, {4, 256, 0, 1280, {5}},
                          {1, 2304, 2304, 5120, {4}},            {1, 1280, 512, 5120, {2, 4}}, {1, 1000, 2600, 1280, {3}}};
  // Inputs: 0 as they come, 1 quantized, 2 BF16 values marked as such (the fmaf path, fp8_bf16_fma).
  for (const Shape& sh : shapes)
    for (const int rows : sh.rows)
      for (const int mode : {1, 0, 2}) {
        const bool quantize = mode == 1;
        const int G = sh.groups;
        const int64_t nb = sh.K / 32, N = G * sh.out, kp = cuda::interleaved_k(sh.K);
        std::vector<uint8_t> W, Ws, W2, Ws2;
        random_fp8(rng, N, sh.K, W, Ws);
        if (sh.out2) random_fp8(rng, sh.out2, sh.K, W2, Ws2);
        std::vector<float> x;
        for (int rr = 0; rr < rows; ++rr) {
          const std::vector<float> row = mode == 2 ? bf16_row(rng, G * sh.K) : random_row(rng, G * sh.K);
          x.insert(x.end(), row.begin(), row.end());
        }
        Buf<uint8_t> dW(W.size()), dWs(Ws.size()), dW2(std::max<size_t>(1, W2.size())), dWs2(std::max<size_t>(1, Ws2.size()));
        Buf<float> dx{x.size()}, dxq{size_t(rows * G * kp)}, dxs{size_t(rows * G * nb)}, dy{size_t(rows * N)},
            dy2{size_t(std::max<int64_t>(1, rows * sh.out2))};
        DSUF_CUDA(cudaMemcpy(dW.p, W.data(), W.size(), cudaMemcpyHostToDevice));
        DSUF_CUDA(cudaMemcpy(dWs.p, Ws.data(), Ws.size(), cudaMemcpyHostToDevice));
        if (sh.out2) {
          DSUF_CUDA(cudaMemcpy(dW2.p, W2.data(), W2.size(), cudaMemcpyHostToDevice));
          DSUF_CUDA(cudaMemcpy(dWs2.p, Ws2.data(), Ws2.size(), cudaMemcpyHostToDevice));
        }
        DSUF_CUDA(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        cuda::LinearInput in = cuda::linear_input(dx.p, G * sh.K, rows, sh.K, quantize, dxq.p, dxs.p, s, G);
        in.bf16 = mode == 2;
        for (const bool r : {true, false}) {
          DSUF_CUDA(cudaMemsetAsync(dy.p, 0xff, dy.n * 4, s));  // NaN where nothing is written
          DSUF_CUDA(cudaMemsetAsync(dy2.p, 0xff, dy2.n * 4, s));
          if (sh.out2)
            cuda::fp8_linear(dW.p, dWs.p, sh.out, sh.K, in, rows, dy.p, sh.out, r, s,
                             {.W = dW2.p, .Ws = dWs2.p, .out = sh.out2, .y = dy2.p, .y_stride = sh.out2});
          else
            cuda::fp8_linear_groups(dW.p, dWs.p, G, sh.out, sh.K, in, rows, dy.p, N, r, s, {});
          DSUF_CUDA(cudaStreamSynchronize(s));
          const std::vector<float> got = to_host(dy.p, dy.n), got2 = to_host(dy2.p, dy2.n);
          std::vector<float> want, want2;
          for (int rr = 0; rr < rows; ++rr)
            for (int g = 0; g < G; ++g) {
              std::vector<float> v, sa;
              reference_input(x.data() + (int64_t(rr) * G + g) * sh.K, sh.K, quantize, v, sa);
              const auto wg = reference_fp8(W.data() + g * sh.out * sh.K, Ws.data() + g * (sh.out / 32) * nb, sh.out,
                                            sh.K, v, sa, r);
              want.insert(want.end(), wg.begin(), wg.end());
              if (!sh.out2) continue;
              const auto w2 = reference_fp8(W2.data(), Ws2.data(), sh.out2, sh.K, v, sa, r);
              want2.insert(want2.end(), w2.begin(), w2.end());
            }
          const std::string what = "fp8_linear " + std::to_string(G) + " × " + std::to_string(sh.out) +
                                   (sh.out2 ? " + " + std::to_string(sh.out2) : std::string()) + " K " +
                                   std::to_string(sh.K) + " rows " + std::to_string(rows) + " input " +
                                   std::to_string(mode) + " bf16 " + std::to_string(r);
          EXPECT_EQ(count_differ(got, want, what), 0);
          if (sh.out2) {
            EXPECT_EQ(count_differ(got2, want2, what + " second"), 0);
          }
        }
      }
  cudaStreamDestroy(s);
}

// The routed experts through pairs of rows of one expert a block (k_fp4_imma<…, kRows = 2>),
// kRowGroup's groups (a row at a time in expert order) and no groups (a row at a time by ids): every
// output the same bits, w1/w3 as a pair, w2-like shapes, the fused SwiGLU (its h and the laid-out
// input of w2: floats, scales and byte planes), and K = 8,192, where the rows' staging does not fit
// and the launch falls back to a row at a time. Few experts, so groups of 1 to 10 rows (split in 2s).
TEST(CudaFp4Experts, SeveralRowsABlockEqualRowAtATime) {
  std::mt19937 rng(20261201);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> byte(0, 255), code(118, 132);
  struct Shape {
    int64_t out, K;
    int tokens, topk, experts;
    bool glu;
  };
  const Shape shapes[] = {{384, 512, 12, 3, 5, false}, {512, 384, 9, 4, 3, false}, {384, 512, 10, 3, 4, true},
                          {2304, 5120, 8, 3, 4, true},  {64, 8192, 5, 3, 2, false}};
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreate(&s));
  for (const Shape& sh : shapes) {
    const int64_t rows = int64_t(sh.tokens) * sh.topk, nb = sh.K / 32, wbytes = sh.out * sh.K / 2;
    ASSERT_TRUE(det::fp4_tileable(sh.out, sh.K));
    // Two matrices an expert (w1 and w3), tiled as the backend lays them out at load.
    const int E = sh.experts;
    Buf<uint8_t> dW(size_t(2 * E * wbytes)), dS(size_t(2 * E * sh.out * nb)), scratch(static_cast<size_t>(wbytes));
    {
      std::vector<uint8_t> w(size_t(2 * E * wbytes)), sc(size_t(2 * E * sh.out * nb));
      for (auto& b : w) b = uint8_t(byte(rng));
      for (auto& c : sc) c = uint8_t(code(rng));
      DSUF_CUDA(cudaMemcpy(dW.p, w.data(), w.size(), cudaMemcpyHostToDevice));
      DSUF_CUDA(cudaMemcpy(dS.p, sc.data(), sc.size(), cudaMemcpyHostToDevice));
    }
    for (int m = 0; m < 2 * E; ++m) cuda::fp4_tile_in_place(dW.p + m * wbytes, sh.out, sh.K, scratch.p, s);
    std::vector<const uint8_t*> ptr(size_t(4 * E));
    for (int e = 0; e < E; ++e) {
      ptr[size_t(e)] = dW.p + e * wbytes, ptr[size_t(E + e)] = dW.p + (E + e) * wbytes;
      ptr[size_t(2 * E + e)] = dS.p + e * sh.out * nb, ptr[size_t(3 * E + e)] = dS.p + (E + e) * sh.out * nb;
    }
    Buf<const uint8_t*> dptr(ptr.size());
    DSUF_CUDA(cudaMemcpy(dptr.p, ptr.data(), ptr.size() * sizeof(void*), cudaMemcpyHostToDevice));
    const uint8_t* const* W1 = dptr.p;
    const uint8_t* const* W3 = dptr.p + E;
    const uint8_t* const* S1 = dptr.p + 2 * E;
    const uint8_t* const* S3 = dptr.p + 3 * E;
    // The inputs: one row a token, quantized with byte planes (swiglu's sink lays them out).
    const int64_t kp = cuda::interleaved_k(sh.K);
    Buf<float> h1(size_t(sh.tokens * sh.K)), h3(size_t(sh.tokens * sh.K)), xq(size_t(sh.tokens * kp)),
        xs(size_t(sh.tokens * nb));
    Buf<uint8_t> xp(size_t(sh.tokens * cuda::interleaved_planes(sh.K)));
    {
      std::vector<float> a(size_t(sh.tokens * sh.K)), b(a.size());
      for (auto& v : a) v = nd(rng);
      for (auto& v : b) v = nd(rng);
      DSUF_CUDA(cudaMemcpy(h1.p, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
      DSUF_CUDA(cudaMemcpy(h3.p, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    }
    const cuda::InputSink in_sink{xq.p, xs.p, true, xp.p};
    cuda::swiglu(h1.p, h3.p, sh.tokens, sh.K, nullptr, 0.0f, false, true, s, in_sink);
    const cuda::LinearInput in = cuda::sink_input(in_sink, sh.K);
    // Routed rows: random experts (repeats within a token too), random routing weights.
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    std::vector<float> rw(static_cast<size_t>(rows));
    std::uniform_int_distribution<int> pick(0, E - 1);
    for (auto& i : ids) i = pick(rng);
    for (auto& v : rw) v = 0.5f + 0.25f * nd(rng);
    Buf<int32_t> dids(static_cast<size_t>(rows)), order(static_cast<size_t>(rows)), groups(size_t(3 * rows)), ngroups(1);
    Buf<float> drw(static_cast<size_t>(rows));
    DSUF_CUDA(cudaMemcpy(dids.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(drw.p, rw.data(), rw.size() * 4, cudaMemcpyHostToDevice));
    // One run: y1, y3 (the pair's outputs; with glu h in y1 and w2's laid-out input in the sink's).
    const int64_t F = sh.out, fkp = cuda::interleaved_k(F), fnb = F / 32, fpl = cuda::interleaved_planes(F);
    struct Out {
      std::vector<float> y1, y3, oq, os;
      std::vector<uint8_t> op;
    };
    auto run = [&](int size) {
      cuda::RowGroups g{order.p, groups.p, ngroups.p};
      if (size > 0) cuda::group_rows(dids.p, rows, E, g, s, size);
      Buf<float> y1(size_t(rows * F)), y3(size_t(rows * F)), oq(size_t(rows * fkp)), os(size_t(rows * fnb));
      Buf<uint8_t> op(size_t(rows * fpl));
      DSUF_CUDA(cudaMemsetAsync(y1.p, 0xff, size_t(rows * F) * 4, s));  // NaN where nothing is written
      DSUF_CUDA(cudaMemsetAsync(y3.p, 0xff, size_t(rows * F) * 4, s));
      DSUF_CUDA(cudaMemsetAsync(oq.p, 0xff, size_t(rows * fkp) * 4, s));
      DSUF_CUDA(cudaMemsetAsync(os.p, 0xff, size_t(rows * fnb) * 4, s));
      DSUF_CUDA(cudaMemsetAsync(op.p, 0xa5, size_t(rows * fpl), s));
      const cuda::RowGroups* gp = size > 0 ? &g : nullptr;
      if (sh.glu) {
        cuda::fp4_swiglu_grouped(W1, S1, W3, S3, dids.p, F, sh.K, in, sh.topk, rows, y1.p, y3.p, true, s, gp, true,
                                 drw.p, 0.0f, false, cuda::InputSink{oq.p, os.p, true, op.p});
      } else {
        cuda::fp4_linear_grouped(W1, S1, dids.p, F, sh.K, in, sh.topk, rows, y1.p, true, s,
                                 {.W = W3, .Ws = S3, .y = y3.p}, gp, true);
      }
      DSUF_CUDA(cudaStreamSynchronize(s));
      Out o{std::vector<float>(size_t(rows * F)), std::vector<float>(size_t(rows * F)), {}, {}, {}};
      DSUF_CUDA(cudaMemcpy(o.y1.data(), y1.p, o.y1.size() * 4, cudaMemcpyDeviceToHost));
      DSUF_CUDA(cudaMemcpy(o.y3.data(), y3.p, o.y3.size() * 4, cudaMemcpyDeviceToHost));
      if (sh.glu) {
        o.oq.resize(size_t(rows * fkp)), o.os.resize(size_t(rows * fnb)), o.op.resize(size_t(rows * fpl));
        DSUF_CUDA(cudaMemcpy(o.oq.data(), oq.p, o.oq.size() * 4, cudaMemcpyDeviceToHost));
        DSUF_CUDA(cudaMemcpy(o.os.data(), os.p, o.os.size() * 4, cudaMemcpyDeviceToHost));
        DSUF_CUDA(cudaMemcpy(o.op.data(), op.p, o.op.size(), cudaMemcpyDeviceToHost));
      }
      return o;
    };
    const Out base = run(0);
    int64_t nan = 0;
    for (float v : base.y1) nan += v != v;
    EXPECT_EQ(nan, 0) << "out " << sh.out << " K " << sh.K << ": the row-at-a-time run left outputs unwritten";
    for (int size : {2, cuda::kRowGroup}) {
      const Out o = run(size);
      auto same = [](const auto& a, const auto& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
      };
      int64_t bad = 0;
      for (size_t i = 0; i < o.y1.size(); ++i) bad += f32_bits(o.y1[i]) != f32_bits(base.y1[i]);
      std::printf("fp4 experts out %lld K %lld rows %lld experts %d%s, groups of %d: %lld of %lld differ\n",
                  static_cast<long long>(sh.out), static_cast<long long>(sh.K), static_cast<long long>(rows), E,
                  sh.glu ? " (fused SwiGLU)" : "", size, static_cast<long long>(bad),
                  static_cast<long long>(o.y1.size()));
      EXPECT_EQ(bad, 0) << "out " << sh.out << " K " << sh.K << ", groups of " << size;
      if (!sh.glu) {
        EXPECT_TRUE(same(o.y3, base.y3)) << "w3's outputs, groups of " << size;
      } else {
        EXPECT_TRUE(same(o.oq, base.oq)) << "w2's laid-out input, groups of " << size;
        EXPECT_TRUE(same(o.os, base.os)) << "w2's input scales, groups of " << size;
        EXPECT_TRUE(same(o.op, base.op)) << "w2's input planes, groups of " << size;
      }
    }
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace dsuf
