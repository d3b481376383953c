// The tiny V4.1 checkpoint (model-spec §6.2) in the exact official layout, with deterministic
// random weights: sharded safetensors + index, FP8 32×32 weights with E8M0 scales, packed FP4
// experts, Engram tables, DSpark stage and vision tensors, config/generation/tokenizer files.
#pragma once

#include <cstdint>
#include <string>

namespace dsuf {

struct TinyOptions {
  std::string out_dir;
  uint64_t seed = 1;
  int num_shards = 4;
  std::string tokenizer_dir;  // holds tokenizer.json and tokenizer_config.json
};

void write_tiny_checkpoint(const TinyOptions& opt);

}  // namespace dsuf
