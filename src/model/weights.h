// Typed views of a loaded checkpoint, in the checkpoint's own formats (no dequantized copies).
// The views point into the memory-mapped shards, which the Checkpoint owns; small F32 parameters
// (mHC, sinks, router biases) are copied out because safetensors does not align them.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/numerics.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace dsuf {

// Row-major BF16 matrix [rows, cols] (a vector when rows == 1).
struct Bf16Mat {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
  float at(int64_t r, int64_t c) const {
    uint16_t h;
    std::memcpy(&h, data + 2 * (r * cols + c), 2);
    return bf16_to_float(h);
  }
  float operator[](int64_t i) const { return at(0, i); }
  // Converts row r into out[0..cols).
  void row(int64_t r, float* out) const;
};

// FP8 E4M3 weight [out, in] with one E8M0 scale per 32×32 tile.
struct Fp8Linear {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;
  int64_t out = 0, in = 0;
  float scale_at(int64_t o, int64_t i) const { return e8m0_to_float(scale[(o / 32) * ((in + 31) / 32) + i / 32]); }
};

// FP4 E2M1 weight [out, in], two per byte (low nibble first), one E8M0 scale per 32 inputs.
struct Fp4Linear {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;
  int64_t out = 0, in = 0;
};

// FP8 rows with one E8M0 scale per 32 columns (Engram tables).
struct Fp8Rows {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr;
  int64_t rows = 0, cols = 0;
};

struct HcParams {
  std::vector<float> fn;     // [(2+n)·n, n·D]
  std::vector<float> base;   // [(2+n)·n]
  std::vector<float> scale;  // [3]
};

struct ExpertWeights {
  Fp4Linear w1, w2, w3;
};

struct MoeWeights {
  Bf16Mat gate;                      // [E, D]
  std::vector<float> bias, bias_vl;  // [E]
  std::vector<ExpertWeights> experts;
  Fp8Linear shared_w1, shared_w2, shared_w3;
};

struct AttnWeights {
  std::vector<float> sink;  // [H]
  Fp8Linear wq_a, wq_b, wkv, wo_a, wo_b;
  Bf16Mat q_norm, kv_norm;
  // KV sources only.
  Bf16Mat comp_wkv, comp_wgate, comp_norm, idx_wk, idx_k_norm;
  // Index sources only.
  Fp8Linear idx_wq_b;
  Bf16Mat idx_weights_proj;
};

struct EngramWeights {
  Fp8Rows table;
  Fp8Linear wkv;
  Bf16Mat q_weight, k_weight;  // [n, D]
};

struct BlockWeights {
  HcParams hc_attn, hc_ffn;
  Bf16Mat attn_norm, ffn_norm;
  AttnWeights attn;
  MoeWeights ffn;
  std::optional<EngramWeights> engram;
};

struct ModelWeights {
  Bf16Mat embed, head, norm;
  std::vector<BlockWeights> layers;
};

// A checkpoint opened, checked against the inventory of its config, and viewed.
struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;
  ModelWeights weights;
  std::vector<std::string> unknown_tensors;  // present in the checkpoint, not in the inventory
};

// Reads a compressed-id table (one id per line, line k = token k), as shipped in
// assets/tokenizer/engram-compressed-ids.txt. Errors name the file and line.
std::vector<int32_t> read_compressed_id_table(const std::string& path);

// Opens DIR/config.json and the safetensors shards, checks every tensor, builds the views.
std::unique_ptr<LoadedModel> load_model(const std::string& dir);

}  // namespace dsuf
