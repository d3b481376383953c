// The device's fast conversions (backend/cuda/kernels.cu: the hardware's E4M3 conversion for the
// activations' FP8 codes, pow2_ceil by bits, a division by a power-of-two scale as a product)
// against the exact software forms they replace, and det::fexp_nb against det::fexp, on every float32
// bit pattern (the division: one divisor per pattern, drawn over the whole exponent range). GPU machine only
// (label "gpu", in cuda_backend_tests).
#include <cstdio>

#include <gtest/gtest.h>

#include "backend/cuda/kernels.cuh"

namespace dsuf {
namespace {

TEST(CudaNumerics, FastConversionsEqualTheExactOnesOnEveryFloat) {
  unsigned long long m[8] = {};
  cuda::testing::fast_conversion_mismatches(m);
  std::printf("e4m3 code: %llu of %llu differ; pow2_ceil: %llu of %llu; v / 2^e: %llu of %llu; fexp_nb: %llu of %llu\n",
              m[0], m[4], m[1], m[5], m[2], m[6], m[3], m[7]);
  // Every float with |x| ≤ 448: 2 · (bit patterns of [0, 448]) = 2 · (0x43E00000 + 1).
  EXPECT_EQ(m[4], 2ull * (0x43E00000ull + 1));
  EXPECT_EQ(m[5], 1ull << 32);
  EXPECT_EQ(m[6], 1ull << 32);
  EXPECT_EQ(m[7], 1ull << 32);
  EXPECT_EQ(m[0], 0u);
  EXPECT_EQ(m[1], 0u);
  EXPECT_EQ(m[2], 0u);
  EXPECT_EQ(m[3], 0u);
}

}  // namespace
}  // namespace dsuf
