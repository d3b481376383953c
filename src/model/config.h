// ModelConfig: the composite DeepSeek-V4.1 config.json (model-spec §1.2) and the per-layer plan
// derived from it once (§3b.1). Kernels and the reference read the plan; nothing re-derives layer
// roles from layer numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsuf {

struct RopeScaling {
  std::string type = "yarn";
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;
};

struct TextConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t moe_intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 1;
  int head_dim = 0;
  int qk_rope_head_dim = 0;
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int o_groups = 0;
  double swiglu_limit = 0.0;
  double rms_norm_eps = 0.0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 0.0;
  double compress_rope_theta = 0.0;
  RopeScaling rope_scaling;
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  std::string scoring_func;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double gate_temp = 1.0;
  int sliding_window = 0;
  std::vector<int> compress_ratios;  // num_hidden_layers + num_nextn_predict_layers entries
  std::vector<int> kv_source_layer_ids;
  std::vector<int> index_source_layer_ids;
  int candidate_source_layer_id = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  double hc_eps = 0.0;
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int engram_max_ngram_size = 0;
  int64_t engram_vocab_size = 0;
  int engram_n_heads = 0;
  int engram_head_dim = 0;
  int engram_pad_token_id = 0;
  int engram_compressed_vocab_size = 0;
  int num_nextn_predict_layers = 0;
  int dspark_block_size = 0;
  int dspark_noise_token_id = 0;
  std::vector<int> dspark_target_layer_ids;
  int dspark_markov_rank = 0;
  int dspark_n_routed_experts = 0;
  int dspark_num_experts_per_tok = 0;
};

struct VisionConfig {
  int num_hidden_layers = 0;
  int hidden_size = 0;
  int num_attention_heads = 0;
  int intermediate_size = 0;
  int patch_size = 0;
  double rope_theta = 0.0;
  int downsample_ratio = 0;
  int max_image_tokens = 0;
  int64_t min_pixels = 0;
};

struct QuantConfig {
  std::string quant_method;
  std::string activation_scheme;
  std::string scale_fmt;
  std::string expert_dtype;
  int block_out = 0;  // weight_block_size[0]
  int block_in = 0;   // weight_block_size[1]
};

// The roles of one backbone layer (model-spec §3b.1).
struct LayerPlan {
  int layer = 0;
  int ratio = 0;               // 0: window only; 2 or 1: shared compressed KV at that ratio
  bool compress_rope = false;  // θ=compress_rope_theta with YaRN (ratio > 0) vs main rope
  int kv_source = -1;          // layer whose compressed KV this layer attends; -1 for ratio 0
  bool owns_compressor = false;  // this layer is a KV source (compressor + indexer keys)
  int index_source = -1;       // layer whose top-k selection this layer attends; -1 for ratio 0
  bool runs_indexer = false;   // this layer is an index source
  bool candidate_source = false;       // runs the block-level (first) top-k
  bool candidate_constrained = false;  // scores only inside the candidate source's blocks
  int engram_slot = -1;        // index into engram_layer_ids, -1 if no Engram
  int dspark_target_slot = -1; // index into dspark_target_layer_ids, -1 if not a target
};

struct DsparkStagePlan {
  int stage = 0;
  bool first = false;  // holds main_proj / main_norm
  bool last = false;   // holds norm, markov_head, confidence_head
};

struct ModelConfig {
  std::string model_type;
  int bos_token_id = 0;
  int eos_token_id = 1;
  int pad_token_id = 2;
  int image_token_id = 0;
  TextConfig text;
  VisionConfig vision;
  QuantConfig quant;
  std::vector<LayerPlan> layers;     // derived, one per backbone layer
  std::vector<DsparkStagePlan> dspark;  // derived, one per draft stage
};

// Parses and validates; derives the plan. Errors name the source and the field.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source = "config.json");
ModelConfig load_model_config(const std::string& path);

// The §6.2 tiny configuration, as JSON (written by `dsuf make-tiny`).
nlohmann::json tiny_config_json();
// The released V4.1-Flash config (§1.2), as JSON: for plans, inventories and benchmarks at full size.
nlohmann::json real_v41_config_json();

}  // namespace dsuf
