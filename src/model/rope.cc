#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace dsuf {

std::vector<float> rope_inv_freq(int dim, double base, const RopeScaling* yarn) {
  std::vector<float> f(dim / 2);
  for (int i = 0; i < dim / 2; ++i) f[i] = static_cast<float>(1.0 / std::pow(base, static_cast<double>(2 * i) / dim));
  if (!yarn) return f;
  auto corr_dim = [&](double rot) {
    return dim * std::log(yarn->original_max_position_embeddings / (rot * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = std::max(0.0, std::floor(corr_dim(yarn->beta_fast)));
  double high = std::min(static_cast<double>(dim - 1), std::ceil(corr_dim(yarn->beta_slow)));
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    f[i] = static_cast<float>(f[i] / yarn->factor * ramp + f[i] * (1.0 - ramp));
  }
  return f;
}

void rope_cos_sin(int64_t pos, const std::vector<float>& inv_freq, float* cs) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float ang = static_cast<float>(pos) * inv_freq[i];
    cs[2 * i] = std::cos(ang);
    cs[2 * i + 1] = std::sin(ang);
  }
}

}  // namespace dsuf
