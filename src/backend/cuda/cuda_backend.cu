// CudaBackend: runs the V4.1 forward with the kernels of kernels.cu, step for step as the CPU
// reference does (same rounding points, same order of the state updates), one sequence chunk at a
// time. Speed comes later (fused kernels, batched decode, CUDA graphs); this version is the
// correctness baseline the fast kernels are checked against too.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.cuh"
#include "core/error.h"
#include "model/engram.h"
#include "model/inventory.h"
#include "model/rope.h"

namespace dsuf {
namespace {

using cuda::RowMeta;
using cuda::SeqMeta;

// Owns one device allocation.
struct DevMem {
  void* p = nullptr;
  DevMem() = default;
  explicit DevMem(size_t bytes) { DSUF_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  DevMem(DevMem&& o) noexcept : p(o.p) { o.p = nullptr; }
  DevMem& operator=(DevMem&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
  ~DevMem() {
    if (p) cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct DevFp8 {
  const uint8_t* w = nullptr;
  const uint8_t* s = nullptr;
  int64_t out = 0, in = 0;
};

struct DevExperts {
  const uint8_t** w1 = nullptr;  // device arrays of per-expert device pointers
  const uint8_t** s1 = nullptr;
  const uint8_t** w2 = nullptr;
  const uint8_t** s2 = nullptr;
  const uint8_t** w3 = nullptr;
  const uint8_t** s3 = nullptr;
};

struct DevLayer {
  const float *hca_fn, *hca_base, *hca_scale, *hcf_fn, *hcf_base, *hcf_scale;
  const uint16_t *attn_norm, *ffn_norm, *q_norm, *kv_norm;
  const float* sink;
  DevFp8 wq_a, wq_b, wkv, wo_a, wo_b;
  const uint16_t *comp_wkv = nullptr, *comp_wgate = nullptr, *comp_norm = nullptr, *idx_wk = nullptr,
                 *idx_k_norm = nullptr, *idx_wproj = nullptr;
  DevFp8 idx_wq_b;
  const uint16_t* gate;
  const float *bias, *bias_vl;
  DevExperts experts;
  DevFp8 sw1, sw2, sw3;
  // Engram (tables in mapped pinned host memory).
  const uint8_t *e_table = nullptr, *e_scale = nullptr;
  DevFp8 e_wkv;
  const uint16_t *e_q = nullptr, *e_k = nullptr;
};

// One sequence's pools on the device. A SequenceState points at them through its `device` handle,
// but copying a state copies the handle, so the pools also record whose they are: the backend that
// made them and how many tokens they hold. A state whose pos differs holds a handle that went stale
// (a copy taken before the pools advanced, a state restored from the conversation cache, host pools
// replaced): Impl::seq drops it and uploads that state's host pools again.
struct DevSeq {
  const void* owner = nullptr;        // the CudaBackend::Impl that allocated them
  int64_t pos = 0;                    // tokens the pools describe
  DevMem window;                      // [L][W][window_entry_bytes]
  std::vector<DevMem> ckv, ikey;      // per KV source, capacity entries
  std::vector<DevMem> pending[2];     // per KV source, [ratio][2·hd] FP32, double-buffered
  std::vector<int> cur;               // which pending buffer is current
  std::vector<int64_t> entries;       // per KV source
};

}  // namespace

struct CudaBackend::Impl {
  const ModelConfig& cfg;
  const LoadedModel* model;  // null for a synthetic model (weights drawn on the device)
  std::map<std::string, const uint8_t*> dev;  // every backbone tensor's device (or mapped host) address
  KvLayout layout;
  std::vector<int32_t> cids;
  CudaOptions opt;
  std::unique_ptr<EngramHasher> hasher;
  cudaStream_t stream = nullptr;
  std::vector<DevMem> owned;
  std::vector<void*> pinned;
  size_t weight_bytes = 0;
  const uint16_t *embed = nullptr, *head = nullptr, *norm = nullptr;
  std::vector<DevLayer> layers;
  std::vector<float> inv_main, inv_comp;  // RoPE frequencies (host); cos/sin go up per chunk
  int half = 0;
  // Workspace, sized for opt.max_chunk rows.
  struct {
    float *X, *pre, *mix_a, *mix_f, *u, *xn, *y, *xq, *sa, *xq2, *sa2, *tmp, *q_lat, *q, *kvw, *ag, *o, *zg, *qi, *wts,
        *scores, *bscores, *router, *rw, *h1, *h3, *ye, *ys, *h1s, *h3s, *emb, *ekv, *logits, *keys;
    int32_t *sel, *cand, *ids;
    uint8_t* cand_mask;
  } ws{};
  int64_t score_stride = 0, bscore_stride = 0, mask_stride = 0, logits_rows = 0;
  int max_rows = 0;  // rows per step: max(max_chunk, max_batch)
  float *X_head = nullptr, *pre_head = nullptr;

  // Per-step inputs: written into pinned host memory, copied up in one transfer (a graph-captured
  // decode step replays that copy from the same pinned buffer).
  struct Staging {
    uint8_t* host = nullptr;
    uint8_t* dev = nullptr;
    size_t cap = 0, used = 0;
    template <typename T>
    T* put(const T* data, size_t count) {  // returns the device address
      used = (used + 15) & ~size_t(15);
      const size_t bytes = count * sizeof(T);
      DSUF_CHECK(used + bytes <= cap, "step staging overflow (", used + bytes, " > ", cap, ")");
      if (bytes) std::memcpy(host + used, data, bytes);
      T* d = reinterpret_cast<T*>(dev + used);
      used += bytes;
      return d;
    }
  } stage;
  float* logits_host = nullptr;  // pinned

  // Decode steps captured as CUDA graphs, by batch size.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    size_t stage_bytes = 0;
  };
  std::map<int, Graph> graphs;
  bool use_graphs = true;
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
  double last_graph_ms = 0;

  Impl(const ModelConfig& c, const LoadedModel* m, std::vector<int32_t> ids, CudaOptions o)
      : cfg(c), model(m), layout(KvLayout::from_config(c)), cids(std::move(ids)), opt(o) {}

  template <typename T>
  T* alloc(size_t count) {
    owned.emplace_back(count * sizeof(T));
    return owned.back().as<T>();
  }
  template <typename T>
  const T* upload(const void* host, size_t bytes) {
    owned.emplace_back(bytes);
    DSUF_CUDA(cudaMemcpy(owned.back().p, host, bytes, cudaMemcpyHostToDevice));
    weight_bytes += bytes;
    return owned.back().as<T>();
  }
  const uint16_t* up(const Bf16Mat& m) { return m.data ? upload<uint16_t>(m.data, size_t(m.rows) * m.cols * 2) : nullptr; }
  const float* up(const std::vector<float>& v) { return upload<float>(v.data(), v.size() * 4); }
  DevFp8 up(const Fp8Linear& l) {
    if (!l.w) return {};
    const size_t sb = size_t((l.out + 31) / 32) * ((l.in + 31) / 32);
    return {upload<uint8_t>(l.w, size_t(l.out) * l.in), upload<uint8_t>(l.scale, sb), l.out, l.in};
  }
  const uint8_t** up_ptrs(const std::vector<const uint8_t*>& v) {
    return const_cast<const uint8_t**>(upload<const uint8_t*>(v.data(), v.size() * sizeof(void*)));
  }
  const uint8_t* pin(const uint8_t* host, size_t bytes) {
    void* p = nullptr;
    DSUF_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocMapped));
    std::memcpy(p, host, bytes);
    pinned.push_back(p);
    void* d = nullptr;
    DSUF_CUDA(cudaHostGetDevicePointer(&d, p, 0));
    return static_cast<const uint8_t*>(d);
  }

  // One sequence's slice of a step.
  struct Part {
    ForwardItem* item;
    DevSeq* ds;
    int offset, n;
    bool logits;  // rows of this part get logits (the last row, or all for kAll)
  };
  // Device addresses of one step's staged inputs.
  struct Step {
    int rows = 0, seqs = 0;
    int32_t* tok;
    RowMeta* meta;
    SeqMeta* seqtab;
    float *cs_main, *cs_comp, *cs_ent;
    uint8_t *image, *dead;
    std::vector<int64_t*> engram_rows;       // per Engram slot
    std::vector<cuda::EmitJob*> emit;        // per KV source
    std::vector<int> n_emit;
    std::vector<cuda::PendingJob*> pending;  // per KV source
    int32_t* logit_rows;
    int n_logit_rows = 0;
    std::vector<int> logit_row_of_part;  // first logits row of each part, −1 if none
    bool all_rows_logits = false;        // fixed layout: every row has logits
    int64_t max_entries = 0;
  };

  void load(uint64_t synthetic_seed);
  void place_tensors(uint64_t synthetic_seed);
  void alloc_workspace();
  DevSeq& seq(SequenceState& st);
  void check_host_pools(const SequenceState& st) const;
  Step stage_step(std::vector<Part>& parts, bool fixed_layout);
  void enqueue_step(const Step& st, std::vector<Part>& parts, bool trace);
  void run_step(std::vector<Part>& parts);
  void finish_step(std::vector<Part>& parts, const Step& st);
  void attention(int l, const Step& st, float* out);
  void moe(int l, int n, const uint8_t* image, float* out);
};

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

namespace {
bool on_device_backbone(const std::string& name) {
  return name.rfind("layers.", 0) == 0 || name == "embed.weight" || name == "head.weight" || name == "norm.weight";
}
bool in_host_memory(const std::string& name) { return name.find(".engram.embed.") != std::string::npos; }
int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
// E8M0 code that makes random E4M3 (|q| ≲ 1) or E2M1 (|q| ≲ 3) codes land near 1/sqrt(fan_in).
uint8_t synthetic_scale(int64_t fan_in, bool fp4) {
  const int e = int(std::lround(std::log2(std::sqrt(double(fan_in))))) + (fp4 ? 1 : 0);
  return uint8_t(127 - e);
}
}  // namespace

void CudaBackend::Impl::place_tensors(uint64_t synthetic_seed) {
  // Every backbone tensor by checkpoint name: on the device, except the Engram tables, which go to
  // pinned host memory the GPU reads directly. From the checkpoint, or drawn on the device.
  uint64_t salt = synthetic_seed;
  for (const WeightSpec& w : expected_weights(cfg)) {
    for (const TensorSpec& ts : physical_tensors(w)) {
      if (!on_device_backbone(ts.name)) continue;
      const size_t bytes = size_t(numel(ts.shape)) * dtype_size(ts.dtype);
      const bool host = in_host_memory(ts.name);
      if (model) {
        const uint8_t* src = model->checkpoint->get(ts.name).data;
        dev[ts.name] = host ? pin(src, bytes) : upload<uint8_t>(src, bytes);
        continue;
      }
      ++salt;
      const bool is_scale = ts.dtype == DType::F8_E8M0;
      const int64_t fan_in = w.shape.back();
      if (host) {
        void* p = nullptr;
        DSUF_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocMapped));
        pinned.push_back(p);
        cuda::fill_host_synthetic(static_cast<uint8_t*>(p), bytes, salt,
                                  is_scale ? cuda::Fill::kConstant : cuda::Fill::kE4M3, synthetic_scale(fan_in, false));
        void* d = nullptr;
        DSUF_CUDA(cudaHostGetDevicePointer(&d, p, 0));
        dev[ts.name] = static_cast<const uint8_t*>(d);
        continue;
      }
      uint8_t* d = alloc<uint8_t>(bytes);
      weight_bytes += bytes;
      cuda::Fill mode = cuda::Fill::kBytes;
      uint8_t constant = 0;
      float sigma = 1.0f;
      if (is_scale) {
        mode = cuda::Fill::kConstant, constant = synthetic_scale(fan_in, w.kind == WeightKind::kFp4Linear);
      } else if (ts.dtype == DType::F8_E4M3) {
        mode = cuda::Fill::kE4M3;
      } else if (ts.dtype == DType::BF16) {
        mode = w.init == WeightInit::kNorm ? cuda::Fill::kBf16One : cuda::Fill::kBf16Normal;
        sigma = w.init == WeightInit::kHead ? 2.5f / std::sqrt(float(fan_in))
                : w.init == WeightInit::kEmbed ? 1.0f : 1.0f / std::sqrt(float(fan_in));
      } else if (ts.dtype == DType::F32) {
        mode = cuda::Fill::kF32Normal;
        sigma = w.init == WeightInit::kHcFn ? 0.1f / std::sqrt(float(fan_in)) : w.init == WeightInit::kBias ? 0.01f : 1.0f;
        if (w.init == WeightInit::kHcScale) mode = cuda::Fill::kF32One;
      }
      cuda::fill_device_synthetic(d, bytes, salt, mode, constant, sigma, stream);
      dev[ts.name] = d;
    }
  }
  DSUF_CUDA(cudaStreamSynchronize(stream));
}

void CudaBackend::Impl::load(uint64_t synthetic_seed) {
  DSUF_CUDA(cudaSetDevice(opt.device));
  DSUF_CUDA(cudaStreamCreate(&stream));
  cuda::init_tables();
  const TextConfig& t = cfg.text;
  DSUF_CHECK(int64_t(cids.size()) >= t.vocab_size, "compressed-id table too short");
  if (!t.engram_layer_ids.empty()) hasher = std::make_unique<EngramHasher>(t, cids.at(t.engram_pad_token_id));
  place_tensors(synthetic_seed);
  auto u16 = [&](const std::string& n) -> const uint16_t* {
    auto it = dev.find(n);
    return it == dev.end() ? nullptr : reinterpret_cast<const uint16_t*>(it->second);
  };
  auto f32 = [&](const std::string& n) { return reinterpret_cast<const float*>(dev.at(n)); };
  auto fp8 = [&](const std::string& n, int64_t out, int64_t in) -> DevFp8 {
    auto it = dev.find(n + ".weight");
    if (it == dev.end()) return {};
    return {it->second, dev.at(n + ".scale"), out, in};
  };
  embed = u16("embed.weight"), head = u16("head.weight"), norm = u16("norm.weight");
  const int64_t D = t.hidden_size, H = t.num_attention_heads, hd = t.head_dim, qr = t.q_lora_rank;
  const int64_t G = t.o_groups, ol = t.o_lora_rank, F = t.moe_intermediate_size;
  for (const LayerPlan& lp : cfg.layers) {
    const std::string p = "layers." + std::to_string(lp.layer) + ".";
    DevLayer d{};
    d.hca_fn = f32(p + "hc_attn_fn"), d.hca_base = f32(p + "hc_attn_base"), d.hca_scale = f32(p + "hc_attn_scale");
    d.hcf_fn = f32(p + "hc_ffn_fn"), d.hcf_base = f32(p + "hc_ffn_base"), d.hcf_scale = f32(p + "hc_ffn_scale");
    d.attn_norm = u16(p + "attn_norm.weight"), d.ffn_norm = u16(p + "ffn_norm.weight");
    d.q_norm = u16(p + "attn.q_norm.weight"), d.kv_norm = u16(p + "attn.kv_norm.weight");
    d.sink = f32(p + "attn.attn_sink");
    d.wq_a = fp8(p + "attn.wq_a", qr, D), d.wq_b = fp8(p + "attn.wq_b", H * hd, qr), d.wkv = fp8(p + "attn.wkv", hd, D);
    d.wo_a = fp8(p + "attn.wo_a", G * ol, H * hd / G), d.wo_b = fp8(p + "attn.wo_b", D, G * ol);
    d.comp_wkv = u16(p + "attn.compressor.wkv.weight"), d.comp_wgate = u16(p + "attn.compressor.wgate.weight");
    d.comp_norm = u16(p + "attn.compressor.norm.weight");
    d.idx_wk = u16(p + "attn.indexer.wk.weight"), d.idx_k_norm = u16(p + "attn.indexer.k_norm.weight");
    d.idx_wproj = u16(p + "attn.indexer.weights_proj.weight");
    d.idx_wq_b = fp8(p + "attn.indexer.wq_b", int64_t(t.index_n_heads) * t.index_head_dim, qr);
    d.gate = u16(p + "ffn.gate.weight"), d.bias = f32(p + "ffn.gate.bias"), d.bias_vl = f32(p + "ffn.gate.bias_vl");
    std::vector<const uint8_t*> ptr[6];
    for (int e = 0; e < t.n_routed_experts; ++e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      const char* names[3] = {"w1", "w2", "w3"};
      for (int k = 0; k < 3; ++k) {
        ptr[2 * k].push_back(dev.at(ep + names[k] + ".weight"));
        ptr[2 * k + 1].push_back(dev.at(ep + names[k] + ".scale"));
      }
    }
    d.experts = {up_ptrs(ptr[0]), up_ptrs(ptr[1]), up_ptrs(ptr[2]), up_ptrs(ptr[3]), up_ptrs(ptr[4]), up_ptrs(ptr[5])};
    d.sw1 = fp8(p + "ffn.shared_experts.w1", F, D), d.sw2 = fp8(p + "ffn.shared_experts.w2", D, F);
    d.sw3 = fp8(p + "ffn.shared_experts.w3", F, D);
    if (lp.engram_slot >= 0) {
      const int64_t in = int64_t(t.engram_max_ngram_size - 1) * t.engram_n_heads * t.engram_head_dim;
      d.e_table = dev.at(p + "engram.embed.weight"), d.e_scale = dev.at(p + "engram.embed.scale");
      d.e_wkv = fp8(p + "engram.wkv", (t.hc_mult + 1) * D, in);
      d.e_q = u16(p + "engram.q_weight"), d.e_k = u16(p + "engram.k_weight");
    }
    layers.push_back(d);
  }
  // RoPE frequencies: the same FP32 values the CPU reference computes (model/rope.h).
  half = t.qk_rope_head_dim / 2;
  inv_main = rope_inv_freq(t.qk_rope_head_dim, t.rope_theta, nullptr);
  inv_comp = rope_inv_freq(t.qk_rope_head_dim, t.compress_rope_theta, &t.rope_scaling);
  alloc_workspace();
}

namespace {
// Every workspace buffer, in floats (or the element counts named), for one max_chunk forward. The
// one list serves the allocation and the memory plan.
struct WorkspaceSizes {
  int64_t X, pre, mix, vecD, xq, sa, tmp, q_lat, q, kvw, ag, o, zg, qi, wts, scores, bscores, sel, cand, cand_mask,
      router, ids, h, ye, hs, emb, ekv, logits, keys;
  int64_t score_stride, bscore_stride;
  size_t bytes() const {
    const int64_t floats = X + pre + 2 * mix + 3 * vecD + 2 * xq + 2 * sa + tmp + q_lat + q + kvw + ag + o + zg + qi +
                           wts + scores + bscores + router + ids /*rw*/ + 2 * h + ye + vecD /*ys*/ + 2 * hs + emb + ekv +
                           logits + keys;
    return size_t(floats) * 4 + size_t(sel + cand + ids) * 4 + size_t(cand_mask);
  }
};
WorkspaceSizes workspace_sizes(const TextConfig& t, int64_t N, int64_t max_context, int64_t R) {
  const int64_t D = t.hidden_size, hc = t.hc_mult, H = t.num_attention_heads, hd = t.head_dim;
  const int64_t qr = t.q_lora_rank, G = t.o_groups, ol = t.o_lora_rank, F = t.moe_intermediate_size;
  const int64_t E = t.n_routed_experts, K = t.num_experts_per_tok, IH = t.index_n_heads, ihd = t.index_head_dim;
  const int64_t ehd = t.engram_head_dim, half = t.qk_rope_head_dim / 2;
  const int64_t maxk = std::max({D, qr, H * hd, G * ol, F, R * ehd, hd});
  WorkspaceSizes w{};
  w.score_stride = max_context;
  w.bscore_stride = (max_context + t.candidate_block_size - 1) / t.candidate_block_size;
  w.X = N * hc * D, w.pre = N * hc, w.mix = N * cuda::hc_mix_stride(int(hc)), w.vecD = N * D;
  w.xq = N * K * maxk, w.sa = N * K * maxk / 32, w.tmp = N * std::max(qr, hd), w.q_lat = N * qr, w.q = N * H * hd;
  w.kvw = N * hd, w.ag = N * 2 * hd, w.o = N * H * hd, w.zg = N * G * ol;
  w.qi = N * IH * ihd, w.wts = N * IH, w.scores = N * w.score_stride, w.bscores = N * w.bscore_stride;
  w.sel = N * t.index_topk, w.cand = N * t.candidate_topk_blocks, w.cand_mask = N * w.bscore_stride;
  w.router = N * E, w.ids = N * K, w.h = N * K * F, w.ye = N * K * D, w.hs = N * F;
  w.emb = N * std::max<int64_t>(R * ehd, 1), w.ekv = N * (hc + 1) * D, w.logits = N * t.vocab_size;
  w.keys = N * (t.sliding_window + t.index_topk) * hd;
  return w;
}
}  // namespace

std::string CudaMemoryPlan::describe() const {
  auto gib = [](size_t b) { return double(b) / (1ull << 30); };
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "weights %.2f GiB + sequences %.2f GiB (%.3f GiB each) + workspace %.2f GiB = %.2f GiB on the device; "
                "Engram tables %.2f GiB pinned in host memory",
                gib(weights), gib(sequences), gib(per_sequence), gib(workspace), gib(total()), gib(host_pinned));
  return buf;
}

CudaMemoryPlan plan_cuda_memory(const LoadedModel& model, const CudaOptions& opt) {
  return plan_cuda_memory(model.config, opt);
}

CudaMemoryPlan plan_cuda_memory(const ModelConfig& cfg, const CudaOptions& opt) {
  const TextConfig& t = cfg.text;
  CudaMemoryPlan p;
  for (const TensorSpec& ts : expected_tensors(cfg)) {
    if (!on_device_backbone(ts.name)) continue;
    const size_t bytes = size_t(numel(ts.shape)) * dtype_size(ts.dtype);
    (in_host_memory(ts.name) ? p.host_pinned : p.weights) += bytes;
  }
  const KvLayout L = KvLayout::from_config(cfg);
  p.per_sequence = size_t(L.num_layers) * L.window * L.window_entry_bytes;
  for (size_t k = 0; k < L.kv_sources.size(); ++k)
    p.per_sequence += size_t(opt.max_context) * (L.ckv_entry_bytes + L.ikey_entry_bytes) +
                      2 * size_t(L.source_ratio[k]) * 2 * L.head_dim * 4;
  p.sequences = p.per_sequence * size_t(opt.max_batch);
  const int64_t R = t.engram_layer_ids.empty() ? 0 : int64_t(t.engram_max_ngram_size - 1) * t.engram_n_heads;
  const WorkspaceSizes w = workspace_sizes(t, std::max(opt.max_chunk, opt.max_batch), opt.max_context, R);
  p.workspace = w.bytes() + size_t(w.X + w.pre) * 4;  // + the head's gathered rows
  return p;
}

void CudaBackend::Impl::alloc_workspace() {
  const TextConfig& t = cfg.text;
  const int64_t R = hasher ? hasher->rows_per_token() : 0;
  max_rows = std::max(opt.max_chunk, opt.max_batch);
  const WorkspaceSizes w = workspace_sizes(t, max_rows, opt.max_context, R);
  X_head = alloc<float>(w.X), pre_head = alloc<float>(w.pre);
  ws.X = alloc<float>(w.X), ws.pre = alloc<float>(w.pre), ws.mix_a = alloc<float>(w.mix), ws.mix_f = alloc<float>(w.mix);
  ws.u = alloc<float>(w.vecD), ws.xn = alloc<float>(w.vecD), ws.y = alloc<float>(w.vecD);
  ws.xq = alloc<float>(w.xq), ws.sa = alloc<float>(w.sa), ws.xq2 = alloc<float>(w.xq), ws.sa2 = alloc<float>(w.sa);
  ws.tmp = alloc<float>(w.tmp), ws.q_lat = alloc<float>(w.q_lat), ws.q = alloc<float>(w.q), ws.kvw = alloc<float>(w.kvw);
  ws.ag = alloc<float>(w.ag), ws.o = alloc<float>(w.o), ws.zg = alloc<float>(w.zg);
  ws.qi = alloc<float>(w.qi), ws.wts = alloc<float>(w.wts);
  score_stride = w.score_stride, bscore_stride = w.bscore_stride, mask_stride = w.bscore_stride;
  ws.scores = alloc<float>(w.scores), ws.bscores = alloc<float>(w.bscores);
  ws.sel = alloc<int32_t>(w.sel), ws.cand = alloc<int32_t>(w.cand), ws.cand_mask = alloc<uint8_t>(w.cand_mask);
  ws.router = alloc<float>(w.router), ws.ids = alloc<int32_t>(w.ids), ws.rw = alloc<float>(w.ids);
  ws.h1 = alloc<float>(w.h), ws.h3 = alloc<float>(w.h), ws.ye = alloc<float>(w.ye), ws.ys = alloc<float>(w.vecD);
  ws.keys = alloc<float>(w.keys);
  ws.h1s = alloc<float>(w.hs), ws.h3s = alloc<float>(w.hs), ws.emb = alloc<float>(w.emb), ws.ekv = alloc<float>(w.ekv);
  logits_rows = max_rows;
  ws.logits = alloc<float>(w.logits);
  DSUF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&logits_host), size_t(w.logits) * 4, cudaHostAllocDefault));
  pinned.push_back(logits_host);
  // Staging: every per-step list, bounded by max_rows rows (and as many sequences).
  const size_t Rn = size_t(max_rows), S = layout.kv_sources.size();
  const size_t slots = hasher ? size_t(hasher->num_slots()) : 0, Rr = hasher ? size_t(hasher->rows_per_token()) : 0;
  stage.cap = 64 * 16 + Rn * (4 + sizeof(RowMeta) + sizeof(SeqMeta) + 2 + 4 + 2 * 2 * half * 4 + slots * Rr * 8) +
              S * (2 * Rn) * (sizeof(cuda::EmitJob) + sizeof(cuda::PendingJob) + 2 * half * 4) + 2 * half * 4;
  DSUF_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&stage.host), stage.cap, cudaHostAllocDefault));
  pinned.push_back(stage.host);
  stage.dev = alloc<uint8_t>(stage.cap);
}

void CudaBackend::Impl::check_host_pools(const SequenceState& st) const {
  const char* why = "sequence state: its host pools do not describe its position (a copy of a device "
                    "state taken without Backend::download?)";
  DSUF_CHECK(int(st.window.size()) == layout.num_layers, why);
  for (const auto& w : st.window) DSUF_CHECK(w.size() == size_t(layout.window) * layout.window_entry_bytes, why);
  const size_t S = layout.kv_sources.size();
  DSUF_CHECK(st.ckv.size() == S && st.ikey.size() == S && st.pending.size() == S, why);
  for (size_t k = 0; k < S; ++k) {
    const int64_t ratio = layout.source_ratio[k], entries = st.pos / ratio;
    DSUF_CHECK(st.ckv[k].size() == size_t(entries) * layout.ckv_entry_bytes, why, " (compressed KV of source ", k, ")");
    DSUF_CHECK(st.ikey[k].size() == size_t(entries) * layout.ikey_entry_bytes, why, " (indexer keys of source ", k, ")");
    DSUF_CHECK(st.pending[k].size() == size_t(st.pos % ratio) * 2 * layout.head_dim, why, " (compressor state of source ", k, ")");
  }
  DSUF_CHECK(int(st.engram_history.size()) == layout.history, why);
}

DevSeq& CudaBackend::Impl::seq(SequenceState& st) {
  if (st.device) {
    auto* held = static_cast<DevSeq*>(st.device.get());
    if (held->owner == this && held->pos == st.pos) return *held;
    st.device.reset();  // stale: the host pools are this state's truth
  }
  // A state that already holds tokens (deserialized, restored from the cache, or one whose stale
  // handle was dropped above) is uploaded from its host pools, which must describe exactly pos
  // tokens: a copy of a device state taken without Backend::download fails here instead of
  // running on stale bytes.
  if (st.pos > 0) check_host_pools(st);
  const TextConfig& t = cfg.text;
  auto ds = std::make_shared<DevSeq>();
  ds->owner = this;
  ds->pos = st.pos;
  const size_t ring_bytes = size_t(layout.num_layers) * layout.window * layout.window_entry_bytes;
  ds->window = DevMem(ring_bytes);
  const size_t S = layout.kv_sources.size();
  ds->cur.assign(S, 0);
  ds->entries.assign(S, 0);
  for (size_t k = 0; k < S; ++k) {
    ds->ckv.emplace_back(size_t(opt.max_context) * layout.ckv_entry_bytes);
    ds->ikey.emplace_back(size_t(opt.max_context) * layout.ikey_entry_bytes);
    for (auto& pb : ds->pending) pb.emplace_back(size_t(layout.source_ratio[k]) * 2 * t.head_dim * 4);
  }
  if (st.pos > 0) {
    for (int l = 0; l < layout.num_layers; ++l)
      DSUF_CUDA(cudaMemcpy(ds->window.as<uint8_t>() + size_t(l) * layout.window * layout.window_entry_bytes,
                           st.window[l].data(), st.window[l].size(), cudaMemcpyHostToDevice));
    for (size_t k = 0; k < S; ++k) {
      ds->entries[k] = st.entries(layout, int(k));
      DSUF_CHECK(ds->entries[k] <= opt.max_context, "sequence longer than max_context");
      DSUF_CUDA(cudaMemcpy(ds->ckv[k].p, st.ckv[k].data(), st.ckv[k].size(), cudaMemcpyHostToDevice));
      DSUF_CUDA(cudaMemcpy(ds->ikey[k].p, st.ikey[k].data(), st.ikey[k].size(), cudaMemcpyHostToDevice));
      if (!st.pending[k].empty())
        DSUF_CUDA(cudaMemcpy(ds->pending[0][k].p, st.pending[k].data(), st.pending[k].size() * 4, cudaMemcpyHostToDevice));
    }
  } else {
    DSUF_CUDA(cudaMemset(ds->window.p, 0, ring_bytes));
  }
  st.device = ds;
  return *ds;
}

// Host side of a step: rows, sequences, RoPE tables, Engram rows and the compressor's job lists,
// all staged for one upload. With fixed_layout (graph-captured decode) every list has the same
// length for a given number of rows, so the captured kernels' arguments stay valid.
CudaBackend::Impl::Step CudaBackend::Impl::stage_step(std::vector<Part>& parts, bool fixed_layout) {
  const ModelConfig& c = cfg;
  const TextConfig& t = c.text;
  const int W = t.sliding_window;
  Step st;
  stage.used = 0;
  std::vector<int32_t> tok;
  std::vector<RowMeta> meta;
  std::vector<SeqMeta> seqs;
  std::vector<uint8_t> image;
  for (Part& p : parts) {
    SequenceState& s = *p.item->state;
    SeqMeta sm{};
    sm.window = p.ds->window.as<uint8_t>();
    for (size_t k = 0; k < layout.kv_sources.size(); ++k) sm.ckv[k] = p.ds->ckv[k].as<uint8_t>(), sm.ikey[k] = p.ds->ikey[k].as<uint8_t>();
    sm.P = s.pos;
    sm.row0 = int32_t(tok.size());
    sm.n = p.n;
    for (int j = 0; j < p.n; ++j) {
      const int32_t id = p.item->tokens[p.offset + j];
      if (id < 0 || id >= t.vocab_size) fail("token id ", id, " is outside the vocabulary [0, ", t.vocab_size, ")");
      tok.push_back(id);
      meta.push_back({s.pos + j, int32_t(seqs.size()), j >= p.n - W ? 1 : 0});
      image.push_back(id == c.image_token_id);
    }
    st.max_entries = std::max<int64_t>(st.max_entries, s.pos + p.n);
    seqs.push_back(sm);
  }
  const int R = int(tok.size());
  st.rows = R;
  st.seqs = int(seqs.size());
  st.tok = stage.put(tok.data(), R);
  st.meta = stage.put(meta.data(), R);
  st.seqtab = stage.put(seqs.data(), seqs.size());
  st.image = stage.put(image.data(), R);
  std::vector<float> csm(size_t(R) * 2 * half), csc(size_t(R) * 2 * half);
  for (int i = 0; i < R; ++i) {
    rope_cos_sin(meta[i].pos, inv_main, csm.data() + size_t(i) * 2 * half);
    rope_cos_sin(meta[i].pos, inv_comp, csc.data() + size_t(i) * 2 * half);
  }
  st.cs_main = stage.put(csm.data(), csm.size());
  st.cs_comp = stage.put(csc.data(), csc.size());
  // Engram: row ids per token per Engram layer (hashing is host work on token ids).
  if (hasher) {
    const int Rr = hasher->rows_per_token(), ctx_len = t.engram_max_ngram_size;
    std::vector<uint8_t> dead(R);
    std::vector<int32_t> cid(R), ctx(ctx_len);
    for (int i = 0; i < R; ++i) cid[i] = image[i] ? -1 : cids[tok[i]], dead[i] = image[i];
    st.dead = stage.put(dead.data(), R);
    for (int slot = 0; slot < hasher->num_slots(); ++slot) {
      std::vector<int64_t> rows(size_t(R) * Rr, 0);
      for (size_t q = 0; q < parts.size(); ++q) {
        const SequenceState& s = *parts[q].item->state;
        const int row0 = seqs[q].row0;
        for (int j = 0; j < parts[q].n; ++j) {
          if (cid[row0 + j] < 0) continue;
          for (int b = 0; b < ctx_len; ++b) {
            const int src = j - b, h = -src - 1;
            ctx[b] = src >= 0 ? cid[row0 + src] : (h < int(s.engram_history.size()) ? s.engram_history[h] : -1);
          }
          hasher->row_ids(slot, ctx.data(), rows.data() + size_t(row0 + j) * Rr);
        }
      }
      st.engram_rows.push_back(stage.put(rows.data(), rows.size()));
    }
  }
  // Compressor jobs per KV source: the entries this step closes, and the partial groups to keep.
  std::vector<float> ecs;
  std::vector<std::vector<cuda::EmitJob>> emit(layout.kv_sources.size());
  std::vector<std::vector<cuda::PendingJob>> pend(layout.kv_sources.size());
  for (size_t k = 0; k < layout.kv_sources.size(); ++k) {
    const int ratio = layout.source_ratio[k];
    for (size_t q = 0; q < parts.size(); ++q) {
      DevSeq& ds = *parts[q].ds;
      const int64_t P = seqs[q].P, before = ds.entries[k], after = (P + parts[q].n) / ratio;
      DSUF_CHECK(before == P / ratio, "compressed-KV bookkeeping out of step");
      if (after > opt.max_context)
        fail("sequence of ", P + parts[q].n, " tokens exceeds the CUDA backend's max_context ", opt.max_context);
      const int pending_n = int(P % ratio);
      const float* pin = ds.pending[ds.cur[k]][k].as<float>();
      for (int64_t w = before; w < after; ++w) {
        // A fixed layout gives each (source, sequence) one cos/sin row: a decode row closes at most one entry.
        const size_t row = fixed_layout ? k * parts.size() + q : ecs.size() / (2 * half);
        ecs.resize(std::max(ecs.size(), (row + 1) * 2 * half));
        emit[k].push_back({w, pin, int32_t(q), pending_n, int32_t(row), 0});
        rope_cos_sin(w * ratio, inv_comp, ecs.data() + row * 2 * half);
      }
      if (fixed_layout && after == before) emit[k].push_back({-1, pin, int32_t(q), 0, 0, 0});
      pend[k].push_back({pin, ds.pending[1 - ds.cur[k]][k].as<float>(), int32_t(q), pending_n,
                         int32_t((P + parts[q].n) % ratio), 0});
    }
  }
  if (fixed_layout) ecs.resize(std::max<size_t>(1, layout.kv_sources.size() * parts.size()) * 2 * half);
  st.cs_ent = stage.put(ecs.data(), std::max<size_t>(ecs.size(), 2 * half));
  for (size_t k = 0; k < layout.kv_sources.size(); ++k) {
    st.emit.push_back(stage.put(emit[k].data(), emit[k].size()));
    st.n_emit.push_back(int(emit[k].size()));
    st.pending.push_back(stage.put(pend[k].data(), pend[k].size()));
  }
  // Rows that get logits (with a fixed layout: every row, whoever asked).
  std::vector<int32_t> lrows;
  st.all_rows_logits = fixed_layout;
  for (size_t q = 0; q < parts.size(); ++q) {
    st.logit_row_of_part.push_back(parts[q].logits || fixed_layout ? int(lrows.size()) : -1);
    if (fixed_layout) {
      for (int j = 0; j < parts[q].n; ++j) lrows.push_back(seqs[q].row0 + j);
      continue;
    }
    if (!parts[q].logits) continue;
    const bool all = parts[q].item->want == ForwardItem::Logits::kAll;
    for (int j = all ? 0 : parts[q].n - 1; j < parts[q].n; ++j) lrows.push_back(seqs[q].row0 + j);
  }
  st.n_logit_rows = int(lrows.size());
  st.logit_rows = stage.put(lrows.data(), lrows.size());
  if (fixed_layout) st.max_entries = opt.max_context;
  return st;
}

void CudaBackend::Impl::attention(int l, const Step& st, float* out) {
  const TextConfig& t = cfg.text;
  const LayerPlan& lp = cfg.layers[l];
  const DevLayer& d = layers[l];
  const bool r = opt.numerics.bf16_activations, aq = opt.numerics.act_quant;
  const int H = t.num_attention_heads, W = t.sliding_window, n = st.rows;
  const int64_t D = t.hidden_size, hd = t.head_dim, qr = t.q_lora_rank, G = t.o_groups, ol = t.o_lora_rank;
  const float eps = float(t.rms_norm_eps);
  const float* cs = lp.compress_rope ? st.cs_comp : st.cs_main;

  cuda::act_quant(ws.xn, n, D, aq, ws.xq, ws.sa, stream);
  cuda::fp8_linear(d.wq_a.w, d.wq_a.s, qr, D, ws.xq, ws.sa, D, n, ws.tmp, qr, r, stream);
  cuda::rmsnorm(ws.tmp, n, qr, d.q_norm, eps, ws.q_lat, r, stream);
  cuda::fp8_linear(d.wkv.w, d.wkv.s, hd, D, ws.xq, ws.sa, D, n, ws.tmp, hd, r, stream);
  cuda::rmsnorm(ws.tmp, n, hd, d.kv_norm, eps, ws.kvw, r, stream);
  cuda::rope(ws.kvw, n, 1, hd, cs, half, 1.0f, r, stream);
  cuda::fp8_fake_quant(ws.kvw, n * hd, r, stream);
  cuda::act_quant(ws.q_lat, n, qr, aq, ws.xq2, ws.sa2, stream);
  cuda::fp8_linear(d.wq_b.w, d.wq_b.s, H * hd, qr, ws.xq2, ws.sa2, qr, n, ws.q, H * hd, r, stream);
  cuda::rope(ws.q, n, H, hd, cs, half, 1.0f, r, stream);

  const int slot = layout.source_slot[l];
  const int ratio = lp.ratio;
  if (lp.owns_compressor) {
    cuda::bf16_linear(d.comp_wkv, hd, D, ws.xn, D, n, ws.ag, 2 * hd, false, stream);
    if (ratio > 1) cuda::bf16_linear(d.comp_wgate, hd, D, ws.xn, D, n, ws.ag + hd, 2 * hd, false, stream);
    cuda::CompressArgs ca{.ag = ws.ag, .jobs = st.emit[slot], .n_jobs = st.n_emit[slot], .seqs = st.seqtab,
                          .src = slot, .ratio = ratio, .hd = hd, .ihd = t.index_head_dim, .norm = d.comp_norm,
                          .wk = d.idx_wk, .k_norm = d.idx_k_norm, .cs = st.cs_ent, .half = half, .eps = eps, .r = r};
    cuda::compress_emit(ca, stream);
    cuda::update_pending(ws.ag, st.pending[slot], st.seqs, st.seqtab, ratio, hd, stream);
  }

  if (lp.runs_indexer) {
    const int IH = t.index_n_heads;
    const int64_t ihd = t.index_head_dim;
    cuda::fp8_linear(d.idx_wq_b.w, d.idx_wq_b.s, IH * ihd, qr, ws.xq2, ws.sa2, qr, n, ws.qi, IH * ihd, r, stream);
    cuda::rope(ws.qi, n, IH, ihd, st.cs_comp, half, 1.0f, r, stream);
    cuda::fp4_fake_quant_pow2(ws.qi, n * IH * ihd, r, stream);
    cuda::bf16_linear(d.idx_wproj, IH, D, ws.xn, D, n, ws.wts, IH, false, stream);
    cuda::IndexScoreArgs ia{.qi = ws.qi, .wts = ws.wts, .meta = st.meta, .seqs = st.seqtab, .src = slot,
                            .max_entries = st.max_entries / ratio, .rows = n, .IH = IH, .ratio = ratio, .ihd = ihd,
                            .cand_mask = lp.candidate_constrained ? ws.cand_mask : nullptr, .mask_stride = mask_stride,
                            .block = t.candidate_block_size, .scores = ws.scores, .score_stride = score_stride, .r = r};
    cuda::index_scores(ia, stream);
    if (lp.candidate_source) {
      cuda::candidate_block_scores(ws.scores, score_stride, n, st.meta, ratio, t.candidate_block_size, ws.bscores,
                                   bscore_stride, stream);
      cuda::top_k(ws.bscores, bscore_stride, n, st.meta, ratio, t.candidate_block_size, t.candidate_topk_blocks,
                  ws.cand, t.candidate_topk_blocks, stream);
      cuda::mask_from_selection(ws.cand, t.candidate_topk_blocks, n, ws.cand_mask, mask_stride, stream);
    }
    cuda::top_k(ws.scores, score_stride, n, st.meta, ratio, 0, t.index_topk, ws.sel, t.index_topk, stream);
  }

  cuda::AttentionArgs aa{.q = ws.q, .kv_chunk = ws.kvw, .meta = st.meta, .seqs = st.seqtab, .layer = l,
                         .src = ratio > 0 ? slot : -1, .sel = ratio > 0 ? ws.sel : nullptr,
                         .sel_stride = t.index_topk, .sink = d.sink, .out = ws.o, .keys = ws.keys,
                         .kmax = W + t.index_topk, .rows = n, .H = H, .W = W, .hd = hd, .r = r};
  cuda::attention(aa, stream);
  cuda::rope(ws.o, n, H, hd, cs, half, -1.0f, r, stream);
  const int64_t gin = (H / G) * hd;
  cuda::act_quant(ws.o, n, H * hd, opt.numerics.wo_a_act_quant && aq, ws.xq, ws.sa, stream);
  for (int g = 0; g < G; ++g)
    cuda::fp8_linear(d.wo_a.w + g * ol * gin, d.wo_a.s + (g * ol / 32) * (gin / 32), ol, gin, ws.xq + g * gin,
                     ws.sa + g * gin / 32, H * hd, n, ws.zg + g * ol, G * ol, r, stream);
  cuda::act_quant(ws.zg, n, G * ol, aq, ws.xq2, ws.sa2, stream);
  cuda::fp8_linear(d.wo_b.w, d.wo_b.s, D, G * ol, ws.xq2, ws.sa2, G * ol, n, out, D, r, stream);
  cuda::pack_window(ws.kvw, n, st.meta, st.seqtab, l, hd, W, stream);
}

void CudaBackend::Impl::moe(int l, int n, const uint8_t* image, float* out) {
  const TextConfig& t = cfg.text;
  const DevLayer& d = layers[l];
  const bool r = opt.numerics.bf16_activations, aq = opt.numerics.act_quant;
  const int E = t.n_routed_experts, K = t.num_experts_per_tok;
  const int64_t D = t.hidden_size, F = t.moe_intermediate_size;
  const float limit = float(t.swiglu_limit);
  cuda::bf16_linear(d.gate, E, D, ws.xn, D, n, ws.router, E, false, stream);
  cuda::route(ws.router, n, E, K, d.bias, d.bias_vl, image, float(t.gate_temp), float(t.routed_scaling_factor),
              ws.ids, ws.rw, stream);
  cuda::act_quant(ws.xn, n, D, aq, ws.xq, ws.sa, stream);
  cuda::fp4_linear_grouped(d.experts.w1, d.experts.s1, ws.ids, F, D, ws.xq, ws.sa, K, int64_t(n) * K, ws.h1, r, stream);
  cuda::fp4_linear_grouped(d.experts.w3, d.experts.s3, ws.ids, F, D, ws.xq, ws.sa, K, int64_t(n) * K, ws.h3, r, stream);
  cuda::swiglu(ws.h1, ws.h3, int64_t(n) * K, F, ws.rw, limit, true, r, stream);
  cuda::act_quant(ws.h1, int64_t(n) * K, F, aq, ws.xq2, ws.sa2, stream);
  cuda::fp4_linear_grouped(d.experts.w2, d.experts.s2, ws.ids, D, F, ws.xq2, ws.sa2, 1, int64_t(n) * K, ws.ye, r, stream);
  cuda::fp8_linear(d.sw1.w, d.sw1.s, F, D, ws.xq, ws.sa, D, n, ws.h1s, F, r, stream);
  cuda::fp8_linear(d.sw3.w, d.sw3.s, F, D, ws.xq, ws.sa, D, n, ws.h3s, F, r, stream);
  cuda::swiglu(ws.h1s, ws.h3s, n, F, nullptr, limit, opt.numerics.shared_expert_clamp, r, stream);
  cuda::act_quant(ws.h1s, n, F, aq, ws.xq2, ws.sa2, stream);
  cuda::fp8_linear(d.sw2.w, d.sw2.s, D, F, ws.xq2, ws.sa2, F, n, ws.ys, D, r, stream);
  cuda::moe_sum(ws.ye, K, ws.ys, n, D, out, r, stream);
}

// The kernels of one step, in order; no host synchronization inside unless tracing (so a decode
// step can be captured as a CUDA graph).
void CudaBackend::Impl::enqueue_step(const Step& st, std::vector<Part>& parts, bool trace) {
  const ModelConfig& c = cfg;
  const TextConfig& t = c.text;
  const bool r = opt.numerics.bf16_activations;
  const int hc = t.hc_mult, n = st.rows, ms = cuda::hc_mix_stride(hc);
  const int64_t D = t.hidden_size, V = t.vocab_size;
  const float eps = float(t.rms_norm_eps), hc_eps = float(t.hc_eps);
  DSUF_CUDA(cudaMemcpyAsync(stage.dev, stage.host, stage.used, cudaMemcpyHostToDevice, stream));
  cuda::embed(st.tok, n, embed, D, hc, ws.X, ws.pre, stream);
  for (const LayerPlan& lp : c.layers) {
    const int l = lp.layer;
    const DevLayer& d = layers[l];
    if (lp.engram_slot >= 0) {
      const int Rr = hasher->rows_per_token();
      const int64_t ehd = t.engram_head_dim;
      cuda::engram_gather(st.engram_rows[lp.engram_slot], n, Rr, d.e_table, d.e_scale, ehd, ws.emb, stream);
      cuda::act_quant(ws.emb, n, Rr * ehd, opt.numerics.act_quant, ws.xq, ws.sa, stream);
      cuda::fp8_linear(d.e_wkv.w, d.e_wkv.s, d.e_wkv.out, d.e_wkv.in, ws.xq, ws.sa, Rr * ehd, n, ws.ekv, (hc + 1) * D,
                       r, stream);
      cuda::engram_gate(ws.X, ws.ekv, d.e_q, d.e_k, st.dead, n, hc, D, eps, r, stream);
    }
    cuda::hc_mix(d.hca_fn, d.hca_base, d.hca_scale, ws.X, n, hc, D, eps, t.hc_sinkhorn_iters, hc_eps, ws.mix_a, stream);
    cuda::hc_collapse(ws.pre, hc, ws.X, n, hc, D, ws.u, r, stream);
    cuda::rmsnorm(ws.u, n, D, d.attn_norm, eps, ws.xn, r, stream);
    attention(l, st, ws.y);
    cuda::hc_expand(ws.mix_a, ms, ws.y, n, hc, D, ws.X, r, stream);
    cuda::hc_mix(d.hcf_fn, d.hcf_base, d.hcf_scale, ws.X, n, hc, D, eps, t.hc_sinkhorn_iters, hc_eps, ws.mix_f, stream);
    cuda::hc_collapse(ws.mix_a, ms, ws.X, n, hc, D, ws.u, r, stream);
    cuda::rmsnorm(ws.u, n, D, d.ffn_norm, eps, ws.xn, r, stream);
    moe(l, n, st.image, ws.y);
    cuda::hc_expand(ws.mix_f, ms, ws.y, n, hc, D, ws.X, r, stream);
    // pre of the FFN site feeds the next attention site's collapse.
    DSUF_CUDA(cudaMemcpy2DAsync(ws.pre, hc * 4, ws.mix_f, ms * 4, hc * 4, n, cudaMemcpyDeviceToDevice, stream));
    if (trace) {
      std::vector<float> x(size_t(n) * hc * D);
      DSUF_CUDA(cudaMemcpyAsync(x.data(), ws.X, x.size() * 4, cudaMemcpyDeviceToHost, stream));
      DSUF_CUDA(cudaStreamSynchronize(stream));
      parts[0].item->trace->push_back(std::move(x));
    }
  }
  if (st.n_logit_rows > 0) {
    const int nl = st.n_logit_rows;
    cuda::gather_rows(ws.X, ws.pre, st.logit_rows, nl, hc, D, X_head, pre_head, stream);
    cuda::hc_collapse(pre_head, hc, X_head, nl, hc, D, ws.u, r, stream);
    cuda::rmsnorm(ws.u, nl, D, norm, eps, ws.xn, r, stream);
    cuda::bf16_linear(head, V, D, ws.xn, D, nl, ws.logits, V, false, stream);
    DSUF_CUDA(cudaMemcpyAsync(logits_host, ws.logits, size_t(nl) * V * 4, cudaMemcpyDeviceToHost, stream));
  }
}

void CudaBackend::Impl::finish_step(std::vector<Part>& parts, const Step& st) {
  const ModelConfig& c = cfg;
  const int64_t V = c.text.vocab_size;
  for (size_t q = 0; q < parts.size(); ++q) {
    Part& p = parts[q];
    SequenceState& s = *p.item->state;
    if (p.logits && p.item->logits && st.logit_row_of_part[q] >= 0) {
      const bool all = p.item->want == ForwardItem::Logits::kAll;
      const int rows = all ? p.n : 1;
      const int src_row = st.logit_row_of_part[q] + (all || !st.all_rows_logits ? 0 : p.n - 1);
      const size_t off = all ? size_t(p.offset) * V : 0;
      p.item->logits->resize(off + size_t(rows) * V);
      std::memcpy(p.item->logits->data() + off, logits_host + size_t(src_row) * V, size_t(rows) * V * 4);
    }
    auto& hist = s.engram_history;
    for (int j = 0; j < p.n; ++j) {
      const int32_t id = p.item->tokens[p.offset + j];
      for (int h = int(hist.size()) - 1; h > 0; --h) hist[h] = hist[h - 1];
      if (!hist.empty()) hist[0] = id == c.image_token_id ? -1 : cids[id];
    }
    s.pos += p.n;
    p.ds->pos = s.pos;
    for (size_t k = 0; k < layout.kv_sources.size(); ++k) {
      p.ds->entries[k] = s.pos / layout.source_ratio[k];
      p.ds->cur[k] ^= 1;
    }
  }
}

void CudaBackend::Impl::run_step(std::vector<Part>& parts) {
  bool trace = false, decode = use_graphs;
  for (const Part& p : parts) {
    trace |= p.item->trace != nullptr;
    decode &= p.n == 1;
  }
  decode &= !trace;
  const Step st = stage_step(parts, decode);
  if (decode) {
    // Decode steps replay a graph captured for this batch size; the staged inputs change, the
    // kernels and their arguments do not.
    Graph& g = graphs[st.rows];
    if (!g.exec || g.stage_bytes != stage.used) {
      if (g.exec) cudaGraphExecDestroy(g.exec);
      cudaGraph_t graph;
      DSUF_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      enqueue_step(st, parts, false);
      DSUF_CUDA(cudaStreamEndCapture(stream, &graph));
      DSUF_CUDA(cudaGraphInstantiate(&g.exec, graph, 0));
      DSUF_CUDA(cudaGraphDestroy(graph));
      g.stage_bytes = stage.used;
    }
    if (!ev0) {
      DSUF_CUDA(cudaEventCreate(&ev0));
      DSUF_CUDA(cudaEventCreate(&ev1));
    }
    DSUF_CUDA(cudaEventRecord(ev0, stream));
    DSUF_CUDA(cudaGraphLaunch(g.exec, stream));
    DSUF_CUDA(cudaEventRecord(ev1, stream));
  } else {
    enqueue_step(st, parts, trace);
  }
  DSUF_CUDA(cudaStreamSynchronize(stream));
  DSUF_CUDA(cudaGetLastError());
  if (decode) {
    float ms = 0;
    DSUF_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
    last_graph_ms = ms;
  }
  finish_step(parts, st);
}

namespace {
// Refuses with the plan's numbers when it does not fit the device.
void check_fits(const ModelConfig& cfg, const CudaOptions& opt) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) fail("--gpus: no CUDA device is available");
  if (opt.device >= count) fail("--gpus: device ", opt.device, " does not exist (", count, " visible)");
  DSUF_CUDA(cudaSetDevice(opt.device));
  const CudaMemoryPlan plan = plan_cuda_memory(cfg, opt);
  size_t free_b = 0, total_b = 0;
  DSUF_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t margin = size_t(512) << 20;  // CUDA context growth, allocator rounding
  if (plan.total() + margin > free_b)
    fail("the model does not fit GPU ", opt.device, ": needs ", plan.describe(), ", plus 0.5 GiB margin; ",
         double(free_b) / (1ull << 30), " GiB free of ", double(total_b) / (1ull << 30),
         " GiB. Lower --max-batch or --max-context, or give more GPUs");
}
}  // namespace

CudaBackend::CudaBackend(const LoadedModel& model, std::vector<int32_t> compressed_ids, CudaOptions opt)
    : impl_(std::make_unique<Impl>(model.config, &model, std::move(compressed_ids), opt)) {
  if (const char* g = std::getenv("DSUF_CUDA_GRAPHS")) impl_->use_graphs = std::string(g) != "0";  // profiling
  check_fits(model.config, opt);  // plan first: refuse before uploading anything
  impl_->load(0);
}

CudaBackend::CudaBackend(const ModelConfig& config, std::vector<int32_t> compressed_ids, CudaOptions opt,
                         uint64_t seed)
    : impl_(std::make_unique<Impl>(config, nullptr, std::move(compressed_ids), opt)) {
  if (const char* g = std::getenv("DSUF_CUDA_GRAPHS")) impl_->use_graphs = std::string(g) != "0";  // profiling
  check_fits(config, opt);
  impl_->load(seed);
}

CudaBackend::~CudaBackend() {
  if (!impl_) return;
  for (auto& [b, g] : impl_->graphs)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  for (void* p : impl_->pinned) cudaFreeHost(p);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

const ModelConfig& CudaBackend::config() const { return impl_->cfg; }
const KvLayout& CudaBackend::layout() const { return impl_->layout; }
size_t CudaBackend::weight_bytes() const { return impl_->weight_bytes; }

SequenceState CudaBackend::new_sequence() const { return SequenceState::empty(impl_->layout); }

void CudaBackend::forward(std::span<ForwardItem> batch) {
  Impl& im = *impl_;
  std::vector<size_t> done(batch.size(), 0);
  std::vector<SequenceState*> seen;
  std::vector<const DevSeq*> pools;
  for (ForwardItem& item : batch) {
    DSUF_CHECK(item.state, "forward item without a sequence state");
    DSUF_CHECK(std::find(seen.begin(), seen.end(), item.state) == seen.end(), "a sequence appears twice in one batch");
    seen.push_back(item.state);
    if (item.state->pos + int64_t(item.tokens.size()) > im.cfg.text.max_position_embeddings)
      fail("sequence of ", item.state->pos + item.tokens.size(), " tokens exceeds max_position_embeddings");
    if (item.logits) item.logits->clear();
    // Two copies of one state at the same position would advance the same device pools: the
    // later one gets pools of its own, uploaded from its host pools.
    if (item.state->device &&
        std::find(pools.begin(), pools.end(), static_cast<const DevSeq*>(item.state->device.get())) != pools.end())
      item.state->device.reset();
    pools.push_back(&im.seq(*item.state));
  }
  // Steps of at most max_rows rows; each sequence contributes one chunk per step, in order. A traced
  // item runs alone (its trace is per step).
  for (;;) {
    std::vector<Impl::Part> parts;
    int used = 0;
    for (size_t i = 0; i < batch.size() && used < im.max_rows; ++i) {
      ForwardItem& item = batch[i];
      const int left = int(item.tokens.size() - done[i]);
      if (left == 0) continue;
      if (item.trace && !parts.empty()) continue;
      const int take = std::min(left, im.max_rows - used);
      const bool last = done[i] + take == item.tokens.size();
      const bool logits = item.want == ForwardItem::Logits::kAll || (last && item.want == ForwardItem::Logits::kLast);
      parts.push_back({&item, &im.seq(*item.state), int(done[i]), take, logits});
      done[i] += take;
      used += take;
      if (item.trace) break;
    }
    if (parts.empty()) break;
    im.run_step(parts);
  }
}

double CudaBackend::last_graph_ms() const { return impl_->last_graph_ms; }

SequenceState CudaBackend::synthetic_sequence(int64_t pos, uint64_t seed) {
  Impl& im = *impl_;
  const KvLayout& L = im.layout;
  SequenceState st = SequenceState::empty(L);
  DevSeq& ds = im.seq(st);
  st.pos = pos;
  ds.pos = pos;
  const int64_t hd = L.head_dim, ihd = L.index_head_dim;
  cuda::fill_entries_synthetic(ds.window.as<uint8_t>(), int64_t(L.num_layers) * L.window, int64_t(L.window_entry_bytes),
                               hd, true, 127, seed, im.stream);
  for (size_t k = 0; k < L.kv_sources.size(); ++k) {
    const int64_t entries = pos / L.source_ratio[k];
    DSUF_CHECK(entries <= im.opt.max_context, "synthetic sequence longer than max_context");
    cuda::fill_entries_synthetic(ds.ckv[k].as<uint8_t>(), entries, int64_t(L.ckv_entry_bytes), hd / 2, false, 0x30,
                                 seed + 1 + k, im.stream);
    cuda::fill_entries_synthetic(ds.ikey[k].as<uint8_t>(), entries, int64_t(L.ikey_entry_bytes), ihd / 2, false, 127,
                                 seed + 101 + k, im.stream);
    ds.entries[k] = entries;
    DSUF_CUDA(cudaMemsetAsync(ds.pending[ds.cur[k]][k].p, 0, size_t(L.source_ratio[k]) * 2 * hd * 4, im.stream));
  }
  for (size_t h = 0; h < st.engram_history.size(); ++h) st.engram_history[h] = int32_t((seed * 7919 + h * 104729) % 99092);
  DSUF_CUDA(cudaStreamSynchronize(im.stream));
  return st;
}

void CudaBackend::download(SequenceState& st) const {
  if (!st.device) return;
  const KvLayout& L = impl_->layout;
  DevSeq& ds = *static_cast<DevSeq*>(st.device.get());
  if (ds.owner != impl_.get() || ds.pos != st.pos) {
    st.device.reset();  // a stale handle: the host pools are already this state's truth
    return;
  }
  for (int l = 0; l < L.num_layers; ++l)
    DSUF_CUDA(cudaMemcpy(st.window[l].data(), ds.window.as<uint8_t>() + size_t(l) * L.window * L.window_entry_bytes,
                         st.window[l].size(), cudaMemcpyDeviceToHost));
  for (size_t k = 0; k < L.kv_sources.size(); ++k) {
    st.ckv[k].resize(size_t(ds.entries[k]) * L.ckv_entry_bytes);
    st.ikey[k].resize(size_t(ds.entries[k]) * L.ikey_entry_bytes);
    DSUF_CUDA(cudaMemcpy(st.ckv[k].data(), ds.ckv[k].p, st.ckv[k].size(), cudaMemcpyDeviceToHost));
    DSUF_CUDA(cudaMemcpy(st.ikey[k].data(), ds.ikey[k].p, st.ikey[k].size(), cudaMemcpyDeviceToHost));
    st.pending[k].resize(size_t(st.pos % L.source_ratio[k]) * 2 * L.head_dim);
    if (!st.pending[k].empty())
      DSUF_CUDA(cudaMemcpy(st.pending[k].data(), ds.pending[ds.cur[k]][k].p, st.pending[k].size() * 4,
                           cudaMemcpyDeviceToHost));
  }
}

}  // namespace dsuf
