// The attention logits kernel (k_attention_logits, through cuda::attention on keys already gathered)
// against the canonical sum it implements: logit = lane_sum(hd, q·k) · (1/√hd) (core/detmath.h), bit for
// bit, in each of its forms — one key a warp's pass (1 and 2 rows), two keys a pass with lane-major
// queries (4 rows; hd = 512 and 128) — on fresh random queries and keys: BF16 values as in the model,
// products that underflow FP32, and values off the BF16 grid (where an FMA would not give the same bits).
// Session 45 ran it against the logits' FMA form (docs/perf.md "Decode — v53 … session 45"; measured
// slower and not landed), with host checks that fusing changes these cases' logits. GPU machine only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.cuh"
#include "core/detmath.h"
#include "core/numerics.h"
#include "cuda_buf.h"

namespace dsuf {
namespace {

using cuda_test::Buf;

struct LogitsCase {
  const char* name;
  int rows, H;
  int64_t hd;
  int keys;
  // Value generators (the RNG, the row, the key or head, the dim): queries and keys.
  float (*q)(std::mt19937&, int, int, int64_t);
  float (*k)(std::mt19937&, int, int, int64_t);
};

float normal(std::mt19937& g) { return std::normal_distribution<float>(0.0f, 1.0f)(g); }
float bf16_normal(std::mt19937& g, int e) { return round_bf16(std::ldexp(normal(g), e)); }

float q_plain(std::mt19937& g, int, int, int64_t) { return bf16_normal(g, 0); }
float k_plain(std::mt19937& g, int, int, int64_t) { return bf16_normal(g, -1); }
// Products near 2^-137 whose lowest bits fall below 2^-149 (their FP32 roundings are not exact).
float q_tiny(std::mt19937& g, int, int, int64_t) { return bf16_normal(g, -62); }
float k_tiny(std::mt19937& g, int, int, int64_t) { return bf16_normal(g, -75); }
// Per key: tiny or large enough for q_tiny's products to be exact.
float k_mixed(std::mt19937& g, int, int j, int64_t) { return bf16_normal(g, j % 3 == 0 ? -75 : -40); }
// Not BF16 values: 24 significant bits, so q·k is not exact in FP32.
float q_fp32(std::mt19937& g, int, int, int64_t) { return normal(g); }
float k_fp32(std::mt19937& g, int, int, int64_t) { return normal(g); }
// One query value of one head a row off the BF16 grid.
float q_one_fp32(std::mt19937& g, int, int h, int64_t d) { return h == 3 && d == 77 ? normal(g) : bf16_normal(g, 0); }

// The canonical logit.
float logit(const float* q, const float* k, int64_t hd) {
  return det::lane_sum(hd, [&](int64_t d) { return q[d] * k[d]; }) * (1.0f / std::sqrt(float(hd)));
}

// One attention over keys already gathered (R rows of W window keys each, no selection), on the
// device: the host's queries, keys and sinks uploaded, the logits and outputs read back after run().
// Outputs and logits are NaN until written.
struct GatheredAttention {
  int R, H, W;
  int64_t hd;
  Buf<float> dq, dk, dsink, dout, datt;
  Buf<cuda::RowMeta> dmeta;
  GatheredAttention(const std::vector<float>& q, const std::vector<float>& keys, const std::vector<float>& sink,
                    int R_, int H_, int W_, int64_t hd_, int pos_step)
      : R(R_), H(H_), W(W_), hd(hd_), dq(q.size()), dk(keys.size()), dsink(sink.size()), dout(q.size()),
        datt(size_t(R_) * H_ * W_), dmeta(size_t(R_)) {
    std::vector<cuda::RowMeta> meta(R);
    for (int i = 0; i < R; ++i) meta[i] = {int64_t(W - 1 + pos_step * i), 0, 0};  // W keys each: the window only
    DSUF_CUDA(cudaMemcpy(dq.p, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(dk.p, keys.data(), keys.size() * sizeof(float), cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(dsink.p, sink.data(), sink.size() * sizeof(float), cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(dmeta.p, meta.data(), meta.size() * sizeof(cuda::RowMeta), cudaMemcpyHostToDevice));
  }
  // cuda::attention with P·V form pv_form (−1: DSUF_PV's), then the logits and outputs to the host.
  void run(cudaStream_t s, int pv_form, std::vector<float>& att, std::vector<float>& out) {
    DSUF_CUDA(cudaMemset(datt.p, 0xff, datt.n * sizeof(float)));
    DSUF_CUDA(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));
    cuda::AttentionArgs a{};
    a.q = dq.p, a.meta = dmeta.p, a.src = -1, a.sel = nullptr, a.sel_stride = 0, a.sink = dsink.p;
    a.out = dout.p, a.keys = dk.p, a.att = datt.p, a.kmax = W, a.rows = R, a.H = H, a.W = W, a.hd = hd;
    a.r = true;
    a.pv_form = pv_form;
    cuda::attention(a, s, /*gathered=*/true);
    DSUF_CUDA(cudaStreamSynchronize(s));
    att.resize(datt.n), out.resize(dout.n);
    DSUF_CUDA(cudaMemcpy(att.data(), datt.p, att.size() * sizeof(float), cudaMemcpyDeviceToHost));
    DSUF_CUDA(cudaMemcpy(out.data(), dout.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
};

TEST(CudaAttentionLogits, EveryFormEqualsTheCanonicalSum) {
  const LogitsCase cases[] = {
      {"plain 1 row", 1, 16, 512, 256, q_plain, k_plain},
      {"plain 2 rows", 2, 16, 512, 256, q_plain, k_plain},
      {"plain 4 rows (pairs, QU 16)", 4, 16, 512, 256, q_plain, k_plain},
      {"plain 4 rows (pairs, QU 4)", 4, 16, 128, 256, q_plain, k_plain},
      {"underflow 1 row", 1, 16, 512, 256, q_tiny, k_tiny},
      {"underflow 4 rows", 4, 16, 512, 256, q_tiny, k_tiny},
      {"underflow 4 rows hd 128", 4, 16, 128, 256, q_tiny, k_tiny},
      {"mixed keys 1 row", 1, 16, 512, 256, q_tiny, k_mixed},
      {"mixed keys 4 rows", 4, 16, 512, 256, q_tiny, k_mixed},
      {"fp32 queries 1 row", 1, 16, 512, 256, q_fp32, k_plain},
      {"fp32 queries 4 rows", 4, 16, 512, 256, q_fp32, k_plain},
      {"one fp32 query value 4 rows", 4, 16, 512, 256, q_one_fp32, k_plain},
      {"fp32 keys 1 row", 1, 16, 512, 256, q_plain, k_fp32},
      {"fp32 keys 4 rows", 4, 16, 512, 256, q_plain, k_fp32},
  };
  std::mt19937 g(20261203u);
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreate(&s));
  for (const LogitsCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int R = c.rows, H = c.H, W = c.keys, kmax = W;
    const int64_t hd = c.hd;
    std::vector<float> q(size_t(R) * H * hd), keys(size_t(R) * kmax * hd), sink(H);
    for (int i = 0; i < R; ++i)
      for (int h = 0; h < H; ++h)
        for (int64_t d = 0; d < hd; ++d) q[(size_t(i) * H + h) * hd + d] = c.q(g, i, h, d);
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < kmax; ++j)
        for (int64_t d = 0; d < hd; ++d) keys[(size_t(i) * kmax + j) * hd + d] = c.k(g, i, j, d);
    for (float& v : sink) v = normal(g);
    GatheredAttention ga(q, keys, sink, R, H, W, hd, 5);
    std::vector<float> att, out;
    ga.run(s, -1, att, out);
    int64_t bad = 0;
    for (int i = 0; i < R; ++i)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < kmax; ++j) {
          const float* qv = q.data() + (size_t(i) * H + h) * hd;
          const float* kv = keys.data() + (size_t(i) * kmax + j) * hd;
          const float want = logit(qv, kv, hd);
          const float got = att[(size_t(i) * H + h) * kmax + j];
          if (det::float_to_bits(got) != det::float_to_bits(want) && ++bad <= 3)
            ADD_FAILURE() << "row " << i << " head " << h << " key " << j << ": got " << got << " want " << want;
        }
    EXPECT_EQ(bad, 0);
  }
  cudaStreamDestroy(s);
}

// The softmax + P·V kernel in each of its forms (AttentionArgs::pv_form: warps, cp, tiles, cpw) against
// the reference's attention (cpu_backend.cc): e_j = fexp(logit_j − max), den = the 128-thread block_sum
// of e plus fexp(sink − max), out = rb((Σ_j e_j·k_j in key order from zero) / den), bit for bit, on the
// logits the logits kernel wrote (the test above checks those). Rows 1, 2 and 4; a partial head group
// (H = 12); key counts not a multiple of 4; hd 512 and 128. Session 46 also ran it on two forms since
// removed (a cluster softmax, the logits read without staging: docs/perf.md "Decode — session 46").
TEST(CudaAttentionPv, EveryFormEqualsTheReference) {
  struct PvCase {
    const char* name;
    int rows, H;
    int64_t hd;
    int keys;
  };
  const PvCase cases[] = {
      {"1 row, 640 keys", 1, 16, 512, 640}, {"2 rows, 301 keys", 2, 16, 512, 301},
      {"4 rows, 640 keys", 4, 16, 512, 640}, {"1 row, H 12, 133 keys", 1, 12, 512, 133},
      {"1 row, hd 128", 1, 16, 128, 257},
  };
  const char* forms[] = {"warps", "cp", "tiles", "cpw"};
  std::mt19937 g(20261204u);
  cudaStream_t s = nullptr;
  DSUF_CUDA(cudaStreamCreate(&s));
  for (const PvCase& c : cases) {
    const int R = c.rows, H = c.H, W = c.keys, kmax = W;
    const int64_t hd = c.hd;
    std::vector<float> q(size_t(R) * H * hd), keys(size_t(R) * kmax * hd), sink(H);
    // Logits of a few units (the softmax's exponentials spread out) and keys off the BF16 grid.
    for (float& v : q) v = bf16_normal(g, -2);
    for (float& v : keys) v = normal(g);
    for (float& v : sink) v = normal(g);
    GatheredAttention ga(q, keys, sink, R, H, W, hd, 3);
    for (int form = 0; form < int(sizeof forms / sizeof *forms); ++form) {
      SCOPED_TRACE(std::string(c.name) + ", " + forms[form]);
      std::vector<float> att, out;
      ga.run(s, form, att, out);
      int64_t bad = 0;
      std::vector<float> e(kmax), o(hd);
      for (int i = 0; i < R; ++i)
        for (int h = 0; h < H; ++h) {
          const float* lg = att.data() + (size_t(i) * H + h) * kmax;
          float mx = -INFINITY;
          for (int j = 0; j < kmax; ++j) mx = std::max(mx, lg[j]);
          for (int j = 0; j < kmax; ++j) e[j] = det::fexp(lg[j] - mx);
          const float den = det::block_sum<128>(kmax, [&](int64_t j) { return e[j]; }) + det::fexp(sink[h] - mx);
          std::fill(o.begin(), o.end(), 0.0f);
          for (int j = 0; j < kmax; ++j)
            for (int64_t d = 0; d < hd; ++d) o[d] += e[j] * keys[(size_t(i) * kmax + j) * hd + d];
          for (int64_t d = 0; d < hd; ++d) {
            const float want = round_bf16(o[d] / den), got = out[(size_t(i) * H + h) * hd + d];
            if (det::float_to_bits(got) != det::float_to_bits(want) && ++bad <= 3)
              ADD_FAILURE() << "row " << i << " head " << h << " dim " << d << ": got " << got << " want " << want;
          }
        }
      EXPECT_EQ(bad, 0);
    }
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace dsuf
