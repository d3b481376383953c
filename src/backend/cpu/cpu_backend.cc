// CPU reference forward of DeepSeek-V4.1 (model-spec §3, §3b). Layout of the work: a chunk of one
// sequence goes through the model layer by layer; inside a layer every token of the chunk is handled
// in position order wherever the state evolves with position (compressor, window ring).
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/detmath.h"
#include "core/numerics.h"
#include "core/sampling.h"
#include "core/topk.h"
#include "model/rope.h"

namespace dsuf {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Activations are BF16 in the reference: every stored intermediate is rounded to BF16. Parity mode
// (CpuNumerics::bf16_activations = false) keeps FP32 instead. The flag is per thread and set for the
// duration of a forward; parallel_for hands it to its workers.
thread_local bool t_bf16 = true;
// Set on the workers that run whole sequences in parallel: their products stay single-threaded.
thread_local bool t_nested = false;
float rb(float x) { return t_bf16 ? round_bf16(x) : x; }
struct RoundingScope {
  bool saved;
  explicit RoundingScope(bool on) : saved(t_bf16) { t_bf16 = on; }
  ~RoundingScope() { t_bf16 = saved; }
};

template <typename F>
void parallel_for(int64_t n, int threads, F&& f) {
  if (threads <= 1 || n < 1024 || t_nested) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t per = (n + threads - 1) / threads;
  const bool bf16 = t_bf16;
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    int64_t b = t * per, e = std::min(n, b + per);
    if (b < e)
      pool.emplace_back([&f, b, e, bf16] {
        RoundingScope scope(bf16);
        f(b, e);
      });
  }
  f(int64_t{0}, std::min(n, per));
  for (auto& th : pool) th.join();
}

struct Luts {
  float e4m3[256];
  float e2m1[16];
  float e8m0[256];
  Luts() {
    for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_float(static_cast<uint8_t>(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_to_float(static_cast<uint8_t>(i));
    for (int i = 0; i < 256; ++i) e8m0[i] = e8m0_to_float(static_cast<uint8_t>(i));
  }
};
const Luts& lut() {
  static const Luts l;
  return l;
}

// The activation as an FP8/FP4 linear sees it: per-32 block E4M3 values and power-of-two scales
// (model-spec §3.0; block 32 for V4.1), or the BF16 values with unit scales when quantization is off.
struct QuantAct {
  std::vector<float> v, s;
  std::vector<int32_t> x512;  // quantized: 512·v, exact integers (det::e4m3_x512), for the FP4 linear
};
QuantAct quant_act(const float* x, int64_t n, bool on) {
  DSUF_CHECK(n % 32 == 0, "linear input of ", n, " values");
  QuantAct a;
  a.v.resize(n);
  a.s.resize(n / 32);
  if (on) a.x512.resize(n);
  for (int64_t b = 0; b < n / 32; ++b) {
    if (on) {
      uint8_t q[32];
      a.s[b] = act_quant_fp8_block(x + 32 * b, 32, q);
      for (int k = 0; k < 32; ++k) a.v[32 * b + k] = lut().e4m3[q[k]];
      for (int k = 0; k < 32; ++k) a.x512[32 * b + k] = det::e4m3_x512(a.v[32 * b + k]);
    } else {
      a.s[b] = 1.0f;
      std::copy(x + 32 * b, x + 32 * b + 32, a.v.begin() + 32 * b);
    }
  }
  return a;
}

// y = bf16(W·x) for an FP8 32×32-block weight: per-K-block partial sums scaled by s_act·s_w and
// accumulated in FP32, as the reference's FP8 GEMM.
void fp8_linear(const Fp8Linear& W, const float* x, float* y, bool act_quant, int threads = 1) {
  const QuantAct a = quant_act(x, W.in, act_quant);
  const int64_t nb = W.in / 32;
  const float* L = lut().e4m3;
  parallel_for(W.out, threads, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const uint8_t* wr = W.w + o * W.in;
      const uint8_t* sr = W.scale + (o / 32) * nb;
      const float acc = det::lane_sum(nb, [&](int64_t kb) {
        float part = 0.0f;
        for (int k = 0; k < 32; ++k) part += a.v[kb * 32 + k] * L[wr[kb * 32 + k]];
        return part * (a.s[kb] * lut().e8m0[sr[kb]]);
      });
      y[o] = rb(acc);
    }
  });
}

// y = bf16(W·x) for a packed E2M1 weight with an E8M0 scale per 32 inputs (FP4 upcast exactly).
// With activation quantization a block's partial is its exact integer sum rounded once
// (det::fp4_act_block_isum/part, docs/numerics.md §3); without, the sequential FP32 sum.
void fp4_linear(const Fp4Linear& W, const float* x, float* y, bool act_quant, int threads = 1) {
  const QuantAct a = quant_act(x, W.in, act_quant);
  const int64_t nb = W.in / 32;
  const float* L = lut().e2m1;
  parallel_for(W.out, threads, [&](int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    const uint8_t* wr = W.w + o * (W.in / 2);
    const uint8_t* sr = W.scale + o * nb;
    const float acc = det::lane_sum(nb, [&](int64_t kb) {
      if (act_quant) {
        const float part = det::fp4_act_block_part(det::fp4_act_block_isum(a.x512.data() + kb * 32, wr + kb * 16));
        return part * (a.s[kb] * lut().e8m0[sr[kb]]);
      }
      float part = 0.0f;
      for (int k = 0; k < 16; ++k) {
        uint8_t b = wr[kb * 16 + k];
        part += a.v[kb * 32 + 2 * k] * L[b & 0xf];  // one product at a time, low nibble first
        part += a.v[kb * 32 + 2 * k + 1] * L[b >> 4];
      }
      return part * (a.s[kb] * lut().e8m0[sr[kb]]);
    });
    y[o] = rb(acc);
  }
  });
}

// FP32 product with a BF16 weight (routers, compressors, indexer projections).
void bf16_linear_f32(const Bf16Mat& W, const float* x, float* y, int threads = 1) {
  parallel_for(W.rows, threads, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(W.cols);
    for (int64_t r = r0; r < r1; ++r) {
      W.row(r, row.data());
      y[r] = det::chunk_lane_sum<8>(W.cols, [&](int64_t c) { return row[c] * x[c]; });
    }
  });
}

// 1/sqrt(mean(x²)+eps) in FP32 with the canonical block-of-256 sum.
float rms_inv(const float* x, int64_t n, double eps) {
  const float ss = det::block_sum<256>(n, [&](int64_t i) { return x[i] * x[i]; });
  return 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
}

// y = bf16(w ⊙ x·rsqrt(mean(x²)+eps)), computed in FP32 (weight optional).
void rms_norm(const float* x, int64_t n, const Bf16Mat* w, double eps, float* y) {
  const float r = rms_inv(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = rb((w ? (*w)[i] : 1.0f) * (x[i] * r));
}

void round_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = rb(x[i]);
}

using det::sigmoid;
using det::silu;
using det::softplus;

// Interleaved RoPE on the last 2·inv_freq.size() values of v (model-spec §3.6); sign −1 de-rotates.
void rope(float* v, int64_t dim, const std::vector<float>& inv_freq, int64_t pos, float sign) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  float cs[128];
  DSUF_CHECK(half <= 64, "rope over ", 2 * half, " dims");
  rope_cos_sin(pos, inv_freq, cs);
  float* r = v + dim - 2 * half;
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[2 * i], s = sign * cs[2 * i + 1];
    const float a = r[2 * i], b = r[2 * i + 1];
    r[2 * i] = rb(a * c - b * s);
    r[2 * i + 1] = rb(a * s + b * c);
  }
}

// top_k (the k largest finite scores, ties to the smaller index): core/topk.h, shared with the tests.

// mHC mixing of one site (model-spec §3.2 with the V4.1 eps): pre, post and the Sinkhorn-normalized
// combination matrix C[j][k], all FP32.
struct HcMix {
  float pre[8], post[8], comb[64];
};
HcMix hc_mix(const HcParams& p, const float* X, int n, int64_t D, double norm_eps, int iters, float hc_eps) {
  const int64_t N = n * D;
  // Sums over the n·D stream values use a 1024-wide block_sum (one GPU block per mix row).
  const float ss = det::block_sum<1024>(N, [&](int64_t i) { return X[i] * X[i]; });
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(N) + static_cast<float>(norm_eps));
  const int M = (2 + n) * n;
  float mix[(2 + 8) * 8];
  for (int m = 0; m < M; ++m) {
    const float* f = p.fn.data() + m * N;
    mix[m] = det::block_sum<1024>(N, [&](int64_t i) { return f[i] * X[i]; }) * r;
  }
  HcMix h;
  for (int k = 0; k < n; ++k) {
    h.pre[k] = sigmoid(mix[k] * p.scale[0] + p.base[k]) + hc_eps;
    h.post[k] = 2.0f * sigmoid(mix[n + k] * p.scale[1] + p.base[n + k]);
  }
  float* C = h.comb;
  for (int j = 0; j < n; ++j) {
    float mx = kNegInf;
    for (int k = 0; k < n; ++k) {
      C[j * n + k] = mix[2 * n + j * n + k] * p.scale[2] + p.base[2 * n + j * n + k];
      mx = std::max(mx, C[j * n + k]);
    }
    float sum = 0.0f;
    for (int k = 0; k < n; ++k) sum += (C[j * n + k] = det::fexp(C[j * n + k] - mx));
    for (int k = 0; k < n; ++k) C[j * n + k] = C[j * n + k] / sum + hc_eps;
  }
  auto col_norm = [&] {
    for (int k = 0; k < n; ++k) {
      float s = 0.0f;
      for (int j = 0; j < n; ++j) s += C[j * n + k];
      for (int j = 0; j < n; ++j) C[j * n + k] /= s + hc_eps;
    }
  };
  auto row_norm = [&] {
    for (int j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int k = 0; k < n; ++k) s += C[j * n + k];
      for (int k = 0; k < n; ++k) C[j * n + k] /= s + hc_eps;
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
  return h;
}

// u = bf16(Σ_k pre_k X_k): the block input of a site.
void hc_collapse(const float* pre, const float* X, int n, int64_t D, float* u) {
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (int k = 0; k < n; ++k) acc += pre[k] * X[k * D + d];
    u[d] = rb(acc);
  }
}

// X'_k = bf16(post_k·y + Σ_j C[j][k]·X_j).
void hc_expand(const HcMix& h, const float* y, int n, int64_t D, float* X) {
  std::vector<float> old(X, X + n * D);
  for (int k = 0; k < n; ++k)
    for (int64_t d = 0; d < D; ++d) {
      float acc = h.post[k] * y[d];
      for (int j = 0; j < n; ++j) acc += h.comb[j * n + k] * old[j * D + d];
      X[k * D + d] = rb(acc);
    }
}

// Packed window entry: head_dim E4M3 codes then head_dim/32 E8M0 scales.
void pack_window(const float* kv, int64_t hd, uint8_t* out) {
  for (int64_t b = 0; b < hd / 32; ++b) {
    float s = act_quant_fp8_block(kv + 32 * b, 32, out + 32 * b);
    out[hd + b] = e8m0_from_pow2(s);
  }
}
void unpack_window(const uint8_t* in, int64_t hd, float* kv) {
  for (int64_t i = 0; i < hd; ++i) kv[i] = lut().e4m3[in[i]] * lut().e8m0[in[hd + i / 32]];
}

// Indexer key: packed E2M1 then one E8M0 power-of-two scale per 32 (model-spec §3b.2 step 4).
void pack_ikey(const float* k, int64_t n, uint8_t* out) {
  std::fill(out, out + n / 2, 0);
  for (int64_t b = 0; b < n / 32; ++b) {
    const float s = fp4_pow2_scale(k + 32 * b, 32);
    for (int i = 0; i < 32; ++i) fp4_packed_set(out, 32 * b + i, e2m1_from_float(k[32 * b + i] / s));
    out[n / 2 + b] = e8m0_from_pow2(s);
  }
}
// A packed key as the indexer's integer form: codes[i] = 2·E2M1 value, scales[b] per 32.
void unpack_ikey_codes(const uint8_t* in, int64_t n, int8_t* codes, float* scales) {
  for (int64_t i = 0; i < n; ++i)
    codes[i] = static_cast<int8_t>(det::e2m1_x2((i & 1) ? in[i >> 1] >> 4 : in[i >> 1] & 0xf));
  for (int64_t b = 0; b < n / 32; ++b) scales[b] = lut().e8m0[in[n / 2 + b]];
}
// An indexer query in the same form: the fake-quant of fp4_fake_quant_pow2 (block 32), kept as codes.
void quant_iquery(const float* q, int64_t n, int8_t* codes, float* scales) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float s = fp4_pow2_scale(q + 32 * b, 32);
    for (int i = 0; i < 32; ++i) codes[32 * b + i] = static_cast<int8_t>(det::e2m1_x2(e2m1_from_float(q[32 * b + i] / s)));
    scales[b] = s;
  }
}

}  // namespace

// Per-forward working set of one sequence chunk.
struct CpuBackend::Chunk {
  SequenceState* st = nullptr;
  int64_t P = 0;  // position of the first token
  int n = 0;
  std::span<const int32_t> tokens;
  std::vector<float> X;         // [n][hc][D] residual streams
  std::vector<float> pre_prev;  // [n][hc]
  std::vector<int32_t> cids;    // Engram compressed ids, −1 for DEAD (image-span) tokens
  std::vector<uint8_t> image;   // [n] image-span token
  int selection_layer = -1;     // index source whose selection is current
  std::vector<std::vector<int32_t>> selection;  // [n] compressed entries to attend
  std::vector<std::vector<uint8_t>> cand_mask;  // [n] per candidate block, from the candidate source
};

CpuBackend::CpuBackend(const LoadedModel& model, std::vector<int32_t> compressed_ids, CpuNumerics numerics,
                       int threads)
    : model_(model),
      layout_(KvLayout::from_config(model.config)),
      compressed_ids_(std::move(compressed_ids)),
      numerics_(numerics),
      threads_(threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency())) {
  const TextConfig& t = model.config.text;
  DSUF_CHECK(static_cast<int64_t>(compressed_ids_.size()) >= t.vocab_size, "Engram compressed-id table has ",
             compressed_ids_.size(), " entries for a vocabulary of ", t.vocab_size);
  for (int32_t c : compressed_ids_)
    DSUF_CHECK(c >= 0 && c < t.engram_compressed_vocab_size, "compressed id ", c, " out of range");
  if (!t.engram_layer_ids.empty())
    hasher_ = std::make_unique<EngramHasher>(t, compressed_ids_.at(t.engram_pad_token_id));
  inv_freq_main_ = rope_inv_freq(t.qk_rope_head_dim, t.rope_theta, nullptr);
  inv_freq_compress_ = rope_inv_freq(t.qk_rope_head_dim, t.compress_rope_theta, &t.rope_scaling);
}

CpuBackend::~CpuBackend() = default;

SequenceState CpuBackend::new_sequence() const {
  SequenceState s = SequenceState::empty(layout_);
  if (!numerics_.kv_quant) {
    s.unquantized = true;
    s.window_f32.assign(layout_.num_layers, std::vector<float>(size_t(layout_.window) * layout_.head_dim, 0.0f));
    s.ckv_f32.resize(layout_.kv_sources.size());
    s.ikey_f32.resize(layout_.kv_sources.size());
  }
  return s;
}

void CpuBackend::forward(std::span<ForwardItem> batch) {
  // A batch is, by definition here, its sequences run alone: each item's arithmetic is the same
  // whichever thread runs it. With several items and threads, whole sequences go to worker threads
  // (the engine's CPU serving), otherwise the large products are split across threads.
  const bool bf16 = numerics_.bf16_activations;
  for (size_t i = 0; i < batch.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      DSUF_CHECK(batch[i].state != batch[j].state, "a sequence appears twice in one batch");
  if (batch.size() < 2 || threads_ < 2) {
    RoundingScope scope(bf16);
    for (ForwardItem& item : batch) forward_one(item);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto worker = [&] {
    RoundingScope scope(bf16);
    t_nested = true;
    for (size_t i; (i = next++) < batch.size();) {
      try {
        forward_one(batch[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
      }
    }
    t_nested = false;
  };
  std::vector<std::thread> pool;
  const size_t n = std::min<size_t>(size_t(threads_), batch.size());
  for (size_t t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

void CpuBackend::engram(int layer, Chunk& c) {
  const TextConfig& t = model_.config.text;
  const LayerPlan& lp = model_.config.layers[layer];
  const EngramWeights& ew = *model_.weights.layers[layer].engram;
  const int n = t.hc_mult;
  const int64_t D = t.hidden_size, ehd = t.engram_head_dim;
  const int rows = hasher_->rows_per_token();
  const int ctx_len = t.engram_max_ngram_size;
  std::vector<int32_t> ctx(ctx_len);
  std::vector<int64_t> row_ids(rows);
  std::vector<float> emb(rows * ehd), kv((n + 1) * D);
  for (int i = 0; i < c.n; ++i) {
    if (c.cids[i] < 0) continue;  // DEAD token: the gate is 0, the streams are unchanged
    for (int j = 0; j < ctx_len; ++j) {
      const int src = i - j;
      if (src >= 0) {
        ctx[j] = c.cids[src];
      } else {
        const int h = -src - 1;  // 0 = the token just before the chunk
        ctx[j] = h < static_cast<int>(c.st->engram_history.size()) ? c.st->engram_history[h] : -1;
      }
    }
    hasher_->row_ids(lp.engram_slot, ctx.data(), row_ids.data());
    for (int r = 0; r < rows; ++r) {
      DSUF_CHECK(row_ids[r] >= 0 && row_ids[r] < ew.table.rows, "Engram row ", row_ids[r], " out of range");
      const uint8_t* w = ew.table.w + row_ids[r] * ehd;
      const uint8_t* s = ew.table.scale + row_ids[r] * (ehd / 32);
      for (int64_t d = 0; d < ehd; ++d) emb[r * ehd + d] = lut().e4m3[w[d]] * lut().e8m0[s[d / 32]];
    }
    fp8_linear(ew.wkv, emb.data(), kv.data(), numerics_.act_quant, threads_);
    const float* v = kv.data() + n * D;
    float* X = c.X.data() + int64_t{i} * n * D;
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
    for (int k = 0; k < n; ++k) {
      float* Xk = X + k * D;
      const float* key = kv.data() + k * D;
      const float rx = rms_inv(Xk, D, t.rms_norm_eps), rk = rms_inv(key, D, t.rms_norm_eps);
      float dot = det::block_sum<256>(
          D, [&](int64_t d) { return Xk[d] * ew.q_weight.at(k, d) * ew.k_weight.at(k, d) * key[d]; });
      dot = dot * rx * rk * inv_sqrt_d;
      const float g = sigmoid((dot >= 0 ? 1.0f : -1.0f) * std::sqrt(std::max(std::fabs(dot), 1e-6f)));
      for (int64_t d = 0; d < D; ++d) Xk[d] = rb(Xk[d] + g * v[d]);
    }
  }
}

void CpuBackend::attention(int layer, Chunk& c, const float* x, float* out) {
  const TextConfig& t = model_.config.text;
  const LayerPlan& lp = model_.config.layers[layer];
  const AttnWeights& a = model_.weights.layers[layer].attn;
  SequenceState& st = *c.st;
  const int H = t.num_attention_heads, W = t.sliding_window;
  const int64_t D = t.hidden_size, hd = t.head_dim, qr = t.q_lora_rank;
  const std::vector<float>& freq = lp.compress_rope ? inv_freq_compress_ : inv_freq_main_;
  const bool kvq = numerics_.kv_quant;
  const int n = c.n;

  // 1. Queries and this layer's window KV.
  std::vector<float> q_lat(n * qr), q(int64_t{n} * H * hd), kvw(n * hd), tmp(std::max(qr, hd));
  for (int i = 0; i < n; ++i) {
    const int64_t pos = c.P + i;
    fp8_linear(a.wq_a, x + i * D, tmp.data(), numerics_.act_quant, threads_);
    rms_norm(tmp.data(), qr, &a.q_norm, t.rms_norm_eps, q_lat.data() + i * qr);
    fp8_linear(a.wq_b, q_lat.data() + i * qr, q.data() + int64_t{i} * H * hd, numerics_.act_quant, threads_);
    for (int h = 0; h < H; ++h) rope(q.data() + (int64_t{i} * H + h) * hd, hd, freq, pos, 1.0f);
    float* kv = kvw.data() + i * hd;
    fp8_linear(a.wkv, x + i * D, tmp.data(), numerics_.act_quant, threads_);
    rms_norm(tmp.data(), hd, &a.kv_norm, t.rms_norm_eps, kv);
    rope(kv, hd, freq, pos, 1.0f);
    if (kvq) fp8_fake_quant(kv, hd, 32);
  }

  // 2. KV source: the compressor publishes shared compressed entries and indexer keys.
  const int slot = layout_.source_slot[layer];
  const int ratio = lp.ratio;
  const int64_t ihd = t.index_head_dim;
  if (lp.owns_compressor) {
    std::vector<float> ag(2 * hd), pooled(hd), latent(hd), entry(hd), k(ihd), knorm(ihd);
    std::vector<uint8_t> packed(layout_.ckv_entry_bytes), kpacked(layout_.ikey_entry_bytes);
    for (int i = 0; i < n; ++i) {
      const int64_t pos = c.P + i;
      bf16_linear_f32(a.comp_wkv, x + i * D, ag.data());
      if (ratio > 1) bf16_linear_f32(a.comp_wgate, x + i * D, ag.data() + hd);
      std::vector<float>& pend = st.pending[slot];
      pend.insert(pend.end(), ag.begin(), ag.end());
      if ((pos + 1) % ratio != 0) continue;
      // Pool the `ratio` buffered tokens: per-channel softmax of the gates over the group.
      for (int64_t d = 0; d < hd; ++d) {
        if (ratio == 1) {
          pooled[d] = rb(pend[d]);
          continue;
        }
        float mx = kNegInf;
        for (int r = 0; r < ratio; ++r) mx = std::max(mx, pend[r * 2 * hd + hd + d]);
        float num = 0.0f, den = 0.0f;
        for (int r = 0; r < ratio; ++r) {
          const float e = det::fexp(pend[r * 2 * hd + hd + d] - mx);
          num += e * pend[r * 2 * hd + d];
          den += e;
        }
        pooled[d] = rb(num / den);
      }
      pend.clear();
      rms_norm(pooled.data(), hd, &a.comp_norm, t.rms_norm_eps, latent.data());
      const int64_t w = pos / ratio, epos = int64_t{ratio} * w;
      entry = latent;
      rope(entry.data(), hd, inv_freq_compress_, epos, 1.0f);
      // Indexer key from the pre-RoPE latent.
      std::vector<float> kraw(ihd);
      bf16_linear_f32(a.idx_wk, latent.data(), kraw.data());
      round_bf16_inplace(kraw.data(), ihd);
      rms_norm(kraw.data(), ihd, &a.idx_k_norm, t.rms_norm_eps, k.data());
      rope(k.data(), ihd, inv_freq_compress_, epos, 1.0f);
      if (kvq) {
        fp4_quant_e4m3(entry.data(), hd, packed.data(), packed.data() + hd / 2);
        st.ckv[slot].insert(st.ckv[slot].end(), packed.begin(), packed.end());
        pack_ikey(k.data(), ihd, kpacked.data());
        st.ikey[slot].insert(st.ikey[slot].end(), kpacked.begin(), kpacked.end());
      } else {
        st.ckv_f32[slot].insert(st.ckv_f32[slot].end(), entry.begin(), entry.end());
        st.ikey_f32[slot].insert(st.ikey_f32[slot].end(), k.begin(), k.end());
      }
    }
  }
  auto n_entries = [&]() -> int64_t {
    return kvq ? st.ckv[slot].size() / layout_.ckv_entry_bytes : st.ckv_f32[slot].size() / hd;
  };

  // 3. Index source: score the visible entries of its KV source and keep the top-k.
  if (lp.runs_indexer) {
    // Dot products in blocks of 32 dims (docs/numerics.md §3): with kvq each block is exact, from
    // the integer sum of the FP4 codes (det::fp4_block_dot); without, the sequential FP32 sum of its
    // products. The block values are added in order.
    const int IH = t.index_n_heads;
    const int64_t total = n_entries(), iblocks = ihd / 32;
    std::vector<float> keys, ksc, qsc(kvq ? IH * iblocks : 0);
    std::vector<int8_t> kc, qc(kvq ? IH * ihd : 0);
    if (kvq) {
      kc.resize(total * ihd), ksc.resize(total * iblocks);
      for (int64_t e = 0; e < total; ++e)
        unpack_ikey_codes(st.ikey[slot].data() + e * layout_.ikey_entry_bytes, ihd, kc.data() + e * ihd,
                          ksc.data() + e * iblocks);
    } else {
      keys.assign(st.ikey_f32[slot].begin(), st.ikey_f32[slot].begin() + total * ihd);
    }
    std::vector<float> qi(IH * ihd), wts(IH), score;
    auto dot = [&](int h, int64_t e) {
      if (kvq)
        return det::seq_sum(iblocks, [&](int64_t j) {
          const int8_t* q = qc.data() + h * ihd + 32 * j;
          const int8_t* k = kc.data() + e * ihd + 32 * j;
          int32_t isum = 0;
          for (int d = 0; d < 32; ++d) isum += int32_t{q[d]} * int32_t{k[d]};
          return det::fp4_block_dot(isum, qsc[h * iblocks + j], ksc[e * iblocks + j]);
        });
      return det::seq_sum(iblocks, [&](int64_t j) {
        const float* q = qi.data() + h * ihd + 32 * j;
        const float* k = keys.data() + e * ihd + 32 * j;
        return det::seq_sum(32, [&](int64_t d) { return q[d] * k[d]; });
      });
    };
    const float head_scale = 1.0f / std::sqrt(static_cast<float>(IH));
    const float dim_scale = 1.0f / std::sqrt(static_cast<float>(ihd));
    const int B = t.candidate_block_size;
    c.selection.assign(n, {});
    if (lp.candidate_source) c.cand_mask.assign(n, {});
    for (int i = 0; i < n; ++i) {
      const int64_t pos = c.P + i;
      const int64_t vis = (pos + 1) / ratio;
      fp8_linear(a.idx_wq_b, q_lat.data() + i * qr, qi.data(), numerics_.act_quant, threads_);
      for (int h = 0; h < IH; ++h) {
        rope(qi.data() + h * ihd, ihd, inv_freq_compress_, pos, 1.0f);
        if (kvq) quant_iquery(qi.data() + h * ihd, ihd, qc.data() + h * ihd, qsc.data() + h * iblocks);
      }
      bf16_linear_f32(a.idx_weights_proj, x + i * D, wts.data());
      score.assign(vis, 0.0f);
      for (int64_t e = 0; e < vis; ++e) {
        float s = 0.0f;
        for (int h = 0; h < IH; ++h) s += rb(wts[h]) * head_scale * std::max(dot(h, e), 0.0f) * dim_scale;
        score[e] = s;
      }
      if (lp.candidate_constrained) {
        const std::vector<uint8_t>& mask = c.cand_mask.at(i);
        for (int64_t e = 0; e < vis; ++e)
          if (e / B >= static_cast<int64_t>(mask.size()) || !mask[e / B]) score[e] = kNegInf;
      }
      if (lp.candidate_source) {
        // Level one: blocks of B consecutive entries scored by their best entry; the newest block
        // always stays; the top candidate_topk_blocks blocks form the mask.
        const int64_t nb = (vis + B - 1) / B;
        std::vector<float> bs(nb, kNegInf);
        for (int64_t e = 0; e < vis; ++e) bs[e / B] = std::max(bs[e / B], score[e]);
        if (nb > 0) bs[nb - 1] = std::numeric_limits<float>::infinity();
        std::vector<uint8_t> mask(nb, 0);
        for (int32_t b : top_k(bs, t.candidate_topk_blocks)) mask[b] = 1;
        c.cand_mask[i] = std::move(mask);
      }
      c.selection[i] = top_k(score, t.index_topk);
    }
    c.selection_layer = layer;
  }

  // 4. Attention over the window ∪ the selected compressed entries, with the sink.
  std::vector<float> ring(int64_t{W} * hd);
  for (int s = 0; s < W; ++s) {
    if (kvq)
      unpack_window(st.window[layer].data() + s * layout_.window_entry_bytes, hd, ring.data() + s * hd);
    else
      std::copy_n(st.window_f32[layer].data() + s * hd, hd, ring.data() + s * hd);
  }
  if (lp.ratio > 0)
    DSUF_CHECK(c.selection_layer == lp.index_source, "layer ", layer, " needs the selection of layer ",
               lp.index_source, ", have ", c.selection_layer);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> o(int64_t{H} * hd), keys, logit;
  std::vector<float> zg(int64_t{t.o_groups} * t.o_lora_rank);
  for (int i = 0; i < n; ++i) {
    const int64_t pos = c.P + i;
    keys.clear();
    for (int64_t s = std::max<int64_t>(0, pos - W + 1); s <= pos; ++s) {
      const float* src = s >= c.P ? kvw.data() + (s - c.P) * hd : ring.data() + (s % W) * hd;
      keys.insert(keys.end(), src, src + hd);
    }
    if (lp.ratio > 0) {
      std::vector<float> e(hd);
      for (int32_t idx : c.selection[i]) {
        if (kvq) {
          const uint8_t* p = st.ckv[layout_.source_slot[layer]].data() + idx * layout_.ckv_entry_bytes;
          fp4_dequant_e4m3(p, p + hd / 2, hd, e.data());
        } else {
          std::copy_n(st.ckv_f32[layout_.source_slot[layer]].data() + int64_t{idx} * hd, hd, e.data());
        }
        keys.insert(keys.end(), e.begin(), e.end());
      }
    }
    const int64_t nk = static_cast<int64_t>(keys.size()) / hd;
    logit.resize(nk);
    for (int h = 0; h < H; ++h) {
      const float* qh = q.data() + (int64_t{i} * H + h) * hd;
      float mx = kNegInf;
      for (int64_t j = 0; j < nk; ++j) {
        const float dot = det::lane_sum(hd, [&](int64_t d) { return qh[d] * keys[j * hd + d]; });
        logit[j] = dot * scale;
        mx = std::max(mx, logit[j]);
      }
      for (int64_t j = 0; j < nk; ++j) logit[j] = det::fexp(logit[j] - mx);
      // The sink only enlarges the denominator.
      const float den = det::block_sum<128>(nk, [&](int64_t j) { return logit[j]; }) + det::fexp(a.sink[h] - mx);
      float* oh = o.data() + h * hd;
      std::fill(oh, oh + hd, 0.0f);
      for (int64_t j = 0; j < nk; ++j)
        for (int64_t d = 0; d < hd; ++d) oh[d] += logit[j] * keys[j * hd + d];
      for (int64_t d = 0; d < hd; ++d) oh[d] = rb(oh[d] / den);
      rope(oh, hd, freq, pos, -1.0f);  // V carried the key's rotation: undo it
    }
    // 5. Grouped low-rank output projection.
    const int64_t gin = int64_t{H / t.o_groups} * hd, ol = t.o_lora_rank;
    for (int g = 0; g < t.o_groups; ++g) {
      Fp8Linear sub = a.wo_a;
      sub.w += g * ol * sub.in;
      sub.scale += (g * ol / 32) * (sub.in / 32);
      sub.out = ol;
      fp8_linear(sub, o.data() + g * gin, zg.data() + g * ol, numerics_.wo_a_act_quant && numerics_.act_quant, threads_);
    }
    fp8_linear(a.wo_b, zg.data(), out + i * D, numerics_.act_quant, threads_);
  }

  // 6. The window ring keeps the last W tokens.
  for (int i = std::max(0, n - W); i < n; ++i) {
    const int64_t s = (c.P + i) % W;
    if (kvq)
      pack_window(kvw.data() + i * hd, hd, st.window[layer].data() + s * layout_.window_entry_bytes);
    else
      std::copy_n(kvw.data() + i * hd, hd, st.window_f32[layer].data() + s * hd);
  }
}

void CpuBackend::moe(int /*layer*/, const BlockWeights& w, int n_experts, int top, const float* x, bool image_token,
                     float* out) const {
  const TextConfig& t = model_.config.text;
  const int64_t D = t.hidden_size, F = t.moe_intermediate_size;
  const MoeWeights& m = w.ffn;
  std::vector<float> score(n_experts), sel_score(n_experts);
  bf16_linear_f32(m.gate, x, score.data());
  const std::vector<float>& bias = image_token ? m.bias_vl : m.bias;
  for (int e = 0; e < n_experts; ++e) {
    score[e] = std::sqrt(softplus(score[e] / static_cast<float>(t.gate_temp)));
    sel_score[e] = score[e] + bias[e];
  }
  const std::vector<int32_t> chosen = top_k(sel_score, top);
  float wsum = 0.0f;
  for (int32_t e : chosen) wsum += score[e];
  const float limit = static_cast<float>(t.swiglu_limit);
  std::vector<float> acc(D, 0.0f), h1(F), h3(F), y(D);
  auto swiglu = [&](float weight, bool clamp) {
    for (int64_t f = 0; f < F; ++f) {
      float g = h1[f], u = h3[f];
      if (clamp && limit > 0) {
        g = std::min(g, limit);
        u = std::clamp(u, -limit, limit);
      }
      h1[f] = rb(weight * (silu(g) * u));
    }
  };
  for (int32_t e : chosen) {
    const ExpertWeights& ex = m.experts[e];
    const float weight = score[e] / (wsum + 1e-20f) * static_cast<float>(t.routed_scaling_factor);
    fp4_linear(ex.w1, x, h1.data(), numerics_.act_quant, threads_);
    fp4_linear(ex.w3, x, h3.data(), numerics_.act_quant, threads_);
    swiglu(weight, true);
    fp4_linear(ex.w2, h1.data(), y.data(), numerics_.act_quant, threads_);
    for (int64_t d = 0; d < D; ++d) acc[d] += y[d];
  }
  fp8_linear(m.shared_w1, x, h1.data(), numerics_.act_quant, threads_);
  fp8_linear(m.shared_w3, x, h3.data(), numerics_.act_quant, threads_);
  swiglu(1.0f, numerics_.shared_expert_clamp);
  fp8_linear(m.shared_w2, h1.data(), y.data(), numerics_.act_quant, threads_);
  for (int64_t d = 0; d < D; ++d) out[d] = rb(acc[d] + y[d]);
}

void CpuBackend::forward_one(ForwardItem& item) {
  const ModelConfig& cfg = model_.config;
  const TextConfig& t = cfg.text;
  const ModelWeights& mw = model_.weights;
  DSUF_CHECK(item.state != nullptr, "forward item without a sequence state");
  DSUF_CHECK(item.state->unquantized == !numerics_.kv_quant, "sequence state made for other numerics");
  DSUF_CHECK(!item.token || (item.want != ForwardItem::Logits::kNone && !item.tokens.empty()),
             "sampling a token needs the last row's logits");
  Chunk c;
  c.st = item.state;
  c.P = item.state->pos;
  c.n = static_cast<int>(item.tokens.size());
  c.tokens = item.tokens;
  const int n = c.n, hc = t.hc_mult;
  const int64_t D = t.hidden_size;
  if (n == 0) {
    if (item.logits) item.logits->clear();
    return;
  }
  if (c.P + n > t.max_position_embeddings)
    fail("sequence of ", c.P + n, " tokens exceeds max_position_embeddings ", t.max_position_embeddings);

  // Embedding; every stream starts as the token's embedding. Layer 0 collapses with stream 0.
  c.X.resize(int64_t{n} * hc * D);
  c.pre_prev.assign(int64_t{n} * hc, 0.0f);
  c.cids.resize(n);
  c.image.resize(n);
  for (int i = 0; i < n; ++i) {
    const int32_t tok = item.tokens[i];
    if (tok < 0 || tok >= t.vocab_size) fail("token id ", tok, " is outside the vocabulary [0, ", t.vocab_size, ")");
    c.image[i] = tok == cfg.image_token_id;
    c.cids[i] = c.image[i] ? -1 : compressed_ids_[tok];
    for (int k = 0; k < hc; ++k) mw.embed.row(tok, c.X.data() + (int64_t{i} * hc + k) * D);
    c.pre_prev[int64_t{i} * hc] = 1.0f;
  }

  std::vector<float> u(int64_t{n} * D), xn(int64_t{n} * D), y(int64_t{n} * D);
  std::vector<HcMix> mix_a(n);
  for (const LayerPlan& lp : cfg.layers) {
    const int l = lp.layer;
    const BlockWeights& w = mw.layers[l];
    if (lp.engram_slot >= 0) engram(l, c);
    // Attention site: mix on the current streams, collapse with the previous site's pre.
    for (int i = 0; i < n; ++i) {
      const float* X = c.X.data() + int64_t{i} * hc * D;
      mix_a[i] = hc_mix(w.hc_attn, X, hc, D, t.rms_norm_eps, t.hc_sinkhorn_iters, static_cast<float>(t.hc_eps));
      hc_collapse(c.pre_prev.data() + i * hc, X, hc, D, u.data() + i * D);
      rms_norm(u.data() + i * D, D, &w.attn_norm, t.rms_norm_eps, xn.data() + i * D);
    }
    attention(l, c, xn.data(), y.data());
    for (int i = 0; i < n; ++i) hc_expand(mix_a[i], y.data() + i * D, hc, D, c.X.data() + int64_t{i} * hc * D);
    // FFN site: collapse with the attention site's pre.
    for (int i = 0; i < n; ++i) {
      float* X = c.X.data() + int64_t{i} * hc * D;
      HcMix mf = hc_mix(w.hc_ffn, X, hc, D, t.rms_norm_eps, t.hc_sinkhorn_iters, static_cast<float>(t.hc_eps));
      hc_collapse(mix_a[i].pre, X, hc, D, u.data() + i * D);
      rms_norm(u.data() + i * D, D, &w.ffn_norm, t.rms_norm_eps, xn.data() + i * D);
      moe(l, w, t.n_routed_experts, t.num_experts_per_tok, xn.data() + i * D, c.image[i], y.data() + i * D);
      hc_expand(mf, y.data() + i * D, hc, D, X);
      std::copy_n(mf.pre, hc, c.pre_prev.data() + i * hc);
    }
    if (item.trace) item.trace->push_back(c.X);
  }

  // Engram history: the compressed ids of the last tokens, newest first.
  std::vector<int32_t>& hist = c.st->engram_history;
  for (int i = 0; i < n; ++i) {
    for (int j = static_cast<int>(hist.size()) - 1; j > 0; --j) hist[j] = hist[j - 1];
    if (!hist.empty()) hist[0] = c.cids[i];
  }
  c.st->pos += n;

  // Head: final collapse, norm, FP32 logits for the rows asked for; the token from the last one.
  if (item.want == ForwardItem::Logits::kNone || (!item.logits && !item.token)) return;
  std::vector<float> last_only;
  std::vector<float>& logits = item.logits ? *item.logits : last_only;
  const int first = item.want == ForwardItem::Logits::kAll && item.logits ? 0 : n - 1;
  const int64_t V = t.vocab_size;
  logits.assign((n - first) * V, 0.0f);
  std::vector<float> h(D);
  for (int i = first; i < n; ++i) {
    hc_collapse(c.pre_prev.data() + i * hc, c.X.data() + int64_t{i} * hc * D, hc, D, u.data());
    rms_norm(u.data(), D, &mw.norm, t.rms_norm_eps, h.data());
    bf16_linear_f32(mw.head, h.data(), logits.data() + (i - first) * V, threads_);
  }
  if (item.token)
    *item.token = sample_token({logits.data() + (n - 1 - first) * V, static_cast<size_t>(V)}, item.sampling, item.draw);
}

}  // namespace dsuf
