// When a BF16 linear may add each product by one FMA and keep the reference's bits.
//
// The reference adds p = x·w rounded to FP32, then p to the sum, rounded again (docs/numerics.md:
// chunk_lane_sum<8> of FP32 products, no contraction). fmaf(x, w, acc) rounds acc + x·w once. The
// two agree whenever x·w is exact in FP32 — then rounding it changes nothing. With x and w both BF16
// values (8 significant bits each) the product has at most 16, so it is exact unless
//   * it underflows: its lowest bit is below 2^-149 (FP32's smallest subnormal), or
//   * it overflows: |x·w| ≥ 2^128.
// Both depend only on the exponents. With e' = max(exponent field, 1) (a subnormal's lowest bit sits
// where the smallest normal's does), a BF16 value's lowest bit is 2^(e' − 134), so the product's is
// 2^(e'x + e'w − 268) and it is ≥ 2^-149 iff e'x + e'w ≥ 119. |v| < 2^(e − 126) for exponent field
// e, so |x·w| < 2^(ex + ew − 252) and no product overflows if ex + ew ≤ 380.
//
// A matrix gives the smallest e'w of its nonzero weights and the largest ew; an input row then
// qualifies when every value is a BF16 value (its low 16 bits zero), finite, below `hi` and, unless
// zero (a zero product is exact), at least `lo`. The kernel (the head's form of 8 rows a block,
// k_bf16_wide) checks the rows it stages (one flag a block, `__syncthreads_and`) and takes the plain
// products when one does not qualify: the FMA is an optimization that never changes a bit, not an
// assumption about the data.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/detmath.h"

namespace dsuf {

// x qualifies iff x is a BF16 value and (x == 0 or lo ≤ |x|) and |x| < hi. hi = 0: nothing
// qualifies (the default: the FMA off).
struct Bf16FmaLimits {
  float lo = 0.0f, hi = 0.0f;
  DSUF_HD bool on() const { return hi > 0.0f; }
};

// From a matrix's exponent fields: min_nonzero the smallest max(field, 1) over its nonzero weights
// (≥ 255 when there are none), max_field the largest field; any_nonfinite: an Inf or NaN weight (no
// FMA then: the products' NaN-ness would match, their payloads need not).
// (Host and device: docs/experiments/logits-fma.patch, not landed, takes q's limits a block.)
DSUF_HD Bf16FmaLimits bf16_fma_limits(int min_nonzero, int max_field, bool any_nonfinite) {
  if (any_nonfinite) return {};
  Bf16FmaLimits l;
  // e'x ≥ 119 − min_nonzero. For k ≥ 2, e'x ≥ k ⇔ |x| ≥ 2^(k − 127) (exponent field k); for k ≤ 1
  // every x does.
  const int k = 119 - min_nonzero;
  l.lo = k <= 1 ? 0.0f : det::bits_to_float(uint32_t(k) << 23);
  // ex ≤ 380 − max_field ⇔ |x| < 2^(381 − max_field − 127) (field 381 − max_field); past FLT_MAX
  // only finiteness is asked (Inf).
  const int m = 381 - max_field;
  l.hi = det::bits_to_float(m >= 255 ? 0x7f800000u : uint32_t(m) << 23);
  return l;
}

// Whether one input value qualifies (the kernels' test, written once).
DSUF_HD bool bf16_fma_input_ok(float x, float lo, float hi) {
  const uint32_t u = det::float_to_bits(x);
  const float a = det::bits_to_float(u & 0x7fffffffu);
  return (u & 0xffffu) == 0 && a < hi && (a >= lo || a == 0.0f);
}

// The same test over n values at once, in integers (a lane's values of a key in the logits FMA of
// docs/experiments/logits-fma.patch, not landed; tested on the CPU in tests/core/bf16_fma_test.cc):
// every value a BF16 value, none at or above hi, every nonzero one at least lo. lo_m1 = lo's bits − 1
// (0 for lo = 0) and hi_bits = hi's bits, from bf16_fma_bits. Magnitudes compare as their bits; a
// zero's |bits| − 1 wraps to the top and drops out of the minimum; a NaN's bits exceed Inf's.
struct Bf16FmaBits {
  uint32_t lo_m1, hi_bits;
};
DSUF_HD Bf16FmaBits bf16_fma_bits(const Bf16FmaLimits& l) {
  const uint32_t lo = det::float_to_bits(l.lo), hi = det::float_to_bits(l.hi);
  return {lo ? lo - 1u : 0u, hi};
}
template <int N>
DSUF_HD bool bf16_fma_values_ok(const float (&v)[N], const Bf16FmaBits& b) {
  uint32_t any = 0, mx = 0, mn = 0xffffffffu;
  for (int u = 0; u < N; ++u) {
    const uint32_t x = det::float_to_bits(v[u]), a = x & 0x7fffffffu;
    any |= x;
    mx = mx > a ? mx : a;
    mn = mn < a - 1u ? mn : a - 1u;
  }
  return (any & 0xffffu) == 0 && mx < b.hi_bits && mn >= b.lo_m1;
}

}  // namespace dsuf
