// Token sampling from FP32 logits: greedy at temperature 0, else temperature, top-k and top-p
// (nucleus) with a per-request seeded generator.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace dsuf {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;
  int top_k = 0;             // 0: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

// Index of the largest logit, the lowest index on ties.
int32_t argmax(std::span<const float> logits);

}  // namespace dsuf
