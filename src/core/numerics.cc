#include "core/numerics.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dsuf {
namespace {

struct E4M3Table {
  float v[256];
  E4M3Table() {
    for (int i = 0; i < 256; ++i) {
      int sign = i >> 7, exp = (i >> 3) & 0xf, man = i & 7;
      float mag;
      if (exp == 15 && man == 7) {
        mag = NAN;
      } else if (exp == 0) {
        mag = std::ldexp(static_cast<float>(man), -9);  // subnormal: man · 2^-9
      } else {
        mag = std::ldexp(1.0f + man / 8.0f, exp - 7);
      }
      v[i] = sign ? -mag : mag;
    }
  }
};
const E4M3Table kE4M3;

constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float amax_of(const float* x, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

}  // namespace

float e4m3_to_float(uint8_t v) { return kE4M3.v[v]; }

uint8_t e4m3_from_float(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7f;
  if (a >= kE4M3Max) return sign | 0x7e;  // saturate (inf included)
  int e = static_cast<int>((f32_bits(a) >> 23) & 0xff) - 127;
  if (e < -6) {
    // Subnormal range: quantum 2^-9. r == 8 is the smallest normal, whose code is also 8.
    float r = std::nearbyint(std::ldexp(a, 9));
    return sign | static_cast<uint8_t>(r);
  }
  float r = std::nearbyint(std::ldexp(a, 3 - e));  // in [8, 16]
  int code_exp = e + 7;
  int man = static_cast<int>(r) - 8;
  if (man == 8) {
    man = 0;
    ++code_exp;
  }
  if (code_exp > 15 || (code_exp == 15 && man == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((code_exp << 3) | man);
}

float e8m0_to_float(uint8_t v) {
  if (v == 255) return NAN;
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

uint8_t e8m0_from_pow2(float s) {
  int e;
  float m = std::frexp(s, &e);  // s = m · 2^e, m in [0.5, 1)
  DSUF_CHECK(s > 0 && m == 0.5f, "E8M0 scale must be a power of two, got ", s);
  int v = (e - 1) + 127;
  DSUF_CHECK(v >= 0 && v <= 254, "E8M0 scale out of range: ", s);
  return static_cast<uint8_t>(v);
}

float pow2_ceil(float x) {
  DSUF_CHECK(x > 0 && std::isfinite(x), "pow2_ceil needs a finite positive value, got ", x);
  int e;
  float m = std::frexp(x, &e);  // x = m · 2^e, m in [0.5, 1)
  return m == 0.5f ? x : std::ldexp(1.0f, e);
}

float e2m1_to_float(uint8_t nibble) { return kE2M1Values[nibble & 0xf]; }

uint8_t e2m1_from_float(float f) {
  uint8_t sign = (f32_bits(f) >> 31) ? 8 : 0;
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 7;  // E2M1 has no NaN; callers never pass one
  // Midpoints between consecutive magnitudes; at a tie pick the even code.
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint8_t code = 7;
  for (uint8_t c = 0; c < 7; ++c) {
    float mid = 0.5f * (kMag[c] + kMag[c + 1]);
    if (a < mid || (a == mid && (c % 2 == 0))) {
      code = c;
      break;
    }
  }
  return sign | code;
}

float act_quant_fp8_block(const float* x, size_t n, uint8_t* q) {
  float amax = std::max(amax_of(x, n), 1e-4f);
  float s = pow2_ceil(amax / kE4M3Max);
  if (q) {
    for (size_t i = 0; i < n; ++i) {
      float v = std::clamp(x[i] / s, -kE4M3Max, kE4M3Max);
      q[i] = e4m3_from_float(v);
    }
  }
  return s;
}

void fp8_fake_quant(float* x, size_t n, size_t block) {
  DSUF_CHECK(block > 0 && n % block == 0, "fp8_fake_quant: ", n, " values, block ", block);
  for (size_t b = 0; b < n; b += block) {
    float s = act_quant_fp8_block(x + b, block, nullptr);
    for (size_t i = b; i < b + block; ++i)
      x[i] = round_e4m3(std::clamp(x[i] / s, -kE4M3Max, kE4M3Max)) * s;
  }
}

float fp4_pow2_scale(const float* x, size_t n) {
  const float floor_amax = 6.0f * std::ldexp(1.0f, -126);
  return pow2_ceil(std::max(amax_of(x, n), floor_amax) / kE2M1Max);
}

void fp4_fake_quant_pow2(float* x, size_t n, size_t block) {
  DSUF_CHECK(block > 0 && n % block == 0, "fp4_fake_quant_pow2: ", n, " values, block ", block);
  for (size_t b = 0; b < n; b += block) {
    const float s = fp4_pow2_scale(x + b, block);
    for (size_t i = b; i < b + block; ++i) x[i] = round_e2m1(x[i] / s) * s;
  }
}

void fp4_quant_e4m3(const float* x, size_t n, uint8_t* packed, uint8_t* scales) {
  constexpr size_t B = kCompressedKvScaleBlock;
  DSUF_CHECK(n % B == 0, "fp4_quant_e4m3: ", n, " values is not a multiple of ", B);
  const float floor_amax = 6.0f * std::ldexp(1.0f, -9);
  std::memset(packed, 0, n / 2);
  for (size_t b = 0; b < n; b += B) {
    float amax = std::max(amax_of(x + b, B), floor_amax);
    uint8_t sc = e4m3_from_float(amax / kE2M1Max);
    float s = e4m3_to_float(sc);
    scales[b / B] = sc;
    for (size_t i = b; i < b + B; ++i) fp4_packed_set(packed, i, e2m1_from_float(x[i] / s));
  }
}

void fp4_dequant_e4m3(const uint8_t* packed, const uint8_t* scales, size_t n, float* out) {
  constexpr size_t B = kCompressedKvScaleBlock;
  for (size_t i = 0; i < n; ++i) out[i] = fp4_packed_get(packed, i) * e4m3_to_float(scales[i / B]);
}

}  // namespace dsuf
