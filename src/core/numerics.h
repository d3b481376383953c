// Number formats of DeepSeek-V4.1 (model-spec §2.1, §3.0, §3b.2) and the reference's rounding rules.
//
//   BF16   round-to-nearest-even from FP32; NaN stays NaN.
//   E4M3   float8_e4m3fn: bias 7, max ±448, no inf, 0x7F/0xFF NaN. Encoding saturates to ±448 and
//          rounds to nearest even (subnormals included).
//   E8M0   a byte v is the scale 2^(v-127); v = 255 is NaN.
//   E2M1   FP4 nibble (bit 3 = sign) with values 0, .5, 1, 1.5, 2, 3, 4, 6. Encoding saturates to ±6
//          and breaks ties toward the even code. Packed two per byte, low nibble first.
//
// Quantizers used by the model, each the single place that rule is written down:
//   act_quant_fp8      activations before FP8/FP4 linears, and KV fake-quant: one power-of-two scale
//                      2^ceil(log2(max(amax,1e-4)/448)) per block, values clamp(x/s, ±448) -> E4M3.
//   fp4_fake_quant_pow2  indexer keys/queries: scale 2^ceil(log2(max(amax, 6·2^-126)/6)) per block.
//   fp4_quant_e4m3     compressed KV: scale e4m3(max(amax, 6·2^-9)/6) per 16 elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dsuf {

// ---- BF16 --------------------------------------------------------------------------------------
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t bf16_from_float(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
inline float round_bf16(float f) { return bf16_to_float(bf16_from_float(f)); }

// ---- E4M3 (float8_e4m3fn) ----------------------------------------------------------------------
constexpr float kE4M3Max = 448.0f;
float e4m3_to_float(uint8_t v);
uint8_t e4m3_from_float(float f);  // saturating, round to nearest even
inline float round_e4m3(float f) { return e4m3_to_float(e4m3_from_float(f)); }

// ---- E8M0 --------------------------------------------------------------------------------------
float e8m0_to_float(uint8_t v);
// The exact power of two `s` as an E8M0 byte; throws if s is not a power of two in range.
uint8_t e8m0_from_pow2(float s);
// 2^ceil(log2(x)) for finite x > 0, computed from the bits (no log2 rounding error).
float pow2_ceil(float x);

// ---- E2M1 (FP4) --------------------------------------------------------------------------------
constexpr float kE2M1Max = 6.0f;
float e2m1_to_float(uint8_t nibble);
uint8_t e2m1_from_float(float f);  // saturating to ±6, ties to even code
inline float round_e2m1(float f) { return e2m1_to_float(e2m1_from_float(f)); }
// Packed pairs: element 2j is the low nibble of byte j, element 2j+1 the high nibble.
inline float fp4_packed_get(const uint8_t* packed, size_t i) {
  uint8_t b = packed[i >> 1];
  return e2m1_to_float((i & 1) ? (b >> 4) : (b & 0xf));
}
inline void fp4_packed_set(uint8_t* packed, size_t i, uint8_t nibble) {
  uint8_t& b = packed[i >> 1];
  b = (i & 1) ? static_cast<uint8_t>((b & 0x0f) | (nibble << 4))
              : static_cast<uint8_t>((b & 0xf0) | (nibble & 0xf));
}

// ---- Quantizers --------------------------------------------------------------------------------
// Activation / KV FP8 quantization of n values as one block: writes E4M3 codes to q (may be null)
// and returns the power-of-two scale. amax is floored at 1e-4 as in the reference's act_quant.
float act_quant_fp8_block(const float* x, size_t n, uint8_t* q);
// Quantize-dequantize in place, one scale per `block` elements (n % block == 0).
void fp8_fake_quant(float* x, size_t n, size_t block);
// The indexer's FP4 scale of one block of n values: 2^ceil(log2(max(amax, 6·2^-126)/6)).
float fp4_pow2_scale(const float* x, size_t n);
// Indexer FP4 fake-quant in place: power-of-two scale per `block`, values to the E2M1 grid.
void fp4_fake_quant_pow2(float* x, size_t n, size_t block);
// Compressed-KV FP4 with an E4M3 scale per 16 values: writes n/2 packed bytes and n/16 scales.
void fp4_quant_e4m3(const float* x, size_t n, uint8_t* packed, uint8_t* scales);
void fp4_dequant_e4m3(const uint8_t* packed, const uint8_t* scales, size_t n, float* out);
constexpr size_t kCompressedKvScaleBlock = 16;

}  // namespace dsuf
