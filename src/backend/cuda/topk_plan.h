// The multi-block top-k of the CUDA backend (kernels.cu: k_top_k_chunks, then k_top_k_merge): its
// order, its pick encoding and how a row is split, shared by the kernels and by the CPU emulation
// test (tests/backend/topk_plan_test.cc). Plain C++; __host__ __device__ under nvcc.
//
// The order. An entry j of a row with value v is eligible when key(v) > key(-inf) (so -inf, and
// NaNs with the sign bit set, never are); eligible entries are ranked by (key desc, index asc), a
// total order. key() is order-preserving on floats (and, unlike float comparison, puts +0 above
// -0; the index scores are never -0). top-k = the min(k, eligible) first entries in that order.
//
// Two stages. Stage 1 cuts a row of `count` entries into G chunks (chunks(), chunk_lo(), chunk_hi())
// and selects each chunk's top-k under the same order (indices shifted by the chunk start, so the
// order within the chunk is the row's). Stage 2 selects the top-k of the union of the chunks'
// picks. That is the row's top-k: an entry e of the row's top-k lies in some chunk c; if it were
// not among c's top-k, c would hold k eligible entries before e, so e would have k entries before
// it in the row and not be in the row's top-k. So the union contains the row's top-k, and the
// top-k of any subset of the row containing the row's top-k is the row's top-k.
//
// Stage 2 runs the single-block selection over the candidates laid out chunk after chunk (stride
// slot_stride(k), unused slots -inf); that selection takes every entry above the k-th key and the
// first remaining ties at the k-th key in storage order. Within one chunk, the candidates holding
// any one key are in index order (a chunk stores its picks above its own k-th key in index order,
// then its ties at its k-th key in index order, so one key's candidates are all in one of those two
// runs), and chunks are stored in index order: storage order restricted to one key is index order,
// so "first ties in storage order" is "ties to the lower index" — the single-block rule.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSUF_TOPK_HD __host__ __device__ __forceinline__
#else
#define DSUF_TOPK_HD inline
#endif

namespace dsuf::topk {

// At most this many chunks per row (stage-1 blocks per row).
constexpr int kMaxGroups = 128;
// Default smallest chunk (entries); DSUF_TOPK_CHUNK overrides it. Rows shorter than two of these
// take the single-block kernel: below ~16K entries a row costs the single block ~10–20 µs, about
// what a second launch plus a second round of radix passes and barriers costs.
constexpr int64_t kDefaultChunk = 8192;
// Chunk starts are multiples of this many entries (float4 alignment is kept where the row has it).
constexpr int64_t kChunkAlign = 16;
// The workspace holds the candidates of at most this many rows at the largest group count; more
// rows in one launch take fewer groups each (launch_groups). 256 rows of one block each already
// fill 132 SMs.
constexpr int64_t kScratchRows = 256;

// Order-preserving key of a float (larger float, larger key).
DSUF_TOPK_HD uint32_t key(float f) {
#if defined(__CUDA_ARCH__)
  uint32_t u = __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
constexpr uint32_t kNegInfKey = 0x007fffffu;  // key(-inf) = ~0xff800000
DSUF_TOPK_HD bool eligible(uint32_t k) { return k > kNegInfKey; }
// A pick, (key << 32) | ~index: larger pick = earlier in (key desc, index asc). Every eligible pick
// is > 0, the padding of the sort.
DSUF_TOPK_HD uint64_t pick(uint32_t k, int64_t index) { return (uint64_t(k) << 32) | uint32_t(~uint32_t(index)); }
DSUF_TOPK_HD int32_t pick_index(uint64_t p) { return int32_t(~uint32_t(p & 0xffffffffu)); }

// One compare-exchange of the descending bitonic sort of the picks: what element j keeps at the
// stage (size, stride), given its own value and its partner's (element j ^ stride). The lower of
// the pair keeps the larger where the size-block is descending ((j & size) == 0), the smaller
// otherwise. The single-block top-k's sort (kernels.cu sort_picks_write) runs its stages in shared
// memory or, below 32 apart, by warp shuffles, each element applying this.
DSUF_TOPK_HD uint64_t bitonic_keep(uint64_t mine, uint64_t other, int64_t j, int64_t size, int64_t stride) {
  const bool desc = (j & size) == 0, lower = (j & stride) == 0;
  const uint64_t hi = mine > other ? mine : other, lo = mine > other ? other : mine;
  return desc == lower ? hi : lo;
}

// The radix digit, decided by the one bin that owns it (kernels.cu block_select, lean): bin d holds
// hist_d entries, above = Σ hist over bins ≥ d (so above − hist_d is the sum over bins > d), rem ≥ 1
// the entries still to take. The digit is the largest d ≥ 1 with above[d] ≥ rem, else 0 (what a scan
// from the top stops at); above never grows with d, so exactly one bin answers true.
DSUF_TOPK_HD bool digit_is_mine(int d, int above, int hist_d, int rem) {
  const int above_next = above - hist_d;
  return d >= 1 ? above >= rem && above_next < rem : above_next < rem;
}

// Candidate slots per chunk: k rounded up to 4 (so each chunk's run starts float4-aligned).
DSUF_TOPK_HD int64_t slot_stride(int k) { return (int64_t(k) + 3) / 4 * 4; }

DSUF_TOPK_HD int64_t isqrt(int64_t x) {
  int64_t r = int64_t(::sqrt(double(x)));
  while (r > 0 && r * r > x) --r;
  while ((r + 1) * (r + 1) <= x) ++r;
  return r;
}

// How a row of `count` entries is cut: G chunks of len entries (the last one shorter), chunk g =
// [g·len, min((g+1)·len, count)), each non-empty, len a multiple of kChunkAlign. G = 1: the row
// takes the single-block selection.
struct Chunks {
  int G;
  int64_t len;
};
// At most g_launch chunks (the launch's groups per row), each at least min_chunk and at least
// √(count·k) long: stage 1 costs ~count/G entry-visits per block, stage 2 ~G·k, and G = √(count/k)
// balances them (262,000 entries, k = 512: 22 chunks of ~11,900, 11,264 candidates).
DSUF_TOPK_HD Chunks chunks(int64_t count, int k, int g_launch, int64_t min_chunk) {
  if (g_launch < 2 || k <= 0 || count < 2 * min_chunk) return {1, count};
  const int64_t s = isqrt(count * int64_t(k));
  int64_t g = count / (s > min_chunk ? s : min_chunk);
  g = g < 1 ? 1 : g > g_launch ? g_launch : g;
  if (g < 2) return {1, count};
  // The length rounded up to kChunkAlign; that may leave the last chunks empty: drop them.
  const int64_t len = ((count + g - 1) / g + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  const int64_t G = (count + len - 1) / len;
  if (G < 2) return {1, count};
  return {int(G), len};
}
DSUF_TOPK_HD int64_t chunk_lo(const Chunks& c, int g) { return int64_t(g) * c.len; }
DSUF_TOPK_HD int64_t chunk_hi(const Chunks& c, int64_t count, int g) {
  const int64_t hi = (int64_t(g) + 1) * c.len;
  return hi < count ? hi : count;
}

// Groups per row of one launch over `rows` rows whose counts are at most max_count, with
// cap_slots candidate slots of workspace: 1 = the single-block kernel. chunks().G may exceed its
// value at max_count by one at a smaller count (the floor of count/√(count·k)), hence the + 1; a
// row wanting more than the launch has takes fewer, larger chunks (still exact, only slower).
inline int launch_groups(int64_t max_count, int rows, int k, int64_t min_chunk, int64_t cap_slots) {
  if (rows <= 0 || k <= 0) return 1;
  int64_t g = chunks(max_count, k, kMaxGroups, min_chunk).G;
  if (g < 2) return 1;
  g = g + 1 < kMaxGroups ? g + 1 : kMaxGroups;
  const int64_t fit = cap_slots / (int64_t(rows) * slot_stride(k));
  if (fit < g) g = fit;
  return g < 2 ? 1 : int(g);
}
// Candidate slots the workspace needs for launches of up to `rows` rows of at most max_count
// entries, chunks at least min_chunk long.
inline int64_t scratch_slots(int64_t rows, int64_t max_count, int k, int64_t min_chunk = kDefaultChunk) {
  const int64_t r = rows < kScratchRows ? rows : kScratchRows;
  const int g = launch_groups(max_count, 1, k, min_chunk, int64_t(1) << 62);
  return g < 2 ? 0 : r * g * slot_stride(k);
}

}  // namespace dsuf::topk
