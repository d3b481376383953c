// Test rows for the top-k tests (topk_plan_test.cc on the CPU, cuda_topk_test.cc on the GPU): one
// generator, so that both check the same shapes of ties, infinities and short rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace dsuf::testing_topk {

// A fresh row of `count` entries of one of several shapes (no NaN, no −0: the reference compares
// floats, the kernels keys; they agree except on those).
inline std::vector<float> make_row(std::mt19937_64& rng, int64_t count, int shape, int k) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> x(static_cast<size_t>(count));
  std::uniform_int_distribution<int> small(0, 7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  auto neg_inf_runs = [&](int runs, int64_t max_len) {
    for (int r = 0; r < runs && count > 0; ++r) {
      const int64_t at = int64_t(rng() % uint64_t(count)), len = 1 + int64_t(rng() % uint64_t(max_len));
      for (int64_t j = at; j < std::min(count, at + len); ++j) x[size_t(j)] = -kInf;
    }
  };
  switch (shape) {
    case 0:  // values from a set of 8: every cut is a tie
      for (auto& v : x) v = 0.25f * float(small(rng));
      break;
    case 1:  // set of 8 with −inf runs
      for (auto& v : x) v = 0.25f * float(small(rng)) - 1.0f;
      neg_inf_runs(8, std::max<int64_t>(count / 6, 1));
      break;
    case 2:  // all equal
      for (auto& v : x) v = 1.5f;
      break;
    case 3:  // fewer eligible than k: −inf with a few finite values (some tied)
      for (auto& v : x) v = -kInf;
      for (int i = 0; i < k / 2 && count > 0; ++i) x[rng() % uint64_t(count)] = float(small(rng));
      break;
    case 4:  // continuous, with +inf entries (the block scores' newest block) and −inf runs
      for (auto& v : x) v = nd(rng);
      for (int i = 0; i < 3 && count > 0; ++i) x[rng() % uint64_t(count)] = kInf;
      neg_inf_runs(4, 1000);
      break;
    case 5:  // quantized normal: ties everywhere, a long tail of distinct values
      for (auto& v : x) v = std::round(nd(rng) * 16.0f) / 16.0f + 0.0f;  // + 0: no −0
      break;
    case 6:  // a large tie block right at the cut: k/3 top values distinct, then thousands equal
      for (auto& v : x) v = -3.0f + 0.001f * float(rng() % 100);
      for (int i = 0; i < k / 3 && count > 0; ++i) x[rng() % uint64_t(count)] = 10.0f + float(i);
      for (int i = 0; i < 4 * k && count > 0; ++i) x[rng() % uint64_t(count)] = 5.0f;
      break;
    case 7:  // candidate-constrained: −inf outside random blocks of 8 (k/4 blocks... 2048 at k = 512)
      for (auto& v : x) v = -kInf;
      for (int b = 0; b < 4 * k && count > 0; ++b) {
        const int64_t a = int64_t(rng() % uint64_t(count)) / 8 * 8;
        for (int64_t j = a; j < std::min(count, a + 8); ++j) x[size_t(j)] = 0.25f * float(small(rng));
      }
      break;
    default:  // all −inf
      for (auto& v : x) v = -kInf;
      break;
  }
  return x;
}

}  // namespace dsuf::testing_topk
