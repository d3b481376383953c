// Token sampling on the device: core/sampling.h's definition, block-parallel, so the token is the
// CPU's (sample_token) bit for bit. Three kernels per step, for every job (a logits row that may be
// sampled; jobs with on = 0 return at once):
//   k_sample_max      block per job: the largest key and its first index (the greedy answer, and
//   the
//                     answer the later kernels overwrite when the row is not greedy);
//   k_sample_weights  (blocks × jobs): w_i = weight(x_i, m, T) into the [jobs][V] FP32 workspace,
//   so
//                     the per-row kernel never evaluates fexp;
//   k_sample_draw     block of 1024 per non-greedy job: the top-k prefix (radix select on counts),
//                     Q, the nucleus prefix (radix select on masses), M, the draw.
// Why the result is the CPU's: keys and weights are per element and computed by the same functions
// (compiled with --fmad=false); every sum is over u64 integers, so the order in which threads,
// warps and shared-memory atomics add them cannot change it; radix-select digits are chosen by the
// shared pick_digit from those exact histograms; walks in index order give each warp a contiguous
// range (warp totals, the warp where the running sum crosses, that warp's scan).
// Histograms use warp-aggregated atomics: the lanes of a warp that hit the same digit add their sum
// once (most keys of a row share their high digits, so plain atomics would serialize).
// Passes over a row (L2-resident after the head), no sort: 1 for greedy, 4 at top_p = 1 (max,
// weights, Q, the draw), 10 with top-p (+ 4 radix, the tie walk, M), 15 with top-k as well.
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.cuh"
#include "core/error.h"
#include "core/sampling.h"

namespace dsuf::cuda {
namespace {

namespace smp = dsuf::sampling;
constexpr int kT = 1024;  // threads of the per-row kernels
constexpr int kWarps = kT / 32;
constexpr unsigned kFull = 0xffffffffu;
using ull = unsigned long long;

struct BlockShared {
  uint64_t hist[256];
  uint64_t part[kWarps];
  uint64_t rem, base;
  int64_t result;
  uint32_t prefix;
  int warp;
  uint32_t best_key[kWarps];
  int64_t best_index[kWarps];
};

__device__ __forceinline__ uint64_t warp_sum_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, ull(v), o);
  return v;
}

// Σ val(i) over the row (u64), to every thread.
template <typename Val>
__device__ uint64_t block_total(int64_t V, Val val, BlockShared& s) {
  uint64_t v = 0;
  for (int64_t i = threadIdx.x; i < V; i += kT) v += val(i);
  v = warp_sum_u64(v);
  __syncthreads();  // s.part may still be read by a previous helper
  if (threadIdx.x % 32 == 0) s.part[threadIdx.x / 32] = v;
  __syncthreads();
  uint64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.part[w];
  return total;
}

// hist[digit] += v for every active lane, one atomic per distinct digit in the warp. Every lane of
// the warp calls it (active or not). The sums are split into 21-bit halves so a 32-bit warp
// reduction holds 32 of them (v < 2^42).
__device__ __forceinline__ void hist_add(uint64_t* hist, bool active, uint32_t digit, uint64_t v) {
  const unsigned act = __ballot_sync(kFull, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(act, digit);
  const unsigned lo = __reduce_add_sync(peers, unsigned(v & 0x1fffffu));
  const unsigned hi = __reduce_add_sync(peers, unsigned(v >> 21));
  if (int(threadIdx.x % 32) == __ffs(peers) - 1)
    atomicAdd(reinterpret_cast<ull*>(&hist[digit]), ull(lo) + (ull(hi) << 21));
}

// sampling::radix_select, block-parallel: the same histograms (exact), the same digit choices.
template <typename Val>
__device__ uint32_t block_radix_select(const float* x, int64_t V, uint64_t& rem, Val val,
                                       BlockShared& s) {
  __syncthreads();
  if (threadIdx.x == 0) s.rem = rem;
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kT) s.hist[d] = 0;
    __syncthreads();
    // The same trip count for every lane: hist_add needs whole warps.
    for (int64_t i0 = 0; i0 < V; i0 += kT) {
      const int64_t i = i0 + threadIdx.x;
      uint32_t digit = 0;
      uint64_t v = 0;
      if (i < V) {
        const uint32_t k = smp::key(x[i]);
        if ((k & mask) == prefix) {
          v = val(i, k);
          digit = (k >> shift) & 255u;
        }
      }
      hist_add(s.hist, v != 0, digit, v);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t r = s.rem;
      s.prefix = prefix | (smp::pick_digit(s.hist, r) << shift);
      s.rem = r;
    }
    __syncthreads();
    prefix = s.prefix;
    mask |= 255u << shift;
  }
  rem = s.rem;
  return prefix;
}

// sampling::first_reaching, block-parallel: warp w owns the contiguous range [w·per, (w+1)·per).
template <typename Val>
__device__ int64_t block_first_reaching(int64_t V, uint64_t need, Val val, BlockShared& s) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  const int64_t per = ((V + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int64_t lo = w * per, hi = lo + per < V ? lo + per : V;
  uint64_t part = 0;
  for (int64_t i = lo + l; i < hi; i += 32) part += val(i);
  part = warp_sum_u64(part);
  __syncthreads();
  if (l == 0) s.part[w] = part;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t acc = 0;
    int found = -1;
    for (int k = 0; k < kWarps; ++k) {
      if (acc + s.part[k] >= need) {
        found = k;
        break;
      }
      acc += s.part[k];
    }
    s.warp = found, s.base = acc, s.result = -1;
  }
  __syncthreads();
  if (w == s.warp) {
    uint64_t acc = s.base;
    for (int64_t i0 = lo; i0 < hi; i0 += 32) {  // uniform over the warp
      const int64_t i = i0 + l;
      uint64_t v = i < hi ? val(i) : 0;
      for (int o = 1; o < 32; o <<= 1) {  // inclusive scan over the lanes
        const uint64_t y = __shfl_up_sync(kFull, ull(v), o);
        if (l >= o) v += y;
      }
      const unsigned hit = __ballot_sync(kFull, acc + v >= need);
      if (hit) {
        if (l == __ffs(hit) - 1) s.result = i;  // the lowest lane: i < hi (a lane past hi adds 0)
        break;
      }
      acc += __shfl_sync(kFull, ull(v), 31);
    }
  }
  __syncthreads();
  return s.result;
}

__global__ void __launch_bounds__(kT)
    k_sample_max(const float* logits, int64_t V, const SampleJob* jobs, uint32_t* max_key,
                 int32_t* out) {
  __shared__ BlockShared s;
  const SampleJob job = jobs[blockIdx.x];
  if (!job.on) return;
  const float* x = logits + int64_t(job.row) * V;
  uint32_t bk = 0;
  int64_t bi = V;  // none yet
  for (int64_t i = threadIdx.x; i < V; i += kT) {
    const uint32_t k = smp::key(x[i]);
    if (k > bk || bi == V) bk = k, bi = i;
  }
  // (key desc, index asc): a total order, so every lane of the butterfly ends with the same pair.
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t ok = __shfl_xor_sync(kFull, bk, o);
    const int64_t oi = int64_t(__shfl_xor_sync(kFull, (long long)bi, o));
    if (ok > bk || (ok == bk && oi < bi)) bk = ok, bi = oi;
  }
  if (threadIdx.x % 32 == 0) s.best_key[threadIdx.x / 32] = bk, s.best_index[threadIdx.x / 32] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {
      const uint32_t ok = s.best_key[w];
      const int64_t oi = s.best_index[w];
      if (ok > bk || (ok == bk && oi < bi)) bk = ok, bi = oi;
    }
    max_key[blockIdx.x] = bk;
    out[blockIdx.x] = int32_t(bi);
  }
}

__global__ void k_sample_weights(const float* logits, int64_t V, const SampleJob* jobs,
                                 const uint32_t* max_key, float* weights) {
  const int j = blockIdx.y;
  const SampleJob job = jobs[j];
  if (!job.on || smp::is_greedy(job.params, max_key[j])) return;
  const float m = smp::key_value(max_key[j]);
  const float* x = logits + int64_t(job.row) * V;
  float* w = weights + int64_t(j) * V;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < V;
       i += int64_t(gridDim.x) * blockDim.x)
    w[i] = smp::weight(x[i], m, job.params.temperature);
}

// sampling::draw_serial, block-parallel (the same steps, the same integers).
__global__ void __launch_bounds__(kT)
    k_sample_draw(const float* logits, const float* weights, int64_t V, const SampleJob* jobs,
                  const uint32_t* max_key, int32_t* out) {
  __shared__ BlockShared s;
  const SampleJob job = jobs[blockIdx.x];
  if (!job.on || smp::is_greedy(job.params, max_key[blockIdx.x])) return;
  const SamplingParams& p = job.params;
  const float* x = logits + int64_t(job.row) * V;
  const float* w = weights + int64_t(blockIdx.x) * V;
  auto q = [&](int64_t i) { return smp::fixed_weight(w[i]); };

  smp::Prefix cand;
  if (p.top_k > 0 && p.top_k < V) {
    uint64_t rem = uint64_t(p.top_k);
    cand.key = block_radix_select(
        x, V, rem, [](int64_t, uint32_t) -> uint64_t { return 1; }, s);
    const uint32_t kk = cand.key;
    cand.last = block_first_reaching(
        V, rem, [&](int64_t i) -> uint64_t { return smp::key(x[i]) == kk ? 1 : 0; }, s);
  }
  const uint64_t total = block_total(
      V, [&](int64_t i) -> uint64_t { return cand.has(smp::key(x[i]), i) ? q(i) : 0; }, s);
  smp::Prefix nucleus = cand;
  uint64_t m = total;
  const uint32_t p30 = smp::top_p_fixed(p.top_p);
  if (p30 < smp::kTopPOne) {
    uint64_t rem = smp::nucleus_target(total, p30);
    nucleus.key = block_radix_select(
        x, V, rem, [&](int64_t i, uint32_t k) -> uint64_t { return cand.has(k, i) ? q(i) : 0; }, s);
    const uint32_t kk = nucleus.key;
    nucleus.last = block_first_reaching(
        V, rem,
        [&](int64_t i) -> uint64_t {
          const uint32_t k = smp::key(x[i]);
          return k == kk && cand.has(k, i) ? q(i) : 0;
        },
        s);
    m = block_total(
        V, [&](int64_t i) -> uint64_t { return nucleus.has(smp::key(x[i]), i) ? q(i) : 0; }, s);
  }
  const uint64_t u = smp::mulhi64(smp::random64(p.seed, job.draw), m);
  const int64_t t = block_first_reaching(
      V, u + 1, [&](int64_t i) -> uint64_t { return nucleus.has(smp::key(x[i]), i) ? q(i) : 0; },
      s);
  if (threadIdx.x == 0 && t >= 0)
    out[blockIdx.x] = int32_t(t);  // t < 0 cannot happen; the argmax stays
}

__global__ void k_sample_serial(const float* logits, int64_t V, const SampleJob* jobs,
                                float* weights, int32_t* out) {
  const SampleJob job = jobs[blockIdx.x];
  if (!job.on || threadIdx.x != 0) return;
  const float* x = logits + int64_t(job.row) * V;
  const smp::Best b = smp::best_of(x, V);
  int64_t t = b.index;
  if (!smp::is_greedy(job.params, b.key)) {
    float* w = weights + int64_t(blockIdx.x) * V;
    const float m = smp::key_value(b.key);
    for (int64_t i = 0; i < V; ++i) w[i] = smp::weight(x[i], m, job.params.temperature);
    const int64_t d = smp::draw_serial(x, w, V, job.params, job.draw);
    if (d >= 0) t = d;
  }
  out[blockIdx.x] = int32_t(t);
}

}  // namespace

void sample(const float* logits, int64_t V, const SampleJob* jobs, int n_jobs, uint32_t* max_key,
            float* weights, int32_t* out, cudaStream_t s) {
  if (n_jobs <= 0) return;
  DSUF_CHECK(V >= 1 && V <= smp::kMaxVocab, "sampling rows of ", V, " logits");
  k_sample_max<<<n_jobs, kT, 0, s>>>(logits, V, jobs, max_key, out);
  const int bx = int(std::min<int64_t>((V + 1023) / 1024, 256));
  k_sample_weights<<<dim3(bx, n_jobs), 256, 0, s>>>(logits, V, jobs, max_key, weights);
  k_sample_draw<<<n_jobs, kT, 0, s>>>(logits, weights, V, jobs, max_key, out);
}

void sample_serial(const float* logits, int64_t V, const SampleJob* jobs, int n_jobs,
                   float* weights, int32_t* out, cudaStream_t s) {
  if (n_jobs <= 0) return;
  DSUF_CHECK(V >= 1 && V <= smp::kMaxVocab, "sampling rows of ", V, " logits");
  k_sample_serial<<<n_jobs, 32, 0, s>>>(logits, V, jobs, weights, out);
}

}  // namespace dsuf::cuda
