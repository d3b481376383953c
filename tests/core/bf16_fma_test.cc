// core/bf16_fma.h: the limits under which a BF16 linear may add each product by one FMA. Checked
// against the exact products: for weights of every exponent (and a few mantissas) and every BF16
// input, an input the limits admit gives a product that is exact and finite in FP32 — so fmaf(x, w,
// acc) is acc + x·w with the reference's two roundings — and an input they reject is one the
// formula in the header names (so the limits are neither loose nor arbitrary). Then matrices of
// weights of mixed exponents, and the case that shows the check matters.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/bf16_fma.h"
#include "core/numerics.h"

namespace dsuf {
namespace {

int field(uint16_t b) { return (b >> 7) & 0xff; }
float bf(uint16_t b) { return bf16_to_float(b); }

// The product in FP32 is the real product (double holds 16-bit × 16-bit significands exactly).
bool exact_product(float x, float w) {
  const float p = x * w;
  return std::isfinite(p) && static_cast<double>(p) == static_cast<double>(x) * static_cast<double>(w);
}

// A matrix's limits as the device scan computes them (kernels.cu, k_bf16_exponents).
Bf16FmaLimits limits_of(const std::vector<uint16_t>& W) {
  int lo = 255, hi = 0;
  for (uint16_t b : W) {
    if (b & 0x7fff) lo = std::min(lo, std::max(field(b), 1));
    hi = std::max(hi, field(b));
  }
  return bf16_fma_limits(lo, hi, hi == 255);
}

TEST(Bf16Fma, AdmittedInputsGiveExactProductsForEveryWeightExponent) {
  int64_t admitted = 0, rejected = 0;
  for (int e = 0; e <= 254; ++e)
    for (int mant : {0, 1, 0x55, 0x7f}) {
      if (e == 0 && mant == 0) continue;  // zero: below
      for (int sign : {0, 1}) {
        const uint16_t wb = static_cast<uint16_t>(sign << 15 | e << 7 | mant);
        const float w = bf(wb);
        const Bf16FmaLimits l = limits_of({wb});
        ASSERT_TRUE(l.on());
        for (uint32_t xb = 0; xb < 65536; ++xb) {
          const float x = bf(static_cast<uint16_t>(xb));
          const int fx = field(static_cast<uint16_t>(xb));
          if (bf16_fma_input_ok(x, l.lo, l.hi)) {
            ++admitted;
            ASSERT_TRUE(exact_product(x, w)) << "w " << w << " x " << x;
          } else {
            ++rejected;
            // Rejected: NaN/Inf, or the header's underflow or overflow condition holds.
            const bool nonfinite = fx == 255;
            const bool under = (xb & 0x7fff) != 0 && std::max(fx, 1) + std::max(e, 1) < 119;
            const bool over = fx + e > 380;
            ASSERT_TRUE(nonfinite || under || over) << "w " << w << " x " << x << " rejected";
          }
        }
      }
    }
  std::printf("single weights: %lld inputs admitted, %lld rejected\n", static_cast<long long>(admitted),
              static_cast<long long>(rejected));
  EXPECT_GT(admitted, rejected);
}

TEST(Bf16Fma, InputsThatAreNotBf16ValuesAreRejected) {
  const Bf16FmaLimits l = bf16_fma_limits(100, 130, false);
  EXPECT_TRUE(bf16_fma_input_ok(1.0f, l.lo, l.hi));
  EXPECT_FALSE(bf16_fma_input_ok(std::nextafter(1.0f, 2.0f), l.lo, l.hi));
  EXPECT_FALSE(bf16_fma_input_ok(std::numeric_limits<float>::quiet_NaN(), l.lo, l.hi));
  EXPECT_FALSE(bf16_fma_input_ok(std::numeric_limits<float>::infinity(), l.lo, l.hi));
  EXPECT_TRUE(bf16_fma_input_ok(0.0f, l.lo, l.hi));
  EXPECT_TRUE(bf16_fma_input_ok(-0.0f, l.lo, l.hi));
  const Bf16FmaLimits off{};
  EXPECT_FALSE(off.on());
  EXPECT_FALSE(bf16_fma_input_ok(1.0f, off.lo, off.hi));
  EXPECT_FALSE(bf16_fma_input_ok(0.0f, off.lo, off.hi));
  EXPECT_FALSE(bf16_fma_limits(100, 255, true).on());  // an Inf or NaN weight: never
}

TEST(Bf16Fma, MatricesOfMixedExponents) {
  std::mt19937 rng(20261203);
  std::uniform_int_distribution<int> mant(0, 127), sign(0, 1);
  int64_t checked = 0;
  for (int m = 0; m < 48; ++m) {
    // Exponents over a random span: small weights (down to subnormals), large ones, or both.
    const int a = std::uniform_int_distribution<int>(0, 250)(rng);
    const int b = std::uniform_int_distribution<int>(a, std::min(254, a + 60))(rng);
    std::uniform_int_distribution<int> ex(a, b);
    std::vector<uint16_t> W(24);
    for (auto& w : W) w = static_cast<uint16_t>(sign(rng) << 15 | ex(rng) << 7 | mant(rng));
    W[3] = 0;  // zeros do not narrow the limits
    const Bf16FmaLimits l = limits_of(W);
    for (uint32_t xb = 0; xb < 65536; ++xb) {
      const float x = bf(static_cast<uint16_t>(xb));
      if (!bf16_fma_input_ok(x, l.lo, l.hi)) continue;
      for (uint16_t wb : W) {
        ASSERT_TRUE(exact_product(x, bf(wb))) << "matrix " << m << " w " << bf(wb) << " x " << x;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 10'000'000);
}

// Why the check exists: x = 1.5·2^-74, w = 2^-75 give 1.5·2^-149, which FP32 cannot hold. After a
// first term of 2^-149, the reference's rounded product (2·2^-149, ties to even) plus 2^-149 is
// 3·2^-149; one fmaf rounds 2.5·2^-149 to 2·2^-149. The limits of that weight reject that x.
TEST(Bf16Fma, TheUnderflowCaseDiffersAndIsRejected) {
  const float w = std::ldexp(1.0f, -75), x = std::ldexp(1.5f, -74), acc = std::ldexp(1.0f, -149);
  ASSERT_EQ(round_bf16(w), w);
  ASSERT_EQ(round_bf16(x), x);
  const float unfused = acc + x * w, fused = std::fma(x, w, acc);
  EXPECT_EQ(unfused, std::ldexp(3.0f, -149));
  EXPECT_EQ(fused, std::ldexp(2.0f, -149));
  const Bf16FmaLimits l = limits_of({bf16_from_float(w)});
  EXPECT_FALSE(bf16_fma_input_ok(x, l.lo, l.hi));
  EXPECT_TRUE(bf16_fma_input_ok(std::ldexp(1.0f, -60), l.lo, l.hi));  // 2^-60 · 2^-75 = 2^-135: exact
}

// The limits as bits (no ldexp: the device computes them too) against ldexp, for every pair of fields.
TEST(Bf16Fma, LimitsAreThePowersOfTwoTheFormulaNames) {
  for (int mn = 1; mn <= 255; ++mn)
    for (int mx = 0; mx <= 254; ++mx) {
      const Bf16FmaLimits l = bf16_fma_limits(mn, mx, false);
      const int k = 119 - mn, m = 254 - mx;
      const float lo = k <= 1 ? 0.0f : std::ldexp(1.0f, k - 127);
      const float hi = m >= 128 ? std::numeric_limits<float>::infinity() : std::ldexp(1.0f, m);
      ASSERT_EQ(l.lo, lo) << mn << " " << mx;
      ASSERT_EQ(l.hi, hi) << mn << " " << mx;
    }
}

// bf16_fma_values_ok (integers over several values) against bf16_fma_input_ok value by value: every
// BF16 code alone, and groups of 4 mixing codes, zeros, NaN, Inf and values that are not BF16 values.
TEST(Bf16Fma, TheIntegerTestOfSeveralValuesIsTheValueTest) {
  std::mt19937 rng(44);
  std::uniform_int_distribution<uint32_t> code(0, 65535), any(0, 0xffffffffu), pick(0, 9);
  const Bf16FmaLimits cases[] = {bf16_fma_limits(1, 130, false), bf16_fma_limits(60, 200, false),
                                 bf16_fma_limits(118, 126, false), bf16_fma_limits(255, 0, false),
                                 bf16_fma_limits(100, 254, false), Bf16FmaLimits{}};
  for (const Bf16FmaLimits& l : cases) {
    const Bf16FmaBits b = bf16_fma_bits(l);
    for (uint32_t c = 0; c < 65536; ++c) {
      const float v[1] = {bf(static_cast<uint16_t>(c))};
      ASSERT_EQ(bf16_fma_values_ok(v, b), bf16_fma_input_ok(v[0], l.lo, l.hi)) << c << " lo " << l.lo;
    }
    for (int t = 0; t < 200000; ++t) {
      float v[4];
      bool want = true;
      for (float& x : v) {
        const uint32_t p = pick(rng);
        x = p == 0   ? 0.0f
            : p == 1 ? -0.0f
            : p == 2 ? det::bits_to_float(any(rng))  // mostly not a BF16 value; NaN and Inf possible
            : bf(static_cast<uint16_t>(code(rng)));
        want = want && bf16_fma_input_ok(x, l.lo, l.hi);
      }
      ASSERT_EQ(bf16_fma_values_ok(v, b), want);
    }
  }
}

}  // namespace
}  // namespace dsuf
