#include "model/tiny.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/numerics.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/safetensors.h"

namespace dsuf {
namespace {

namespace fs = std::filesystem;

// splitmix64: tiny, fast and identical on every platform, so a seed names one checkpoint.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double normal() {
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
  }
};

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Draws the logical values of a weight; each weight gets its own stream, so adding a tensor never
// changes the others.
std::vector<float> draw(const WeightSpec& w, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : w.shape) n *= d;
  const double in = static_cast<double>(w.shape.back());
  Rng rng{seed ^ name_hash(w.name)};
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    double z;
    switch (w.init) {
      case WeightInit::kLinear: z = rng.normal() / std::sqrt(in); break;
      case WeightInit::kNorm: z = 1.0 + 0.1 * rng.normal(); break;
      case WeightInit::kEmbed: z = rng.normal(); break;
      case WeightInit::kHead: z = 2.5 * rng.normal() / std::sqrt(in); break;
      case WeightInit::kHcFn: z = 0.1 * rng.normal() / std::sqrt(in); break;
      case WeightInit::kHcBase: z = rng.normal(); break;
      case WeightInit::kHcScale: z = 0.5 + rng.uniform(); break;
      case WeightInit::kSink: z = rng.normal(); break;
      case WeightInit::kBias: z = 0.01 * rng.normal(); break;
      case WeightInit::kRouter: z = rng.normal() / std::sqrt(in); break;
      case WeightInit::kSmall: z = 0.05 * rng.normal(); break;
      default: z = 0;
    }
    x = static_cast<float>(z);
  }
  return v;
}

void put_u16(std::vector<uint8_t>& b, size_t i, uint16_t v) { std::memcpy(&b[2 * i], &v, 2); }

struct Owned {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};

// Quantizes a logical weight into its physical tensors.
std::vector<Owned> encode(const WeightSpec& w, const std::vector<float>& v) {
  std::vector<TensorSpec> phys = physical_tensors(w);
  std::vector<Owned> out;
  auto bytes_of = [](const TensorSpec& t) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    return static_cast<size_t>(n) * dtype_size(t.dtype);
  };
  for (auto& p : phys) out.push_back({p, std::vector<uint8_t>(bytes_of(p))});
  switch (w.kind) {
    case WeightKind::kBf16:
      for (size_t i = 0; i < v.size(); ++i) put_u16(out[0].bytes, i, bf16_from_float(v[i]));
      break;
    case WeightKind::kF32:
      std::memcpy(out[0].bytes.data(), v.data(), v.size() * 4);
      break;
    case WeightKind::kFp8Linear: {
      const int64_t O = w.shape[0], In = w.shape[1], sb = (In + 31) / 32;
      for (int64_t ob = 0; ob < O; ob += 32)
        for (int64_t ib = 0; ib < In; ib += 32) {
          float amax = 0;
          for (int64_t o = ob; o < std::min(O, ob + 32); ++o)
            for (int64_t i = ib; i < std::min(In, ib + 32); ++i) amax = std::max(amax, std::fabs(v[o * In + i]));
          float s = pow2_ceil(std::max(amax, 1e-30f) / kE4M3Max);
          out[1].bytes[(ob / 32) * sb + ib / 32] = e8m0_from_pow2(s);
          for (int64_t o = ob; o < std::min(O, ob + 32); ++o)
            for (int64_t i = ib; i < std::min(In, ib + 32); ++i)
              out[0].bytes[o * In + i] = e4m3_from_float(v[o * In + i] / s);
        }
      break;
    }
    case WeightKind::kFp8Rows:
    case WeightKind::kFp4Linear: {
      const bool fp4 = w.kind == WeightKind::kFp4Linear;
      const float qmax = fp4 ? kE2M1Max : kE4M3Max;
      const int64_t R = w.shape[0], C = w.shape[1];
      for (int64_t r = 0; r < R; ++r)
        for (int64_t cb = 0; cb < C; cb += 32) {
          float amax = 0;
          for (int64_t c = cb; c < cb + 32; ++c) amax = std::max(amax, std::fabs(v[r * C + c]));
          float s = pow2_ceil(std::max(amax, 1e-30f) / qmax);
          out[1].bytes[r * (C / 32) + cb / 32] = e8m0_from_pow2(s);
          for (int64_t c = cb; c < cb + 32; ++c) {
            float q = v[r * C + c] / s;
            if (fp4)
              fp4_packed_set(out[0].bytes.data() + r * (C / 2), c, e2m1_from_float(q));
            else
              out[0].bytes[r * C + c] = e4m3_from_float(q);
          }
        }
      break;
    }
  }
  return out;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
  if (!f) fail(p.string(), ": cannot write");
}

}  // namespace

nlohmann::json variant_config_json(const std::string& variant) {
  nlohmann::json j = tiny_config_json();
  if (variant == "tiny") return j;
  nlohmann::json& t = j["text_config"];
  if (variant == "tiny-long") {
    // Only the position limit changes: the RoPE tables (YaRN from 256 positions, factor 4) and the
    // weights are the tiny model's, so both give the same output on what fits in 4096 tokens.
    t["max_position_embeddings"] = 131072;
    return j;
  }
  if (variant != "real-dims")
    fail("make-tiny: unknown --variant '", variant, "' (tiny, tiny-long or real-dims)");
  t["vocab_size"] = 16384;
  j["image_token_id"] = 16000;
  t["dspark_noise_token_id"] = 16001;
  t["hidden_size"] = 5120;
  t["num_hidden_layers"] = 4;
  t["num_attention_heads"] = 64;
  t["head_dim"] = 512;
  t["qk_rope_head_dim"] = 64;
  t["q_lora_rank"] = 1280;
  t["o_groups"] = 8;
  t["o_lora_rank"] = 1024;
  t["sliding_window"] = 128;
  t["compress_ratios"] = {0, 2, 1, 1, 0};
  t["kv_source_layer_ids"] = {1, 2};
  t["index_source_layer_ids"] = {1, 2, 3};
  t["candidate_source_layer_id"] = 2;
  t["candidate_topk_blocks"] = 4;
  t["candidate_block_size"] = 8;
  t["index_n_heads"] = 32;
  t["index_head_dim"] = 128;
  t["index_topk"] = 64;
  t["n_routed_experts"] = 8;
  t["num_experts_per_tok"] = 6;
  t["moe_intermediate_size"] = 2304;
  t["engram_layer_ids"] = {1};
  t["engram_n_heads"] = 8;
  t["engram_head_dim"] = 256;
  // 24 primes from 1000 upwards (n-gram sizes 2..4 × 8 heads).
  t["engram_num_embeddings"] = {25874};
  t["dspark_target_layer_ids"] = {1, 2, 3};
  t["dspark_markov_rank"] = 256;
  t["dspark_n_routed_experts"] = 8;
  t["dspark_num_experts_per_tok"] = 3;
  t["max_position_embeddings"] = 65536;
  return j;
}

void write_tiny_checkpoint(const TinyOptions& opt) {
  if (opt.out_dir.empty()) fail("make-tiny: --out is required");
  fs::create_directories(opt.out_dir);
  nlohmann::json cfg_json = variant_config_json(opt.variant);
  ModelConfig cfg = parse_model_config(cfg_json, "tiny config");

  // Each weight has its own random stream, so drawing them on several threads changes nothing.
  const std::vector<WeightSpec> specs = expected_weights(cfg);
  std::vector<std::vector<Owned>> encoded(specs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < specs.size();) encoded[i] = encode(specs[i], draw(specs[i], opt.seed));
  };
  std::vector<std::thread> pool;
  const unsigned n_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (unsigned t = 1; t < n_threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  std::vector<SafetensorsWriter::Tensor> tensors;
  for (auto& group : encoded)
    for (Owned& o : group) tensors.push_back({o.spec.name, o.spec.dtype, o.spec.shape, std::move(o.bytes)});
  write_sharded_checkpoint(opt.out_dir, std::move(tensors), opt.num_shards);

  const fs::path out(opt.out_dir);
  write_text(out / "config.json", cfg_json.dump(2) + "\n");
  nlohmann::json gen = {{"bos_token_id", cfg.bos_token_id}, {"eos_token_id", cfg.eos_token_id},
                        {"do_sample", true}, {"temperature", 1.0}, {"top_p", 1.0}};
  write_text(out / "generation_config.json", gen.dump(2) + "\n");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::path src = fs::path(opt.tokenizer_dir) / f;
    if (!fs::exists(src)) fail("make-tiny: ", src.string(), " not found (set --tokenizer-dir)");
    fs::copy_file(src, out / f, fs::copy_options::overwrite_existing);
    fs::permissions(out / f, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                                 fs::perms::others_read);
  }
}

}  // namespace dsuf
