// Host-side sampling for tools and tests: a request's stream of draws over core/sampling.h. The
// engine itself never samples: the backend does (ForwardItem::token), with the same definition.
#pragma once

#include <cstdint>
#include <span>

#include "core/sampling.h"

namespace dsuf {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p) {}
  // Draw number draws() of the request: the token the engine would get from the backend there.
  int32_t sample(std::span<const float> logits) { return sample_token(logits, p_, draws_++); }
  uint64_t draws() const { return draws_; }

 private:
  SamplingParams p_;
  uint64_t draws_ = 0;
};

// Index of the largest logit, the lowest index on ties (core/sampling.h's order: −0 = +0, NaN
// lowest).
int32_t argmax(std::span<const float> logits);

}  // namespace dsuf
