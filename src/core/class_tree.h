// The reference GEMV's reduction order, reproduced by one thread that owns whole sums.
//
// The CUDA GEMVs (and the CPU reference, which mirrors them) reduce an output's K-blocks as a warp:
// lane l adds the parts of K-blocks kb ≡ l (mod 32) in order, starting from 0, and the 32 lane sums
// are added by warp_sum's xor tree, lane 0's result being ((a₀ + a₁₆) + (a₈ + a₂₄)) + … . A tiled
// kernel whose thread owns a whole sum (k_fp8_gemm, k_fp4_mma_rows) gets the same bits by visiting
// the lane classes in 5-bit bit-reversed order (0, 16, 8, 24, 4, …) and pushing each finished class
// sum onto a binary-counter stack of 5 levels: every push of an odd position adds the pair the tree
// adds at that level, the earlier operand first. Empty classes (nb < 32) are pushed as 0, as their
// lanes hold 0. Host and device share this code, so the host tests run the kernels' own logic.
#pragma once

#include <cstdint>

#include "core/detmath.h"

#if defined(__CUDA_ARCH__)
#define DSUF_UNROLL _Pragma("unroll")
#else
#define DSUF_UNROLL
#endif

namespace dsuf::det {

// The lane class visited i-th.
DSUF_HD int class_lane(int i) {
#if defined(__CUDA_ARCH__)
  return int(__brev(unsigned(i)) >> 27);
#else
  int r = 0;
  for (int b = 0; b < 5; ++b) r |= ((i >> b) & 1) << (4 - b);
  return r;
#endif
}

// A position in the visiting order of a row of nb K-blocks: class i, round q (K-block lane + 32q).
struct ClassCursor {
  int i = 0, q = 0;  // class 0 (lane 0) always has K-block 0
};
DSUF_HD int class_kb(ClassCursor c) { return class_lane(c.i) + 32 * c.q; }
// The first class after i that has a K-block (32: none).
DSUF_HD int next_class(int i, int nb) {
  do ++i;
  while (i < 32 && class_lane(i) >= nb);
  return i;
}
DSUF_HD ClassCursor class_advance(ClassCursor c, int nb) {
  if (class_lane(c.i) + 32 * (c.q + 1) < nb) return ClassCursor{c.i, c.q + 1};
  return ClassCursor{next_class(c.i, nb), 0};
}

// N independent sums: acc takes the current class's K-block parts (acc[e] += c, in order), push(i)
// ends class i. After class 31 acc holds the totals.
template <int N>
struct ClassTree {
  float acc[N], st[5][N];
  DSUF_HD ClassTree() {
    DSUF_UNROLL
    for (int e = 0; e < N; ++e) acc[e] = 0.0f;
#if !defined(__CUDA_ARCH__)  // never read before written; zeroed on the host for the compiler's sake
    for (auto& level : st)
      for (float& v : level) v = 0.0f;
#endif
  }
  DSUF_HD void push(int i) {
    bool carry = true;
    DSUF_UNROLL
    for (int lev = 0; lev < 5; ++lev) {
      if (carry) {
        if ((i >> lev) & 1) {
          DSUF_UNROLL
          for (int e = 0; e < N; ++e) acc[e] = st[lev][e] + acc[e];
        } else {
          DSUF_UNROLL
          for (int e = 0; e < N; ++e) st[lev][e] = acc[e];
          carry = false;
        }
      }
    }
    if (i < 31) {  // class 31 leaves the total in acc
      DSUF_UNROLL
      for (int e = 0; e < N; ++e) acc[e] = 0.0f;
    }
  }
};

}  // namespace dsuf::det
