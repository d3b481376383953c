// The BF16 linear's every launch form against the canonical sum it implements (core/detmath.h:
// chunk_lane_sum<8> of the FP32 products, as the CPU reference's bf16_linear_f32), bit for bit, on
// fresh random weights and inputs: one row and several, few outputs and the head's many (the
// stream, k_bf16_wide at 4 and 8 rows, k_bf16_linear<1/4/8>), and K a multiple of 256 (the staged
// forms) or not (K = 320, 1,000: the unstaged path; the staging layout would place a shorter last
// round past the row — session 22). GPU machine only (label "gpu", in cuda_backend_tests).
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/check.h"
#include "cuda_buf.h"
#include "backend/cuda/kernels.cuh"
#include "core/detmath.h"
#include "core/numerics.h"

namespace dsuf {
namespace {

using cuda_test::Buf;

TEST(CudaBf16Linear, EveryFormEqualsTheCanonicalSum) {
  std::mt19937 rng(20261201);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Shape {
    int64_t out, K, rows;
  };
  const Shape shapes[] = {{40, 320, 1},    {40, 320, 9},     {16384, 320, 3},  {40, 1000, 5},   {96, 1280, 1},
                          {96, 1280, 4},   {96, 1280, 9},    {16384, 1280, 1}, {16384, 1280, 4}, {16400, 1280, 11},
                          {16384, 5120, 2}, {16384, 5120, 8}, {200, 5120, 13}};
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
    int64_t bad = 0;
    for (int64_t r = 0; r < sh.rows; ++r)
      for (int64_t o = 0; o < sh.out; ++o) {
        const uint16_t* wr = W.data() + o * sh.K;
        const float* xr = x.data() + r * sh.K;
        const float want = det::chunk_lane_sum<8>(sh.K, [&](int64_t j) { return bf16_to_float(wr[j]) * xr[j]; });
        const float got = y[size_t(r * sh.out + o)];
        if (f32_bits(got) != f32_bits(want) && bad++ < 3)
          ADD_FAILURE() << "out " << sh.out << " K " << sh.K << " rows " << sh.rows << ": y[" << r << "][" << o
                        << "] = " << got << ", canonical " << want;
      }
    std::printf("bf16_linear out %lld K %lld rows %lld: %lld of %lld differ\n", static_cast<long long>(sh.out),
                static_cast<long long>(sh.K), static_cast<long long>(sh.rows), static_cast<long long>(bad),
                static_cast<long long>(sh.rows * sh.out));
    EXPECT_EQ(bad, 0);
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace dsuf
