// Token sampling, defined once for the host and the device. The CPU backend runs sample_token()
// (sampling.cc, the serial form below); the CUDA backend runs the same definition block-parallel
// (backend/cuda/sample.cu) with the same helpers; both pick the same token for the same logits.
//
// Why the two cannot differ: the only floating-point work is per element (its key and its weight)
// and uses IEEE-exact operations in a fixed order (a subtraction, a division, core/detmath.h's
// fexp, a power-of-two scale, a truncation), so every element gets the same integer weight on both
// sides. Everything after that (masses, thresholds, the draw) is integer arithmetic, whose results
// do not depend on the order of the additions: a serial loop, a block reduction and shared-memory
// atomics give the same numbers.
//
// The definition (docs/cuda.md "Sampling" gives the reasons):
//  1. key(x): order-preserving u32 of the logit's bits, −0 equal to +0, NaN below −inf. The
//     canonical order of the vocabulary: larger key first; among equal keys, lower index first.
//  2. Greedy when temperature ≤ 0, top_k = 1 or the largest logit is ±inf: the first index with the
//     largest key.
//  3. m = the largest logit; w_i = fexp((x_i − m) / T) (0 for NaN); q_i = trunc(w_i · 2^40) (u64),
//     so the first token of the order weighs exactly 2^40.
//  4. Top-k (0 < k < V): the candidates C are the first k tokens of the canonical order; else all.
//  5. Q = Σ_C q. Top-p < 1: p30 = ceil(top_p · 2^30), target = ceil(Q · p30 / 2^30), and the
//     nucleus N is the shortest prefix of C (canonical order) whose mass reaches target; top_p = 1:
//     N = C.
//  6. M = Σ_N q; r = random64(seed, draw); u = floor(r · M / 2^64) < M; the token is the first
//  index
//     of N, walking in index order, at which the running sum of q exceeds u.
// A prefix of the canonical order is kept as (key κ, last index ℓ): token i belongs to it iff
// key_i > κ, or key_i = κ and i ≤ ℓ. It is found by radix select over the keys (four 8-bit digits,
// masses per digit) and one index-order walk over the tokens whose key is κ: no sort.
//
// The random stream is counter-based: draw d of a request with seed s uses random64(s, d) and
// nothing else, so the token does not depend on the batch, the row, the device or earlier calls.
#pragma once

#include <cstdint>
#include <span>

#include "core/detmath.h"

namespace dsuf {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // 1: off
  int top_k = 0;             // 0: off
  uint64_t seed = 0;
};

// The token for one row of logits; `draw` counts the tokens this request sampled before (0 first).
// Throws when the row is empty or longer than sampling::kMaxVocab.
int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t draw);

namespace sampling {

constexpr uint32_t kTopPOne = uint32_t(1) << 30;  // top_p in units of 2^-30
constexpr float kWeightScale = 1099511627776.0f;  // 2^40
constexpr int64_t kMaxVocab = int64_t(1) << 22;   // V · 2^41 < 2^63: masses never overflow

DSUF_HD uint32_t key(float x) {
  uint32_t u = det::float_to_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0;  // NaN: below −inf (whose key is 0x007fffff)
  if ((u & 0x7fffffffu) == 0) u = 0;              // −0 = +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
DSUF_HD float key_value(uint32_t k) {
  return det::bits_to_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

DSUF_HD bool is_greedy(const SamplingParams& p, uint32_t max_key) {
  const bool finite = (det::float_to_bits(key_value(max_key)) & 0x7f800000u) != 0x7f800000u;
  return !(p.temperature > 0.0f) || p.top_k == 1 || !finite;
}

// w = e^((x − m)/T) ∈ [0, 1] (m the largest logit, T > 0); NaN logits weigh nothing.
DSUF_HD float weight(float x, float m, float temperature) {
  if (x != x) return 0.0f;
  return det::fexp((x - m) / temperature);
}
DSUF_HD uint64_t fixed_weight(float w) {
  if (!(w > 0.0f)) return 0;
  if (w > 2.0f) w = 2.0f;  // never happens for x ≤ m; keeps the bound on masses unconditional
  return uint64_t(w * kWeightScale);  // exact scale, truncation
}

DSUF_HD uint32_t top_p_fixed(float top_p) {
  if (!(top_p < 1.0f)) return kTopPOne;  // 1 (and NaN): off
  if (!(top_p > 0.0f)) return 1;
  const float f = top_p * 1073741824.0f;  // exact: a power-of-two scale
  uint32_t v = uint32_t(f);               // float(v) is exact: f is an integer once f ≥ 2^24
  if (float(v) < f) ++v;
  return v < 1 ? 1 : v;
}
// ceil(mass · p30 / 2^30) without overflow (mass < 2^63, p30 ≤ 2^30).
DSUF_HD uint64_t nucleus_target(uint64_t mass, uint32_t p30) {
  const uint64_t low_mask = (uint64_t(1) << 30) - 1;
  const uint64_t hi = mass >> 30, lo = (mass & low_mask) * p30;
  return hi * p30 + (lo >> 30) + ((lo & low_mask) != 0 ? 1 : 0);
}

// SplitMix64's finalizer; random64 is a counter-based stream: a scrambled seed plus the draw index
// times the golden-ratio increment, finalized.
DSUF_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
DSUF_HD uint64_t random64(uint64_t seed, uint64_t draw) {
  return mix64(mix64(seed) + 0x9e3779b97f4a7c15ull * (draw + 1));
}
// The high 64 bits of a·b.
DSUF_HD uint64_t mulhi64(uint64_t a, uint64_t b) {
  const uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
  const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

// A prefix of the canonical order (see above); the default holds every token.
struct Prefix {
  uint32_t key = 0;
  int64_t last = INT64_MAX;
  DSUF_HD bool has(uint32_t k, int64_t i) const { return k > key || (k == key && i <= last); }
};

// One radix-select step: walking the digits from 255 down, the digit whose bucket holds the
// rem-th unit of mass; rem becomes what is still needed inside that bucket.
DSUF_HD uint32_t pick_digit(const uint64_t* hist, uint64_t& rem) {
  uint64_t acc = 0;
  uint32_t d = 255;
  for (; d > 0; --d) {
    if (acc + hist[d] >= rem) break;
    acc += hist[d];
  }
  rem -= acc;
  return d;
}

// ---- The serial form (sampling.cc runs it; the CUDA test runs it on one device thread too). ----

struct Best {
  uint32_t key;
  int64_t index;
};
DSUF_HD Best best_of(const float* x, int64_t n) {
  Best b{key(x[0]), 0};
  for (int64_t i = 1; i < n; ++i) {
    const uint32_t k = key(x[i]);
    if (k > b.key) b = {k, i};
  }
  return b;
}

// The key at which Σ val(i, key) over the canonical order first reaches rem (rem ≥ 1, ≤ the total);
// rem becomes the mass still needed among the tokens with exactly that key.
template <typename Val>
DSUF_HD uint32_t radix_select(const float* x, int64_t n, uint64_t& rem, Val val) {
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    uint64_t hist[256] = {};
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t k = key(x[i]);
      if ((k & mask) == prefix) hist[(k >> shift) & 255] += val(i, k);
    }
    prefix |= pick_digit(hist, rem) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}
// The first index at which the running sum of val (index order) reaches need; −1 if it never does.
template <typename Val>
DSUF_HD int64_t first_reaching(int64_t n, uint64_t need, Val val) {
  uint64_t acc = 0;
  for (int64_t i = 0; i < n; ++i)
    if ((acc += val(i)) >= need) return i;
  return -1;
}

// Steps 4–6 for a row that is not greedy; w[i] = weight(x[i], key_value(max key), T). Returns −1
// only if the definition's invariants were broken (callers then answer the argmax).
DSUF_HD int64_t draw_serial(const float* x, const float* w, int64_t n, const SamplingParams& p,
                            uint64_t draw) {
  auto q = [&](int64_t i) { return fixed_weight(w[i]); };
  Prefix cand;
  if (p.top_k > 0 && p.top_k < n) {
    uint64_t rem = uint64_t(p.top_k);
    cand.key = radix_select(x, n, rem, [](int64_t, uint32_t) -> uint64_t { return 1; });
    const uint32_t kk = cand.key;
    cand.last =
        first_reaching(n, rem, [&](int64_t i) -> uint64_t { return key(x[i]) == kk ? 1 : 0; });
  }
  auto mass = [&](const Prefix& pre) {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; ++i)
      if (pre.has(key(x[i]), i)) s += q(i);
    return s;
  };
  const uint64_t total = mass(cand);
  Prefix nucleus = cand;
  uint64_t m = total;
  const uint32_t p30 = top_p_fixed(p.top_p);
  if (p30 < kTopPOne) {
    uint64_t rem = nucleus_target(total, p30);
    nucleus.key = radix_select(
        x, n, rem, [&](int64_t i, uint32_t k) -> uint64_t { return cand.has(k, i) ? q(i) : 0; });
    const uint32_t kk = nucleus.key;
    nucleus.last = first_reaching(n, rem, [&](int64_t i) -> uint64_t {
      const uint32_t k = key(x[i]);
      return k == kk && cand.has(k, i) ? q(i) : 0;
    });
    m = mass(nucleus);
  }
  const uint64_t u = mulhi64(random64(p.seed, draw), m);
  return first_reaching(
      n, u + 1, [&](int64_t i) -> uint64_t { return nucleus.has(key(x[i]), i) ? q(i) : 0; });
}

}  // namespace sampling
}  // namespace dsuf
