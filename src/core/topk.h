// The indexer's top-k rule (model-spec §3b): the indices of the k largest finite scores, ties to the
// smaller index (an [open] rule, docs/numerics.md), sorted by (score desc, index asc). The CPU
// reference uses it (backend/cpu/cpu_backend.cc); the CUDA kernels (backend/cuda/kernels.cu
// k_top_k*) must agree with it, and tests/backend/topk_plan_test.cc checks the multi-block plan of
// backend/cuda/topk_plan.h against it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace dsuf {

inline std::vector<int32_t> top_k(const std::vector<float>& score, int64_t k) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < static_cast<int32_t>(score.size()); ++i)
    if (score[i] != kNegInf) idx.push_back(i);
  auto better = [&](int32_t a, int32_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); };
  if (static_cast<int64_t>(idx.size()) > k) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
    idx.resize(k);
  } else {
    std::sort(idx.begin(), idx.end(), better);
  }
  return idx;
}

}  // namespace dsuf
