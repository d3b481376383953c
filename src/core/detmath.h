// Deterministic math shared by the CPU reference and the CUDA kernels, so that both produce the same
// bits for the same inputs (the CUDA backend is checked against the reference for exact equality).
//
// Two things make float results differ between a CPU and a GPU: the libraries' transcendental
// functions (glibc's expf is not CUDA's) and the order of additions. This header fixes both:
//   * fexp / flog1p / sigmoid / silu / softplus use only +, −, ×, ÷ and bit operations in a fixed
//     order (CUDA code must be compiled with --fmad=false; the CPU build never contracts to FMA
//     because it compiles ISO C++ without -mfma);
//   * the canonical reduction orders below, which map onto a warp/block on the GPU and are written
//     out sequentially for the CPU.
//
// Canonical orders (N values f(0..N-1)):
//   lane_sum(32):  32 partials p[l] = f(l) + f(l+32) + f(l+64) + … (in that order), then tree32(p).
//   chunk_lane_sum<C>(32): the same over chunks of C consecutive values: lane l takes chunks
//                  l, l+32, … and adds their values one at a time in index order, then tree32
//                  (a GPU lane reads a chunk as one vector load; BF16 linears use C = 8).
//   block_sum(T):  T partials p[t] = f(t) + f(t+T) + …, then per warp of 32 partials tree32 → q[w],
//                  then tree32 over q padded with zeros to 32.
//   tree32(v):     for o = 16, 8, 4, 2, 1: v[i] = v[i] + v[i+o] for i < o; result v[0]
//                  (what an xor-butterfly warp reduction leaves in every lane).
//   seq_sum(n):    ((0 + f(0)) + f(1)) + … + f(n−1), one at a time from zero (one GPU thread's loop).
//
// Indexer dot products (q·k over index_head_dim, docs/numerics.md §3): blocks of 32 dims; each block
// value B_j is exact when q and k are FP4 (fp4_block_dot on the integer sum of the codes) and the
// sequential FP32 sum of its 32 products otherwise; dot = seq_sum over the blocks.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSUF_HD __host__ __device__ __forceinline__
#else
#define DSUF_HD inline
#endif

namespace dsuf::det {

DSUF_HD float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
DSUF_HD uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// Round to the nearest integer, ties to even (valid for |x| < 2^22).
DSUF_HD float round_even(float x) {
  const float magic = 12582912.0f;  // 1.5·2^23
  const float t = x + magic;  // rounds to an integer: the ulp at 1.5·2^23 is 1
  return t - magic;
}

// e^x with about 1 ulp error; exact handling of the range ends.
DSUF_HD float fexp(float x) {
  if (x != x) return x;
  if (x > 88.7228f) return bits_to_float(0x7f800000u);
  if (x < -103.9721f) return 0.0f;
  const float k = round_even(x * 1.44269504088896341f);
  float r = x - k * 0.693145751953125f;  // ln2 split: hi has 16 significant bits, so k·hi is exact
  r = r - k * 1.42860682030941723e-06f;
  // e^r on |r| ≤ 0.35: Taylor to degree 8, Horner form.
  float p = 2.48015873015873e-05f;
  p = p * r + 1.98412698412698e-04f;
  p = p * r + 1.38888888888889e-03f;
  p = p * r + 8.33333333333333e-03f;
  p = p * r + 4.16666666666667e-02f;
  p = p * r + 1.66666666666667e-01f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int ki = int(k);
  // Scale by 2^k in two steps so that subnormal results come out right.
  if (ki < -125) {
    p = p * bits_to_float(uint32_t(-125 + 127) << 23);
    ki += 125;
  } else if (ki > 127) {
    p = p * 2.0f;
    ki -= 1;
  }
  return p * bits_to_float(uint32_t(ki + 127) << 23);
}

// fexp's value for every float x, computed without branches: the same operations in the same order
// on x clamped to [−104, 89] (which leaves every x that reaches fexp's polynomial unchanged), then
// fexp's three early results chosen by selects. A GPU warp can then interleave several of them (the
// P·V kernel's softmax: fexp's early returns made each exponential its own basic block).
DSUF_HD float fexp_nb(float x) {
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);  // NaN stays NaN (selected below)
  const float k = round_even(xc * 1.44269504088896341f);
  float r = xc - k * 0.693145751953125f;
  r = r - k * 1.42860682030941723e-06f;
  float p = 2.48015873015873e-05f;
  p = p * r + 1.98412698412698e-04f;
  p = p * r + 1.38888888888889e-03f;
  p = p * r + 8.33333333333333e-03f;
  p = p * r + 4.16666666666667e-02f;
  p = p * r + 1.66666666666667e-01f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int ki = x == x ? int(k) : 0;  // (a NaN's k: no conversion of it)
  const bool lo = ki < -125, hi = ki > 127;
  p = lo ? p * bits_to_float(uint32_t(-125 + 127) << 23) : (hi ? p * 2.0f : p);
  ki = lo ? ki + 125 : (hi ? ki - 1 : ki);
  float y = p * bits_to_float(uint32_t(ki + 127) << 23);
  y = x < -103.9721f ? 0.0f : y;
  y = x > 88.7228f ? bits_to_float(0x7f800000u) : y;
  return x != x ? x : y;
}

// ln(x) for finite x > 0 (about 1 ulp).
DSUF_HD float flog(float x) {
  uint32_t u = float_to_bits(x);
  int e = int((u >> 23) & 0xff) - 127;
  if (e == -127) {  // subnormal: normalize
    x = x * 8388608.0f;
    u = float_to_bits(x);
    e = int((u >> 23) & 0xff) - 127 - 23;
  }
  float m = bits_to_float((u & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = m * 0.5f;
    e += 1;
  }
  // ln(m) = 2·atanh(s), s = (m−1)/(m+1), |s| ≤ 0.1716.
  const float s = (m - 1.0f) / (m + 1.0f);
  const float s2 = s * s;
  float p = 0.11111111111f;
  p = p * s2 + 0.14285714286f;
  p = p * s2 + 0.2f;
  p = p * s2 + 0.33333333333f;
  p = p * s2 + 1.0f;
  const float ln_m = 2.0f * s * p;
  const float fe = float(e);
  return fe * 1.42860682030941723e-06f + ln_m + fe * 0.693145751953125f;
}

// ln(1 + y) for y > −1, accurate for small y.
DSUF_HD float flog1p(float y) {
  const float u = 1.0f + y;
  if (u == 1.0f) return y;
  return flog(u) * (y / (u - 1.0f));
}

DSUF_HD float sigmoid(float x) { return 1.0f / (1.0f + fexp(-x)); }
DSUF_HD float silu(float x) { return x / (1.0f + fexp(-x)); }
// torch's softplus: x itself above the threshold 20.
DSUF_HD float softplus(float x) { return x > 20.0f ? x : flog1p(fexp(x)); }

DSUF_HD float tree32(float* v) {
  for (int o = 16; o > 0; o >>= 1)
    for (int i = 0; i < o; ++i) v[i] = v[i] + v[i + o];
  return v[0];
}

// The canonical lane-strided sum of f(0..n-1) (see above); f is any callable.
template <typename F>
DSUF_HD float lane_sum(int64_t n, F&& f) {
  float p[32];
  for (int l = 0; l < 32; ++l) {
    float acc = 0.0f;
    for (int64_t j = l; j < n; j += 32) acc += f(j);
    p[l] = acc;
  }
  return tree32(p);
}

// The canonical chunked lane sum (see above).
template <int C, typename F>
DSUF_HD float chunk_lane_sum(int64_t n, F&& f) {
  float p[32];
  for (int l = 0; l < 32; ++l) {
    float acc = 0.0f;
    for (int64_t c = l; c * C < n; c += 32)
      for (int64_t j = c * C; j < c * C + C && j < n; ++j) acc += f(j);
    p[l] = acc;
  }
  return tree32(p);
}

// The canonical block sum with T threads (T a multiple of 32, ≤ 1024).
template <int T, typename F>
DSUF_HD float block_sum(int64_t n, F&& f) {
  float q[32] = {};
  for (int w = 0; w < T / 32; ++w) {
    float p[32];
    for (int l = 0; l < 32; ++l) {
      float acc = 0.0f;
      for (int64_t j = 32 * w + l; j < n; j += T) acc += f(j);
      p[l] = acc;
    }
    q[w] = tree32(p);
  }
  return tree32(q);
}

// The canonical sequential sum (see above).
template <typename F>
DSUF_HD float seq_sum(int64_t n, F&& f) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += f(i);
  return acc;
}

// ---- FP4 × FP4 block dot products -----------------------------------------------------------------
// An E2M1 nibble (bit 3 the sign) as twice its value: an integer in −12..12 (codes 0..7 are 0, .5,
// 1, 1.5, 2, 3, 4, 6).
DSUF_HD int e2m1_x2(uint32_t nibble) {
  const int mag = int((0xC8643210u >> (4 * (nibble & 7u))) & 0xfu);
  return (nibble & 8u) ? -mag : mag;
}

// One 32-block of a dot product of two FP4 vectors with power-of-two block scales sa, sb:
// isum = Σ (2c)(2c') over the block's pairs of E2M1 values c, c' (|isum| ≤ 32·144 = 4608, so any
// integer order gives the same isum and float(isum) is exact). The result is the block's exact sum
// Σ (c·sa)(c'·sb) whenever 0.25·sa·sb ≥ 2^-149, i.e. sa·sb ≥ 2^-147 (every partial sum is then an
// integer multiple of 0.25·sa·sb below 2^13 times it, so it is also what a sequential FP32 sum of
// the products gives); below that 0.25·sa·sb rounds to 0 and so does the block.
DSUF_HD float fp4_block_dot(int32_t isum, float sa, float sb) { return float(isum) * (0.25f * sa * sb); }

// ---- FP4 weights × quantized activations (the FP4 linear with activation quantization) -----------
// With activation quantization every input is an E4M3 value a (a multiple of 2^-9, |a| ≤ 448) and
// every weight an E2M1 value c, so X = 512·a is an integer in [−229376, 229376] (19 bits with the
// sign) and 2c an integer in {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}. A 32-block of the linear is the exact
// integer S = Σ X·(2c) (|S| ≤ 32·229376·12 = 88 080 384 < 2^27, so int32 holds it and any order of
// the additions gives it), turned into a float once — rounded to nearest, ties to even, the only
// rounding — and scaled by 2^-10 (exact: a power of two on a value ≥ 1 when nonzero):
//   part = float(S)·2^-10,
// the block's real Σ a·c rounded once. (Before, part was the sequential FP32 sum of the 32 products,
// which rounds whenever a partial sum reaches 2^24·2^-10 = 2^14 in magnitude.) float(int32) rounds to
// nearest even on both sides: cvtsi2ss under the default MXCSR on x86, __int2float_rn on the GPU.
DSUF_HD int32_t e4m3_x512(float a) { return int32_t(a * 512.0f); }  // a an E4M3 value: exact

// S for one 32-block: X[0..31] (512·a) against 16 packed E2M1 bytes (low nibble first).
DSUF_HD int32_t fp4_act_block_isum(const int32_t* X, const uint8_t* w) {
  int32_t s = 0;
  for (int k = 0; k < 16; ++k) {
    s += X[2 * k] * e2m1_x2(w[k] & 0xfu);
    s += X[2 * k + 1] * e2m1_x2(w[k] >> 4);
  }
  return s;
}
DSUF_HD float fp4_act_block_part(int32_t isum) { return float(isum) * 0x1p-10f; }

}  // namespace dsuf::det
