#include "model/weights.h"

#include <fstream>

#include "core/error.h"
#include "model/inventory.h"

namespace dsuf {

void Bf16Mat::row(int64_t r, float* out) const {
  const uint8_t* p = data + 2 * r * cols;
  for (int64_t c = 0; c < cols; ++c) {
    uint16_t h;
    std::memcpy(&h, p + 2 * c, 2);
    out[c] = bf16_to_float(h);
  }
}

namespace {

class Viewer {
 public:
  explicit Viewer(const Checkpoint& ckpt) : ckpt_(ckpt) {}
  const TensorInfo& get(const std::string& name) const { return ckpt_.get(name); }
  Bf16Mat bf16(const std::string& name) const {
    const TensorInfo& t = get(name);
    Bf16Mat m{t.data, t.shape.size() == 2 ? t.shape[0] : 1, t.shape.back()};
    return m;
  }
  std::vector<float> f32(const std::string& name) const {
    const TensorInfo& t = get(name);
    std::vector<float> v(t.nbytes / 4);
    std::memcpy(v.data(), t.data, t.nbytes);
    return v;
  }
  Fp8Linear fp8(const std::string& name) const {
    const TensorInfo& w = get(name + ".weight");
    return {w.data, get(name + ".scale").data, w.shape[0], w.shape[1]};
  }
  Fp4Linear fp4(const std::string& name) const {
    const TensorInfo& w = get(name + ".weight");
    return {w.data, get(name + ".scale").data, w.shape[0], w.shape[1] * 2};
  }
  Fp8Rows fp8_rows(const std::string& name) const {
    const TensorInfo& w = get(name + ".weight");
    return {w.data, get(name + ".scale").data, w.shape[0], w.shape[1]};
  }
  bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }

 private:
  const Checkpoint& ckpt_;
};

BlockWeights view_block(const Viewer& v, const std::string& p, int n_experts) {
  BlockWeights b;
  b.hc_attn = {v.f32(p + "hc_attn_fn"), v.f32(p + "hc_attn_base"), v.f32(p + "hc_attn_scale")};
  b.hc_ffn = {v.f32(p + "hc_ffn_fn"), v.f32(p + "hc_ffn_base"), v.f32(p + "hc_ffn_scale")};
  b.attn_norm = v.bf16(p + "attn_norm.weight");
  b.ffn_norm = v.bf16(p + "ffn_norm.weight");
  AttnWeights& a = b.attn;
  a.sink = v.f32(p + "attn.attn_sink");
  a.wq_a = v.fp8(p + "attn.wq_a");
  a.wq_b = v.fp8(p + "attn.wq_b");
  a.wkv = v.fp8(p + "attn.wkv");
  a.wo_a = v.fp8(p + "attn.wo_a");
  a.wo_b = v.fp8(p + "attn.wo_b");
  a.q_norm = v.bf16(p + "attn.q_norm.weight");
  a.kv_norm = v.bf16(p + "attn.kv_norm.weight");
  MoeWeights& m = b.ffn;
  m.gate = v.bf16(p + "ffn.gate.weight");
  m.bias = v.f32(p + "ffn.gate.bias");
  m.bias_vl = v.f32(p + "ffn.gate.bias_vl");
  for (int e = 0; e < n_experts; ++e) {
    std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
    m.experts.push_back({v.fp4(ep + "w1"), v.fp4(ep + "w2"), v.fp4(ep + "w3")});
  }
  m.shared_w1 = v.fp8(p + "ffn.shared_experts.w1");
  m.shared_w2 = v.fp8(p + "ffn.shared_experts.w2");
  m.shared_w3 = v.fp8(p + "ffn.shared_experts.w3");
  return b;
}

}  // namespace

std::vector<int32_t> read_compressed_id_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open the Engram compressed-id table");
  std::vector<int32_t> ids;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    char* end = nullptr;
    long v = std::strtol(line.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) fail(path, ":", ids.size() + 1, ": not a compressed id: '", line, "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

std::unique_ptr<LoadedModel> load_model(const std::string& dir) {
  auto m = std::make_unique<LoadedModel>();
  m->config = load_model_config(dir + "/config.json");
  m->checkpoint = Checkpoint::open(dir);
  m->unknown_tensors = check_inventory(*m->checkpoint, m->config);
  Viewer v(*m->checkpoint);
  const ModelConfig& c = m->config;
  ModelWeights& w = m->weights;
  w.embed = v.bf16("embed.weight");
  w.head = v.bf16("head.weight");
  w.norm = v.bf16("norm.weight");
  for (const LayerPlan& lp : c.layers) {
    const std::string p = "layers." + std::to_string(lp.layer) + ".";
    BlockWeights b = view_block(v, p, c.text.n_routed_experts);
    if (lp.owns_compressor) {
      b.attn.comp_wkv = v.bf16(p + "attn.compressor.wkv.weight");
      if (lp.ratio > 1) b.attn.comp_wgate = v.bf16(p + "attn.compressor.wgate.weight");
      b.attn.comp_norm = v.bf16(p + "attn.compressor.norm.weight");
      b.attn.idx_wk = v.bf16(p + "attn.indexer.wk.weight");
      b.attn.idx_k_norm = v.bf16(p + "attn.indexer.k_norm.weight");
    }
    if (lp.runs_indexer) {
      b.attn.idx_wq_b = v.fp8(p + "attn.indexer.wq_b");
      b.attn.idx_weights_proj = v.bf16(p + "attn.indexer.weights_proj.weight");
    }
    if (lp.engram_slot >= 0) {
      b.engram = EngramWeights{v.fp8_rows(p + "engram.embed"), v.fp8(p + "engram.wkv"),
                               v.bf16(p + "engram.q_weight"), v.bf16(p + "engram.k_weight")};
    }
    w.layers.push_back(std::move(b));
  }
  return m;
}

}  // namespace dsuf
