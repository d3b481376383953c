// The CUDA backend's integer form of det::fp4_act_block_isum (core/detmath.h): 4 E2M1 weights at a
// time decoded by byte permutes and multiplied with byte planes of the activations by dp4a. Written
// once for both sides: on the GPU prmt and dp4a are the PTX instructions; on the host they are
// emulated as the PTX ISA defines them, so tests/core/fp4_int_test.cc checks the kernel's algebra
// (tables, selectors, signedness, plane weights) against the block function without a GPU.
//
// Activations: X = 512·a (det::e4m3_x512) split into three byte planes, X = hi·65536 + mid·256 + lo
// with lo, mid unsigned bytes and hi a signed byte (hi ∈ [−4, 3] for |X| ≤ 229376).
//
// Weights: a 32-block is 16 bytes, weight k in nibble k (low nibble first), so the 16-bit half h of
// word t holds weights 8t+4h .. 8t+4h+3, nibble n at bits 4n. prmt in its generic mode builds output
// byte n from selector nibble n: bits 0-2 pick one of 8 table bytes, bit 3 set replaces the byte by
// its sign bit replicated. An E2M1 nibble is exactly such a selector (bits 0-2 the magnitude code,
// bit 3 the sign), so with a table of non-negative bytes (sign bit 0):
//   P = prmt(2·|2c| table, nibbles)          = 2·(2c) for a positive weight, 0 for a negative one;
//   N = prmt(−|2c| table, nibbles & 0x7777)  = −|2c| for every weight (signed bytes);
// and 2c = P + N byte by byte (a positive weight: 2m − m; a negative one: 0 − m). Each plane's sum
// over 4 weights is then dp4a(P, plane) + dp4a(N, plane): unsigned × unsigned and signed × unsigned
// for lo and mid, signed × signed for hi. (This is S = 2·Σ dp4a(M⁺, plane) − Σ dp4a(M, plane) with
// the factor 2 and the minus sign folded into the two tables, so one accumulator per plane.)
// Per plane, |Σ| ≤ 32·12·255 (lo, mid) and 32·12·4 (hi); S = acc_lo + 256·acc_mid + 65536·acc_hi,
// all modulo 2^32, is exact because |S| < 2^27.
#pragma once

#include <cstdint>

#include "core/detmath.h"

namespace dsuf::det {

// PTX prmt.b32 (generic mode): d byte n = byte (c >> 4n) & 7 of {b, a} (a bytes 0-3, b bytes 4-7),
// or, when bit 3 of that selector nibble is set, that byte's bit 7 replicated; c's bits 16-31 unused.
DSUF_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  const uint64_t src = (uint64_t(b) << 32) | a;
  uint32_t d = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t ctl = (c >> (4 * n)) & 0xfu;
    uint32_t byte = uint32_t(src >> (8 * (ctl & 7u))) & 0xffu;
    if (ctl & 8u) byte = (byte & 0x80u) ? 0xffu : 0u;
    d |= byte << (8 * n);
  }
  return d;
#endif
}

#if !defined(__CUDA_ARCH__)
// Byte n of v, zero- or sign-extended.
inline int32_t byte_u(uint32_t v, int n) { return int32_t((v >> (8 * n)) & 0xffu); }
inline int32_t byte_s(uint32_t v, int n) { return int32_t(int8_t(uint8_t(v >> (8 * n)))); }
#endif

// PTX dp4a: c + Σ_n a.byte[n]·b.byte[n] modulo 2^32; .u32.u32 (both unsigned), .s32.u32 (a signed,
// b unsigned), .s32.s32 (both signed).
template <bool SignedA, bool SignedB>
DSUF_HD uint32_t dp4a(uint32_t a, uint32_t b, uint32_t c) {
  static_assert(SignedA || !SignedB, "dp4a: only u32.u32, s32.u32 and s32.s32 are used");
#if defined(__CUDA_ARCH__)
  uint32_t d;
  if constexpr (SignedB)
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  else if constexpr (SignedA)
    asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  else
    asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  int64_t s = 0;
  for (int n = 0; n < 4; ++n)
    s += int64_t(SignedA ? byte_s(a, n) : byte_u(a, n)) * (SignedB ? byte_s(b, n) : byte_u(b, n));
  return c + uint32_t(uint64_t(s));
#endif
}
DSUF_HD uint32_t dp4a_uu(uint32_t a, uint32_t b, uint32_t c) { return dp4a<false, false>(a, b, c); }
DSUF_HD uint32_t dp4a_su(uint32_t a, uint32_t b, uint32_t c) { return dp4a<true, false>(a, b, c); }
DSUF_HD uint32_t dp4a_ss(uint32_t a, uint32_t b, uint32_t c) { return dp4a<true, true>(a, b, c); }

// The two permute tables, byte i for the magnitude code i (|c| = 0, .5, 1, 1.5, 2, 3, 4, 6).
struct Fp4Tables {
  uint32_t pos_lo = 0x06040200u, pos_hi = 0x18100C08u;  // 2·|2c|: 0 2 4 6 | 8 12 16 24 (sign bits 0)
  uint32_t neg_lo = 0xFDFEFF00u, neg_hi = 0xF4F8FAFCu;  // −|2c|: 0 −1 −2 −3 | −4 −6 −8 −12
};

// The byte planes of X: lo and mid unsigned, hi signed.
DSUF_HD uint8_t x512_plane(int32_t X, int p) { return uint8_t(uint32_t(X >> (8 * p)) & 0xffu); }

// Per-plane accumulators of one block (modulo 2^32).
struct Fp4Acc {
  uint32_t lo = 0, mid = 0, hi = 0;
};

// 4 weights (selector nibbles in sel's low 16 bits; the high bits are ignored) against the matching
// plane words (byte n of each: the activation of weight n).
DSUF_HD void fp4_act_x4(uint32_t sel, uint32_t xlo, uint32_t xmid, uint32_t xhi, Fp4Acc& acc,
                        const Fp4Tables& t = Fp4Tables{}) {
  const uint32_t p = prmt(t.pos_lo, t.pos_hi, sel);
  const uint32_t n = prmt(t.neg_lo, t.neg_hi, sel & 0x7777u);
  acc.lo = dp4a_su(n, xlo, dp4a_uu(p, xlo, acc.lo));
  acc.mid = dp4a_su(n, xmid, dp4a_uu(p, xmid, acc.mid));
  acc.hi = dp4a_ss(n, xhi, dp4a_ss(p, xhi, acc.hi));
}

// S of the block from its accumulators.
DSUF_HD int32_t fp4_act_isum(const Fp4Acc& a) { return int32_t(a.lo + (a.mid << 8) + (a.hi << 16)); }

// A whole block the way the kernel computes it: w the 16 weight bytes as 4 words (little-endian),
// lo/mid/hi the planes as 8 words each (word m: the activations of weights 4m..4m+3).
DSUF_HD int32_t fp4_act_block_isum_dp4a(const uint32_t* w, const uint32_t* lo, const uint32_t* mid,
                                        const uint32_t* hi, const Fp4Tables& t = Fp4Tables{}) {
  Fp4Acc acc;
  for (int m = 0; m < 8; ++m) fp4_act_x4(w[m / 2] >> (16 * (m % 2)), lo[m], mid[m], hi[m], acc, t);
  return fp4_act_isum(acc);
}

// ---- The integer-MMA form: mma.m16n8k32.row.col.s32.s8.u8 (16 weight rows a block) ------------
// One MMA takes 16 weight rows' 32-blocks as A (s8) and the block's input planes as B's columns
// (u8): column 0 lo, 1 mid, 2 hi + 4 (B is unsigned and hi ∈ [−4, 3]: fp4_mma_hi4), 3 all ones, to
// take the +4 back out (S = S_lo + 2^8·S_mid + 2^16·(S_hi4 − 4·S_1): fp4_mma_isum); 4..7 zero. A
// block's S is exact in any order of its products, so the MMA's k runs over the nibbles in the
// order that suits a lane: quad position q (lane % 4) holds MMA k = 4q..4q+3 in its A registers 0/1
// and B register 0, and k = 16+4q..16+4q+3 in A registers 2/3 and B register 1. They are taken to be
// nibbles 8q..8q+3 and 8q+4..8q+7: the low and high halves of the block's 32-bit word q, and plane
// bytes 8q..8q+7 (one 8-byte load). As in the dp4a form the weights go in as two matrices, P = 2·|2c|
// for non-negative codes (0 for negative ones) and N = −|2c| for all, P + N = 2c: two MMAs a block.
// A registers of lane (g = lane / 4, q): 0 row g low half, 1 row g+8 low half, 2 row g high half,
// 3 row g+8 high half (the PTX fragment layout of m16n8k32 for 8-bit A).
struct Fp4MmaA {
  uint32_t pos[4], neg[4];
};
DSUF_HD void fp4_mma_a(uint32_t word_g, uint32_t word_g8, Fp4MmaA& a, const Fp4Tables& t = Fp4Tables{}) {
  const uint32_t sel[4] = {word_g, word_g8, word_g >> 16, word_g8 >> 16};  // prmt reads the low 16 bits
  for (int i = 0; i < 4; ++i) {
    a.pos[i] = prmt(t.pos_lo, t.pos_hi, sel[i]);
    a.neg[i] = prmt(t.neg_lo, t.neg_hi, sel[i] & 0x7777u);
  }
}
// The same A as one signed matrix (one MMA instead of two): per byte ((P | 0x80) − M) ^ 0x80 with
// P the pos table's byte (2·|2c| or 0) and M = |2c| — never a borrow, since P | 0x80 ≥ 0x80 > M —
// which is P − M = P + N as s8: 2c. For the prefill kernel, whose A serves four MMAs.
struct Fp4MagTable {
  uint32_t lo = 0x03020100u, hi = 0x0C080604u;  // |2c|: 0 1 2 3 | 4 6 8 12
};
DSUF_HD void fp4_mma_a_signed(uint32_t word_g, uint32_t word_g8, uint32_t (&a)[4], const Fp4Tables& t = Fp4Tables{},
                              const Fp4MagTable& m = Fp4MagTable{}) {
  const uint32_t sel[4] = {word_g, word_g8, word_g >> 16, word_g8 >> 16};
  for (int i = 0; i < 4; ++i) {
    const uint32_t P = prmt(t.pos_lo, t.pos_hi, sel[i]), M = prmt(m.lo, m.hi, sel[i] & 0x7777u);
    a[i] = ((P | 0x80808080u) - M) ^ 0x80808080u;
  }
}
// The prefill kernel's B columns for a pair of input rows r0, r1 (column n: lane group n supplies it):
// 0 r0 lo, 1 r0 mid, 2 r1 lo, 3 r1 mid, 4 r0 hi + 4, 5 ones, 6 r1 hi + 4, 7 zeros. plane < 0: a
// constant column (ones for 5, zeros for 7). Then lane (g, q) of the D fragment holds columns 2q and
// 2q+1 of rows g and g+8: q = 0 r0's lo/mid, 1 r1's lo/mid, 2 r0's hi+4 and the ones, 3 r1's hi+4.
struct Fp4PairColumn {
  int row, plane;
};
DSUF_HD Fp4PairColumn fp4_pair_column(int n) {
  return {n == 2 || n == 3 || n == 6 ? 1 : 0, n < 4 ? n % 2 : (n == 4 || n == 6) ? 2 : -1};
}
// hi + 4 in each byte (hi ∈ [−4, 3] as s8 → [0, 7]; no byte carries into the next).
DSUF_HD uint32_t fp4_mma_hi4(uint32_t v) { return ((v & 0x7f7f7f7fu) + 0x04040404u) ^ (v & 0x80808080u); }
// One row's S from its four column sums (modulo 2^32, like fp4_act_isum; S fits int32).
DSUF_HD int32_t fp4_mma_isum(uint32_t s_lo, uint32_t s_mid, uint32_t s_hi4, uint32_t s_one) {
  return int32_t(s_lo + (s_mid << 8) + ((s_hi4 - 4u * s_one) << 16));
}

// ---- k_fp4_imma: a stage of two K-blocks in one accumulator --------------------------------------
// B's columns 0-3 hold the first K-block's lo, mid, hi + 4 and ones, columns 4-7 the second's (each
// block's MMAs see zeros in the other half), so lane (g, q) of D holds K-block q / 2's columns
// 2·(q mod 2) and 2·(q mod 2) + 1 for rows g (registers 0, 1) and g + 8 (registers 2, 3). Its term of
// fp4_mma_isum, modulo 2^32: F·(d0 + k·d1) — lo + 2^8·mid for even q (k = 2^8, F = 1), 2^16·(hi4 −
// 4·ones) for odd q (k = −4, F = 2^16). A lane takes its two rows' partials u = d0 + k·d1, sends the
// partner's row's times F, and ends with its own row's as F·u + the partner's: one multiply-add
// fewer than forming both terms first (v34).
struct Fp4ImmaFactors {
  uint32_t k, F;
};
DSUF_HD Fp4ImmaFactors fp4_imma_factors(int odd_q) { return {odd_q ? uint32_t(-4) : 256u, odd_q ? 65536u : 1u}; }
DSUF_HD uint32_t fp4_imma_partial(uint32_t d0, uint32_t d1, Fp4ImmaFactors f) { return d0 + d1 * f.k; }
// The block sum lane (g, q) ends with — row g + 8·(q mod 2), K-block q / 2 — from its partials u_g
// (row g) and u_g8 (row g + 8) and `partner`, the value lane q ^ 1 sent: fp4_imma_send.
DSUF_HD uint32_t fp4_imma_send(uint32_t u_g, uint32_t u_g8, int odd_q, Fp4ImmaFactors f) {
  return (odd_q ? u_g : u_g8) * f.F;
}
DSUF_HD int32_t fp4_imma_isum(uint32_t u_g, uint32_t u_g8, int odd_q, Fp4ImmaFactors f, uint32_t partner) {
  return int32_t((odd_q ? u_g8 : u_g) * f.F + partner);
}
// warp_sum's xor tree (offsets 16, 8, 4, 2, 1) over 32 class sums, of which one lane holds the 16 of
// one parity h (acc[s]: class 2s + h): levels 16, 8, 4 and 2 stay inside the lane; this is its value
// before level 1, which adds the other parity's (lane q ^ 2 in k_fp4_imma).
DSUF_HD float fp4_imma_tree(const float (&acc)[16]) {
  float a8[8], b4[4];
  for (int s = 0; s < 8; ++s) a8[s] = acc[s] + acc[s + 8];
  for (int s = 0; s < 4; ++s) b4[s] = a8[s] + a8[s + 4];
  return (b4[0] + b4[2]) + (b4[1] + b4[3]);
}

// k_fp4_imma's staged inputs, padded so that a lane's B registers of a stage are one 16-byte shared
// load with the zeros in place: stage st's 512 bytes hold lane L = 4g + q's b0, b1, c0, c1 at L·16 —
// for g < 4 plane g of K-block 2·st (bytes 8q..8q+7) then 8 zero bytes, for g ≥ 4 8 zero bytes then
// plane g − 4 of K-block 2·st + 1 (the stage's B columns 0-3 and 4-7, each MMA pair seeing zeros in
// the other half). The byte offset of plane p's 8-byte piece q of K-block kb (its zeros at offset ^ 8):
DSUF_HD int fp4_imma_bpos(int kb, int p, int q) { return (kb / 2) * 512 + (4 * (4 * (kb % 2) + p) + q) * 16 + (kb % 2) * 8; }
// k_fp4_imma's merged pair (kMerged, session 23): two input rows of one expert in one MMA's columns —
// B column g is plane g mod 4 of input row g / 4 — and a stage's two K-blocks in two accumulators (the
// first MMA pair reads bytes 0-7 of the lane's 16, the second bytes 8-15), so no zeros are staged and
// one 16-byte load serves both rows. Lane (g, q) of the first accumulator then holds input row q / 2's
// sums of the stage's first K-block (fp4_imma_isum's algebra, unchanged), the second accumulator its
// second K-block's. The byte offset of row rr's plane p piece q of K-block kb:
DSUF_HD int fp4_imma_pair_bpos(int rr, int kb, int p, int q) {
  return (kb / 2) * 512 + (4 * (4 * rr + p) + q) * 16 + (kb % 2) * 8;
}

// ---- k_fp4_imma<…, true>'s weight layout (DSUF_FP4=tiled) -------------------------------------------
// An E2M1 matrix of `rows` rows (a multiple of 16) and nb K-blocks (even) as tiles of 16 rows × 2
// K-blocks, 512 bytes each, tile (t, st) at (t·nb/2 + st)·512, so that a warp's 16 rows stream as one
// contiguous run; inside a tile, lane L = 4g + q's 16 bytes hold word q (bytes 4q..4q+3) of row g and
// row g + 8 of K-block 2st, then of K-block 2st + 1 — the registers ldmatrix.x4 hands k_fp4_imma's
// lane, so one 16-byte load a lane replaces the shared-memory ring. The offset of byte `byte` of row
// `row` in the checkpoint's row-major layout:
DSUF_HD int64_t fp4_tiled_offset(int64_t row, int64_t byte, int64_t nb) {
  const int64_t t = row / 16, r = row % 16, kb = byte / 16, q = (byte % 16) / 4;
  const int64_t reg = r / 8 + 2 * (kb % 2);
  return (t * (nb / 2) + kb / 2) * 512 + (4 * (r % 8) + q) * 16 + reg * 4 + byte % 4;
}
// Whether a linear of `out` rows and K inputs can take the tiled layout (and k_fp4_imma<…, true>):
// whole tiles, the scale codes in 4-byte pieces (nb % 4), and at most 256 K-blocks of staged inputs.
DSUF_HD bool fp4_tileable(int64_t out, int64_t K) {
  const int64_t nb = K / 32;
  return out > 0 && out % 16 == 0 && K % 32 == 0 && nb % 4 == 0 && nb <= 256;
}

}  // namespace dsuf::det
