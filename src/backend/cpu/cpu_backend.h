// The CPU reference backend: the executable form of model-spec §3/§3b for DeepSeek-V4.1. Plain,
// single-precision C++ that follows the official numerics (FP8 activation quantization before every
// FP8/FP4 linear, KV stored fake-quantized in its packed form, FP32 routers/compressors/mHC). It is
// the yardstick the CUDA backend is checked against, so clarity wins over speed.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/engram.h"
#include "model/weights.h"

namespace dsuf {

// Switches for comparing against implementations that omit some of the reference's quantization
// steps (transformers' deepseek_v41, for one). The defaults are the reference numerics.
struct CpuNumerics {
  bool act_quant = true;        // FP8 activation quantization before FP8/FP4 linears
  bool bf16_activations = true;  // round every stored activation to BF16 (off: FP32 throughout)
  bool kv_quant = true;         // window FP8, compressed-KV FP4, indexer key/query FP4 fake-quant
  bool shared_expert_clamp = false;  // SwiGLU clamp on the shared expert ([open], see docs/numerics.md)
  bool wo_a_act_quant = false;  // grouped o-projection: BF16 einsum (reference) or FP8 linear
};

// transformers' deepseek_v41 run in FP32 (docs/transformers-v41.md §3).
inline CpuNumerics transformers_numerics() {
  return {.act_quant = false, .bf16_activations = false, .kv_quant = true, .shared_expert_clamp = true};
}

class CpuBackend final : public Backend {
 public:
  // `compressed_ids` maps every token id to its Engram compressed id (text/engram_ids or the shipped
  // table). `threads` bounds the worker threads used for the largest products (head, experts).
  CpuBackend(const LoadedModel& model, std::vector<int32_t> compressed_ids, CpuNumerics numerics = {},
             int threads = 0);
  ~CpuBackend() override;

  const ModelConfig& config() const override { return model_.config; }
  const KvLayout& layout() const override { return layout_; }
  SequenceState new_sequence() const override;
  void forward(std::span<ForwardItem> batch) override;

  const CpuNumerics& numerics() const { return numerics_; }

 private:
  struct Chunk;
  void forward_one(ForwardItem& item);
  void engram(int layer, Chunk& c);
  void attention(int layer, Chunk& c, const float* x, float* out);
  void moe(int layer, const BlockWeights& w, int n_experts, int top_k, const float* x, bool image_token,
           float* out) const;

  const LoadedModel& model_;
  KvLayout layout_;
  std::vector<int32_t> compressed_ids_;
  CpuNumerics numerics_;
  int threads_;
  std::unique_ptr<EngramHasher> hasher_;
  // RoPE inverse frequencies, FP32 as the reference computes them: main (θ=rope_theta) and
  // compress (θ=compress_rope_theta with YaRN).
  std::vector<float> inv_freq_main_, inv_freq_compress_;
};

}  // namespace dsuf
