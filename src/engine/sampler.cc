#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace dsuf {

int32_t argmax(std::span<const float> logits) {
  DSUF_CHECK(!logits.empty(), "argmax of no logits");
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (p_.temperature <= 0.0f) return argmax(logits);
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  size_t keep = idx.size();
  if (p_.top_k > 0) keep = std::min<size_t>(keep, static_cast<size_t>(p_.top_k));
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  idx.resize(keep);
  const double mx = logits[idx[0]];
  std::vector<double> prob(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp((logits[idx[i]] - mx) / p_.temperature));
  // Nucleus: the smallest prefix (by probability) whose mass reaches top_p.
  double mass = 0;
  size_t n = keep;
  for (size_t i = 0; i < keep; ++i) {
    mass += prob[i] / sum;
    if (mass >= p_.top_p) {
      n = i + 1;
      break;
    }
  }
  std::discrete_distribution<size_t> dist(prob.begin(), prob.begin() + n);
  return idx[dist(rng_)];
}

}  // namespace dsuf
