// CudaBackend: runs the V4.1 forward with the kernels of kernels.cu, step for step as the CPU
// reference does (same rounding points, same order of the state updates), one sequence chunk at a
// time. Speed comes later (fused kernels, batched decode, CUDA graphs); this version is the
// correctness baseline the fast kernels are checked against too.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.cuh"
#include "core/error.h"
#include "model/engram.h"
#include "model/rope.h"

namespace dsuf {
namespace {

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

// One sequence's pools on the device.
struct DevSeq {
  DevMem window;                      // [L][W][window_entry_bytes]
  std::vector<DevMem> ckv, ikey;      // per KV source, capacity entries
  std::vector<DevMem> pending[2];     // per KV source, [ratio][2·hd] FP32, double-buffered
  std::vector<int> cur;               // which pending buffer is current
  std::vector<int64_t> entries;       // per KV source
};

}  // namespace

struct CudaBackend::Impl {
  const LoadedModel& model;
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
    float *X, *pre, *mix_a, *mix_f, *u, *xn, *y, *xq, *sa, *xq2, *sa2, *tmp, *q_lat, *q, *kvw, *ag, *ring, *o, *zg,
        *qi, *wts, *scores, *bscores, *router, *rw, *h1, *h3, *ye, *ys, *h1s, *h3s, *emb, *ekv, *logits, *cs_main,
        *cs_comp, *cs_ent;
    int32_t *tok, *sel, *cand, *ids;
    int64_t *pos, *rows;
    uint8_t *cand_mask, *image, *dead;
  } ws{};
  int64_t score_stride = 0, bscore_stride = 0, mask_stride = 0, logits_rows = 0;

  Impl(const LoadedModel& m, std::vector<int32_t> ids, CudaOptions o)
      : model(m), layout(KvLayout::from_config(m.config)), cids(std::move(ids)), opt(o) {}

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

  void load();
  void alloc_workspace();
  DevSeq& seq(SequenceState& st);
  void run_chunk(SequenceState& st, DevSeq& ds, const int32_t* tokens, int n, ForwardItem& item, bool last_chunk,
                 int64_t logits_from);
  void attention(int l, SequenceState& st, DevSeq& ds, int n, int64_t P, float* out);
  void moe(int l, int n, float* out);
  void engram(int l, SequenceState& st, const int32_t* tokens, int n);
};

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void CudaBackend::Impl::load() {
  DSUF_CUDA(cudaSetDevice(opt.device));
  DSUF_CUDA(cudaStreamCreate(&stream));
  cuda::init_tables();
  const ModelConfig& c = model.config;
  const TextConfig& t = c.text;
  const ModelWeights& w = model.weights;
  DSUF_CHECK(int64_t(cids.size()) >= t.vocab_size, "compressed-id table too short");
  if (!t.engram_layer_ids.empty()) hasher = std::make_unique<EngramHasher>(t, cids.at(t.engram_pad_token_id));
  embed = up(w.embed);
  head = up(w.head);
  norm = up(w.norm);
  for (const LayerPlan& lp : c.layers) {
    const BlockWeights& b = w.layers[lp.layer];
    DevLayer d{};
    d.hca_fn = up(b.hc_attn.fn), d.hca_base = up(b.hc_attn.base), d.hca_scale = up(b.hc_attn.scale);
    d.hcf_fn = up(b.hc_ffn.fn), d.hcf_base = up(b.hc_ffn.base), d.hcf_scale = up(b.hc_ffn.scale);
    d.attn_norm = up(b.attn_norm), d.ffn_norm = up(b.ffn_norm), d.q_norm = up(b.attn.q_norm), d.kv_norm = up(b.attn.kv_norm);
    d.sink = up(b.attn.sink);
    d.wq_a = up(b.attn.wq_a), d.wq_b = up(b.attn.wq_b), d.wkv = up(b.attn.wkv), d.wo_a = up(b.attn.wo_a),
    d.wo_b = up(b.attn.wo_b);
    d.comp_wkv = up(b.attn.comp_wkv), d.comp_wgate = up(b.attn.comp_wgate), d.comp_norm = up(b.attn.comp_norm);
    d.idx_wk = up(b.attn.idx_wk), d.idx_k_norm = up(b.attn.idx_k_norm), d.idx_wproj = up(b.attn.idx_weights_proj);
    d.idx_wq_b = up(b.attn.idx_wq_b);
    d.gate = up(b.ffn.gate), d.bias = up(b.ffn.bias), d.bias_vl = up(b.ffn.bias_vl);
    std::vector<const uint8_t*> p[6];
    for (const ExpertWeights& e : b.ffn.experts) {
      const Fp4Linear* l3[3] = {&e.w1, &e.w2, &e.w3};
      for (int k = 0; k < 3; ++k) {
        p[2 * k].push_back(upload<uint8_t>(l3[k]->w, size_t(l3[k]->out) * l3[k]->in / 2));
        p[2 * k + 1].push_back(upload<uint8_t>(l3[k]->scale, size_t(l3[k]->out) * l3[k]->in / 32));
      }
    }
    d.experts = {up_ptrs(p[0]), up_ptrs(p[1]), up_ptrs(p[2]), up_ptrs(p[3]), up_ptrs(p[4]), up_ptrs(p[5])};
    d.sw1 = up(b.ffn.shared_w1), d.sw2 = up(b.ffn.shared_w2), d.sw3 = up(b.ffn.shared_w3);
    if (b.engram) {
      const EngramWeights& e = *b.engram;
      d.e_table = pin(e.table.w, size_t(e.table.rows) * e.table.cols);
      d.e_scale = pin(e.table.scale, size_t(e.table.rows) * e.table.cols / 32);
      d.e_wkv = up(e.wkv), d.e_q = up(e.q_weight), d.e_k = up(e.k_weight);
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
  int64_t X, pre, mix, vecD, xq, sa, tmp, q_lat, q, kvw, ag, ring, o, zg, qi, wts, scores, bscores, sel, cand,
      cand_mask, router, ids, h, ye, hs, emb, ekv, rows, flags, logits, cs;
  int64_t score_stride, bscore_stride;
  size_t bytes() const {
    const int64_t floats = X + pre + 2 * mix + 3 * vecD + 2 * xq + 2 * sa + tmp + q_lat + q + kvw + ag + ring + o + zg +
                           qi + wts + scores + bscores + router + ids /*rw*/ + 2 * h + ye + vecD /*ys*/ + 2 * hs + emb +
                           ekv + logits + 3 * cs;
    return size_t(floats) * 4 + size_t(sel + cand + ids) * 4 + size_t(cand_mask + 2 * flags) + size_t(rows + flags) * 8 +
           size_t(flags) * 4 /*tok*/;
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
  w.kvw = N * hd, w.ag = N * 2 * hd, w.ring = int64_t(t.sliding_window) * hd, w.o = N * H * hd, w.zg = N * G * ol;
  w.qi = N * IH * ihd, w.wts = N * IH, w.scores = N * w.score_stride, w.bscores = N * w.bscore_stride;
  w.sel = N * t.index_topk, w.cand = N * t.candidate_topk_blocks, w.cand_mask = N * w.bscore_stride;
  w.router = N * E, w.ids = N * K, w.h = N * K * F, w.ye = N * K * D, w.hs = N * F;
  w.emb = N * std::max<int64_t>(R * ehd, 1), w.ekv = N * (hc + 1) * D, w.rows = N * std::max<int64_t>(R, 1);
  w.flags = N, w.logits = N * t.vocab_size, w.cs = N * 2 * half;
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
  const TextConfig& t = model.config.text;
  CudaMemoryPlan p;
  for (const auto& [name, info] : model.checkpoint->tensors()) {
    const bool backbone = name.rfind("layers.", 0) == 0 || name == "embed.weight" || name == "head.weight" ||
                          name == "norm.weight";
    if (!backbone) continue;
    if (name.find(".engram.embed.") != std::string::npos)
      p.host_pinned += info->nbytes;
    else
      p.weights += info->nbytes;
  }
  const KvLayout L = KvLayout::from_config(model.config);
  p.per_sequence = size_t(L.num_layers) * L.window * L.window_entry_bytes;
  for (size_t k = 0; k < L.kv_sources.size(); ++k)
    p.per_sequence += size_t(opt.max_context) * (L.ckv_entry_bytes + L.ikey_entry_bytes) +
                      2 * size_t(L.source_ratio[k]) * 2 * L.head_dim * 4;
  p.sequences = p.per_sequence * size_t(opt.max_batch);
  const int64_t R = t.engram_layer_ids.empty() ? 0 : int64_t(t.engram_max_ngram_size - 1) * t.engram_n_heads;
  p.workspace = workspace_sizes(t, opt.max_chunk, opt.max_context, R).bytes();
  return p;
}

void CudaBackend::Impl::alloc_workspace() {
  const TextConfig& t = model.config.text;
  const int64_t R = hasher ? hasher->rows_per_token() : 0;
  const WorkspaceSizes w = workspace_sizes(t, opt.max_chunk, opt.max_context, R);
  ws.X = alloc<float>(w.X), ws.pre = alloc<float>(w.pre), ws.mix_a = alloc<float>(w.mix), ws.mix_f = alloc<float>(w.mix);
  ws.u = alloc<float>(w.vecD), ws.xn = alloc<float>(w.vecD), ws.y = alloc<float>(w.vecD);
  ws.xq = alloc<float>(w.xq), ws.sa = alloc<float>(w.sa), ws.xq2 = alloc<float>(w.xq), ws.sa2 = alloc<float>(w.sa);
  ws.tmp = alloc<float>(w.tmp), ws.q_lat = alloc<float>(w.q_lat), ws.q = alloc<float>(w.q), ws.kvw = alloc<float>(w.kvw);
  ws.ag = alloc<float>(w.ag), ws.ring = alloc<float>(w.ring), ws.o = alloc<float>(w.o), ws.zg = alloc<float>(w.zg);
  ws.qi = alloc<float>(w.qi), ws.wts = alloc<float>(w.wts);
  score_stride = w.score_stride, bscore_stride = w.bscore_stride, mask_stride = w.bscore_stride;
  ws.scores = alloc<float>(w.scores), ws.bscores = alloc<float>(w.bscores);
  ws.sel = alloc<int32_t>(w.sel), ws.cand = alloc<int32_t>(w.cand), ws.cand_mask = alloc<uint8_t>(w.cand_mask);
  ws.router = alloc<float>(w.router), ws.ids = alloc<int32_t>(w.ids), ws.rw = alloc<float>(w.ids);
  ws.h1 = alloc<float>(w.h), ws.h3 = alloc<float>(w.h), ws.ye = alloc<float>(w.ye), ws.ys = alloc<float>(w.vecD);
  ws.h1s = alloc<float>(w.hs), ws.h3s = alloc<float>(w.hs), ws.emb = alloc<float>(w.emb), ws.ekv = alloc<float>(w.ekv);
  ws.rows = alloc<int64_t>(w.rows), ws.dead = alloc<uint8_t>(w.flags), ws.image = alloc<uint8_t>(w.flags);
  ws.tok = alloc<int32_t>(w.flags), ws.pos = alloc<int64_t>(w.flags);
  ws.cs_main = alloc<float>(w.cs), ws.cs_comp = alloc<float>(w.cs), ws.cs_ent = alloc<float>(w.cs);
  logits_rows = opt.max_chunk;
  ws.logits = alloc<float>(w.logits);
}

DevSeq& CudaBackend::Impl::seq(SequenceState& st) {
  if (st.device) return *static_cast<DevSeq*>(st.device.get());
  const TextConfig& t = model.config.text;
  auto ds = std::make_shared<DevSeq>();
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
  // A state that already holds tokens (deserialized) is uploaded from its host pools.
  if (st.pos > 0) {
    DSUF_CHECK(!st.window.empty(), "sequence state without host pools to upload");
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

void CudaBackend::Impl::engram(int l, SequenceState& st, const int32_t* tokens, int n) {
  const ModelConfig& c = model.config;
  const TextConfig& t = c.text;
  const DevLayer& d = layers[l];
  const int R = hasher->rows_per_token(), ctx_len = t.engram_max_ngram_size, hc = t.hc_mult;
  const int64_t D = t.hidden_size, ehd = t.engram_head_dim;
  std::vector<int64_t> rows(size_t(n) * R);
  std::vector<uint8_t> dead(n);
  std::vector<int32_t> ctx(ctx_len), cid(n);
  for (int i = 0; i < n; ++i) cid[i] = tokens[i] == c.image_token_id ? -1 : cids[tokens[i]];
  for (int i = 0; i < n; ++i) {
    dead[i] = cid[i] < 0;
    if (dead[i]) continue;
    for (int j = 0; j < ctx_len; ++j) {
      const int src = i - j;
      const int h = -src - 1;
      ctx[j] = src >= 0 ? cid[src] : (h < int(st.engram_history.size()) ? st.engram_history[h] : -1);
    }
    hasher->row_ids(model.config.layers[l].engram_slot, ctx.data(), rows.data() + size_t(i) * R);
  }
  DSUF_CUDA(cudaMemcpyAsync(ws.rows, rows.data(), rows.size() * 8, cudaMemcpyHostToDevice, stream));
  DSUF_CUDA(cudaMemcpyAsync(ws.dead, dead.data(), n, cudaMemcpyHostToDevice, stream));
  const bool r = opt.numerics.bf16_activations;
  cuda::engram_gather(ws.rows, n, R, d.e_table, d.e_scale, ehd, ws.emb, stream);
  cuda::act_quant(ws.emb, n, R * ehd, opt.numerics.act_quant, ws.xq, ws.sa, stream);
  cuda::fp8_linear(d.e_wkv.w, d.e_wkv.s, d.e_wkv.out, d.e_wkv.in, ws.xq, ws.sa, R * ehd, n, ws.ekv, (hc + 1) * D, r, stream);
  cuda::engram_gate(ws.X, ws.ekv, d.e_q, d.e_k, ws.dead, n, hc, D, float(t.rms_norm_eps), r, stream);
  DSUF_CUDA(cudaStreamSynchronize(stream));  // the host vectors above must outlive the copies
}

void CudaBackend::Impl::attention(int l, SequenceState& st, DevSeq& ds, int n, int64_t P, float* out) {
  (void)st;
  const TextConfig& t = model.config.text;
  const LayerPlan& lp = model.config.layers[l];
  const DevLayer& d = layers[l];
  const bool r = opt.numerics.bf16_activations, aq = opt.numerics.act_quant, kvq = opt.numerics.kv_quant;
  const int H = t.num_attention_heads, W = t.sliding_window;
  const int64_t D = t.hidden_size, hd = t.head_dim, qr = t.q_lora_rank, G = t.o_groups, ol = t.o_lora_rank;
  const float eps = float(t.rms_norm_eps);
  const float* cs = lp.compress_rope ? ws.cs_comp : ws.cs_main;
  DSUF_CHECK(kvq, "the CUDA backend stores KV quantized only (kv_quant = false is CPU-only)");

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
    const int pending_n = int(P % ratio);
    const int64_t before = ds.entries[slot], after = (P + n) / ratio;
    DSUF_CHECK(after <= opt.max_context, "sequence of ", P + n, " tokens exceeds the CUDA backend's max_context ",
               opt.max_context);
    std::vector<float> ecs(size_t(after - before) * 2 * half);
    for (int64_t w = before; w < after; ++w) rope_cos_sin(w * ratio, inv_comp, ecs.data() + (w - before) * 2 * half);
    if (!ecs.empty()) {
      DSUF_CUDA(cudaMemcpyAsync(ws.cs_ent, ecs.data(), ecs.size() * 4, cudaMemcpyHostToDevice, stream));
      DSUF_CUDA(cudaStreamSynchronize(stream));  // ecs is a local
    }
    cuda::CompressArgs ca{.ag = ws.ag, .pending = ds.pending[ds.cur[slot]][slot].as<float>(), .pending_n = pending_n,
                          .n = n, .ratio = ratio, .P = P, .hd = hd, .ihd = t.index_head_dim, .first_entry = before,
                          .n_entries = int(after - before), .norm = d.comp_norm, .wk = d.idx_wk, .k_norm = d.idx_k_norm,
                          .cs = ws.cs_ent, .half = half, .eps = eps, .kv_quant = kvq, .r = r,
                          .ckv = ds.ckv[slot].as<uint8_t>(), .ikey = ds.ikey[slot].as<uint8_t>()};
    cuda::compress_emit(ca, stream);
    const int next = 1 - ds.cur[slot];
    cuda::update_pending(ws.ag, n, ds.pending[ds.cur[slot]][slot].as<float>(), pending_n, ratio, hd,
                         ds.pending[next][slot].as<float>(), stream);
    ds.cur[slot] = next;
    ds.entries[slot] = after;
  }

  if (lp.runs_indexer) {
    const int IH = t.index_n_heads;
    const int64_t ihd = t.index_head_dim;
    cuda::fp8_linear(d.idx_wq_b.w, d.idx_wq_b.s, IH * ihd, qr, ws.xq2, ws.sa2, qr, n, ws.qi, IH * ihd, r, stream);
    cuda::rope(ws.qi, n, IH, ihd, ws.cs_comp, half, 1.0f, r, stream);
    cuda::fp4_fake_quant_pow2(ws.qi, n * IH * ihd, r, stream);
    cuda::bf16_linear(d.idx_wproj, IH, D, ws.xn, D, n, ws.wts, IH, false, stream);
    cuda::IndexScoreArgs ia{.qi = ws.qi, .wts = ws.wts, .ikey = ds.ikey[slot].as<uint8_t>(), .entries = ds.entries[slot],
                            .n = n, .IH = IH, .ratio = ratio, .ihd = ihd, .P = P,
                            .cand_mask = lp.candidate_constrained ? ws.cand_mask : nullptr,
                            .mask_stride = mask_stride, .block = t.candidate_block_size, .scores = ws.scores,
                            .score_stride = score_stride, .r = r};
    cuda::index_scores(ia, stream);
    if (lp.candidate_source) {
      cuda::candidate_block_scores(ws.scores, score_stride, n, P, ratio, t.candidate_block_size, ws.bscores,
                                   bscore_stride, stream);
      cuda::top_k(ws.bscores, bscore_stride, n, P, ratio, t.candidate_block_size, t.candidate_topk_blocks, ws.cand,
                  t.candidate_topk_blocks, stream);
      cuda::mask_from_selection(ws.cand, t.candidate_topk_blocks, n, ws.cand_mask, mask_stride, stream);
    }
    cuda::top_k(ws.scores, score_stride, n, P, ratio, 0, t.index_topk, ws.sel, t.index_topk, stream);
  }

  uint8_t* ring = ds.window.as<uint8_t>() + size_t(l) * W * layout.window_entry_bytes;
  cuda::unpack_window(ring, W, hd, ws.ring, stream);
  cuda::AttentionArgs aa{.q = ws.q, .kv_chunk = ws.kvw, .ring = ws.ring,
                         .ckv = ratio > 0 ? ds.ckv[slot].as<uint8_t>() : nullptr,
                         .sel = ratio > 0 ? ws.sel : nullptr, .sel_stride = t.index_topk, .sink = d.sink, .out = ws.o,
                         .n = n, .H = H, .W = W, .hd = hd, .P = P, .r = r};
  cuda::attention(aa, stream);
  cuda::rope(ws.o, n, H, hd, cs, half, -1.0f, r, stream);
  const int64_t gin = (H / G) * hd;
  cuda::act_quant(ws.o, n, H * hd, opt.numerics.wo_a_act_quant && aq, ws.xq, ws.sa, stream);
  for (int g = 0; g < G; ++g)
    cuda::fp8_linear(d.wo_a.w + g * ol * gin, d.wo_a.s + (g * ol / 32) * (gin / 32), ol, gin, ws.xq + g * gin,
                     ws.sa + g * gin / 32, H * hd, n, ws.zg + g * ol, G * ol, r, stream);
  cuda::act_quant(ws.zg, n, G * ol, aq, ws.xq2, ws.sa2, stream);
  cuda::fp8_linear(d.wo_b.w, d.wo_b.s, D, G * ol, ws.xq2, ws.sa2, G * ol, n, out, D, r, stream);
  cuda::pack_window(ws.kvw, n, std::max(0, n - W), hd, P, W, ring, stream);
}

void CudaBackend::Impl::moe(int l, int n, float* out) {
  const TextConfig& t = model.config.text;
  const DevLayer& d = layers[l];
  const bool r = opt.numerics.bf16_activations, aq = opt.numerics.act_quant;
  const int E = t.n_routed_experts, K = t.num_experts_per_tok;
  const int64_t D = t.hidden_size, F = t.moe_intermediate_size;
  const float limit = float(t.swiglu_limit);
  cuda::bf16_linear(d.gate, E, D, ws.xn, D, n, ws.router, E, false, stream);
  cuda::route(ws.router, n, E, K, d.bias, d.bias_vl, ws.image, float(t.gate_temp), float(t.routed_scaling_factor),
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

void CudaBackend::Impl::run_chunk(SequenceState& st, DevSeq& ds, const int32_t* tokens, int n, ForwardItem& item,
                                  bool last_chunk, int64_t logits_from) {
  const ModelConfig& c = model.config;
  const TextConfig& t = c.text;
  const bool r = opt.numerics.bf16_activations;
  const int hc = t.hc_mult;
  const int64_t D = t.hidden_size, P = st.pos;
  const float eps = float(t.rms_norm_eps), hc_eps = float(t.hc_eps);
  const int ms = cuda::hc_mix_stride(hc);
  std::vector<int64_t> pos(n);
  std::vector<uint8_t> image(n);
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= t.vocab_size) fail("token id ", tokens[i], " is outside the vocabulary");
    pos[i] = P + i;
    image[i] = tokens[i] == c.image_token_id;
  }
  DSUF_CUDA(cudaMemcpyAsync(ws.tok, tokens, n * 4, cudaMemcpyHostToDevice, stream));
  DSUF_CUDA(cudaMemcpyAsync(ws.pos, pos.data(), n * 8, cudaMemcpyHostToDevice, stream));
  DSUF_CUDA(cudaMemcpyAsync(ws.image, image.data(), n, cudaMemcpyHostToDevice, stream));
  std::vector<float> csm(size_t(n) * 2 * half), csc(size_t(n) * 2 * half);
  for (int i = 0; i < n; ++i) {
    rope_cos_sin(P + i, inv_main, csm.data() + size_t(i) * 2 * half);
    rope_cos_sin(P + i, inv_comp, csc.data() + size_t(i) * 2 * half);
  }
  DSUF_CUDA(cudaMemcpyAsync(ws.cs_main, csm.data(), csm.size() * 4, cudaMemcpyHostToDevice, stream));
  DSUF_CUDA(cudaMemcpyAsync(ws.cs_comp, csc.data(), csc.size() * 4, cudaMemcpyHostToDevice, stream));
  cuda::embed(ws.tok, n, embed, D, hc, ws.X, ws.pre, stream);
  for (const LayerPlan& lp : c.layers) {
    const int l = lp.layer;
    const DevLayer& d = layers[l];
    if (lp.engram_slot >= 0) engram(l, st, tokens, n);
    cuda::hc_mix(d.hca_fn, d.hca_base, d.hca_scale, ws.X, n, hc, D, eps, t.hc_sinkhorn_iters, hc_eps, ws.mix_a, stream);
    cuda::hc_collapse(ws.pre, hc, ws.X, n, hc, D, ws.u, r, stream);
    cuda::rmsnorm(ws.u, n, D, d.attn_norm, eps, ws.xn, r, stream);
    attention(l, st, ds, n, P, ws.y);
    cuda::hc_expand(ws.mix_a, ms, ws.y, n, hc, D, ws.X, r, stream);
    cuda::hc_mix(d.hcf_fn, d.hcf_base, d.hcf_scale, ws.X, n, hc, D, eps, t.hc_sinkhorn_iters, hc_eps, ws.mix_f, stream);
    cuda::hc_collapse(ws.mix_a, ms, ws.X, n, hc, D, ws.u, r, stream);
    cuda::rmsnorm(ws.u, n, D, d.ffn_norm, eps, ws.xn, r, stream);
    moe(l, n, ws.y);
    cuda::hc_expand(ws.mix_f, ms, ws.y, n, hc, D, ws.X, r, stream);
    // pre of the FFN site feeds the next attention site's collapse.
    DSUF_CUDA(cudaMemcpy2DAsync(ws.pre, hc * 4, ws.mix_f, ms * 4, hc * 4, n, cudaMemcpyDeviceToDevice, stream));
    if (item.trace) {
      std::vector<float> x(size_t(n) * hc * D);
      DSUF_CUDA(cudaMemcpyAsync(x.data(), ws.X, x.size() * 4, cudaMemcpyDeviceToHost, stream));
      DSUF_CUDA(cudaStreamSynchronize(stream));
      item.trace->push_back(std::move(x));
    }
  }
  // Engram history and position.
  for (int i = 0; i < n; ++i) {
    auto& hist = st.engram_history;
    for (int j = int(hist.size()) - 1; j > 0; --j) hist[j] = hist[j - 1];
    if (!hist.empty()) hist[0] = image[i] ? -1 : cids[tokens[i]];
  }
  st.pos += n;
  if (item.want != ForwardItem::Logits::kNone && item.logits && (last_chunk || item.want == ForwardItem::Logits::kAll)) {
    const int first = item.want == ForwardItem::Logits::kAll ? 0 : n - 1;
    const int rows = n - first;
    const int64_t V = t.vocab_size;
    cuda::hc_collapse(ws.pre + first * hc, hc, ws.X + int64_t(first) * hc * D, rows, hc, D, ws.u, r, stream);
    cuda::rmsnorm(ws.u, rows, D, norm, eps, ws.xn, r, stream);
    cuda::bf16_linear(head, V, D, ws.xn, D, rows, ws.logits, V, false, stream);
    const size_t off = size_t(logits_from) * V;
    item.logits->resize(off + size_t(rows) * V);
    DSUF_CUDA(cudaMemcpyAsync(item.logits->data() + off, ws.logits, size_t(rows) * V * 4, cudaMemcpyDeviceToHost, stream));
  }
  DSUF_CUDA(cudaStreamSynchronize(stream));
  DSUF_CUDA(cudaGetLastError());
}

CudaBackend::CudaBackend(const LoadedModel& model, std::vector<int32_t> compressed_ids, CudaOptions opt)
    : impl_(std::make_unique<Impl>(model, std::move(compressed_ids), opt)) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) fail("--gpus: no CUDA device is available");
  if (opt.device >= count) fail("--gpus: device ", opt.device, " does not exist (", count, " visible)");
  DSUF_CUDA(cudaSetDevice(opt.device));
  // Plan first, refuse with numbers before uploading anything.
  const CudaMemoryPlan plan = plan_cuda_memory(model, opt);
  size_t free_b = 0, total_b = 0;
  DSUF_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t margin = size_t(512) << 20;  // CUDA context growth, allocator rounding
  if (plan.total() + margin > free_b)
    fail("the model does not fit GPU ", opt.device, ": needs ", plan.describe(), ", plus 0.5 GiB margin; ",
         double(free_b) / (1ull << 30), " GiB free of ", double(total_b) / (1ull << 30),
         " GiB. Lower --max-batch or --max-context, or give more GPUs");
  impl_->load();
}

CudaBackend::~CudaBackend() {
  if (!impl_) return;
  for (void* p : impl_->pinned) cudaFreeHost(p);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

const ModelConfig& CudaBackend::config() const { return impl_->model.config; }
const KvLayout& CudaBackend::layout() const { return impl_->layout; }
size_t CudaBackend::weight_bytes() const { return impl_->weight_bytes; }

SequenceState CudaBackend::new_sequence() const { return SequenceState::empty(impl_->layout); }

void CudaBackend::forward(std::span<ForwardItem> batch) {
  for (ForwardItem& item : batch) {
    DSUF_CHECK(item.state, "forward item without a sequence state");
    SequenceState& st = *item.state;
    if (st.pos + int64_t(item.tokens.size()) > impl_->model.config.text.max_position_embeddings)
      fail("sequence of ", st.pos + item.tokens.size(), " tokens exceeds max_position_embeddings");
    DevSeq& ds = impl_->seq(st);
    if (item.logits) item.logits->clear();
    const int n = int(item.tokens.size());
    for (int i = 0; i < n; i += impl_->opt.max_chunk) {
      const int m = std::min(impl_->opt.max_chunk, n - i);
      impl_->run_chunk(st, ds, item.tokens.data() + i, m, item, i + m == n, item.want == ForwardItem::Logits::kAll ? i : 0);
    }
  }
}

void CudaBackend::download(SequenceState& st) const {
  if (!st.device) return;
  const KvLayout& L = impl_->layout;
  DevSeq& ds = *static_cast<DevSeq*>(st.device.get());
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
