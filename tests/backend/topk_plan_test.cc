// The multi-block top-k of the CUDA backend (backend/cuda/topk_plan.h; kernels.cu k_top_k_chunks +
// k_top_k_merge), emulated on the CPU: a host copy of the kernels' selection (block_select_256:
// eligible count, the four 8-bit radix digits chosen as the kernel chooses them, per-thread ranges
// and exclusive scans for the gather, the slot layout), driven by the plan the kernels use (the
// same topk_plan.h functions: key, pick, groups, chunk bounds, slot stride, launch_groups). On
// fresh random rows — heavy ties, −inf runs, +inf, fewer eligible than k, count < k, counts not a
// multiple of the chunk — the two-stage result must equal the CPU reference's top_k
// (core/topk.h) and the single-block emulation. Mutated plans (chunks stored out of order, a chunk
// keeping k − 1, unshifted indices, ties taken from the end) must fail on the same rows.
// CPU only (no GPU): runs in `make test`.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/topk_plan.h"
#include "core/topk.h"
#include "topk_rows.h"

namespace dsuf {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kThreads = 256;

enum class Mutation { none, reverse_chunks, keep_k_minus_1, unshifted_index, ties_from_end };

// Host copy of kernels.cu block_select_256: emit(slot, j, key, value) once per pick; returns want.
template <typename Emit>
int block_select(const float* row, int64_t count, int k, Emit emit, bool ties_from_end = false) {
  int eligible = 0;
  for (int64_t j = 0; j < count; ++j) eligible += topk::eligible(topk::key(row[j]));
  const int want = eligible < k ? eligible : k;
  uint32_t threshold = topk::kNegInfKey + 1;
  int ties_to_take = 0;
  if (eligible > k) {
    uint32_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      int hist[256] = {}, above[257] = {};
      for (int64_t j = 0; j < count; ++j) {
        const uint32_t key = topk::key(row[j]);
        if (topk::eligible(key) && (key & mask) == prefix) ++hist[(key >> shift) & 255];
      }
      for (int d = 255; d >= 0; --d) above[d] = above[d + 1] + hist[d];
      int digit = 0;  // the largest d ≥ 1 with above[d] ≥ remaining, else 0
      for (int d = 1; d < 256; ++d)
        if (above[d] >= remaining) digit = d;
      remaining -= above[digit + 1];
      prefix |= uint32_t(digit) << shift;
      mask |= 255u << shift;
    }
    threshold = prefix;
    ties_to_take = remaining;
  }
  // Gather: thread t owns [t·per, t·per + per), offsets by exclusive scans over the threads.
  const int64_t per = ((count + kThreads - 1) / kThreads + 3) / 4 * 4;
  auto range = [&](int t, int64_t& lo, int64_t& hi) {
    lo = std::min<int64_t>(t * per, count);
    hi = std::min<int64_t>(lo + per, count);
  };
  std::vector<int> n_gt(kThreads), n_eq(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    int64_t lo, hi;
    range(t, lo, hi);
    for (int64_t j = lo; j < hi; ++j) {
      const uint32_t key = topk::key(row[j]);
      if (!topk::eligible(key)) continue;
      if (eligible <= k || key > threshold) ++n_gt[t];
      else if (key == threshold) ++n_eq[t];
    }
  }
  int total_eq = 0;
  for (int t = 0; t < kThreads; ++t) total_eq += n_eq[t];
  const int n_gt_total = want - ties_to_take;
  int og = 0, oe = 0;  // running exclusive sums
  for (int t = 0; t < kThreads; ++t) {
    int64_t lo, hi;
    range(t, lo, hi);
    int g = og, e = oe;
    for (int64_t j = lo; j < hi; ++j) {
      const uint32_t key = topk::key(row[j]);
      if (!topk::eligible(key)) continue;
      if (eligible <= k || key > threshold) {
        emit(g++, j, key, row[j]);
      } else if (key == threshold) {
        // The kernel takes the first ties_to_take; the mutation the last ones.
        const bool take = ties_from_end ? e >= total_eq - ties_to_take : e < ties_to_take;
        if (take) emit(n_gt_total + (ties_from_end ? e - (total_eq - ties_to_take) : e), j, key, row[j]);
        ++e;
      }
    }
    og += n_gt[t], oe += n_eq[t];
  }
  return want;
}

// Sort (the kernel's bitonic sort: descending picks; picks are distinct) and write, −1 padded.
std::vector<int32_t> sort_write(std::vector<uint64_t> picks, int want, int out_stride) {
  for (int s = 0; s < want; ++s) EXPECT_NE(picks[s], 0u) << "slot " << s << " of " << want << " never written";
  std::sort(picks.begin(), picks.begin() + want, std::greater<>());
  std::vector<int32_t> out(out_stride, -1);
  for (int j = 0; j < want && j < out_stride; ++j) out[j] = topk::pick_index(picks[j]);
  return out;
}

// k_top_k.
std::vector<int32_t> single_block(const std::vector<float>& row, int k) {
  std::vector<uint64_t> picks(k, 0);
  const int want = block_select(row.data(), int64_t(row.size()), k, [&](int s, int64_t j, uint32_t key, float) {
    EXPECT_EQ(picks[s], 0u);
    picks[s] = topk::pick(key, j);
  });
  return sort_write(picks, want, k);
}

struct TwoStageStats {
  int groups = 0;
  int64_t candidates = 0;
};
// k_top_k_chunks + k_top_k_merge for one row, g_launch groups in the launch.
std::vector<int32_t> two_stage(const std::vector<float>& row, int k, int g_launch, int64_t min_chunk,
                               Mutation m = Mutation::none, TwoStageStats* stats = nullptr) {
  const int64_t count = int64_t(row.size());
  const topk::Chunks ch = topk::chunks(count, k, g_launch, min_chunk);
  const int G = ch.G;
  EXPECT_GE(G, 1);
  EXPECT_LE(G, std::max(g_launch, 1));
  std::vector<uint64_t> picks(k, 0);
  auto pick_emit = [&](const int32_t* idx) {
    return [&picks, idx](int s, int64_t j, uint32_t key, float) {
      EXPECT_EQ(picks[s], 0u);
      picks[s] = topk::pick(key, idx ? idx[j] : j);
    };
  };
  int want;
  if (stats) stats->groups = G;
  if (G < 2) {
    want = block_select(row.data(), count, k, pick_emit(nullptr));
  } else {
    // Stage 1: the row's candidates, cand_stride = g_launch·ks, chunk g at [g·ks, (g+1)·ks).
    const int64_t ks = topk::slot_stride(k);
    std::vector<float> val(size_t(g_launch * ks), std::nanf(""));  // stage 1 writes every slot it reads
    std::vector<int32_t> idx(size_t(g_launch * ks), -7);
    int64_t covered = 0;
    for (int g = 0; g < G; ++g) {
      const int64_t lo = topk::chunk_lo(ch, g), hi = topk::chunk_hi(ch, count, g);
      EXPECT_EQ(lo, covered) << "chunks must tile the row";
      EXPECT_EQ(lo % topk::kChunkAlign, 0);
      EXPECT_GT(hi, lo) << "empty chunk";
      covered = hi;
      const int at = m == Mutation::reverse_chunks ? G - 1 - g : g;
      const int keep = m == Mutation::keep_k_minus_1 ? k - 1 : k;
      float* v = val.data() + at * ks;
      int32_t* ix = idx.data() + at * ks;
      std::vector<char> written(size_t(ks), 0);
      const int w = block_select(row.data() + lo, hi - lo, keep, [&](int s, int64_t j, uint32_t, float x) {
        EXPECT_EQ(written[s], 0);
        written[s] = 1;
        v[s] = x;
        ix[s] = int32_t(m == Mutation::unshifted_index ? j : lo + j);
      });
      for (int s = 0; s < w; ++s) EXPECT_EQ(written[s], 1);
      for (int64_t s = w; s < ks; ++s) v[s] = -kInf, ix[s] = -1;
    }
    EXPECT_EQ(covered, count);
    if (stats) stats->candidates = G * ks;
    // Stage 2 over the G·ks candidates.
    want = block_select(val.data(), G * ks, k, pick_emit(idx.data()), m == Mutation::ties_from_end);
  }
  return sort_write(picks, want, k);
}

std::vector<int32_t> reference(const std::vector<float>& row, int k) {
  std::vector<int32_t> r = top_k(row, k);
  r.resize(size_t(k), -1);
  return r;
}

using testing_topk::make_row;
constexpr int kShapes = 9;

struct Case {
  int k;
  int64_t min_chunk;
};

// Fresh random rows at small chunk sizes (many chunks per row, fast), counts from 1 to a few
// chunk multiples, every shape; two-stage == reference == single block.
TEST(TopkPlan, TwoStageEqualsReferenceOnRandomRows) {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t seed = rng();
  rng.seed(seed);
  int rows = 0, multi = 0, mismatches = 0;
  for (const Case c : {Case{16, 256}, Case{64, 256}, Case{61, 300}, Case{512, 2048}, Case{5, 256}}) {
    for (int it = 0; it < 200; ++it) {
      const int shape = it % kShapes;
      // count < k, around k, a few chunks, many chunks; rarely a multiple of anything
      const int64_t top = it % 4 == 0 ? 2 * int64_t(c.k) : 40 * c.min_chunk;
      const int64_t count = 1 + int64_t(rng() % uint64_t(top));
      const std::vector<float> row = make_row(rng, count, shape, c.k);
      const int g_launch = it % 3 == 2 ? 2 + int(rng() % 3)  // a launch capped by its workspace
                                       : topk::launch_groups(count + int64_t(rng() % 1000), 1, c.k, c.min_chunk,
                                                             int64_t(1) << 40);
      TwoStageStats st;
      const std::vector<int32_t> two = two_stage(row, c.k, g_launch, c.min_chunk, Mutation::none, &st);
      const std::vector<int32_t> ref = reference(row, c.k);
      ++rows, multi += st.groups > 1;
      if (two != ref || single_block(row, c.k) != ref) {
        if (++mismatches <= 5)
          ADD_FAILURE() << "seed " << seed << ": k " << c.k << " count " << count << " shape " << shape << " groups "
                        << st.groups;
      }
    }
  }
  std::printf("[topk] %d rows (%d over several chunks), %d mismatches, seed %llu\n", rows, multi, mismatches,
              (unsigned long long)seed);
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(multi, rows / 2);
}

// The real sizes at the default chunk, planned as a 1M-context launch: k = 512 of 1,048,000
// (ratio 1) and 524,000 (ratio 2) entries and shorter rows; k = 2048 of 131,000 block scores.
TEST(TopkPlan, TwoStageEqualsReferenceAtRealSizes) {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t seed = rng();
  rng.seed(seed);
  struct C {
    int64_t count;
    int k;
  };
  for (const C c : {C{1048000, 512}, C{524000, 512}, C{262000, 512}, C{131071, 512}, C{16384, 512}, C{16383, 512},
                    C{40001, 512}, C{131000, 2048}, C{33000, 2048}}) {
    const int g = topk::launch_groups(1048000, 1, c.k, topk::kDefaultChunk, int64_t(1) << 40);
    for (const int shape : {0, 1, 4, 5, 6, 7}) {
      const std::vector<float> row = make_row(rng, c.count, shape, c.k);
      TwoStageStats st;
      EXPECT_EQ(two_stage(row, c.k, g, topk::kDefaultChunk, Mutation::none, &st), reference(row, c.k))
          << "seed " << seed << " count " << c.count << " k " << c.k << " shape " << shape;
      if (shape == 0)
        std::printf("[topk] %lld entries, k %d: %d chunks, %lld candidates (launch %d)\n", (long long)c.count, c.k,
                    st.groups, (long long)st.candidates, g);
      if (c.count >= 2 * topk::kDefaultChunk) {
        EXPECT_GE(st.groups, 2) << c.count;
      } else {
        EXPECT_EQ(st.groups, 1) << c.count;
      }
    }
  }
}

// The test can fail: each mutation of the plan gives a wrong answer on rows of the same kind.
TEST(TopkPlan, MutationsAreCaught) {
  std::mt19937_64 rng(12345);
  for (const Mutation m :
       {Mutation::reverse_chunks, Mutation::keep_k_minus_1, Mutation::unshifted_index, Mutation::ties_from_end}) {
    int wrong = 0;
    for (int it = 0; it < 16; ++it) {
      const int k = 64;
      const std::vector<float> row = make_row(rng, 5000 + int64_t(rng() % 5000), it % 2 == 0 ? 0 : 6, k);
      const int g = topk::launch_groups(int64_t(row.size()), 1, k, 256, int64_t(1) << 40);
      wrong += two_stage(row, k, g, 256, m) != reference(row, k);
    }
    std::printf("[topk] mutation %d: %d of 16 rows wrong\n", int(m), wrong);
    EXPECT_GT(wrong, 0) << "mutation " << int(m) << " went unnoticed";
  }
}

// Signed zeros and NaNs: the kernels order keys (+0 above −0; NaN with the sign bit clear above
// +inf, with it set ineligible), the reference floats. The two kernel paths must still agree.
TEST(TopkPlan, TwoStageEqualsSingleBlockOnZerosAndNaN) {
  std::mt19937_64 rng(std::random_device{}());
  const float vals[] = {0.0f, -0.0f, std::nanf(""), -std::nanf(""), 1.0f, -kInf, kInf};
  for (int it = 0; it < 40; ++it) {
    const int k = it % 2 ? 64 : 7;
    std::vector<float> row(size_t(600 + rng() % 6000));
    for (auto& v : row) v = vals[rng() % 7];
    const int g = topk::launch_groups(int64_t(row.size()), 1, k, 256, int64_t(1) << 40);
    EXPECT_EQ(two_stage(row, k, g, 256), single_block(row, k)) << "row " << it;
  }
}

// The plan: chunks tile the row; a launch never needs more slots than it has; the workspace's
// slots (scratch_slots) give every row of up to max_count entries the groups it wants.
TEST(TopkPlan, PlanBounds) {
  for (const int k : {512, 64, 5}) {
    const int64_t max_count = 1048000 + 7;
    const int64_t cap = topk::scratch_slots(topk::kScratchRows, max_count, k);
    const int g_launch = topk::launch_groups(max_count, int(topk::kScratchRows), k, topk::kDefaultChunk, cap);
    ASSERT_GE(g_launch, 2) << k;
    EXPECT_LE(int64_t(topk::kScratchRows) * g_launch * topk::slot_stride(k), cap);
    for (int64_t count = 0; count <= max_count; ++count) {
      const topk::Chunks want = topk::chunks(count, k, topk::kMaxGroups, topk::kDefaultChunk);
      const topk::Chunks got = topk::chunks(count, k, g_launch, topk::kDefaultChunk);
      ASSERT_EQ(got.G, want.G) << "k " << k << " count " << count;  // the + 1 of launch_groups suffices
      if (got.G < 2) continue;
      ASSERT_EQ(got.len % topk::kChunkAlign, 0);
      ASSERT_GE(got.len, topk::kDefaultChunk - topk::kChunkAlign) << count;
      ASSERT_LT(topk::chunk_lo(got, got.G - 1), count) << "empty last chunk at " << count;
      ASSERT_EQ(topk::chunk_hi(got, count, got.G - 1), count);
    }
    // More rows than the workspace was sized for: fewer groups, never more slots.
    for (const int rows : {1, 7, 256, 257, 1000, 4096}) {
      const int g = topk::launch_groups(max_count, rows, k, 256, cap);
      if (g >= 2) {
        EXPECT_LE(int64_t(rows) * g * topk::slot_stride(k), cap) << rows;
      }
    }
  }
  for (int64_t x = 0; x < 2000000; x += 7) {
    const int64_t r = topk::isqrt(x);
    ASSERT_TRUE(r * r <= x && (r + 1) * (r + 1) > x) << x;
  }
}

// The workspace follows the chosen smallest chunk (DSUF_TOPK_CHUNK): at 8,192 entries the default
// chunk leaves one block (no scratch), a 1,024-entry chunk plans several groups, and the slots it
// asks for hold them (as sized, launch_groups never plans more than fit).
TEST(TopkPlan, ScratchFollowsTheSmallestChunk) {
  const int k = 512;
  const int64_t count = 8192;
  EXPECT_EQ(topk::scratch_slots(1, count, k), 0);
  EXPECT_EQ(topk::scratch_slots(1, count, k, topk::kDefaultChunk), 0);
  const int64_t slots = topk::scratch_slots(1, count, k, 1024);
  ASSERT_GT(slots, 0);
  const int g = topk::launch_groups(count, 1, k, 1024, slots);
  EXPECT_GE(g, 2);
  EXPECT_LE(int64_t(g) * topk::slot_stride(k), slots);
  EXPECT_EQ(topk::chunks(count, k, g, 1024).G, 4);  // √(8,192·512) = 2,048-entry chunks
}

// The bitonic network of the single-block sort (kernels.cu sort_picks_write: every element applies
// topk::bitonic_keep at every stage, in shared memory or by shuffles) sorts any padded set of
// picks descending: fresh random picks of fresh random counts, with ties in the key (the index
// part keeps picks distinct) and the zero padding.
TEST(TopkPlan, BitonicNetworkSortsThePicksDescending) {
  std::mt19937_64 rng(20261130);
  for (int npow = 1; npow <= 1024; npow <<= 1) {
    for (int rep = 0; rep < 20; ++rep) {
      const int want = npow == 1 ? int(rng() % 2) : npow / 2 + 1 + int(rng() % (npow / 2));
      std::vector<uint64_t> v(size_t(npow), 0);
      for (int j = 0; j < want; ++j) {
        const uint32_t key = topk::kNegInfKey + 1 + uint32_t(rng() % 64);  // few keys: many ties
        v[size_t(j)] = topk::pick(key, int64_t(rng() % 100000) * 1024 + j);
      }
      std::vector<uint64_t> want_sorted = v;
      std::sort(want_sorted.begin(), want_sorted.end(), std::greater<uint64_t>());
      for (int size = 2; size <= npow; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
          std::vector<uint64_t> next(v.size());
          for (int j = 0; j < npow; ++j) next[size_t(j)] = topk::bitonic_keep(v[size_t(j)], v[size_t(j ^ stride)], j, size, stride);
          v.swap(next);
        }
      ASSERT_EQ(v, want_sorted) << "npow " << npow << " want " << want;
    }
  }
}

// block_select's lean digit rule (each bin decides alone) against the classic one (the largest
// d ≥ 1 with above[d] ≥ rem, else 0, as an atomicMax finds it), on fresh random histograms: flat,
// a few heavy bins, skewed to the top, empty; rem from 1 to past the total.
TEST(TopkPlan, EachBinFindsTheSameDigitAsTheScan) {
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  int bad = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<int> hist(256, 0);
    const int n = std::array<int, 6>{0, 1, 5, 50, 500, 8192}[rng() % 6];
    const int shape = int(rng() % 3);
    for (int e = 0; e < n; ++e) {
      const int heavy[] = {0, 1, 127, 128, 255};
      const int b = shape == 0 ? int(rng() % 256) : shape == 1 ? heavy[rng() % 5] : 255 - int(rng() % 16) * int(rng() % 16);
      ++hist[size_t(std::clamp(b, 0, 255))];
    }
    const int rem = 1 + int(rng() % uint64_t(n + 3));
    std::vector<int> above(257, 0);
    for (int d = 255; d >= 0; --d) above[size_t(d)] = above[size_t(d) + 1] + hist[size_t(d)];
    int digit = 0;
    for (int d = 1; d < 256; ++d)
      if (above[size_t(d)] >= rem) digit = std::max(digit, d);
    int writers = 0, got = -1;
    for (int d = 0; d < 256; ++d)
      if (topk::digit_is_mine(d, above[size_t(d)], hist[size_t(d)], rem)) ++writers, got = d;
    if ((writers != 1 || got != digit) && ++bad <= 5)
      ADD_FAILURE() << "n " << n << " rem " << rem << ": digit " << digit << ", " << writers << " bins answered, got " << got;
  }
  EXPECT_EQ(bad, 0) << "seed " << seed;
}

}  // namespace
}  // namespace dsuf
