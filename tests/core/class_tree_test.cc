// The visiting order and stack of core/class_tree.h (k_fp8_gemm, k_fp4_mma_rows) against the GEMV's
// reduction as the reference computes it: per lane l the parts of K-blocks l, l+32, … added in order
// from 0, then warp_sum's xor tree (lane 0's value). Bit for bit, for every row length the kernels
// meet and more, on values whose sums round differently in another order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/class_tree.h"

namespace dsuf {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The GEMV: lane sums in order, then the xor tree (o = 16, 8, 4, 2, 1: v_l ← v_l + v_{l^o}).
float warp_reference(const std::vector<float>& c) {
  float v[32];
  for (int l = 0; l < 32; ++l) {
    v[l] = 0.0f;
    for (size_t kb = size_t(l); kb < c.size(); kb += 32) v[l] = v[l] + c[kb];
  }
  for (int o = 16; o > 0; o >>= 1) {
    float n[32];
    for (int l = 0; l < 32; ++l) n[l] = v[l] + v[l ^ o];
    std::memcpy(v, n, sizeof v);
  }
  return v[0];
}

// The kernels' loop (k_fp8_gemm, k_fp4_mma_rows): a cursor over the visiting order, a push at each
// class end (and for the empty classes up to the next).
float cursor_path(const std::vector<float>& c) {
  const int nb = int(c.size());
  det::ClassTree<1> tree;
  det::ClassCursor cur;
  for (int t = 0; t < nb; ++t) {
    tree.acc[0] += c[size_t(det::class_kb(cur))];
    const det::ClassCursor nx = det::class_advance(cur, nb);
    const bool more = t + 1 < nb;
    if (nx.i != cur.i || !more) {
      tree.push(cur.i);
      for (int i = cur.i + 1; i < (more ? nx.i : 32); ++i) tree.push(i);
    }
    cur = nx;
  }
  return tree.acc[0];
}

std::vector<float> parts(std::mt19937& g, int nb) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-30, 30);
  std::vector<float> c(static_cast<size_t>(nb));
  for (auto& x : c) x = std::ldexp(u(g), e(g));  // wide magnitudes: the order decides the rounding
  return c;
}

TEST(ClassTree, EveryRowLengthEqualsTheWarpReduction) {
  std::mt19937 g(97);
  for (int nb = 1; nb <= 400; ++nb)
    for (int rep = 0; rep < 8; ++rep) {
      const std::vector<float> c = parts(g, nb);
      const uint32_t want = bits(warp_reference(c));
      ASSERT_EQ(bits(cursor_path(c)), want) << "nb " << nb << ", set " << rep;
    }
}

TEST(ClassTree, CursorVisitsEveryBlockOnceInItsClass) {
  for (int nb : {1, 4, 31, 32, 33, 72, 160, 384}) {
    std::vector<int> seen(static_cast<size_t>(nb), 0);
    det::ClassCursor c;
    for (int t = 0; t < nb; ++t) {
      const int kb = det::class_kb(c);
      ASSERT_LT(kb, nb) << "nb " << nb << ", step " << t;
      ++seen[size_t(kb)];
      EXPECT_EQ(det::class_lane(c.i), kb % 32) << "nb " << nb << ", step " << t;
      c = det::class_advance(c, nb);
    }
    EXPECT_EQ(c.i, 32) << "nb " << nb << ": the cursor ends past the last class";
    for (int kb = 0; kb < nb; ++kb) EXPECT_EQ(seen[size_t(kb)], 1) << "nb " << nb << ", K-block " << kb;
  }
}

// The test can fail: lane order 0, 1, 2, … (no bit reversal) with the same stack adds other pairs.
TEST(ClassTree, NaturalClassOrderDiffers) {
  std::mt19937 g(5);
  int differ = 0;
  for (int rep = 0; rep < 200; ++rep) {
    const std::vector<float> c = parts(g, 128);
    det::ClassTree<1> tree;
    for (int l = 0; l < 32; ++l) {
      for (int kb = l; kb < 128; kb += 32) tree.acc[0] += c[size_t(kb)];
      tree.push(l);
    }
    differ += bits(tree.acc[0]) != bits(warp_reference(c));
  }
  EXPECT_GT(differ, 100);
}

}  // namespace
}  // namespace dsuf
