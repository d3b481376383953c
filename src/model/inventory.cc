#include "model/inventory.h"

#include <set>
#include <sstream>

#include "core/error.h"

namespace dsuf {
namespace {

using K = WeightKind;
using I = WeightInit;

class Builder {
 public:
  explicit Builder(std::vector<WeightSpec>& out) : out_(out) {}
  void add(std::string name, K kind, std::vector<int64_t> shape, I init) {
    out_.push_back({std::move(name), kind, std::move(shape), init});
  }

 private:
  std::vector<WeightSpec>& out_;
};

// The parts every block shares (backbone layers and DSpark stages): mHC, norms, window attention, MoE.
void add_block(Builder& b, const std::string& p, const TextConfig& t, int n_experts) {
  const int64_t D = t.hidden_size, n = t.hc_mult, H = t.num_attention_heads, hd = t.head_dim;
  const int64_t mix = (2 + n) * n;
  for (const char* site : {"attn", "ffn"}) {
    b.add(p + "hc_" + site + "_fn", K::kF32, {mix, n * D}, I::kHcFn);
    b.add(p + "hc_" + site + "_base", K::kF32, {mix}, I::kHcBase);
    b.add(p + "hc_" + site + "_scale", K::kF32, {3}, I::kHcScale);
  }
  b.add(p + "attn_norm.weight", K::kBf16, {D}, I::kNorm);
  b.add(p + "ffn_norm.weight", K::kBf16, {D}, I::kNorm);
  b.add(p + "attn.attn_sink", K::kF32, {H}, I::kSink);
  b.add(p + "attn.wq_a", K::kFp8Linear, {t.q_lora_rank, D}, I::kLinear);
  b.add(p + "attn.q_norm.weight", K::kBf16, {t.q_lora_rank}, I::kNorm);
  b.add(p + "attn.wq_b", K::kFp8Linear, {H * hd, t.q_lora_rank}, I::kLinear);
  b.add(p + "attn.wkv", K::kFp8Linear, {hd, D}, I::kLinear);
  b.add(p + "attn.kv_norm.weight", K::kBf16, {hd}, I::kNorm);
  b.add(p + "attn.wo_a", K::kFp8Linear, {t.o_groups * t.o_lora_rank, H * hd / t.o_groups}, I::kLinear);
  b.add(p + "attn.wo_b", K::kFp8Linear, {D, t.o_groups * t.o_lora_rank}, I::kLinear);
  b.add(p + "ffn.gate.weight", K::kBf16, {n_experts, D}, I::kRouter);
  b.add(p + "ffn.gate.bias", K::kF32, {n_experts}, I::kBias);
  b.add(p + "ffn.gate.bias_vl", K::kF32, {n_experts}, I::kBias);
  const int64_t F = t.moe_intermediate_size;
  for (int e = 0; e < n_experts; ++e) {
    std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
    b.add(ep + "w1", K::kFp4Linear, {F, D}, I::kLinear);
    b.add(ep + "w2", K::kFp4Linear, {D, F}, I::kLinear);
    b.add(ep + "w3", K::kFp4Linear, {F, D}, I::kLinear);
  }
  const int64_t Fs = F * t.n_shared_experts;
  b.add(p + "ffn.shared_experts.w1", K::kFp8Linear, {Fs, D}, I::kLinear);
  b.add(p + "ffn.shared_experts.w2", K::kFp8Linear, {D, Fs}, I::kLinear);
  b.add(p + "ffn.shared_experts.w3", K::kFp8Linear, {Fs, D}, I::kLinear);
}

}  // namespace

std::vector<WeightSpec> expected_weights(const ModelConfig& cfg) {
  const TextConfig& t = cfg.text;
  const int64_t D = t.hidden_size, V = t.vocab_size, hd = t.head_dim;
  std::vector<WeightSpec> out;
  Builder b(out);
  b.add("embed.weight", K::kBf16, {V, D}, I::kEmbed);
  b.add("head.weight", K::kBf16, {V, D}, I::kHead);
  b.add("norm.weight", K::kBf16, {D}, I::kNorm);

  for (const LayerPlan& lp : cfg.layers) {
    const std::string p = "layers." + std::to_string(lp.layer) + ".";
    add_block(b, p, t, t.n_routed_experts);
    if (lp.owns_compressor) {
      b.add(p + "attn.compressor.wkv.weight", K::kBf16, {hd, D}, I::kLinear);
      if (lp.ratio > 1) b.add(p + "attn.compressor.wgate.weight", K::kBf16, {hd, D}, I::kLinear);
      b.add(p + "attn.compressor.norm.weight", K::kBf16, {hd}, I::kNorm);
      b.add(p + "attn.indexer.wk.weight", K::kBf16, {t.index_head_dim, hd}, I::kLinear);
      b.add(p + "attn.indexer.k_norm.weight", K::kBf16, {t.index_head_dim}, I::kNorm);
    }
    if (lp.runs_indexer) {
      b.add(p + "attn.indexer.wq_b", K::kFp8Linear, {int64_t{t.index_n_heads} * t.index_head_dim, t.q_lora_rank},
            I::kLinear);
      b.add(p + "attn.indexer.weights_proj.weight", K::kBf16, {t.index_n_heads, D}, I::kLinear);
    }
    if (lp.engram_slot >= 0) {
      const int64_t rows = t.engram_num_embeddings[lp.engram_slot];
      const int64_t in = int64_t{t.engram_max_ngram_size - 1} * t.engram_n_heads * t.engram_head_dim;
      b.add(p + "engram.embed", K::kFp8Rows, {rows, t.engram_head_dim}, I::kEmbed);
      b.add(p + "engram.wkv", K::kFp8Linear, {(t.hc_mult + 1) * D, in}, I::kLinear);
      b.add(p + "engram.q_weight", K::kBf16, {t.hc_mult, D}, I::kNorm);
      b.add(p + "engram.k_weight", K::kBf16, {t.hc_mult, D}, I::kNorm);
    }
  }

  for (const DsparkStagePlan& st : cfg.dspark) {
    const std::string p = "mtp." + std::to_string(st.stage) + ".";
    add_block(b, p, t, t.dspark_n_routed_experts);
    if (st.first) {
      const int64_t in = static_cast<int64_t>(t.dspark_target_layer_ids.size()) * D;
      b.add(p + "main_proj", K::kFp8Linear, {D, in}, I::kLinear);
      b.add(p + "main_norm.weight", K::kBf16, {D}, I::kNorm);
    }
    if (st.last) {
      const int64_t r = t.dspark_markov_rank;
      b.add(p + "norm.weight", K::kBf16, {D}, I::kNorm);
      b.add(p + "markov_head.embed.weight", K::kBf16, {V, r}, I::kSmall);
      b.add(p + "markov_head.head.weight", K::kBf16, {V, r}, I::kSmall);
      b.add(p + "confidence_head.proj.weight", K::kBf16, {1, D + r}, I::kLinear);
    }
  }

  const VisionConfig& v = cfg.vision;
  const int64_t vh = v.hidden_size, ps = v.patch_size;
  b.add("vision.patch_embed.proj.weight", K::kBf16, {vh, 3 * ps * ps}, I::kLinear);
  b.add("vision.patch_embed.proj.bias", K::kBf16, {vh}, I::kSmall);
  for (int blk = 0; blk < v.num_hidden_layers; ++blk) {
    const std::string p = "vision.blocks." + std::to_string(blk) + ".";
    b.add(p + "norm1.weight", K::kBf16, {vh}, I::kNorm);
    b.add(p + "norm2.weight", K::kBf16, {vh}, I::kNorm);
    b.add(p + "attn.wqkv.weight", K::kBf16, {3 * vh, vh}, I::kLinear);
    b.add(p + "attn.wqkv.bias", K::kBf16, {3 * vh}, I::kSmall);
    b.add(p + "attn.wo.weight", K::kBf16, {vh, vh}, I::kLinear);
    b.add(p + "attn.wo.bias", K::kBf16, {vh}, I::kSmall);
    b.add(p + "mlp.w1.weight", K::kBf16, {2 * int64_t{v.intermediate_size}, vh}, I::kLinear);
    b.add(p + "mlp.w2.weight", K::kBf16, {vh, v.intermediate_size}, I::kLinear);
  }
  b.add("vision.norm.weight", K::kBf16, {vh}, I::kNorm);
  const int64_t ds = v.downsample_ratio;
  b.add("aligner.w1.weight", K::kBf16, {D, vh * ds * ds}, I::kLinear);
  b.add("aligner.w1.bias", K::kBf16, {D}, I::kSmall);
  b.add("aligner.w2.weight", K::kBf16, {D, D}, I::kLinear);
  b.add("aligner.w2.bias", K::kBf16, {D}, I::kSmall);
  b.add("image_start", K::kBf16, {D}, I::kEmbed);
  b.add("image_end", K::kBf16, {D}, I::kEmbed);
  b.add("image_newline", K::kBf16, {D}, I::kEmbed);
  return out;
}

std::vector<TensorSpec> physical_tensors(const WeightSpec& w) {
  auto div_up = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  switch (w.kind) {
    case K::kBf16:
      return {{w.name, DType::BF16, w.shape}};
    case K::kF32:
      return {{w.name, DType::F32, w.shape}};
    case K::kFp8Linear:
      return {{w.name + ".weight", DType::F8_E4M3, w.shape},
              {w.name + ".scale", DType::F8_E8M0, {div_up(w.shape[0], 32), div_up(w.shape[1], 32)}}};
    case K::kFp4Linear:
      return {{w.name + ".weight", DType::I8, {w.shape[0], w.shape[1] / 2}},
              {w.name + ".scale", DType::F8_E8M0, {w.shape[0], w.shape[1] / 32}}};
    case K::kFp8Rows:
      return {{w.name + ".weight", DType::F8_E4M3, w.shape},
              {w.name + ".scale", DType::F8_E8M0, {w.shape[0], w.shape[1] / 32}}};
  }
  return {};
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& cfg) {
  std::vector<TensorSpec> out;
  for (const WeightSpec& w : expected_weights(cfg))
    for (TensorSpec& t : physical_tensors(w)) out.push_back(std::move(t));
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::vector<std::string> check_inventory(const Checkpoint& ckpt, const ModelConfig& cfg) {
  std::vector<std::string> problems;
  std::set<std::string> known;
  for (const TensorSpec& want : expected_tensors(cfg)) {
    known.insert(want.name);
    const TensorInfo* got = ckpt.find(want.name);
    if (!got) {
      problems.push_back("missing tensor " + want.name + " (expected " + dtype_name(want.dtype) + " " +
                         shape_str(want.shape) + ")");
      continue;
    }
    if (got->dtype != want.dtype || got->shape != want.shape)
      problems.push_back(got->file + ": tensor " + want.name + " is " + dtype_name(got->dtype) + " " +
                         shape_str(got->shape) + ", expected " + dtype_name(want.dtype) + " " +
                         shape_str(want.shape));
  }
  if (!problems.empty()) {
    std::ostringstream os;
    os << ckpt.dir() << ": the checkpoint does not match config.json (" << problems.size() << " problem"
       << (problems.size() > 1 ? "s" : "") << "):";
    for (size_t i = 0; i < problems.size() && i < 20; ++i) os << "\n  " << problems[i];
    if (problems.size() > 20) os << "\n  ... and " << problems.size() - 20 << " more";
    throw Error(os.str());
  }
  std::vector<std::string> unknown;
  for (const auto& [name, info] : ckpt.tensors())
    if (!known.count(name)) unknown.push_back(name);
  return unknown;
}

}  // namespace dsuf
