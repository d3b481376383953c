#include "core/sampling.h"

#include <vector>

#include "core/error.h"

namespace dsuf {

int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t draw) {
  const int64_t n = static_cast<int64_t>(logits.size());
  DSUF_CHECK(n >= 1 && n <= sampling::kMaxVocab, "sampling a row of ", n, " logits");
  const float* x = logits.data();
  const sampling::Best best = sampling::best_of(x, n);
  if (sampling::is_greedy(p, best.key)) return static_cast<int32_t>(best.index);
  const float m = sampling::key_value(best.key);
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[i] = sampling::weight(x[i], m, p.temperature);
  const int64_t t = sampling::draw_serial(x, w.data(), n, p, draw);
  return static_cast<int32_t>(t >= 0 ? t : best.index);
}

}  // namespace dsuf
