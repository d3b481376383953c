#include "engine/sampler.h"

#include "core/error.h"

namespace dsuf {

int32_t argmax(std::span<const float> logits) {
  DSUF_CHECK(!logits.empty(), "argmax of no logits");
  return static_cast<int32_t>(
      sampling::best_of(logits.data(), static_cast<int64_t>(logits.size())).index);
}

}  // namespace dsuf
