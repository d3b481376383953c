// The tiny V4.1 checkpoint (model-spec §6.2) in the exact official layout, with deterministic
// random weights: sharded safetensors + index, FP8 32×32 weights with E8M0 scales, packed FP4
// experts, Engram tables, DSpark stage and vision tensors, config/generation/tokenizer files.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace dsuf {

struct TinyOptions {
  std::string out_dir;
  uint64_t seed = 1;
  int num_shards = 4;
  std::string tokenizer_dir;  // holds tokenizer.json and tokenizer_config.json
  // "tiny": model-spec §6.2. "real-dims": every per-layer dimension of the real V4.1-Flash (hidden
  // 5120, 64 heads × 512, rope 64, q rank 1280, o 8 × 1024, MXFP4 experts 2304 wide, indexer 32 × 128,
  // window 128, Engram 8 heads × 256) with 4 layers (ratios 0, 2, 1, 1: every role), 8 experts
  // (top 6), a 16384-token vocabulary and small Engram tables — the shapes the kernels meet, small
  // enough to write and to run on the CPU reference. "tiny-long": the tiny model with a
  // 131072-token context, for long-prompt benchmarks (conversation cache).
  std::string variant = "tiny";
};

// The JSON config of a variant (throws on an unknown name).
nlohmann::json variant_config_json(const std::string& variant);

void write_tiny_checkpoint(const TinyOptions& opt);

}  // namespace dsuf
