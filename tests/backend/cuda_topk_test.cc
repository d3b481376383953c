// cuda::top_k on the device, single-block (k_top_k) and multi-block (k_top_k_chunks +
// k_top_k_merge, backend/cuda/topk_plan.h), against the CPU reference's top_k (core/topk.h) on
// fresh random rows: heavy ties, −inf runs, +inf, fewer eligible than k, count < k, rows of
// different lengths in one launch, unaligned rows, block-count rows, and a launch planned for far
// longer rows than it gets (as a captured decode graph plans for max_context). GPU machine only
// (label "gpu", in cuda_backend_tests). CudaTopK.Timing prints both paths' device time.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/check.h"
#include "cuda_buf.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/topk_plan.h"
#include "core/detmath.h"
#include "core/topk.h"
#include "topk_rows.h"

namespace dsuf {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

using cuda_test::Buf;

using testing_topk::make_row;

struct Launch {
  int k;
  int ratio = 1, block = 0;  // block > 0: counts are block counts (as the candidate blocks' top-k)
  int64_t min_chunk = topk::kDefaultChunk;
  int64_t max_count = 0;     // 0: the largest count; else the launch's bound (≥ every count)
};

// One launch over rows of counts[i] entries (stride apart; −7 beyond the count, never read); out
// rows of k. multi: the multi-block path with room for kMaxGroups groups a row.
std::vector<int32_t> device_top_k(const std::vector<float>& host, int64_t stride, const std::vector<int64_t>& counts,
                                  const Launch& L, bool multi, float* us = nullptr, int iters = 0) {
  const int rows = int(counts.size());
  Buf<float> x(host.size());
  DSUF_CUDA(cudaMemcpy(x.p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  std::vector<cuda::RowMeta> meta(static_cast<size_t>(rows));
  int64_t max_count = 0;
  for (int i = 0; i < rows; ++i) {
    // count = (pos+1)/ratio, in blocks ceil(that / block).
    const int64_t vis = L.block > 0 ? counts[i] * L.block : counts[i];
    meta[i] = {.pos = vis * L.ratio - 1, .seq = 0, .write = 0};
    max_count = std::max(max_count, counts[i]);
  }
  if (L.max_count) max_count = L.max_count;
  Buf<cuda::RowMeta> dmeta(static_cast<size_t>(rows));
  DSUF_CUDA(cudaMemcpy(dmeta.p, meta.data(), meta.size() * sizeof(cuda::RowMeta), cudaMemcpyHostToDevice));
  const int64_t slots = int64_t(rows) * topk::kMaxGroups * topk::slot_stride(L.k);
  Buf<float> cv(multi ? size_t(slots) : 1);
  Buf<int32_t> ci(multi ? size_t(slots) : 1), out(size_t(rows) * L.k);
  cuda::TopkScratch ts{};
  if (multi) ts = {.val = cv.p, .idx = ci.p, .slots = slots, .max_count = max_count, .min_chunk = L.min_chunk};
  auto launch = [&] { cuda::top_k(x.p, stride, rows, dmeta.p, L.ratio, L.block, L.k, out.p, L.k, nullptr, ts); };
  launch();
  DSUF_CUDA(cudaGetLastError());
  DSUF_CUDA(cudaDeviceSynchronize());
  if (us && iters > 0) {
    cudaEvent_t e0, e1;
    DSUF_CUDA(cudaEventCreate(&e0));
    DSUF_CUDA(cudaEventCreate(&e1));
    DSUF_CUDA(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) launch();
    DSUF_CUDA(cudaEventRecord(e1));
    DSUF_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    DSUF_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    *us = 1000.0f * ms / float(iters);
    DSUF_CUDA(cudaEventDestroy(e0));
    DSUF_CUDA(cudaEventDestroy(e1));
  }
  std::vector<int32_t> res(size_t(rows) * L.k);
  DSUF_CUDA(cudaMemcpy(res.data(), out.p, res.size() * 4, cudaMemcpyDeviceToHost));
  return res;
}

// Rows of the given counts (stride = largest + pad), random shapes; both paths == the reference.
int check_launch(std::mt19937_64& rng, const std::vector<int64_t>& counts, int64_t pad, const Launch& L,
                 const char* what) {
  const int64_t stride = *std::max_element(counts.begin(), counts.end()) + pad;
  std::vector<float> host(size_t(stride) * counts.size(), -7.0f);
  std::vector<std::vector<int32_t>> ref;
  std::vector<int> shapes;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int shape = int(rng() % 9);
    const std::vector<float> row = make_row(rng, counts[i], shape, L.k);
    std::copy(row.begin(), row.end(), host.begin() + int64_t(i) * stride);
    std::vector<int32_t> r = top_k(row, L.k);
    r.resize(size_t(L.k), -1);
    ref.push_back(r), shapes.push_back(shape);
  }
  int bad = 0;
  for (const bool multi : {false, true}) {
    const std::vector<int32_t> got = device_top_k(host, stride, counts, L, multi);
    for (size_t i = 0; i < counts.size(); ++i) {
      const bool same = std::equal(ref[i].begin(), ref[i].end(), got.begin() + int64_t(i) * L.k);
      if (!same && ++bad <= 8)
        ADD_FAILURE() << what << (multi ? " multi" : " single") << ": row " << i << " count " << counts[i]
                      << " shape " << shapes[i] << " k " << L.k;
    }
  }
  return bad;
}

// A fresh seed for a test's random rows, printed so that a failure can be replayed.
uint64_t fresh_seed(const char* tag) {
  const uint64_t seed = std::mt19937_64(std::random_device{}())();
  std::printf("%s seed %llu\n", tag, (unsigned long long)seed);
  return seed;
}

TEST(CudaTopK, MultiBlockEqualsCpu) {
  const uint64_t seed = fresh_seed("[topk]");
  std::mt19937_64 rng(seed);
  int bad = 0;
  // The real sizes at 1M context: rows of 1,048,000 (ratio 1) and 524,000 (ratio 2) entries, k =
  // 512, with shorter rows in the same launch; stride ≡ 1 mod 4 (rows after the first unaligned,
  // scalar loads) and ≡ 0.
  for (const int64_t pad : {int64_t(1), int64_t(4)}) {
    bad += check_launch(rng, {1048000, 524000, 262000, 16383, 16384 + 5, 700, 0, 511}, pad, Launch{.k = 512},
                        "real k=512");
  }
  // Rows around the 8K decode step's 8,192 entries (8 a thread of the 1,024-thread block) and short
  // ones, k = 512 and 64 (branch topk-cache read such rows once into registers: exact, ±0 ms, v25).
  for (const int64_t pad : {int64_t(1), int64_t(4)}) {
    bad += check_launch(rng, {8192, 8191, 8193, 4099, 1, 2, 600, 7000}, pad, Launch{.k = 512}, "cached k=512");
    bad += check_launch(rng, {8192, 8189, 65, 64, 63, 9000}, pad, Launch{.k = 64}, "cached k=64");
  }
  // The candidate blocks' top-k at 1M: 131,000 block scores, k = 2048, blocks of 8.
  bad += check_launch(rng, {131000, 70001, 2000, 16500}, 2, Launch{.k = 2048, .block = 8}, "real k=2048");
  // Many small chunks: k 64 and an odd k (slot stride rounded), chunks from 256 entries.
  for (int rep = 0; rep < 6; ++rep) {
    std::vector<int64_t> counts;
    for (int i = 0; i < 8; ++i) counts.push_back(int64_t(rng() % 60000));
    bad += check_launch(rng, counts, int64_t(rng() % 4), Launch{.k = 64, .min_chunk = 256}, "k=64");
    bad += check_launch(rng, counts, int64_t(rng() % 4), Launch{.k = 61, .ratio = 2, .min_chunk = 300}, "k=61");
  }
  // Block counts (the candidate blocks' top-k: count = ceil((pos+1)/ratio / block)).
  bad += check_launch(rng, {20000, 9000, 33, 40000}, 3, Launch{.k = 64, .ratio = 4, .block = 16, .min_chunk = 512},
                      "blocks");
  // Planned for max_context = 1M (as a captured decode graph): most of the launch's chunk blocks
  // find their row too short and return.
  bad += check_launch(rng, {300, 17000, 70000, 0}, 0, Launch{.k = 512, .max_count = 1048000}, "graph-sized");
  EXPECT_EQ(bad, 0) << "seed " << seed;
}

// top_k_picks (the decode step's selection left unsorted for gather_keys to place by rank): on the
// single-block path its picks, sorted on the host, are the reference's selection, 0 after the
// row's picks, and its out rows −1 from there (the rest is gather_keys' to write: the backend tests
// check that placement against the CPU reference end to end). Rows with ties, −inf runs, fewer
// eligible than k and count < k, as above.
// Both forms: one block a row (k_top_k) and a cluster of 8 blocks a row (k_top_k_cluster, whose
// eighths of the row and cross-block digit and offsets are what this checks; asked for by name it
// cannot fall back), on rows up to the cluster's bound of 131,072 entries.
TEST(CudaTopK, PicksAreTheSelection) {
  const uint64_t seed = fresh_seed("[topk picks]");
  std::mt19937_64 rng(seed);
  int bad = 0;
  for (const cuda::TopkPicks how : {cuda::TopkPicks::kBlock, cuda::TopkPicks::kCluster})
  for (const int k : {512, 64, 61, 1, 2048}) {
    const std::vector<int64_t> counts = {8192, 8191, int64_t(k) + 1, int64_t(k), int64_t(k) - 1, 1, 0, 5000, 100003,
                                         33, 131072};
    const int64_t stride = 131072 + 3, rows = int64_t(counts.size());  // rows after the first unaligned
    std::vector<float> host(size_t(stride * rows), -7.0f);
    std::vector<std::vector<int32_t>> ref;
    for (int64_t i = 0; i < rows; ++i) {
      const std::vector<float> row = make_row(rng, counts[size_t(i)], int(rng() % 9), k);
      std::copy(row.begin(), row.end(), host.begin() + i * stride);
      ref.push_back(top_k(row, k));
    }
    std::vector<cuda::RowMeta> meta(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) meta[i] = {.pos = counts[i] - 1, .seq = 0, .write = 0};
    Buf<float> x(host.size());
    Buf<cuda::RowMeta> dmeta(meta.size());
    Buf<uint64_t> picks(size_t(rows * k));
    Buf<int32_t> out(size_t(rows * k));
    DSUF_CUDA(cudaMemcpy(x.p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(dmeta.p, meta.data(), meta.size() * sizeof(cuda::RowMeta), cudaMemcpyHostToDevice));
    // Stale contents, as in a step's workspace: every slot must be written or left to gather_keys.
    DSUF_CUDA(cudaMemset(picks.p, 0x5a, size_t(rows * k) * 8));
    DSUF_CUDA(cudaMemset(out.p, 0x5a, size_t(rows * k) * 4));
    cuda::TopkScratch ts{};
    ts.max_count = *std::max_element(counts.begin(), counts.end());  // the launch's bound (the cluster's ≤ 131,072)
    ASSERT_TRUE(cuda::top_k_picks(x.p, stride, int(rows), dmeta.p, 1, k, picks.p, out.p, k, nullptr, ts, how));
    DSUF_CUDA(cudaDeviceSynchronize());
    std::vector<uint64_t> hp(size_t(rows * k));
    std::vector<int32_t> ho(size_t(rows * k));
    DSUF_CUDA(cudaMemcpy(hp.data(), picks.p, hp.size() * 8, cudaMemcpyDeviceToHost));
    DSUF_CUDA(cudaMemcpy(ho.data(), out.p, ho.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < rows; ++i) {
      const std::vector<int32_t>& r = ref[size_t(i)];
      const int want = int(r.size());
      std::vector<uint64_t> mine(hp.begin() + i * k, hp.begin() + i * k + want);
      std::sort(mine.rbegin(), mine.rend());  // descending: (score desc, index asc)
      std::vector<int32_t> idx;
      for (const uint64_t p : mine) idx.push_back(topk::pick_index(p));
      bool ok = idx == r && std::all_of(mine.begin(), mine.end(), [](uint64_t p) { return p != 0; });
      for (int j = want; j < k; ++j) ok = ok && hp[size_t(i * k + j)] == 0 && ho[size_t(i * k + j)] == -1;
      if (!ok && ++bad <= 8)
        ADD_FAILURE() << (how == cuda::TopkPicks::kCluster ? "cluster" : "block") << " k " << k << " row " << i
                      << " count " << counts[size_t(i)];
    }
  }
  EXPECT_EQ(bad, 0) << "seed " << seed;
}

// top_k_mask (the candidate blocks' selection as a mask, no sort) against the mask of the CPU
// reference's selection: one block a row (no scratch), and the multi-block fallback.
TEST(CudaTopK, MaskEqualsSelection) {
  const uint64_t seed = fresh_seed("[topk mask]");
  std::mt19937_64 rng(seed);
  int bad = 0;
  struct Case {
    std::vector<int64_t> counts;
    int k, block;
    bool multi;
  };
  // 8K context: 256 block scores of 8, k = 2048 (all taken); 1M: 32,750 blocks; random shapes with
  // ties, -inf runs and fewer eligible than k.
  for (const Case& c : {Case{{256, 255, 3, 0}, 2048, 8, false}, Case{{32750, 20000, 700}, 2048, 8, false},
                        Case{{32750, 20000, 700}, 2048, 8, true}, Case{{5000, 4096, 64, 1}, 61, 4, false},
                        Case{{60000, 9000}, 64, 16, true}}) {
    const int rows = int(c.counts.size());
    const int64_t stride = *std::max_element(c.counts.begin(), c.counts.end()) + 3, mstride = stride + 5;
    std::vector<float> host(size_t(stride) * rows, -7.0f);
    std::vector<uint8_t> want(size_t(mstride) * rows, 0);
    for (int i = 0; i < rows; ++i) {
      const std::vector<float> row = make_row(rng, c.counts[i], int(rng() % 9), c.k);
      std::copy(row.begin(), row.end(), host.begin() + int64_t(i) * stride);
      for (int32_t j : top_k(row, c.k)) want[size_t(i * mstride + j)] = 1;
    }
    Buf<float> x(host.size());
    DSUF_CUDA(cudaMemcpy(x.p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    std::vector<cuda::RowMeta> meta(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) meta[i] = {.pos = c.counts[i] * c.block - 1, .seq = 0, .write = 0};
    Buf<cuda::RowMeta> dmeta(meta.size());
    DSUF_CUDA(cudaMemcpy(dmeta.p, meta.data(), meta.size() * sizeof(cuda::RowMeta), cudaMemcpyHostToDevice));
    const int64_t slots = int64_t(rows) * topk::kMaxGroups * topk::slot_stride(c.k);
    Buf<float> cv{size_t(slots)};
    Buf<int32_t> ci{size_t(slots)}, sel{size_t(rows) * c.k};
    Buf<uint8_t> mask(want.size());
    DSUF_CUDA(cudaMemset(mask.p, 0xab, want.size()));  // stale bytes: the mask must be rewritten whole
    cuda::TopkScratch ts{};
    if (c.multi)
      ts = {.val = cv.p, .idx = ci.p, .slots = slots,
            .max_count = *std::max_element(c.counts.begin(), c.counts.end()), .min_chunk = 256};
    cuda::top_k_mask(x.p, stride, rows, dmeta.p, 1, c.block, c.k, sel.p, mask.p, mstride, nullptr, ts);
    DSUF_CUDA(cudaGetLastError());
    std::vector<uint8_t> got(want.size());
    DSUF_CUDA(cudaMemcpy(got.data(), mask.p, got.size(), cudaMemcpyDeviceToHost));
    for (int i = 0; i < rows; ++i)
      if (!std::equal(want.begin() + i * mstride, want.begin() + (i + 1) * mstride, got.begin() + i * mstride) &&
          ++bad <= 8)
        ADD_FAILURE() << "row " << i << " count " << c.counts[i] << " k " << c.k << (c.multi ? " multi" : " single");
  }
  EXPECT_EQ(bad, 0) << "seed " << seed;
}

TEST(CudaTopK, Timing) {
  // Not a pass/fail check: µs per top-k launch, single-block vs multi-block, at the 1M-context
  // sizes: k = 512 of 1,048,000 (ratio 1; also candidate-constrained: −inf outside 2048 blocks of
  // 8) and of 524,000 (ratio 2) entries, k = 2048 of 131,000 block scores; 1 and 4 rows.
  std::mt19937_64 rng(3);
  struct T {
    int64_t count;
    int k, block, shape;
    const char* what;
  };
  for (const T c : {T{1048000, 512, 0, 4, "normal"}, T{1048000, 512, 0, 7, "constrained"},
                    T{1048000, 512, 0, 0, "8 values"}, T{524000, 512, 0, 4, "normal"},
                    T{131000, 2048, 8, 4, "block scores"}, T{2048, 512, 0, 4, "8K, ratio 4"},
                    T{256, 2048, 8, 4, "8K blocks"}}) {
    for (const int rows : {1, 4}) {
      std::vector<float> host(size_t(c.count) * rows);
      for (int r = 0; r < rows; ++r) {
        const std::vector<float> row = make_row(rng, c.count, c.shape, c.k);
        std::copy(row.begin(), row.end(), host.begin() + int64_t(r) * c.count);
      }
      const std::vector<int64_t> counts(size_t(rows), c.count);
      const Launch L{.k = c.k, .block = c.block};
      float us_single = 0, us_multi = 0;
      const auto a = device_top_k(host, c.count, counts, L, false, &us_single, 10);
      const auto b = device_top_k(host, c.count, counts, L, true, &us_multi, 10);
      EXPECT_EQ(a, b);
      std::printf("top-k %4d of %7lld (%-12s), %d rows: single %8.1f us, multi %8.1f us (%d chunks a row)\n", c.k,
                  (long long)c.count, c.what, rows, us_single, us_multi,
                  topk::chunks(c.count, c.k, topk::kMaxGroups, topk::kDefaultChunk).G);
    }
  }
}

// cuda::route against the CPU reference's routing (cpu_backend.cc moe): scores sqrt(softplus(l / temp)),
// the top k of score + bias (bias_vl for image rows; ties to the lower index), weights score / (Σ of the
// picked scores in pick order + 1e-20) · scale — ids equal, weights bit for bit. E from one slot of the
// redux picks to all 16 (k_route<true, kSlots> scans 4, 8, 12 or 16), and past 512 (the scan form);
// every row has planted ties (equal selection values) among its leaders.
TEST(CudaRoute, PicksAndWeightsEqualTheReference) {
  const int k = 6, n = 3;
  const float temp = 1.5f, scale = 2.5f;
  const std::vector<uint8_t> image = {0, 1, 0};
  std::mt19937 rng(34);
  std::normal_distribution<float> logit(0.0f, 2.0f), small(0.0f, 0.05f);
  for (const int E : {8, 33, 96, 130, 256, 300, 384, 512, 600}) {
    std::vector<float> l(size_t(n) * E), bias(E), bias_vl(E);
    for (auto& v : l) v = logit(rng);
    for (int e = 0; e < E; ++e) bias[e] = small(rng), bias_vl[e] = small(rng);
    for (int i = 0; i < n; ++i) {  // the row's leader copied to experts after it: equal values, lower index first
      float* li = l.data() + size_t(i) * E;
      const int lead = int(std::max_element(li, li + E) - li);
      for (const int e : {lead + E / 3, lead + 2 * E / 3 + 1})
        if (e < E) {
          li[e] = li[lead] + 0.5f;  // above the leader: a tie at the top, the lower index first
          bias[e] = bias[std::min(lead + E / 3, E - 1)], bias_vl[e] = bias_vl[std::min(lead + E / 3, E - 1)];
        }
    }
    std::vector<int32_t> ids_ref(size_t(n) * k);
    std::vector<float> w_ref(size_t(n) * k);
    for (int i = 0; i < n; ++i) {
      std::vector<float> score(E), sel(E);
      const std::vector<float>& b = image[i] ? bias_vl : bias;
      for (int e = 0; e < E; ++e) {
        score[e] = std::sqrt(det::softplus(l[size_t(i) * E + e] / temp));
        sel[e] = score[e] + b[e];
      }
      const std::vector<int32_t> chosen = top_k(sel, k);
      float wsum = 0.0f;
      for (const int32_t e : chosen) wsum += score[e];
      for (int j = 0; j < k; ++j) {
        ids_ref[size_t(i) * k + j] = chosen[j];
        w_ref[size_t(i) * k + j] = score[chosen[j]] / (wsum + 1e-20f) * scale;
      }
    }
    Buf<float> dl(l.size()), db(E), dbv(E), dw(w_ref.size());
    Buf<uint8_t> dimg(n);
    Buf<int32_t> dids(ids_ref.size());
    DSUF_CUDA(cudaMemcpy(dl.p, l.data(), l.size() * 4, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(db.p, bias.data(), size_t(E) * 4, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(dbv.p, bias_vl.data(), size_t(E) * 4, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(dimg.p, image.data(), size_t(n), cudaMemcpyHostToDevice));
    cuda::route(dl.p, n, E, k, db.p, dbv.p, dimg.p, temp, scale, dids.p, dw.p, nullptr);
    DSUF_CUDA(cudaDeviceSynchronize());
    std::vector<int32_t> ids(ids_ref.size());
    std::vector<float> w(w_ref.size());
    DSUF_CUDA(cudaMemcpy(ids.data(), dids.p, ids.size() * 4, cudaMemcpyDeviceToHost));
    DSUF_CUDA(cudaMemcpy(w.data(), dw.p, w.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(ids, ids_ref) << "E " << E;
    for (size_t j = 0; j < w.size(); ++j)
      EXPECT_EQ(std::bit_cast<uint32_t>(w[j]), std::bit_cast<uint32_t>(w_ref[j])) << "E " << E << " pick " << j;
  }
}

}  // namespace
}  // namespace dsuf
