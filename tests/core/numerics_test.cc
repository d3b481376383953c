// Exhaustive tests of the number formats against brute-force oracles written independently of
// core/numerics.cc (nearest representable value by search, ties to the even code).
#include "core/numerics.h"

#include "core/detmath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace dsuf {
namespace {

// Nearest finite code by exhaustive search over `codes`; ties go to the code with an even low bit.
template <typename Decode>
uint8_t brute_nearest(float x, int ncodes, Decode decode, float max_mag) {
  if (x > max_mag) x = max_mag;
  if (x < -max_mag) x = -max_mag;
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < ncodes; ++c) {
    float v = decode(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    if (std::signbit(v) != std::signbit(x) && v != 0) continue;
    if (v == 0 && std::signbit(v) != std::signbit(x)) continue;  // keep the sign of zero results
    double d = std::fabs(static_cast<double>(v) - x);
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best);
}

std::vector<float> all_bf16_finite() {
  std::vector<float> v;
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isfinite(f)) v.push_back(f);
  }
  return v;
}

// det::fexp_nb (the branch-free form the P·V softmax can use) gives det::fexp's bits: every float
// within 2^16 bit patterns of the range ends (±103.9721, 88.7228, the clamps ±104 / 89, the scaling's
// k = −125 and 127, zero), every 1021st pattern elsewhere, and the specials. (The whole 2^32 was checked
// once on the CPU, and cuda_backend_tests' CudaNumerics checks it on the GPU.)
TEST(DetMath, BranchFreeExpEqualsFexp) {
  uint64_t checked = 0, differ = 0;
  auto check = [&](uint32_t u) {
    const float x = det::bits_to_float(u);
    ++checked;
    if (det::float_to_bits(det::fexp_nb(x)) != det::float_to_bits(det::fexp(x)) && differ++ < 5)
      ADD_FAILURE() << "x = " << x << " (0x" << std::hex << u << ")";
  };
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 1021) check(uint32_t(u));
  for (float edge : {-103.9721f, 88.7228f, -104.0f, 89.0f, -125.0f * 0.6931472f, 127.0f * 0.6931472f,
                     -126.0f * 0.6931472f, 128.0f * 0.6931472f, 0.0f, -0.0f})
    for (int d = -(1 << 16); d <= (1 << 16); ++d) check(det::float_to_bits(edge) + uint32_t(d));
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x00000001u, 0x80000001u})
    check(u);
  EXPECT_EQ(differ, 0u) << "of " << checked;
  EXPECT_GT(checked, 4000000u);
}

TEST(Bf16, EveryCodeRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(round_bf16(f)));
      continue;
    }
    EXPECT_EQ(bf16_from_float(f), h) << h;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // Exact midpoints between adjacent bf16 values go to the even one; anything else to the nearest.
  EXPECT_EQ(bf16_from_float(bits_f32(0x3f808000u)), 0x3f80);  // 1 + 2^-8: tie -> even 0x3f80
  EXPECT_EQ(bf16_from_float(bits_f32(0x3f818000u)), 0x3f82);  // tie -> even 0x3f82
  EXPECT_EQ(bf16_from_float(bits_f32(0x3f808001u)), 0x3f81);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7f7effffu);  // below the overflow-to-inf edge
  for (int i = 0; i < 200000; ++i) {
    float f = bits_f32(bits(rng));
    float lo = bf16_to_float(static_cast<uint16_t>(f32_bits(f) >> 16));
    float hi = bf16_to_float(static_cast<uint16_t>((f32_bits(f) >> 16) + 1));
    double dl = static_cast<double>(f) - lo, dh = static_cast<double>(hi) - f;
    float want = dl < dh ? lo : dh < dl ? hi : ((f32_bits(lo) >> 16) & 1 ? hi : lo);
    ASSERT_EQ(round_bf16(f), want) << f;
  }
}

TEST(E4M3, CodePoints) {
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  // Every finite code decodes to a distinct value (zeros aside) and round-trips.
  float prev = -1;
  for (int c = 0; c < 0x7f; ++c) {
    float v = e4m3_to_float(static_cast<uint8_t>(c));
    EXPECT_GT(v, prev) << c;
    prev = v;
    EXPECT_EQ(e4m3_from_float(v), c);
    EXPECT_EQ(e4m3_from_float(-v), c | 0x80);
  }
}

TEST(E4M3, RoundingMatchesBruteForceOnEveryBf16AndMidpoint) {
  std::vector<float> xs = all_bf16_finite();
  for (int c = 0; c < 0x7e; ++c) {  // exact midpoints between adjacent codes, both signs
    float a = e4m3_to_float(static_cast<uint8_t>(c)), b = e4m3_to_float(static_cast<uint8_t>(c + 1));
    float mid = 0.5f * (a + b);
    xs.insert(xs.end(), {mid, -mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
  }
  auto dec = [](uint8_t c) { return e4m3_to_float(c); };
  for (float x : xs) ASSERT_EQ(e4m3_from_float(x), brute_nearest(x, 256, dec, 448.0f)) << x;
}

TEST(E4M3, Saturates) {
  EXPECT_EQ(e4m3_from_float(449.0f), 0x7e);
  EXPECT_EQ(e4m3_from_float(1e30f), 0x7e);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(e4m3_from_float(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(e4m3_from_float(std::nanf("")) & 0x7f, 0x7f);
}

TEST(E8M0, EveryCode) {
  for (int v = 0; v < 255; ++v) {
    float s = e8m0_to_float(static_cast<uint8_t>(v));
    EXPECT_EQ(s, std::ldexp(1.0f, v - 127));
    EXPECT_EQ(e8m0_from_pow2(s), v);
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  EXPECT_THROW(e8m0_from_pow2(3.0f), std::exception);
}

TEST(E8M0, Pow2Ceil) {
  EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
  EXPECT_EQ(pow2_ceil(1.0000001f), 2.0f);
  EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(pow2_ceil(std::ldexp(1.0f, -130)), std::ldexp(1.0f, -130));  // subnormal exact
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-40, 40);
  for (int i = 0; i < 100000; ++i) {
    float x = std::exp2(u(rng));
    float p = pow2_ceil(x);
    ASSERT_GE(p, x);
    ASSERT_LT(p / 2, x);
  }
}

TEST(E2M1, CodePointsAndPacking) {
  const float want[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(c)), want[c]);
    EXPECT_EQ(std::signbit(e2m1_to_float(static_cast<uint8_t>(c))), c >= 8);
    EXPECT_EQ(e2m1_from_float(want[c]), c);
  }
  uint8_t packed[2] = {0, 0};
  fp4_packed_set(packed, 0, 0x3);  // element 0 -> low nibble of byte 0
  fp4_packed_set(packed, 1, 0xc);  // element 1 -> high nibble of byte 0
  fp4_packed_set(packed, 2, 0x7);
  EXPECT_EQ(packed[0], 0xc3);
  EXPECT_EQ(packed[1], 0x07);
  EXPECT_EQ(fp4_packed_get(packed, 0), 1.5f);
  EXPECT_EQ(fp4_packed_get(packed, 1), -2.0f);
  EXPECT_EQ(fp4_packed_get(packed, 2), 6.0f);
}

TEST(E2M1, RoundingTiesToEvenCodeAndSaturates) {
  EXPECT_EQ(round_e2m1(0.25f), 0.0f);
  EXPECT_EQ(round_e2m1(0.75f), 1.0f);
  EXPECT_EQ(round_e2m1(1.25f), 1.0f);
  EXPECT_EQ(round_e2m1(1.75f), 2.0f);
  EXPECT_EQ(round_e2m1(2.5f), 2.0f);
  EXPECT_EQ(round_e2m1(3.5f), 4.0f);
  EXPECT_EQ(round_e2m1(5.0f), 4.0f);
  EXPECT_EQ(round_e2m1(100.0f), 6.0f);
  EXPECT_EQ(round_e2m1(-5.5f), -6.0f);
  auto dec = [](uint8_t c) { return e2m1_to_float(c); };
  for (float x : all_bf16_finite()) ASSERT_EQ(e2m1_from_float(x), brute_nearest(x, 16, dec, 6.0f)) << x;
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(nd(rng));
  return v;
}

TEST(ActQuant, PowerOfTwoScaleAndClamp) {
  for (uint32_t seed = 0; seed < 50; ++seed) {
    float mag = std::exp2(static_cast<float>(seed % 30) - 15);
    auto x = random_values(32, seed, mag);
    std::vector<uint8_t> q(32);
    float s = act_quant_fp8_block(x.data(), 32, q.data());
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    EXPECT_EQ(s, pow2_ceil(std::max(amax, 1e-4f) / 448.0f));
    for (size_t i = 0; i < 32; ++i) {
      float deq = e4m3_to_float(q[i]) * s;
      EXPECT_LE(std::fabs(e4m3_to_float(q[i])), 448.0f);
      EXPECT_LE(std::fabs(deq - x[i]), std::fabs(x[i]) / 16 + s * std::ldexp(1.0f, -10)) << x[i];
    }
  }
  // amax floor: an all-tiny block uses the scale of 1e-4.
  std::vector<float> tiny(32, 1e-7f);
  EXPECT_EQ(act_quant_fp8_block(tiny.data(), 32, nullptr), pow2_ceil(1e-4f / 448.0f));
}

TEST(FakeQuant, Fp8IsIdempotentAndPerBlock) {
  auto x = random_values(128, 11, 3.0f);
  x[40] = 1000.0f;  // a big value only changes its own 32-block's scale
  auto y = x;
  fp8_fake_quant(y.data(), y.size(), 32);
  auto z = y;
  fp8_fake_quant(z.data(), z.size(), 32);
  EXPECT_EQ(y, z);
  float s1 = act_quant_fp8_block(x.data() + 32, 32, nullptr);
  float s0 = act_quant_fp8_block(x.data(), 32, nullptr);
  EXPECT_GT(s1, s0 * 64);
}

TEST(FakeQuant, Fp4Pow2) {
  auto x = random_values(128, 12, 0.1f);
  auto y = x;
  fp4_fake_quant_pow2(y.data(), y.size(), 32);
  for (size_t b = 0; b < 128; b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    float s = pow2_ceil(amax / 6.0f);
    for (size_t i = b; i < b + 32; ++i) {
      EXPECT_EQ(y[i], round_e2m1(x[i] / s) * s);
      float q = y[i] / s;  // on the grid
      EXPECT_EQ(round_e2m1(q), q);
    }
  }
}

TEST(FakeQuant, Fp4Pow2ScaleIsTheFakeQuantsScale) {
  auto x = random_values(128, 14, 0.3f);
  auto y = x;
  fp4_fake_quant_pow2(y.data(), y.size(), 32);
  for (size_t b = 0; b < 128; b += 32) {
    const float s = fp4_pow2_scale(x.data() + b, 32);
    for (size_t i = b; i < b + 32; ++i) EXPECT_EQ(y[i], round_e2m1(x[i] / s) * s);
  }
  std::vector<float> zeros(32, 0.0f);
  EXPECT_EQ(fp4_pow2_scale(zeros.data(), 32), std::ldexp(1.0f, -126));  // the floor 6·2^-126
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Fp4BlockDot, CodesAsTwiceTheirValue) {
  for (uint32_t n = 0; n < 16; ++n) EXPECT_EQ(det::e2m1_x2(n), 2.0f * e2m1_to_float(uint8_t(n))) << n;
}

// The indexer's integer form of an FP4·FP4 block (det::fp4_block_dot) equals the sequential FP32 sum
// of the 32 products of the decoded values, bit for bit, whenever sa·sb ≥ 2^-147; the blocked dot
// (docs/numerics.md §3) is then the same either way.
TEST(Fp4BlockDot, IntegerSumEqualsSequentialFp32Sum) {
  std::mt19937 rng(15);
  std::uniform_int_distribution<int> nib(0, 15), ex(-126, 40);
  std::vector<uint8_t> qa(128), kb(128);
  float sa[4], sb[4];
  for (int trial = 0; trial < 20000; ++trial) {
    // Mostly random nibbles; some trials all ±6 (the largest |isum|, 4608) or only a few codes.
    const int mode = trial % 10;
    for (int d = 0; d < 128; ++d) {
      qa[d] = uint8_t(mode == 0 ? 7 | (nib(rng) & 8) : mode == 1 ? (d % 5 ? 0 : nib(rng)) : nib(rng));
      kb[d] = uint8_t(mode == 0 ? (qa[d] ^ (trial & 8)) : nib(rng));
    }
    for (int j = 0; j < 4; ++j) {
      int ea = ex(rng), eb = ex(rng);
      while (ea + eb < -147) eb = ex(rng);
      sa[j] = std::ldexp(1.0f, ea), sb[j] = std::ldexp(1.0f, eb);
    }
    float int_dot = 0.0f, f32_dot = 0.0f;
    for (int j = 0; j < 4; ++j) {
      int32_t isum = 0;
      for (int d = 32 * j; d < 32 * j + 32; ++d) isum += det::e2m1_x2(qa[d]) * det::e2m1_x2(kb[d]);
      ASSERT_LE(std::abs(isum), 4608);
      const float bi = det::fp4_block_dot(isum, sa[j], sb[j]);
      const float bf = det::seq_sum(32, [&](int64_t i) {
        return (e2m1_to_float(qa[32 * j + i]) * sa[j]) * (e2m1_to_float(kb[32 * j + i]) * sb[j]);
      });
      ASSERT_EQ(bits(bi), bits(bf)) << "trial " << trial << " block " << j << ": isum " << isum << ", scales 2^"
                                    << std::ilogb(sa[j]) << " · 2^" << std::ilogb(sb[j]);
      int_dot += bi;
      f32_dot += bf;
    }
    ASSERT_EQ(bits(int_dot), bits(f32_dot));
  }
}

TEST(Fp4BlockDot, UnderflowBelowTwoToMinus147) {
  // 0.25·sa·sb ≥ 2^-149: exact even where the block value is subnormal.
  EXPECT_EQ(det::fp4_block_dot(3, std::ldexp(1.0f, -126), std::ldexp(1.0f, -21)), 3 * std::ldexp(1.0f, -149));
  // Below: the scale product rounds to zero, and so does the block (the exact sum here is 2^-148).
  EXPECT_EQ(det::fp4_block_dot(4, std::ldexp(1.0f, -126), std::ldexp(1.0f, -22)), 0.0f);
}

TEST(CompressedKv, Fp4WithE4M3ScalesPer16) {
  auto x = random_values(512, 13, 2.0f);
  std::vector<uint8_t> packed(256), scales(32);
  fp4_quant_e4m3(x.data(), x.size(), packed.data(), scales.data());
  std::vector<float> y(512);
  fp4_dequant_e4m3(packed.data(), scales.data(), 512, y.data());
  for (size_t b = 0; b < 512; b += 16) {
    float amax = 0;
    for (size_t i = b; i < b + 16; ++i) amax = std::max(amax, std::fabs(x[i]));
    float s = round_e4m3(amax / 6.0f);
    EXPECT_EQ(e4m3_to_float(scales[b / 16]), s);
    for (size_t i = b; i < b + 16; ++i) EXPECT_EQ(y[i], round_e2m1(x[i] / s) * s);
  }
  // The floor keeps an all-zero block's scale at 2^-9, never zero.
  std::vector<float> zeros(16, 0.0f);
  fp4_quant_e4m3(zeros.data(), 16, packed.data(), scales.data());
  EXPECT_EQ(e4m3_to_float(scales[0]), std::ldexp(1.0f, -9));
}

}  // namespace
}  // namespace dsuf
