#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsuf {
namespace {

using nlohmann::json;

// Reads fields of one JSON object, naming `source: path.field` in every error.
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string path)
      : obj_(obj), source_(std::move(source)), path_(std::move(path)) {
    if (!obj_.is_object()) fail(source_, ": ", path_.empty() ? "top level" : path_, " must be an object");
  }
  std::string where(const char* key) const { return source_ + ": " + (path_.empty() ? "" : path_ + ".") + key; }
  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& at(const char* key) const {
    if (!has(key)) fail(where(key), ": missing");
    return obj_.at(key);
  }
  int64_t i64(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_integer()) fail(where(key), ": expected an integer, got ", v.dump());
    return v.get<int64_t>();
  }
  int i32(const char* key) const {
    int64_t v = i64(key);
    if (v < INT32_MIN || v > INT32_MAX) fail(where(key), ": ", v, " is out of range");
    return static_cast<int>(v);
  }
  int i32_or(const char* key, int dflt) const { return has(key) ? i32(key) : dflt; }
  double f64(const char* key) const {
    const json& v = at(key);
    if (!v.is_number()) fail(where(key), ": expected a number, got ", v.dump());
    return v.get<double>();
  }
  double f64_or(const char* key, double dflt) const { return has(key) ? f64(key) : dflt; }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = at(key);
    if (!v.is_boolean()) fail(where(key), ": expected true or false, got ", v.dump());
    return v.get<bool>();
  }
  std::string str(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) fail(where(key), ": expected a string, got ", v.dump());
    return v.get<std::string>();
  }
  std::string str_or(const char* key, const std::string& dflt) const { return has(key) ? str(key) : dflt; }
  template <typename T>
  std::vector<T> ints(const char* key) const {
    const json& v = at(key);
    if (!v.is_array()) fail(where(key), ": expected a list of integers, got ", v.dump());
    std::vector<T> out;
    for (const auto& e : v) {
      if (!e.is_number_integer()) fail(where(key), ": expected a list of integers, got ", v.dump());
      out.push_back(static_cast<T>(e.get<int64_t>()));
    }
    return out;
  }
  Fields sub(const char* key) const {
    return Fields(at(key), source_, path_.empty() ? key : path_ + "." + key);
  }

 private:
  const json& obj_;
  std::string source_;
  std::string path_;
};

void require(bool ok, const Fields& f, const char* key, const std::string& what) {
  if (!ok) fail(f.where(key), ": ", what);
}

std::string list_str(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

TextConfig parse_text(const Fields& f) {
  TextConfig t;
  std::string mt = f.str("model_type");
  if (mt != "deepseek_v41_text")
    fail(f.where("model_type"), ": unknown model_type '", mt, "' (expected deepseek_v41_text)");
  t.vocab_size = f.i64("vocab_size");
  t.hidden_size = f.i64("hidden_size");
  t.moe_intermediate_size = f.i64("moe_intermediate_size");
  t.num_hidden_layers = f.i32("num_hidden_layers");
  t.num_attention_heads = f.i32("num_attention_heads");
  t.num_key_value_heads = f.i32_or("num_key_value_heads", 1);
  t.head_dim = f.i32("head_dim");
  t.qk_rope_head_dim = f.i32("qk_rope_head_dim");
  t.q_lora_rank = f.i64("q_lora_rank");
  t.o_lora_rank = f.i64("o_lora_rank");
  t.o_groups = f.i32("o_groups");
  t.swiglu_limit = f.f64("swiglu_limit");
  t.rms_norm_eps = f.f64("rms_norm_eps");
  t.max_position_embeddings = f.i64("max_position_embeddings");
  t.rope_theta = f.f64("rope_theta");
  t.compress_rope_theta = f.f64("compress_rope_theta");
  Fields rs = f.sub("rope_scaling");
  t.rope_scaling.type = rs.has("rope_type") ? rs.str("rope_type") : rs.str("type");
  t.rope_scaling.factor = rs.f64("factor");
  t.rope_scaling.beta_fast = rs.f64("beta_fast");
  t.rope_scaling.beta_slow = rs.f64("beta_slow");
  t.rope_scaling.original_max_position_embeddings = rs.i64("original_max_position_embeddings");
  t.n_routed_experts = f.i32("n_routed_experts");
  t.n_shared_experts = f.i32("n_shared_experts");
  t.num_experts_per_tok = f.i32("num_experts_per_tok");
  t.scoring_func = f.str("scoring_func");
  t.norm_topk_prob = f.boolean("norm_topk_prob", true);
  t.routed_scaling_factor = f.f64("routed_scaling_factor");
  t.gate_temp = f.f64_or("gate_temp", 1.0);
  t.sliding_window = f.i32("sliding_window");
  t.compress_ratios = f.ints<int>("compress_ratios");
  t.kv_source_layer_ids = f.ints<int>("kv_source_layer_ids");
  t.index_source_layer_ids = f.ints<int>("index_source_layer_ids");
  t.candidate_source_layer_id = f.i32("candidate_source_layer_id");
  t.candidate_topk_blocks = f.i32("candidate_topk_blocks");
  t.candidate_block_size = f.i32("candidate_block_size");
  t.index_n_heads = f.i32("index_n_heads");
  t.index_head_dim = f.i32("index_head_dim");
  t.index_topk = f.i32("index_topk");
  t.hc_mult = f.i32("hc_mult");
  t.hc_sinkhorn_iters = f.i32("hc_sinkhorn_iters");
  t.hc_eps = f.f64("hc_eps");
  t.engram_layer_ids = f.ints<int>("engram_layer_ids");
  t.engram_num_embeddings = f.ints<int64_t>("engram_num_embeddings");
  t.engram_max_ngram_size = f.i32("engram_max_ngram_size");
  t.engram_vocab_size = f.i64("engram_vocab_size");
  t.engram_n_heads = f.i32("engram_n_heads");
  t.engram_head_dim = f.i32("engram_head_dim");
  // The checkpoint spells it engram_pad_token_id; transformers uses engram_pad_id.
  t.engram_pad_token_id = f.has("engram_pad_token_id") ? f.i32("engram_pad_token_id")
                                                        : f.i32("engram_pad_id");
  t.engram_compressed_vocab_size = f.i32("engram_compressed_vocab_size");
  t.num_nextn_predict_layers = f.i32("num_nextn_predict_layers");
  t.dspark_block_size = f.i32("dspark_block_size");
  t.dspark_noise_token_id = f.i32("dspark_noise_token_id");
  t.dspark_target_layer_ids = f.ints<int>("dspark_target_layer_ids");
  t.dspark_markov_rank = f.i32("dspark_markov_rank");
  t.dspark_n_routed_experts = f.i32("dspark_n_routed_experts");
  t.dspark_num_experts_per_tok = f.i32("dspark_num_experts_per_tok");
  return t;
}

void validate_text(const TextConfig& t, const Fields& f) {
  auto positive = [&](const char* key, int64_t v) { require(v > 0, f, key, "must be positive, got " + std::to_string(v)); };
  positive("vocab_size", t.vocab_size);
  positive("hidden_size", t.hidden_size);
  positive("moe_intermediate_size", t.moe_intermediate_size);
  positive("num_hidden_layers", t.num_hidden_layers);
  positive("num_attention_heads", t.num_attention_heads);
  positive("head_dim", t.head_dim);
  positive("q_lora_rank", t.q_lora_rank);
  positive("o_lora_rank", t.o_lora_rank);
  positive("o_groups", t.o_groups);
  positive("sliding_window", t.sliding_window);
  positive("n_routed_experts", t.n_routed_experts);
  positive("index_n_heads", t.index_n_heads);
  positive("index_topk", t.index_topk);
  positive("hc_mult", t.hc_mult);
  positive("hc_sinkhorn_iters", t.hc_sinkhorn_iters);
  require(t.num_key_value_heads == 1, f, "num_key_value_heads", "V4.1 attention is MQA with one KV head");
  require(t.qk_rope_head_dim > 0 && t.qk_rope_head_dim % 2 == 0 && t.qk_rope_head_dim < t.head_dim, f,
          "qk_rope_head_dim", "must be even, positive and below head_dim");
  require(t.num_attention_heads % t.o_groups == 0, f, "o_groups", "must divide num_attention_heads");
  require(t.num_experts_per_tok > 0 && t.num_experts_per_tok <= t.n_routed_experts, f,
          "num_experts_per_tok", "must be in 1..n_routed_experts");
  require(t.scoring_func == "sqrtsoftplus", f, "scoring_func", "only sqrtsoftplus is supported, got '" + t.scoring_func + "'");
  require(t.n_shared_experts == 1, f, "n_shared_experts", "V4.1 has exactly one shared expert");
  require(t.rope_scaling.type == "yarn", f, "rope_scaling", "only yarn is supported");
  // Quantization granularities (model-spec §6): head_dim and index_head_dim carry FP8/FP4 blocks of 32
  // and FP4 scale blocks of 16; the index head is 2 rope halves + nope.
  require(t.head_dim % 32 == 0, f, "head_dim", "must be a multiple of 32 (KV FP8 block)");
  require(t.index_head_dim > t.qk_rope_head_dim && t.index_head_dim % 32 == 0, f, "index_head_dim",
          "must be a multiple of 32 and larger than qk_rope_head_dim");
  require(t.hc_mult >= 1 && t.hc_mult <= 8, f, "hc_mult", "must be in 1..8");

  const int n_layers = t.num_hidden_layers;
  const size_t want = static_cast<size_t>(n_layers + t.num_nextn_predict_layers);
  require(t.compress_ratios.size() == want, f, "compress_ratios",
          "expected " + std::to_string(want) + " entries (num_hidden_layers + num_nextn_predict_layers), got " +
              std::to_string(t.compress_ratios.size()));
  for (size_t i = 0; i < t.compress_ratios.size(); ++i) {
    int r = t.compress_ratios[i];
    require(r == 0 || r == 1 || r == 2, f, "compress_ratios",
            "entry " + std::to_string(i) + " is " + std::to_string(r) + "; V4.1 uses ratios 0, 2 and 1");
    if (static_cast<int>(i) >= n_layers)
      require(r == 0, f, "compress_ratios", "DSpark stage entries must be 0");
  }
  auto in_range_sorted = [&](const char* key, const std::vector<int>& ids) {
    for (size_t i = 0; i < ids.size(); ++i) {
      require(ids[i] >= 0 && ids[i] < n_layers, f, key, "layer " + std::to_string(ids[i]) + " is out of range");
      require(i == 0 || ids[i] > ids[i - 1], f, key, "must be strictly increasing: " + list_str(ids));
    }
  };
  in_range_sorted("kv_source_layer_ids", t.kv_source_layer_ids);
  in_range_sorted("index_source_layer_ids", t.index_source_layer_ids);
  in_range_sorted("engram_layer_ids", t.engram_layer_ids);
  in_range_sorted("dspark_target_layer_ids", t.dspark_target_layer_ids);
  require(t.engram_num_embeddings.size() == t.engram_layer_ids.size(), f, "engram_num_embeddings",
          "needs one entry per engram_layer_ids entry");
  if (!t.engram_layer_ids.empty()) {
    positive("engram_n_heads", t.engram_n_heads);
    require(t.engram_head_dim > 0 && t.engram_head_dim % 32 == 0, f, "engram_head_dim", "must be a multiple of 32");
    require(t.engram_max_ngram_size >= 2, f, "engram_max_ngram_size", "must be at least 2");
    positive("engram_compressed_vocab_size", t.engram_compressed_vocab_size);
    positive("engram_vocab_size", t.engram_vocab_size);
  }
  if (t.num_nextn_predict_layers > 0) {
    require(!t.dspark_target_layer_ids.empty(), f, "dspark_target_layer_ids", "needed when num_nextn_predict_layers > 0");
    positive("dspark_n_routed_experts", t.dspark_n_routed_experts);
    require(t.dspark_num_experts_per_tok > 0 && t.dspark_num_experts_per_tok <= t.dspark_n_routed_experts, f,
            "dspark_num_experts_per_tok", "must be in 1..dspark_n_routed_experts");
    positive("dspark_markov_rank", t.dspark_markov_rank);
  }
  positive("candidate_block_size", t.candidate_block_size);
  positive("candidate_topk_blocks", t.candidate_topk_blocks);
}

// Derives the per-layer plan (model-spec §3b.1) and checks that the source lists are consistent.
std::vector<LayerPlan> derive_plan(const TextConfig& t, const Fields& f) {
  const std::set<int> kv(t.kv_source_layer_ids.begin(), t.kv_source_layer_ids.end());
  const std::set<int> idx(t.index_source_layer_ids.begin(), t.index_source_layer_ids.end());
  std::vector<LayerPlan> plan(t.num_hidden_layers);
  int cur_kv = -1, cur_idx = -1;
  bool any_compressed = false;
  for (int l = 0; l < t.num_hidden_layers; ++l) {
    LayerPlan& p = plan[l];
    p.layer = l;
    p.ratio = t.compress_ratios[l];
    p.compress_rope = p.ratio > 0;
    const std::string at = "layer " + std::to_string(l);
    if (kv.count(l)) {
      require(p.ratio > 0, f, "kv_source_layer_ids", at + " has compress ratio 0 and cannot own a compressor");
      cur_kv = l;
      p.owns_compressor = true;
    }
    if (idx.count(l)) {
      require(p.ratio > 0, f, "index_source_layer_ids", at + " has compress ratio 0 and cannot run an indexer");
      cur_idx = l;
      p.runs_indexer = true;
    }
    if (p.ratio == 0) {
      require(!any_compressed, f, "compress_ratios",
              at + " has ratio 0 after compressed layers; window-only layers must come first");
      continue;
    }
    any_compressed = true;
    require(cur_kv >= 0, f, "kv_source_layer_ids", "no KV source at or before " + at);
    require(cur_idx >= 0, f, "index_source_layer_ids", "no index source at or before " + at);
    require(t.compress_ratios[cur_kv] == p.ratio, f, "compress_ratios",
            at + " has ratio " + std::to_string(p.ratio) + " but its KV source layer " + std::to_string(cur_kv) +
                " has ratio " + std::to_string(t.compress_ratios[cur_kv]));
    require(cur_idx >= cur_kv, f, "index_source_layer_ids",
            at + " would use the selection of layer " + std::to_string(cur_idx) + ", made over the KV of another source");
    p.kv_source = cur_kv;
    p.index_source = cur_idx;
  }
  require(idx.count(t.candidate_source_layer_id) > 0, f, "candidate_source_layer_id",
          "layer " + std::to_string(t.candidate_source_layer_id) + " is not an index source");
  const int cand = t.candidate_source_layer_id;
  plan[cand].candidate_source = true;
  for (int l : t.index_source_layer_ids)
    if (l > cand && plan[l].kv_source == plan[cand].kv_source) plan[l].candidate_constrained = true;
  for (size_t i = 0; i < t.engram_layer_ids.size(); ++i) plan[t.engram_layer_ids[i]].engram_slot = static_cast<int>(i);
  for (size_t i = 0; i < t.dspark_target_layer_ids.size(); ++i)
    plan[t.dspark_target_layer_ids[i]].dspark_target_slot = static_cast<int>(i);
  return plan;
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& source) {
  Fields top(j, source, "");
  ModelConfig c;
  c.model_type = top.str("model_type");
  if (c.model_type != "deepseek_v41")
    fail(top.where("model_type"), ": unknown model_type '", c.model_type,
         "'; this engine runs DeepSeek-V4.1 (deepseek_v41)");
  c.bos_token_id = top.i32_or("bos_token_id", 0);
  c.eos_token_id = top.i32_or("eos_token_id", 1);
  c.pad_token_id = top.i32_or("pad_token_id", 2);
  c.image_token_id = top.i32("image_token_id");

  Fields tf = top.sub("text_config");
  c.text = parse_text(tf);
  validate_text(c.text, tf);

  Fields vf = top.sub("vision_config");
  std::string vmt = vf.str("model_type");
  if (vmt != "deepseek_v41_vision")
    fail(vf.where("model_type"), ": unknown model_type '", vmt, "' (expected deepseek_v41_vision)");
  c.vision.num_hidden_layers = vf.i32("num_hidden_layers");
  c.vision.hidden_size = vf.i32("hidden_size");
  c.vision.num_attention_heads = vf.i32("num_attention_heads");
  c.vision.intermediate_size = vf.i32("intermediate_size");
  c.vision.patch_size = vf.i32("patch_size");
  c.vision.rope_theta = vf.f64("rope_theta");
  c.vision.downsample_ratio = vf.i32("downsample_ratio");
  c.vision.max_image_tokens = vf.i32("max_image_tokens");
  c.vision.min_pixels = vf.i64("min_pixels");
  require(c.vision.num_attention_heads > 0 && c.vision.hidden_size % c.vision.num_attention_heads == 0, vf,
          "num_attention_heads", "must divide hidden_size");

  Fields qf = top.sub("quantization_config");
  c.quant.quant_method = qf.str("quant_method");
  c.quant.activation_scheme = qf.str_or("activation_scheme", "dynamic");
  c.quant.scale_fmt = qf.str("scale_fmt");
  c.quant.expert_dtype = qf.str_or("expert_dtype", "fp4");
  require(c.quant.quant_method == "fp8", qf, "quant_method", "only fp8 is supported, got '" + c.quant.quant_method + "'");
  require(c.quant.scale_fmt == "ue8m0", qf, "scale_fmt", "only ue8m0 is supported, got '" + c.quant.scale_fmt + "'");
  require(c.quant.expert_dtype == "fp4", qf, "expert_dtype", "only fp4 experts are supported");
  require(c.quant.activation_scheme == "dynamic", qf, "activation_scheme", "only dynamic is supported");
  auto blk = qf.ints<int>("weight_block_size");
  require(blk.size() == 2 && blk[0] == 32 && blk[1] == 32, qf, "weight_block_size", "V4.1 uses [32, 32]");
  c.quant.block_out = blk[0];
  c.quant.block_in = blk[1];

  // FP8 linears need every dimension to be a multiple of the block (the activation quant block is
  // the weight's input block).
  const TextConfig& t = c.text;
  auto mult = [&](const char* key, int64_t v) {
    require(v % 32 == 0, tf, key, std::to_string(v) + " is not a multiple of the FP8 block 32");
  };
  mult("hidden_size", t.hidden_size);
  mult("q_lora_rank", t.q_lora_rank);
  mult("o_lora_rank", t.o_lora_rank);
  mult("moe_intermediate_size", t.moe_intermediate_size);

  auto token = [&](const Fields& f, const char* key, int64_t id) {
    require(id >= 0 && id < t.vocab_size, f, key,
            std::to_string(id) + " is outside the vocabulary of " + std::to_string(t.vocab_size));
  };
  token(top, "bos_token_id", c.bos_token_id);
  token(top, "eos_token_id", c.eos_token_id);
  token(top, "pad_token_id", c.pad_token_id);
  token(top, "image_token_id", c.image_token_id);
  token(tf, "engram_pad_token_id", t.engram_pad_token_id);
  if (t.num_nextn_predict_layers > 0) token(tf, "dspark_noise_token_id", t.dspark_noise_token_id);

  c.layers = derive_plan(c.text, tf);
  for (int s = 0; s < t.num_nextn_predict_layers; ++s)
    c.dspark.push_back({.stage = s, .first = s == 0, .last = s == t.num_nextn_predict_layers - 1});
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  return parse_model_config(j, path);
}

json real_v41_config_json() {
  // model-spec §1.2: the released DeepSeek-V4.1-Flash config.json, value for value.
  json j = tiny_config_json();
  json& t = j["text_config"];
  t["vocab_size"] = 129280, t["hidden_size"] = 5120, t["moe_intermediate_size"] = 2304;
  t["num_hidden_layers"] = 40, t["num_attention_heads"] = 64, t["num_key_value_heads"] = 1, t["head_dim"] = 512;
  t["qk_rope_head_dim"] = 64, t["q_lora_rank"] = 1280, t["o_lora_rank"] = 1024, t["o_groups"] = 8;
  t["swiglu_limit"] = 10.0, t["rms_norm_eps"] = 1e-20, t["max_position_embeddings"] = 1048576;
  t["rope_theta"] = 10000, t["compress_rope_theta"] = 160000;
  t["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 16}, {"beta_fast", 32}, {"beta_slow", 1},
                       {"original_max_position_embeddings", 65536}};
  t["n_routed_experts"] = 384, t["n_shared_experts"] = 1, t["num_experts_per_tok"] = 6;
  t["routed_scaling_factor"] = 1.5, t["sliding_window"] = 128;
  std::vector<int> ratios = {0, 0};
  ratios.insert(ratios.end(), 18, 2);
  ratios.insert(ratios.end(), 20, 1);
  ratios.insert(ratios.end(), {0, 0, 0});
  t["compress_ratios"] = ratios;
  t["kv_source_layer_ids"] = {2, 8, 14, 20};
  t["index_source_layer_ids"] = {2, 8, 14, 20, 24, 28, 32, 36};
  t["index_n_heads"] = 32, t["index_head_dim"] = 128, t["index_topk"] = 512;
  t["candidate_source_layer_id"] = 20, t["candidate_topk_blocks"] = 2048, t["candidate_block_size"] = 8;
  t["hc_mult"] = 4, t["hc_sinkhorn_iters"] = 20, t["hc_eps"] = 1e-6;
  t["engram_layer_ids"] = {1, 14}, t["engram_num_embeddings"] = {384006168, 384016682};
  t["engram_max_ngram_size"] = 4, t["engram_vocab_size"] = 16000000, t["engram_n_heads"] = 8;
  t["engram_head_dim"] = 256, t["engram_pad_token_id"] = 2, t["engram_compressed_vocab_size"] = 99092;
  t["num_nextn_predict_layers"] = 3, t["dspark_block_size"] = 5, t["dspark_noise_token_id"] = 128799;
  t["dspark_target_layer_ids"] = {37, 38, 39}, t["dspark_markov_rank"] = 256;
  t["dspark_n_routed_experts"] = 128, t["dspark_num_experts_per_tok"] = 3;
  t.erase("engram_pad_id");
  j["vision_config"] = {{"model_type", "deepseek_v41_vision"}, {"num_hidden_layers", 32}, {"hidden_size", 1024},
                        {"num_attention_heads", 16}, {"intermediate_size", 2816}, {"patch_size", 14},
                        {"rope_theta", 10000}, {"downsample_ratio", 3}, {"max_image_tokens", 1024},
                        {"min_pixels", 295936}, {"max_wh_ratio", nullptr}};
  j["transformers_version"] = "5.6.0";
  return j;
}

json tiny_config_json() {
  // model-spec §6.2, verbatim values.
  return json::parse(R"({
  "model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"],
  "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "image_token_id": 129264,
  "dtype": "bfloat16",
  "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                          "weight_block_size": [32, 32], "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
  "text_config": {
    "model_type": "deepseek_v41_text", "vocab_size": 129280, "hidden_size": 256,
    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128,
    "sliding_window": 16, "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0],
    "kv_source_layer_ids": [2, 4], "index_source_layer_ids": [2, 4, 6],
    "candidate_source_layer_id": 4, "candidate_topk_blocks": 2, "candidate_block_size": 8,
    "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
    "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": true,
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hidden_act": "silu",
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-20,
    "rope_theta": 10000, "compress_rope_theta": 160000, "max_position_embeddings": 4096,
    "rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 256},
    "engram_layer_ids": [1], "engram_num_embeddings": [6126], "engram_vocab_size": 1000,
    "engram_max_ngram_size": 4, "engram_n_heads": 2, "engram_head_dim": 64,
    "engram_pad_token_id": 2, "engram_pad_id": 2, "engram_compressed_vocab_size": 99092,
    "num_nextn_predict_layers": 1, "dspark_block_size": 5, "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [5, 6, 7], "dspark_markov_rank": 32,
    "dspark_n_routed_experts": 8, "dspark_num_experts_per_tok": 2,
    "tie_word_embeddings": false, "attention_bias": false, "attention_dropout": 0.0,
    "initializer_range": 0.02, "use_cache": true
  },
  "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 2, "hidden_size": 128,
    "num_attention_heads": 2, "intermediate_size": 256, "patch_size": 14, "rope_theta": 10000,
    "downsample_ratio": 3, "max_image_tokens": 64, "min_pixels": 3136, "max_wh_ratio": null}
})");
}

}  // namespace dsuf
