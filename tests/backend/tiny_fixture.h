// Shared access to the tiny checkpoint (written by the make_tiny_checkpoint CTest fixture) and a
// CPU backend over it, loaded once per test binary.
#pragma once

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "model/weights.h"

namespace dsuf::testing {

inline std::string tiny_dir() {
  const char* d = std::getenv("DSUF_TINY_CKPT");
  return d ? d : "build/test-tiny-ckpt";
}

inline const std::vector<int32_t>& compressed_ids() {
  static const std::vector<int32_t> ids =
      read_compressed_id_table(std::string(DSUF_SOURCE_DIR) + "/assets/tokenizer/engram-compressed-ids.txt");
  return ids;
}

inline const LoadedModel& tiny_model() {
  static std::unique_ptr<LoadedModel> m = load_model(tiny_dir());
  return *m;
}

// Random prompt over ordinary token ids, with a few image-span ids (DEAD for Engram, bias_vl routing).
inline std::vector<int32_t> random_prompt(size_t n, uint32_t seed, bool with_image_tokens = true) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, 127999);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = id(rng);
  if (with_image_tokens && n > 40) {
    const int32_t img = tiny_model().config.image_token_id;
    v[20] = v[21] = v[22] = img;
    v[n / 2] = img;
  }
  return v;
}

}  // namespace dsuf::testing
