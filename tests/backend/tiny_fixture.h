// Shared access to the tiny checkpoint (written by the make_tiny_checkpoint CTest fixture) and a
// CPU backend over it, loaded once per test binary.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "model/tiny.h"
#include "model/weights.h"

namespace dsuf::testing {

inline std::string source_dir();

// DSUF_TINY_CKPT (the CTest fixture writes it), or a copy written on first use under /tmp (for
// running a test binary by hand, e.g. on the GPU machine).
inline std::string tiny_dir() {
  if (const char* d = std::getenv("DSUF_TINY_CKPT")) return d;
  static const std::string dir = [] {
    std::string out = "/tmp/dsuf-tiny-ckpt-seed1";
    if (!std::filesystem::exists(out + "/config.json"))
      write_tiny_checkpoint({.out_dir = out, .seed = 1, .num_shards = 4, .tokenizer_dir = source_dir() + "/assets/tokenizer"});
    return out;
  }();
  return dir;
}

// The source tree: DSUF_SOURCE_DIR from the environment (a copy on another machine) or the build's.
inline std::string source_dir() {
  const char* d = std::getenv("DSUF_SOURCE_DIR");
  return d ? d : DSUF_SOURCE_DIR;
}

inline const std::vector<int32_t>& compressed_ids() {
  static const std::vector<int32_t> ids =
      read_compressed_id_table(source_dir() + "/assets/tokenizer/engram-compressed-ids.txt");
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

// Feeds `tokens` to `b` in chunks of the given sizes (cycled); returns the last position's logits.
inline std::vector<float> prefill_chunked(Backend& b, SequenceState& st, const std::vector<int32_t>& tokens,
                                          const std::vector<int>& sizes) {
  std::vector<float> logits;
  size_t i = 0, k = 0;
  while (i < tokens.size()) {
    const size_t n = std::min<size_t>(sizes[k++ % sizes.size()], tokens.size() - i);
    const bool last = i + n == tokens.size();
    ForwardItem item{.state = &st,
                     .tokens = std::span<const int32_t>(tokens.data() + i, n),
                     .want = last ? ForwardItem::Logits::kLast : ForwardItem::Logits::kNone,
                     .logits = &logits};
    b.forward({&item, 1});
    i += n;
  }
  return logits;
}

// A make-tiny variant's checkpoint, written once to default_dir (or $env) and loaded once per test
// binary (the caller keeps the static).
inline std::unique_ptr<LoadedModel> variant_model(const char* env_name, const std::string& default_dir,
                                                  const std::string& variant) {
  const char* env = std::getenv(env_name);
  const std::string dir = env ? env : default_dir;
  if (!std::filesystem::exists(dir + "/config.json"))
    write_tiny_checkpoint({.out_dir = dir, .seed = 1, .num_shards = 4,
                           .tokenizer_dir = source_dir() + "/assets/tokenizer", .variant = variant});
  return load_model(dir);
}

// The real V4.1 per-layer dimensions (dsuf make-tiny --variant real-dims): 4 layers with every role.
inline const LoadedModel& real_dims_model() {
  static std::unique_ptr<LoadedModel> m =
      variant_model("DSUF_REAL_DIMS_CKPT", "/tmp/dsuf-real-dims-seed1", "real-dims");
  return *m;
}

// The tiny model with a 131072-token context (dsuf make-tiny --variant tiny-long: the tiny weights,
// only the position limit differs).
inline const LoadedModel& tiny_long_model() {
  static std::unique_ptr<LoadedModel> m =
      variant_model("DSUF_TINY_LONG_CKPT", "/tmp/dsuf-tiny-long-seed1", "tiny-long");
  return *m;
}

// One forward of `toks` for one sequence; returns the logits asked for (`trace` as ForwardItem's).
inline std::vector<float> run(Backend& b, SequenceState& st, const std::vector<int32_t>& toks,
                              ForwardItem::Logits want, std::vector<std::vector<float>>* trace = nullptr) {
  std::vector<float> logits;
  ForwardItem item{.state = &st, .tokens = toks, .want = want, .logits = &logits, .trace = trace};
  b.forward({&item, 1});
  return logits;
}

}  // namespace dsuf::testing
