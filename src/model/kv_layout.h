// KvLayout: the per-sequence decode state of V4.1 (model-spec §4.2), computed once from the plan,
// and SequenceState, one sequence's pools in their packed (lossless) formats:
//
//   window ring, every layer      W slots × (head_dim E4M3 + head_dim/32 E8M0)      slot = pos mod W
//   shared compressed KV, per     one entry per `ratio` tokens: head_dim/2 bytes of packed E2M1
//     KV source                   + head_dim/16 E4M3 scales                          (§3b.2 step 3)
//   indexer keys, per KV source   one per entry: index_head_dim/2 packed E2M1 + index_head_dim/32 E8M0
//   compressor partial window     (pos mod ratio) buffered tokens of the pre-pooling a‖g (FP32)
//   Engram history                compressed ids of the last max_ngram−1 tokens (−1: none / DEAD)
//
// Every stored value is already the fake-quantized value the model computes with, so the packed form
// loses nothing. One versioned binary format serializes a SequenceState (conversation cache, transfers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"

namespace dsuf {

struct KvLayout {
  static constexpr uint32_t kVersion = 1;
  int num_layers = 0;
  int window = 0;                 // sliding_window
  int head_dim = 0;
  int index_head_dim = 0;
  int history = 0;                // engram_max_ngram_size − 1
  size_t window_entry_bytes = 0;  // head_dim + head_dim/32
  size_t ckv_entry_bytes = 0;     // head_dim/2 + head_dim/16
  size_t ikey_entry_bytes = 0;    // index_head_dim/2 + index_head_dim/32
  std::vector<int> kv_sources;    // layer ids owning a compressor, in order
  std::vector<int> source_slot;   // per layer: index into kv_sources of its KV source, −1 if none
  std::vector<int> source_ratio;  // per KV source
  uint64_t fingerprint = 0;       // hash of everything above; a state only loads into its own layout

  static KvLayout from_config(const ModelConfig& cfg);
  // Packed bytes a sequence of `tokens` tokens holds (for admission and the memory plan).
  size_t bytes_for(int64_t tokens) const;
};

struct SequenceState {
  int64_t pos = 0;                              // tokens consumed so far
  std::vector<std::vector<uint8_t>> window;     // [layer] W × window_entry_bytes
  std::vector<std::vector<uint8_t>> ckv;        // [kv source] entries × ckv_entry_bytes
  std::vector<std::vector<uint8_t>> ikey;       // [kv source] entries × ikey_entry_bytes
  std::vector<std::vector<float>> pending;      // [kv source] (pos mod ratio) × 2·head_dim
  std::vector<int32_t> engram_history;          // [history]: c_{pos−1}, c_{pos−2}, ...; −1 = none

  // Parity mode only (a backend told to skip the KV quantization, to compare with implementations
  // that skip it): the same pools unquantized, in FP32. Never serialized.
  bool unquantized = false;
  std::vector<std::vector<float>> window_f32, ckv_f32, ikey_f32;

  // A backend that keeps the pools elsewhere (GPU memory) hangs its handle here; the host pools
  // above are then filled only on request (Backend::download).
  std::shared_ptr<void> device;

  static SequenceState empty(const KvLayout& layout);
  int64_t entries(const KvLayout& layout, int slot) const {
    return static_cast<int64_t>(ckv[slot].size() / layout.ckv_entry_bytes);
  }

  // Versioned binary form: magic, version, layout fingerprint, then every pool.
  std::string serialize(const KvLayout& layout) const;
  // Throws dsuf::Error naming what does not match (magic, version, layout, truncation, sizes).
  static SequenceState deserialize(const KvLayout& layout, const std::string& bytes);
};

}  // namespace dsuf
