// Straightforward kernels mirroring the CPU reference; see kernels.cuh for the contract.
#include "backend/cuda/kernels.cuh"

#include <algorithm>
#include <cfloat>
#include <thread>
#include <vector>
#include <utility>
#include <string>
#include <cstdlib>
#include <cmath>
#include <type_traits>

#include <cooperative_groups.h>

#include "backend/cuda/check.h"
#include "backend/cuda/topk_plan.h"
#include "core/detmath.h"

namespace dsuf::cuda {
namespace {


__device__ __forceinline__ float bf16r(float x) {
  // Round to nearest even BF16 (NaN kept), as core/numerics.h.
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  u += 0x7fffu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ float rb(float x, bool r) { return r ? bf16r(x) : x; }
__device__ __forceinline__ float bf16_load(const uint16_t* p, int64_t i) { return __uint_as_float(uint32_t(p[i]) << 16); }
__device__ __forceinline__ float e8m0(uint8_t v) {
  if (v == 0) return __uint_as_float(0x00400000u);  // 2^-127, a float subnormal
  return __uint_as_float(uint32_t(v) << 23);        // v = 255 gives inf (NaN in E8M0; never stored)
}
// Exact decodes by bit placement (value·2^-120 / value·2^-126 scaled back exactly): no table, so no
// serialized constant-memory reads when the lanes of a warp look up different codes.
__device__ __forceinline__ float e4m3_bits(uint32_t b) {  // b's low byte: value·2^-120
  return __uint_as_float(((b & 0x7fu) << 20) | ((b & 0x80u) << 24));
}
__device__ __forceinline__ float e2m1_bits(uint32_t n) {  // n's low nibble: value·2^-126
  return __uint_as_float(((n & 0x7u) << 22) | ((n & 0x8u) << 28));
}
__device__ __forceinline__ float e4m3_val(uint32_t b) {  // 0x7f/0xff: NaN, as the CPU's table
  return (b & 0x7fu) == 0x7fu ? __uint_as_float(0x7fc00000u) : e4m3_bits(b) * 0x1p120f;
}
__device__ __forceinline__ float e2m1_val(uint32_t n) { return e2m1_bits(n) * 0x1p126f; }
__device__ __forceinline__ float pow2_ceil(float x) {
  int e;
  float m = frexpf(x, &e);
  return m == 0.5f ? x : ldexpf(1.0f, e);
}
__device__ __forceinline__ uint8_t e8m0_code(float pow2) {
  uint32_t u = __float_as_uint(pow2);
  uint32_t exp = (u >> 23) & 0xff;
  return exp == 0 ? 0 : uint8_t(exp);  // only 2^-127 is subnormal among stored scales
}
// Saturating round-to-nearest-even E4M3 (same rule as core/numerics.cc).
__device__ uint8_t e4m3_code(float f) {
  uint32_t u = __float_as_uint(f);
  uint8_t sign = (u >> 24) & 0x80;
  float a = fabsf(f);
  if (isnan(f)) return sign | 0x7f;
  if (a >= 448.0f) return sign | 0x7e;
  int e = int((__float_as_uint(a) >> 23) & 0xff) - 127;
  if (e < -6) return sign | uint8_t(rintf(ldexpf(a, 9)));
  float r = rintf(ldexpf(a, 3 - e));
  int ce = e + 7, man = int(r) - 8;
  if (man == 8) man = 0, ++ce;
  if (ce > 15 || (ce == 15 && man == 7)) return sign | 0x7e;
  return sign | uint8_t((ce << 3) | man);
}
__device__ uint8_t e2m1_code(float f) {
  uint8_t sign = (__float_as_uint(f) >> 31) ? 8 : 0;
  float a = fabsf(f);
  const float mag[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  uint8_t code = 7;
  for (uint8_t c = 0; c < 7; ++c) {
    float mid = 0.5f * (mag[c] + mag[c + 1]);
    if (a < mid || (a == mid && (c % 2 == 0))) {
      code = c;
      break;
    }
  }
  return sign | code;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = warp_sum(v);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    float x = l < int(blockDim.x / 32) ? part[l] : 0.0f;
    x = warp_sum(x);
    if (l == 0) total = x;
  }
  __syncthreads();
  return total;
}
__device__ float block_max(float v) {
  __shared__ float part[32];
  __shared__ float total;
  v = warp_max(v);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    float x = l < int(blockDim.x / 32) ? part[l] : -INFINITY;
    x = warp_max(x);
    if (l == 0) total = x;
  }
  __syncthreads();
  return total;
}

int blocks_for(int64_t n, int per) { return int((n + per - 1) / per); }

// Programmatic dependent launch (sm_90+): a kernel launched with the attribute may start while the
// previous one finishes; everything before pdl_wait() must touch only memory no earlier kernel of
// the step writes (weights). pdl_trigger() lets the next kernel start early. Both are no-ops when
// the launch has no such dependency.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }

// ---- embedding and mHC -------------------------------------------------------------------------
__global__ void k_embed(const int32_t* tok, const uint16_t* table, int64_t D, int hc, float* X, float* pre) {
  int i = blockIdx.x;
  const uint16_t* row = table + int64_t(tok[i]) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float v = bf16_load(row, d);
    for (int k = 0; k < hc; ++k) X[(int64_t(i) * hc + k) * D + d] = v;
  }
  if (threadIdx.x < hc) pre[i * hc + threadIdx.x] = threadIdx.x == 0 ? 1.0f : 0.0f;
}

// mHC mix of one site (model-spec §3.2) in one launch: mix = (fn_m · x̄)·rsqrt(mean(x̄²)+eps) for the
// (2+hc)·hc rows m of fn, then pre, post and the Sinkhorn-normalized combination.
//
// The dot products and the sum of squares over the N = hc·D stream values keep the canonical
// block_sum<1024> order (core/detmath.h): partial t < 1024 adds f(t), f(t+1024), … in order; the 32
// partials of each "warp" v = t/32 are tree-reduced to q_v; q_0..q_31 are tree-reduced. Here one warp
// computes one q_v of one output (lane l on partial 32v + l), so a row's (M+1)·32 warp sums (M mix rows
// and the sum of squares as output M) spread over (M+1)·32 warps instead of M+1 blocks of 1024
// threads. A block is G warps with the same v and outputs m = g·G .. g·G+G−1: they share the stream
// values x[32v + l + 1024j], staged once in shared memory, and each warp holds its fn values in
// registers for the R rows of its row tile. Each warp sum goes to `part`; the last block of a row tile
// to finish (a counter per tile, reset by that block, so a captured graph can replay the launch)
// tree-reduces the 32 warp sums of every output and runs the Sinkhorn finish, a warp per row.
constexpr int kMixChunk = 24;  // chain elements held in registers per lane (N/1024 = 20 for V4.1)

// dst[k] = load(k) for k < n by the whole block, B loads in flight per thread.
template <int B, typename Load>
__device__ __forceinline__ void block_gather(float* dst, int n, Load&& load) {
  for (int k0 = 0; k0 < n; k0 += B * int(blockDim.x)) {
    float v[B];
#pragma unroll
    for (int p = 0; p < B; ++p) {
      const int k = k0 + p * int(blockDim.x) + int(threadIdx.x);
      v[p] = k < n ? load(k) : 0.0f;
    }
#pragma unroll
    for (int p = 0; p < B; ++p) {
      const int k = k0 + p * int(blockDim.x) + int(threadIdx.x);
      if (k < n) dst[k] = v[p];
    }
  }
}

// Entry idx of a per-lane matrix (entry t on lane t % 32, register t / 32), fetched by every lane.
template <int E>
__device__ __forceinline__ float lane_entry(const float (&v)[E], int idx) {
  float r = __shfl_sync(0xffffffffu, v[0], idx & 31);
#pragma unroll
  for (int e = 1; e < E; ++e) {
    const float o = __shfl_sync(0xffffffffu, v[e], idx & 31);
    if ((idx >> 5) == e) r = o;
  }
  return r;
}

// The mix of one row from its reduced sums (dots[0..M), dots[M] the sum of squares), by one whole
// warp: lane t holds combination entry t (and t + 32 for hc > 5). Every row or column sum adds the
// entries in index order, gathered by shuffles, so each value is computed with the reference's
// operations in the reference's order (cpu_backend.cc hc_mix); no shared memory, no block barrier.
template <int HC>
__device__ void hc_mix_finish_warp(const float* dots, int64_t N, float norm_eps, const float* __restrict__ base,
                                   const float* __restrict__ scale, int iters, float hc_eps, float* __restrict__ o) {
  constexpr int NN = HC * HC, E = (NN + 31) / 32;
  const int lane = threadIdx.x % 32;
  const float rinv = 1.0f / sqrtf(dots[(2 + HC) * HC] / float(N) + norm_eps);
  if (lane < HC) {
    const float mp = dots[lane] * rinv, mq = dots[HC + lane] * rinv;
    o[lane] = det::sigmoid(mp * scale[0] + base[lane]) + hc_eps;
    o[HC + lane] = 2.0f * det::sigmoid(mq * scale[1] + base[HC + lane]);
  }
  float c[E], v[E], s[E];
  int row[E], col[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int t = lane + 32 * e;
    row[e] = t / HC, col[e] = t % HC;
    c[e] = 0.0f;
    if (t < NN) {
      const float mc = dots[2 * HC + t] * rinv;
      c[e] = mc * scale[2] + base[2 * HC + t];
    }
  }
  // Row softmax, then + eps.
#pragma unroll
  for (int e = 0; e < E; ++e) {
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < HC; ++k) mx = fmaxf(mx, lane_entry(c, row[e] * HC + k));
    v[e] = det::fexp(c[e] - mx);
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    s[e] = 0.0f;
#pragma unroll
    for (int k = 0; k < HC; ++k) s[e] += lane_entry(v, row[e] * HC + k);
  }
#pragma unroll
  for (int e = 0; e < E; ++e) c[e] = v[e] / s[e] + hc_eps;
  // Sinkhorn: column normalization, then iters − 1 times rows and columns (the reference's order).
  auto col_norm = [&] {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      s[e] = 0.0f;
#pragma unroll
      for (int j = 0; j < HC; ++j) s[e] += lane_entry(c, j * HC + col[e]);
    }
#pragma unroll
    for (int e = 0; e < E; ++e) c[e] = c[e] / (s[e] + hc_eps);
  };
  auto row_norm = [&] {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      s[e] = 0.0f;
#pragma unroll
      for (int k = 0; k < HC; ++k) s[e] += lane_entry(c, row[e] * HC + k);
    }
#pragma unroll
    for (int e = 0; e < E; ++e) c[e] = c[e] / (s[e] + hc_eps);
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (lane + 32 * e < NN) o[2 * HC + lane + 32 * e] = c[e];
}

// Grid (32·groups, row tiles of R rows), G = blockDim.x/32 warps; dynamic shared memory
// max(R·J, R·T)·32 + R·T floats (J = ⌈N/1024⌉, T = M + 1).
template <int HC>
__global__ void __launch_bounds__(256) k_hc_mix(const float* __restrict__ fn, const float* __restrict__ X, int n,
                                                int64_t N, int R, float norm_eps, const float* __restrict__ base,
                                                const float* __restrict__ scale, int iters, float hc_eps,
                                                float* __restrict__ out, float* __restrict__ part,
                                                unsigned* __restrict__ count) {
  constexpr int M = (2 + HC) * HC, T = M + 1;
  extern __shared__ float sm[];
  __shared__ bool last;
  const int G = blockDim.x / 32, groups = (T + G - 1) / G;
  const int v = blockIdx.x / groups, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m = (blockIdx.x % groups) * G + warp;  // ≥ T: an idle warp of the last group
  const int row0 = blockIdx.y * R, rows = min(R, n - row0);
  const int J = int((N + 1023) / 1024);
  const int64_t t = 32 * v + lane;
  const bool in_regs = J <= kMixChunk;
  // This warp's fn values first: their latency (DRAM) overlaps the staging of the stream values (L2).
  float f[kMixChunk];
#pragma unroll
  for (int j = 0; j < kMixChunk; ++j) {
    const int64_t idx = t + 1024 * int64_t(j);
    f[j] = in_regs && m < M && j < J && idx < N ? __ldg(fn + int64_t(m) * N + idx) : 0.0f;
  }
  float* xs = sm;  // [R][J][32]: x[32v + l + 1024j] at (r·J + j)·32 + l
  block_gather<4>(xs, rows * J * 32, [&](int k) {  // one batch for J·32 = 640 values, 160 threads
    const int r = k / (J * 32), j = (k / 32) % J;
    const int64_t idx = 32 * v + k % 32 + 1024 * int64_t(j);
    return idx < N ? X[int64_t(row0 + r) * N + idx] : 0.0f;
  });
  __syncthreads();
  if (m < T) {
    for (int r = 0; r < rows; ++r) {
      const float* x = xs + r * J * 32 + lane;
      float acc = 0.0f;
      if (in_regs) {
#pragma unroll
        for (int j = 0; j < kMixChunk; ++j)
          if (j < J && t + 1024 * int64_t(j) < N) acc += (m < M ? f[j] : x[32 * j]) * x[32 * j];
      } else {
        for (int j = 0; j < J; ++j) {
          const int64_t idx = t + 1024 * int64_t(j);
          if (idx < N) acc += (m < M ? __ldg(fn + int64_t(m) * N + idx) : x[32 * j]) * x[32 * j];
        }
      }
      acc = warp_sum(acc);
      if (lane == 0) part[(int64_t(row0 + r) * T + m) * 32 + v] = acc;
    }
  }
  // Hand-off: every block publishes its warp sums, then counts itself in; the last one reduces.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned done = atomicAdd(count + blockIdx.y, 1u);
    last = done == gridDim.x - 1;
    if (last) count[blockIdx.y] = 0;  // every other block of the tile has counted itself in
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The tile's warp sums into shared memory (over the staged values, no longer read), then a warp
  // per (row, output) tree-reduces its 32.
  float* ps = sm;                                // [rows][T][32]
  float* dots = sm + max(R * J, R * T) * 32;     // [rows][T]
  const float* tile_part = part + int64_t(row0) * T * 32;
  block_gather<8>(ps, rows * T * 32, [&](int k) { return __ldcg(tile_part + k); });
  __syncthreads();
  for (int k = warp; k < rows * T; k += G) {
    const float sum = warp_sum(ps[k * 32 + lane]);  // tree32 over the 32 warp sums
    if (lane == 0) dots[k] = sum;
  }
  __syncthreads();
  for (int r = warp; r < rows; r += G)
    hc_mix_finish_warp<HC>(dots + r * T, N, norm_eps, base, scale, iters, hc_eps,
                           out + int64_t(row0 + r) * hc_mix_stride(HC));
}

__global__ void k_hc_collapse(const float* __restrict__ pre, int pre_stride, const float* __restrict__ X, int hc,
                              int64_t D, float* __restrict__ u, bool r) {
  int i = blockIdx.y;
  int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= D) return;
  float acc = 0.0f;
  for (int k = 0; k < hc; ++k) acc += pre[int64_t(i) * pre_stride + k] * X[(int64_t(i) * hc + k) * D + d];
  u[int64_t(i) * D + d] = rb(acc, r);
}

// Collapse + RMSNorm of one row (optionally expanding the previous site first), spread over a
// cluster of 8 blocks. The norm's sum of squares keeps the canonical block_sum<256> order: partial
// t < 256 adds u[t]², u[t+256]², … in order, each warp v = t/32 of the 8 tree-reduces its 32 partials,
// and the 8 warp sums, padded with zeros to 32, are tree-reduced. Block c of a row's cluster owns
// warp v = c's values u[32c + l + 256j]: it computes them (expanding and collapsing the hc streams at
// those positions, each thread a position at a time, so the in-place expansion never races), its
// warp 0 adds the 32 partials in order, and every block reads all 8 warp sums from the cluster's
// shared memory, so each normalizes its values with the same bits.
//   expansion (emix set): X_k ← bf16(post_k·y_in + Σ_j C[j][k]·X_j) with emix's post and C;
//   collapse: u = bf16(Σ_k pre_k·X_k); output bf16(w ⊙ u·rsqrt(mean(u²)+eps)).
constexpr int kNormCluster = 8;  // the warps of block_sum<256>
constexpr int kNormPerThread = 4;  // positions per thread per pass (one pass for D ≤ 8192)

template <int HC>
__global__ void __launch_bounds__(256) k_collapse_norm(const float* __restrict__ pre, int pre_stride,
                                                       const float* __restrict__ emix, int emix_stride,
                                                       const float* __restrict__ y_in, float* __restrict__ X,
                                                       int64_t D, const uint16_t* __restrict__ w, float eps,
                                                       float* __restrict__ y, bool r) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ float us[];  // [32·J]: u[32c + l + 256j] at 32j + l
  __shared__ float q;
  const int c = int(cluster.block_rank()), i = blockIdx.y, lane = threadIdx.x % 32;
  const int J = int((D + 255) / 256), E = 32 * J;
  constexpr int kPass = kNormPerThread * 256;
  auto pos = [&](int e) { return int64_t(32 * c + e % 32) + 256 * int64_t(e / 32); };
  // The norm weights of the first pass now: their latency overlaps everything before the output.
  float wv[kNormPerThread];
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int e = threadIdx.x + 256 * k;
    wv[k] = w && e < E && pos(e) < D ? bf16_load(w, pos(e)) : 1.0f;
  }
  float pr[HC], post[HC], C[HC * HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) pr[k] = pre[int64_t(i) * pre_stride + k];
  if (emix) {
    const float* m = emix + int64_t(i) * emix_stride;
#pragma unroll
    for (int k = 0; k < HC; ++k) post[k] = m[HC + k];
#pragma unroll
    for (int k = 0; k < HC * HC; ++k) C[k] = m[2 * HC + k];
  }
  float* x = X + int64_t(i) * HC * D;
  for (int e0 = 0; e0 < E; e0 += kPass) {
    float xv[kNormPerThread][HC], yv[kNormPerThread];
#pragma unroll
    for (int p = 0; p < kNormPerThread; ++p) {  // all loads of the pass first
      const int e = e0 + threadIdx.x + 256 * p;
      const bool ok = e < E && pos(e) < D;
#pragma unroll
      for (int k = 0; k < HC; ++k) xv[p][k] = ok ? x[int64_t(k) * D + pos(e)] : 0.0f;
      yv[p] = ok && emix ? y_in[int64_t(i) * D + pos(e)] : 0.0f;
    }
#pragma unroll
    for (int p = 0; p < kNormPerThread; ++p) {
      const int e = e0 + threadIdx.x + 256 * p;
      if (e >= E) continue;
      float u = 0.0f;
      if (pos(e) < D) {
        if (emix) {
          float nv[HC];
#pragma unroll
          for (int k = 0; k < HC; ++k) {
            float acc = post[k] * yv[p];
#pragma unroll
            for (int j = 0; j < HC; ++j) acc += C[j * HC + k] * xv[p][j];
            nv[k] = rb(acc, r);
          }
#pragma unroll
          for (int k = 0; k < HC; ++k) {
            xv[p][k] = nv[k];
            x[int64_t(k) * D + pos(e)] = nv[k];
          }
        }
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < HC; ++k) acc += pr[k] * xv[p][k];
        u = rb(acc, r);
      }
      us[e] = u;
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = 0.0f;
    for (int j = 0; j < J; ++j)
      if (pos(32 * j + lane) < D) s += us[32 * j + lane] * us[32 * j + lane];
    s = warp_sum(s);
    if (lane == 0) q = s;
  }
  cluster.sync();  // every block's warp sum written and visible
  float ss = lane < kNormCluster ? *cluster.map_shared_rank(&q, lane) : 0.0f;
  ss = warp_sum(ss);
  const float rinv = 1.0f / sqrtf(ss / float(D) + eps);
  for (int e0 = 0; e0 < E; e0 += kPass) {
#pragma unroll
    for (int p = 0; p < kNormPerThread; ++p) {
      const int e = e0 + threadIdx.x + 256 * p;
      if (e >= E || pos(e) >= D) continue;
      const float wgt = e0 == 0 ? wv[p] : w ? bf16_load(w, pos(e)) : 1.0f;
      y[int64_t(i) * D + pos(e)] = rb(wgt * (us[e] * rinv), r);
    }
  }
  cluster.sync();  // no block leaves while another may still read its q
}

// RMSNorm, a 256-thread block per row of job blockIdx.y (one launch normalizes the rows of one or two
// (x, dim, w, y) jobs): thread t takes x[t + 256k] — the canonical block_sum<256> partials — and keeps
// its first kRmsRegs values and weights in registers, so the output needs no second read. y may
// equal x (a thread rewrites only what it read).
constexpr int kRmsRegs = 4;
__global__ void __launch_bounds__(256) k_rmsnorm(RmsJob a, RmsJob b, float eps, bool r) {
  const RmsJob jb = blockIdx.y == 0 ? a : b;
  const int64_t dim = jb.dim;
  const float* xr = jb.x + int64_t(blockIdx.x) * dim;
  float* yr = jb.y + int64_t(blockIdx.x) * dim;
  float xv[kRmsRegs], wv[kRmsRegs];
#pragma unroll
  for (int p = 0; p < kRmsRegs; ++p) {
    const int64_t j = threadIdx.x + 256 * p;
    xv[p] = j < dim ? xr[j] : 0.0f;
    wv[p] = jb.w && j < dim ? bf16_load(jb.w, j) : 1.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < kRmsRegs; ++p)
    if (threadIdx.x + 256 * p < dim) ss += xv[p] * xv[p];
  for (int64_t j = threadIdx.x + 256 * kRmsRegs; j < dim; j += 256) ss += xr[j] * xr[j];
  ss = block_sum(ss);
  const float rinv = 1.0f / sqrtf(ss / float(dim) + eps);
#pragma unroll
  for (int p = 0; p < kRmsRegs; ++p)
    if (threadIdx.x + 256 * p < dim) yr[threadIdx.x + 256 * p] = rb(wv[p] * (xv[p] * rinv), r);
  for (int64_t j = threadIdx.x + 256 * kRmsRegs; j < dim; j += 256)
    yr[j] = rb((jb.w ? bf16_load(jb.w, j) : 1.0f) * (xr[j] * rinv), r);
}

// ---- quantization and linears ------------------------------------------------------------------
// The per-32 quantizers run one warp per block, lane k on element k (the max is order-free).
__device__ __forceinline__ float fp8_block_scale(float v) {
  return pow2_ceil(fmaxf(warp_max(fabsf(v)), 1e-4f) / 448.0f);
}
__device__ __forceinline__ uint8_t fp8_code(float v, float s) { return e4m3_code(fminf(fmaxf(v / s, -448.0f), 448.0f)); }

// ---- FP8 / FP4 matrix-vector products ------------------------------------------------------------
// The canonical order (core/detmath.h lane_sum): lane l of a warp owns the K-blocks kb ≡ l (mod 32) in
// ascending order; a block's 32 products are summed sequentially from 0, scaled by s_act·s_w and added
// to the lane's sum; the 32 lane sums are then reduced by tree32 (= the xor butterfly of warp_sum).
// Nothing here depends on which thread runs which lane, so a warp serves several outputs and several
// rows at once while every (row, output) keeps exactly that order.
//
// Weights are decoded by placing their bits into an FP32 (no table: a table lookup with 32 different
// addresses per warp serializes), giving value·2^-120 for E4M3 and value·2^-126 for E2M1 — both exact,
// subnormal or not. On the quantized path (kExact: the inputs are E4M3 values) a product of two such
// values is exact in FP32, so fma(x, w, part) rounds exactly as part + x·w; the inputs are stored as
// x·2^64 (quantize_act), so the partial is the reference's times 2^-56 (E4M3) or 2^-62 (E2M1) with no
// rounding difference: every nonzero product is at least 2^-18 (2^-10) before scaling, far above
// FP32's smallest normal after it. It is scaled back exactly before the block scale. On the general
// path (inputs any FP32) the weight is scaled back first and the product rounded separately, as the
// reference does.
constexpr float kXStage = 0x1p64f;  // quantized inputs stored as x·2^64

// The linears read their inputs in an interleaved layout (per row and group of K inputs): K-block
// kb's float4 j sits at float4 xpos4(kb, j), so that the 32 lanes of a warp (K-blocks ≡ lane mod 32)
// read 512 contiguous bytes per load. In the plain layout each lane's 16 bytes came from a different
// 128-byte line: 32 L1 wavefronts per load, which capped the linears near 1 TB/s.
__device__ __forceinline__ int64_t xpos4(int kb, int j) { return (int64_t(kb >> 5) * 8 + j) * 32 + (kb & 31); }

// Lays out rows × groups × K inputs (stride x_stride) for the linears, with the reference's per-32
// FP8 activation quantization on the way when quantize (E4M3 values stored times 2^64, scales to
// xs): once per input row, for every linear that reads it. A warp per 32-block.
__global__ void k_linear_input(const float* __restrict__ x, int64_t x_stride, int64_t K, int groups, bool quantize,
                               float* __restrict__ xq, float* __restrict__ xs) {
  const int nb = int(K / 32), gb = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (gb >= groups * nb) return;
  const int g = gb / nb, kb = gb % nb;
  const int64_t row = blockIdx.y, kp = interleaved_k(K);
  const float v = x[row * x_stride + int64_t(g) * K + kb * 32 + lane];
  float q = v;
  if (quantize) {
    const float sc = fp8_block_scale(v);
    q = e4m3_val(fp8_code(v, sc)) * kXStage;
    if (lane == 0) xs[row * groups * nb + gb] = sc;
  }
  xq[row * groups * kp + g * kp + xpos4(kb, lane / 4) * 4 + lane % 4] = q;
}

__device__ __forceinline__ uint32_t word_of(const uint4 (&w)[2], int i) {
  const uint4& q = w[i / 4];
  return (i % 4 == 0) ? q.x : (i % 4 == 1) ? q.y : (i % 4 == 2) ? q.z : q.w;
}

// One product step on either path: part + x·w with the reference's rounding.
template <bool kExact>
__device__ __forceinline__ float mac(float part, float x, float wbits, float wscale) {
  if (kExact) return fmaf(x, wbits, part);
  return __fadd_rn(part, __fmul_rn(x, __fmul_rn(wbits, wscale)));
}

// How a GEMV lane gets its weights (docs/perf.md measures them; DSUF_GEMV picks one):
//   kRegs      it loads a K-block's weights into registers, then uses them;
//   kRegsPipe  the same, with the next K-block's load issued before the current one's arithmetic
//              (twice the bytes in flight, more registers). The default.
// The inputs are read straight from global memory (the rows are small and every warp of the block
// reads the same ones, so they come from L1): no shared-memory staging, no barrier, no prologue.
//   kDeep      all of a lane's K-blocks up to kDeepBytes per output-row set loaded at once (one round
//              trip for the small linears, whose lanes have only a few K-blocks each), then used
//              in order.
enum GemvMode { kRegs = 0, kRegsPipe = 1, kDeep = 2 };
// K-blocks a lane loads at once in kDeep: 256 bytes of weights per lane.
template <int BytesPerKb>
constexpr int deep_u() { return 256 / BytesPerKb > 8 ? 8 : 256 / BytesPerKb; }

// K-block kb of an interleaved input row as 8 float4 (the quantized ones are x·2^64).
__device__ __forceinline__ void load_x(const float* __restrict__ xr, int kb, float4 (&xv)[8]) {
  const float4* p = reinterpret_cast<const float4*>(xr);
#pragma unroll
  for (int j = 0; j < 8; ++j) xv[j] = __ldg(p + xpos4(kb, j));
}

// One lane's K-block kb for OPW outputs (weights w, scales sw) and nr ≤ R rows of inputs.
template <int OPW, int R, bool kExact>
__device__ __forceinline__ void fp8_kb_mac(const uint4 (&w)[OPW][2], const float (&sw)[OPW], const float* x,
                                           int64_t x_stride, const float* xs, int64_t xs_stride, int kb, int nr,
                                           float (&acc)[OPW][R]) {
  const float wscale = 0x1p120f, back = 0x1p56f;
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    if (rr >= nr) break;
    float4 xv[8];
    load_x(x + rr * x_stride, kb, xv);
    float part[OPW];
#pragma unroll
    for (int o = 0; o < OPW; ++o) part[o] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int o = 0; o < OPW; ++o) {
        const uint32_t t = word_of(w[o], j);
        part[o] = mac<kExact>(part[o], xv[j].x, e4m3_bits(t), wscale);
        part[o] = mac<kExact>(part[o], xv[j].y, e4m3_bits(t >> 8), wscale);
        part[o] = mac<kExact>(part[o], xv[j].z, e4m3_bits(t >> 16), wscale);
        part[o] = mac<kExact>(part[o], xv[j].w, e4m3_bits(t >> 24), wscale);
      }
    }
    const float s_a = kExact ? __ldg(xs + rr * xs_stride + kb) : 1.0f;
#pragma unroll
    for (int o = 0; o < OPW; ++o) acc[o][rr] += (kExact ? part[o] * back : part[o]) * (s_a * sw[o]);
  }
}

template <int OPW, bool kExact>
__device__ __forceinline__ void fp4_kb_mac(const uint4 (&w)[OPW], const float (&sw)[OPW], const float* x,
                                           const float* xs, int kb, float (&acc)[OPW]) {
  const float wscale = 0x1p126f, back = 0x1p62f;
  float4 xv[8];
  load_x(x, kb, xv);
  float part[OPW];
#pragma unroll
  for (int o = 0; o < OPW; ++o) part[o] = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      const uint4& q = w[o];
      const uint32_t t = (j / 2 == 0 ? q.x : j / 2 == 1 ? q.y : j / 2 == 2 ? q.z : q.w) >> (16 * (j % 2));
      part[o] = mac<kExact>(part[o], xv[j].x, e2m1_bits(t), wscale);
      part[o] = mac<kExact>(part[o], xv[j].y, e2m1_bits(t >> 4), wscale);
      part[o] = mac<kExact>(part[o], xv[j].z, e2m1_bits(t >> 8), wscale);
      part[o] = mac<kExact>(part[o], xv[j].w, e2m1_bits(t >> 12), wscale);
    }
  }
  const float s_a = kExact ? __ldg(xs + kb) : 1.0f;
#pragma unroll
  for (int o = 0; o < OPW; ++o) acc[o] += (kExact ? part[o] * back : part[o]) * (s_a * sw[o]);
}

// Block of 8 warps; warp w takes outputs o0..o0+OPW-1 and the block's R rows (grid.y: row groups).
// grid.z: independent groups (the grouped o-projection): group g uses weight rows g·out.., inputs
// g·K.. of each row (at x_group in the interleaved row, scales g·K/32..) and outputs g·out.. ; or,
// with pair.W set, z = 1 is a second linear of the same inputs (its own weights, outputs, y).
template <int OPW, int R, bool kExact, int kMode>
__global__ void __launch_bounds__(256) k_fp8_gemv(const uint8_t* __restrict__ W, const uint8_t* __restrict__ Ws,
                                                   int64_t out, int64_t K, const float* __restrict__ x,
                                                   int64_t x_stride, int64_t x_group, const float* __restrict__ xs,
                                                   int64_t xs_stride, int rows, float* __restrict__ y,
                                                   int64_t y_stride, bool r, Fp8Pair pair) {
  const int nb = int(K / 32);
  const int g = blockIdx.z;
  if (!pair.W) {
    W += int64_t(g) * out * K, Ws += int64_t(g) * (out / 32) * nb, x += int64_t(g) * x_group, xs += int64_t(g) * nb;
    y += int64_t(g) * out;
  } else if (g == 1) {
    W = pair.W, Ws = pair.Ws, out = pair.out, y = pair.y, y_stride = pair.y_stride;
  }
  const int row0 = blockIdx.y * R, nr = min(R, rows - row0);
  x += int64_t(row0) * x_stride, xs += int64_t(row0) * xs_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = (int64_t(blockIdx.x) * 8 + warp) * OPW;
  pdl_trigger();
  if (o0 >= out) return;
  auto clamp = [&](int o) { return o0 + o < out ? o0 + o : out - 1; };  // a tail repeats the last row
  uint4 w[OPW][2], wn[OPW][2];
  float sw[OPW];
  auto load = [&](int kb) {
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      const uint8_t* wr = W + clamp(o) * K + int64_t(kb) * 32;
      wn[o][0] = __ldg(reinterpret_cast<const uint4*>(wr));
      wn[o][1] = __ldg(reinterpret_cast<const uint4*>(wr + 16));
    }
  };
  if (kMode == kRegsPipe && lane < nb) load(lane);  // weights only: before the wait
  pdl_wait();
  float acc[OPW][R];
#pragma unroll
  for (int o = 0; o < OPW; ++o)
#pragma unroll
    for (int rr = 0; rr < R; ++rr) acc[o][rr] = 0.0f;
  if (kMode == kDeep) {
    constexpr int U = deep_u<32 * OPW>();
    for (int kb0 = lane; kb0 < nb; kb0 += 32 * U) {
      uint4 wu[U][OPW][2];
      float su[U][OPW];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kb = kb0 + 32 * u;
        if (kb >= nb) break;
#pragma unroll
        for (int o = 0; o < OPW; ++o) {
          const uint8_t* wr = W + clamp(o) * K + int64_t(kb) * 32;
          wu[u][o][0] = __ldg(reinterpret_cast<const uint4*>(wr));
          wu[u][o][1] = __ldg(reinterpret_cast<const uint4*>(wr + 16));
          su[u][o] = e8m0(__ldg(Ws + (clamp(o) / 32) * nb + kb));
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kb = kb0 + 32 * u;
        if (kb >= nb) break;
        fp8_kb_mac<OPW, R, kExact>(wu[u], su[u], x, x_stride, xs, xs_stride, kb, nr, acc);
      }
    }
  } else {
    for (int kb = lane; kb < nb; kb += 32) {
      if (kMode == kRegs) load(kb);
#pragma unroll
      for (int o = 0; o < OPW; ++o) w[o][0] = wn[o][0], w[o][1] = wn[o][1];
      if (kMode == kRegsPipe && kb + 32 < nb) load(kb + 32);
#pragma unroll
      for (int o = 0; o < OPW; ++o) sw[o] = e8m0(__ldg(Ws + (clamp(o) / 32) * nb + kb));
      fp8_kb_mac<OPW, R, kExact>(w, sw, x, x_stride, xs, xs_stride, kb, nr, acc);
    }
  }
#pragma unroll
  for (int o = 0; o < OPW; ++o)
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const float v = warp_sum(acc[o][rr]);
      if (lane == 0 && rr < nr && o0 + o < out) y[int64_t(row0 + rr) * y_stride + o0 + o] = rb(v, r);
    }
}

// Grouped FP4 (experts): grid.y = rows; row i uses expert ids[i] and input row i / x_div; grid.z = 2
// for a pair (pair: the second weights and outputs). Each packed byte holds two inputs' weights, low
// nibble first; they are added one after the other.
template <int OPW, bool kExact, int kMode>
__global__ void __launch_bounds__(256) k_fp4_gemv(const uint8_t* const* W, const uint8_t* const* Ws,
                                                   const int32_t* ids, int64_t out, int64_t K, const float* x,
                                                   int64_t x_stride, const float* xs, int64_t xs_stride, int x_div,
                                                   float* y, bool r, Fp4Pair pair) {
  const int nb = int(K / 32);
  const int row = blockIdx.y;
  if (blockIdx.z == 1) W = pair.W, Ws = pair.Ws, y = pair.y;  // the second linear of a pair
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = (int64_t(blockIdx.x) * 8 + warp) * OPW;
  const int64_t row_bytes = K / 2;
  pdl_trigger();
  if (o0 >= out) return;
  pdl_wait();  // the expert ids come from this step's router
  const int e = ids ? ids[row] : 0;
  const uint8_t* We = W[e];
  const uint8_t* Se = Ws[e];
  x += int64_t(row / x_div) * x_stride, xs += int64_t(row / x_div) * xs_stride;
  auto clamp = [&](int o) { return o0 + o < out ? o0 + o : out - 1; };
  float acc[OPW];
#pragma unroll
  for (int o = 0; o < OPW; ++o) acc[o] = 0.0f;
  uint4 w[OPW], wn[OPW];
  float sw[OPW];
  auto load = [&](int kb) {
#pragma unroll
    for (int o = 0; o < OPW; ++o)
      wn[o] = __ldg(reinterpret_cast<const uint4*>(We + clamp(o) * row_bytes + int64_t(kb) * 16));
  };
  if (kMode == kRegsPipe && lane < nb) load(lane);
  if (kMode == kDeep) {
    constexpr int U = deep_u<16 * OPW>();
    for (int kb0 = lane; kb0 < nb; kb0 += 32 * U) {
      uint4 wu[U][OPW];
      float su[U][OPW];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kb = kb0 + 32 * u;
        if (kb >= nb) break;
#pragma unroll
        for (int o = 0; o < OPW; ++o) {
          wu[u][o] = __ldg(reinterpret_cast<const uint4*>(We + clamp(o) * row_bytes + int64_t(kb) * 16));
          su[u][o] = e8m0(__ldg(Se + clamp(o) * nb + kb));
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kb = kb0 + 32 * u;
        if (kb >= nb) break;
        fp4_kb_mac<OPW, kExact>(wu[u], su[u], x, xs, kb, acc);
      }
    }
  } else {
    for (int kb = lane; kb < nb; kb += 32) {
      if (kMode == kRegs) load(kb);
#pragma unroll
      for (int o = 0; o < OPW; ++o) w[o] = wn[o];
      if (kMode == kRegsPipe && kb + 32 < nb) load(kb + 32);
#pragma unroll
      for (int o = 0; o < OPW; ++o) sw[o] = e8m0(__ldg(Se + clamp(o) * nb + kb));
      fp4_kb_mac<OPW, kExact>(w, sw, x, xs, kb, acc);
    }
  }
#pragma unroll
  for (int o = 0; o < OPW; ++o) {
    const float v = warp_sum(acc[o]);
    if (lane == 0 && o0 + o < out) y[int64_t(row) * out + o0 + o] = rb(v, r);
  }
}

// One warp per output; lane l takes 8-element chunks l, l+32, … (chunk_lane_sum<8>): one 16-byte
// weight load and two float4 input loads per chunk when K and the strides allow, else scalars in
// the same order.
__global__ void k_bf16_linear(const uint16_t* __restrict__ W, int64_t out, int64_t K, const float* __restrict__ x,
                              int64_t x_stride, float* __restrict__ y, int64_t y_stride, bool r) {
  const int64_t o = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int row = blockIdx.y, lane = threadIdx.x % 32;
  if (o >= out) return;
  const uint16_t* wr = W + o * K;
  const float* xr = x + int64_t(row) * x_stride;
  float acc = 0.0f;
  const bool vec = K % 8 == 0 && x_stride % 4 == 0 && (reinterpret_cast<uintptr_t>(W) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  if (vec) {
#pragma unroll 4
    for (int64_t c = lane; c * 8 < K; c += 32) {
      const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wr + c * 8));
      const float4 x0 = *reinterpret_cast<const float4*>(xr + c * 8);
      const float4 x1 = *reinterpret_cast<const float4*>(xr + c * 8 + 4);
      acc += __uint_as_float(wv.x << 16) * x0.x;
      acc += __uint_as_float(wv.x & 0xffff0000u) * x0.y;
      acc += __uint_as_float(wv.y << 16) * x0.z;
      acc += __uint_as_float(wv.y & 0xffff0000u) * x0.w;
      acc += __uint_as_float(wv.z << 16) * x1.x;
      acc += __uint_as_float(wv.z & 0xffff0000u) * x1.y;
      acc += __uint_as_float(wv.w << 16) * x1.z;
      acc += __uint_as_float(wv.w & 0xffff0000u) * x1.w;
    }
  } else {
    for (int64_t c = lane; c * 8 < K; c += 32)
      for (int64_t k = c * 8; k < c * 8 + 8 && k < K; ++k) acc += bf16_load(wr, k) * xr[k];
  }
  acc = warp_sum(acc);
  if (lane == 0) y[int64_t(row) * y_stride + o] = rb(acc, r);
}

// ---- RoPE and KV packing -----------------------------------------------------------------------
__global__ void k_rope(float* x, int64_t rows, int heads, int64_t dim, const float* cs, int half, float sign,
                       bool r) {
  int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * heads * half) return;
  const int i = int(t % half);
  const int64_t rh = t / half;  // row·heads + head
  const int64_t row = rh / heads;
  float* v = x + rh * dim + dim - 2 * half;
  const float c = cs[(row * half + i) * 2], s = sign * cs[(row * half + i) * 2 + 1];
  const float a = v[2 * i], b = v[2 * i + 1];
  v[2 * i] = rb(a * c - b * s, r);
  v[2 * i + 1] = rb(a * s + b * c, r);
}

__global__ void k_fp8_fake_quant(float* x, int64_t blocks, bool r) {
  const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (b >= blocks) return;
  float* p = x + b * 32 + threadIdx.x % 32;
  const float v = *p, s = fp8_block_scale(v);
  *p = rb(e4m3_val(fp8_code(v, s)) * s, r);
}

__device__ __forceinline__ uint8_t* ring_of(const SeqMeta& sq, int layer, int W, int64_t hd) {
  return sq.window + (int64_t(layer) * W) * (hd + hd / 32);
}

__global__ void k_pack_window(const float* kv, int rows, const RowMeta* meta, const SeqMeta* seqs, int layer,
                              int64_t hd, int W) {
  const int64_t nb = hd / 32;
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // one warp per 32-block
  const int k = threadIdx.x % 32;
  if (t >= int64_t(rows) * nb) return;
  const int i = int(t / nb);
  const int64_t b = t % nb;
  const RowMeta m = meta[i];
  if (!m.write) return;
  const float v = kv[int64_t(i) * hd + b * 32 + k];
  uint8_t* e = ring_of(seqs[m.seq], layer, W, hd) + (m.pos % W) * (hd + nb);
  const float s = fp8_block_scale(v);
  e[b * 32 + k] = fp8_code(v, s);
  if (k == 0) e[hd + b] = e8m0_code(s);
}

// ---- attention ---------------------------------------------------------------------------------
__device__ __forceinline__ float ckv_elem(const uint8_t* entry, int64_t hd, int64_t d) {
  uint8_t b = entry[d >> 1];
  float v = e2m1_val((d & 1) ? (b >> 4) : (b & 0xf));
  return v * e4m3_val(entry[hd / 2 + d / 16]);
}

// The keys a row attends (window ∪ selected compressed entries), decoded once into FP32 for all
// heads: [rows][kmax][hd]. Window keys before the sequence's first row in this step come from its
// ring (packed), later ones from this step's rows.
__global__ void k_gather_keys(AttentionArgs a) {
  const int i = blockIdx.x, j = blockIdx.y;
  const RowMeta m = a.meta[i];
  const SeqMeta& sq = a.seqs[m.seq];
  const int64_t pos = m.pos, hd = a.hd;
  const int64_t w0 = pos - a.W + 1 > 0 ? pos - a.W + 1 : 0;
  const int n_win = int(pos - w0 + 1);
  float* dst = a.keys + (int64_t(i) * a.kmax + j) * hd;
  if (j < n_win) {
    const int64_t sp = w0 + j;
    if (sp >= sq.P) {
      for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = a.kv_chunk[(sq.row0 + sp - sq.P) * hd + d];
    } else {
      const uint8_t* e = ring_of(sq, a.layer, a.W, hd) + (sp % a.W) * (hd + hd / 32);
      for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = e4m3_val(e[d]) * e8m0(e[hd + d / 32]);
    }
    return;
  }
  if (!a.sel || j - n_win >= a.sel_stride) return;
  const int32_t e = a.sel[int64_t(i) * a.sel_stride + (j - n_win)];
  if (e < 0) return;
  const uint8_t* entry = sq.ckv[a.src] + int64_t(e) * (hd / 2 + hd / 16);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = ckv_elem(entry, hd, d);
}

// Attention, in two kernels that keep the reference's arithmetic and spread it over the GPU:
// logits (one warp per (key, 8 heads): the lane-strided dot of core/detmath.h for each head), then
// softmax and P·V (one thread per output dim for 4 heads; the denominator is the 128-thread
// block_sum, the P·V sum runs over keys in order).
constexpr int kAttHeadsQK = 8, kAttDimsPV = 128, kAttKeySplit = 20;

__device__ __forceinline__ int attention_keys(const AttentionArgs& a, int i, int* first_free) {
  // The row's keys: its window, then the selection up to its first -1 (found in parallel).
  const int64_t pos = a.meta[i].pos;
  const int64_t w0 = pos - a.W + 1 > 0 ? pos - a.W + 1 : 0;
  if (threadIdx.x == 0) *first_free = a.sel ? a.sel_stride : 0;
  __syncthreads();
  if (a.sel)
    for (int j = threadIdx.x; j < a.sel_stride; j += blockDim.x)
      if (a.sel[int64_t(i) * a.sel_stride + j] < 0) atomicMin(first_free, j);
  __syncthreads();
  return int(pos - w0 + 1) + *first_free;
}

__global__ void __launch_bounds__(256) k_attention_logits(AttentionArgs a) {
  extern __shared__ float qs[];  // [kAttHeadsQK][hd]
  __shared__ int first_free;
  const int i = blockIdx.x, h0 = blockIdx.y * kAttHeadsQK;
  const int64_t hd = a.hd;
  const int nk = attention_keys(a, i, &first_free);
  const int nh = min(kAttHeadsQK, a.H - h0);  // the last group may be partial
  for (int64_t t = threadIdx.x; t < kAttHeadsQK * hd; t += blockDim.x)
    qs[t] = t < nh * hd ? a.q[(int64_t(i) * a.H + h0) * hd + t] : 0.0f;
  __syncthreads();
  const float scale = 1.0f / sqrtf(float(hd));
  const int lane = threadIdx.x % 32;
  const int gw = blockIdx.z * (blockDim.x / 32) + threadIdx.x / 32, nw = gridDim.z * (blockDim.x / 32);
  const float* keys = a.keys + int64_t(i) * a.kmax * hd;
  for (int j = gw; j < nk; j += nw) {
    float dot[kAttHeadsQK];
#pragma unroll
    for (int h = 0; h < kAttHeadsQK; ++h) dot[h] = 0.0f;
#pragma unroll 4
    for (int64_t d = lane; d < hd; d += 32) {
      const float k = keys[int64_t(j) * hd + d];
#pragma unroll
      for (int h = 0; h < kAttHeadsQK; ++h) dot[h] += qs[h * hd + d] * k;
    }
#pragma unroll
    for (int h = 0; h < kAttHeadsQK; ++h) {
      const float v = warp_sum(dot[h]);
      if (lane == h && h < nh) a.att[(int64_t(i) * a.H + h0 + h) * a.kmax + j] = v * scale;
    }
  }
}

// HPV heads per block (DSUF_PV_HEADS=1|2|4, 2 by default): fewer give more blocks (at batch 1 there
// are H/HPV × hd/128 of them) and a shorter softmax per block, at the price of reading the keys
// once per HPV heads. The arithmetic per (head, dim) is the same for every HPV.
template <int HPV>
__global__ void __launch_bounds__(kAttDimsPV) k_attention_pv(AttentionArgs a) {
  extern __shared__ float p[];  // [HPV][kmax]: exp(logit − max)
  __shared__ int first_free;
  __shared__ float den_s[HPV];
  const int i = blockIdx.x, h0 = blockIdx.y * HPV;
  const int64_t hd = a.hd;
  const int nk = attention_keys(a, i, &first_free);
  const int nh = min(HPV, a.H - h0);
  for (int h = 0; h < nh; ++h) {
    const float* lg = a.att + (int64_t(i) * a.H + h0 + h) * a.kmax;
    float* ph = p + h * a.kmax;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) mx = fmaxf(mx, lg[j]);
    mx = block_max(mx);
    float den = 0.0f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) den += (ph[j] = det::fexp(lg[j] - mx));
    den = block_sum(den) + det::fexp(a.sink[h0 + h] - mx);
    if (threadIdx.x == 0) den_s[h] = den;
  }
  __syncthreads();
  const int64_t d = int64_t(blockIdx.z) * blockDim.x + threadIdx.x;
  if (d >= hd) return;
  const float* __restrict__ keys = a.keys + int64_t(i) * a.kmax * hd + d;
  float acc[HPV];
#pragma unroll
  for (int h = 0; h < HPV; ++h) acc[h] = 0.0f;
  // Keys in register tiles of 32: the tile's loads are all in flight together, then used in order.
  constexpr int kTile = 32;
  for (int j0 = 0; j0 < nk; j0 += kTile) {
    float kt[kTile];
#pragma unroll
    for (int t = 0; t < kTile; ++t) kt[t] = j0 + t < nk ? keys[int64_t(j0 + t) * hd] : 0.0f;
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (j0 + t >= nk) break;
#pragma unroll
      for (int h = 0; h < HPV; ++h) acc[h] += p[h * a.kmax + j0 + t] * kt[t];
    }
  }
#pragma unroll
  for (int h = 0; h < HPV; ++h)
    if (h < nh) a.out[(int64_t(i) * a.H + h0 + h) * hd + d] = rb(acc[h] / den_s[h], a.r);
}

// ---- compressor --------------------------------------------------------------------------------
__global__ void k_compress_emit(CompressArgs a) {
  extern __shared__ float sm[];
  float* pooled = sm;             // [hd]
  float* latent = sm + a.hd;      // [hd]
  float* kv = sm + 2 * a.hd;      // [ihd]
  const int64_t hd = a.hd, ihd = a.ihd;
  const EmitJob job = a.jobs[blockIdx.x];
  if (job.w < 0) return;
  const SeqMeta& sq = a.seqs[job.seq];
  const int64_t w = job.w;
  const int64_t pstart = sq.P - job.pending_n;
  auto tok = [&](int64_t p) -> const float* {
    return p < sq.P ? job.pending + (p - pstart) * 2 * hd : a.ag + (sq.row0 + p - sq.P) * 2 * hd;
  };
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    if (a.ratio == 1) {
      pooled[d] = rb(tok(w)[d], a.r);
      continue;
    }
    float mx = -INFINITY;
    for (int q = 0; q < a.ratio; ++q) mx = fmaxf(mx, tok(w * a.ratio + q)[hd + d]);
    float num = 0.0f, den = 0.0f;
    for (int q = 0; q < a.ratio; ++q) {
      const float* t = tok(w * a.ratio + q);
      const float e = det::fexp(t[hd + d] - mx);
      num += e * t[d];
      den += e;
    }
    pooled[d] = rb(num / den, a.r);
  }
  __syncthreads();
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) ss += pooled[d] * pooled[d];
  ss = block_sum(ss);
  float rinv = 1.0f / sqrtf(ss / float(hd) + a.eps);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) latent[d] = rb(bf16_load(a.norm, d) * (pooled[d] * rinv), a.r);
  __syncthreads();
  // Indexer key from the pre-RoPE latent: one warp per output.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  for (int64_t o = warp; o < ihd; o += nw) {
    float acc = 0.0f;
    for (int64_t c = lane; c * 8 < hd; c += 32)  // chunk_lane_sum<8>, as every BF16 linear
      for (int64_t d = c * 8; d < c * 8 + 8 && d < hd; ++d) acc += bf16_load(a.wk, o * hd + d) * latent[d];
    acc = warp_sum(acc);
    if (lane == 0) kv[o] = rb(acc, a.r);
  }
  __syncthreads();
  ss = 0.0f;
  for (int64_t d = threadIdx.x; d < ihd; d += blockDim.x) ss += kv[d] * kv[d];
  ss = block_sum(ss);
  rinv = 1.0f / sqrtf(ss / float(ihd) + a.eps);
  __syncthreads();
  for (int64_t d = threadIdx.x; d < ihd; d += blockDim.x) kv[d] = rb(bf16_load(a.k_norm, d) * (kv[d] * rinv), a.r);
  __syncthreads();
  // RoPE at the entry's position (its first token) on both the entry and the key.
  if (threadIdx.x < a.half) {
    const int i = threadIdx.x;
    const float* cs = a.cs + int64_t(job.cs_row) * a.half * 2;
    const float c = cs[2 * i], s = cs[2 * i + 1];
    float* v = latent + hd - 2 * a.half;
    float x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = rb(x0 * c - x1 * s, a.r);
    v[2 * i + 1] = rb(x0 * s + x1 * c, a.r);
    float* k = kv + ihd - 2 * a.half;
    x0 = k[2 * i], x1 = k[2 * i + 1];
    k[2 * i] = rb(x0 * c - x1 * s, a.r);
    k[2 * i + 1] = rb(x0 * s + x1 * c, a.r);
  }
  __syncthreads();
  // Compressed entry: FP4 with E4M3 scales per 16; key: FP4 with E8M0 scales per 32.
  uint8_t* ent = sq.ckv[a.src] + w * (hd / 2 + hd / 16);
  for (int64_t b = threadIdx.x; b < hd / 16; b += blockDim.x) {
    float amax = 0.0f;
    for (int k = 0; k < 16; ++k) amax = fmaxf(amax, fabsf(latent[b * 16 + k]));
    const uint8_t sc = e4m3_code(fmaxf(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f);
    const float s = e4m3_val(sc);
    ent[hd / 2 + b] = sc;
    for (int k = 0; k < 16; k += 2)
      ent[b * 8 + k / 2] = e2m1_code(latent[b * 16 + k] / s) | (e2m1_code(latent[b * 16 + k + 1] / s) << 4);
  }
  uint8_t* key = sq.ikey[a.src] + w * (ihd / 2 + ihd / 32);
  for (int64_t b = threadIdx.x; b < ihd / 32; b += blockDim.x) {
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = fmaxf(amax, fabsf(kv[b * 32 + k]));
    const float s = pow2_ceil(fmaxf(amax, 6.0f * ldexpf(1.0f, -126)) / 6.0f);
    key[ihd / 2 + b] = e8m0_code(s);
    for (int k = 0; k < 32; k += 2)
      key[b * 16 + k / 2] = e2m1_code(kv[b * 32 + k] / s) | (e2m1_code(kv[b * 32 + k + 1] / s) << 4);
  }
}

__global__ void k_update_pending(const float* ag, const PendingJob* jobs, const SeqMeta* seqs, int64_t hd) {
  // The kept tokens are the last `keep` of pending ++ the sequence's rows.
  const PendingJob job = jobs[blockIdx.y];
  const int64_t total = int64_t(job.keep) * 2 * hd;
  int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (job.keep <= 0 || t >= total) return;
  const SeqMeta& sq = seqs[job.seq];
  const int j = int(t / (2 * hd));
  const int64_t d = t % (2 * hd);
  const int src = job.pending_n + sq.n - job.keep + j;  // index in pending ++ rows
  job.out[t] = src < job.pending_n ? job.in[int64_t(src) * 2 * hd + d]
                                   : ag[int64_t(sq.row0 + src - job.pending_n) * 2 * hd + d];
}

// ---- indexer -----------------------------------------------------------------------------------
// Queries to FP4 codes: one warp per 32-block, the scale rule of fp4_pow2_scale.
__global__ void k_index_q_quant(const float* x, int64_t blocks, int8_t* codes, float* scales) {
  const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (b >= blocks) return;
  const int lane = threadIdx.x % 32;
  const float v = x[b * 32 + lane];
  const float s = pow2_ceil(fmaxf(warp_max(fabsf(v)), 6.0f * ldexpf(1.0f, -126)) / 6.0f);
  codes[b * 32 + lane] = int8_t(det::e2m1_x2(e2m1_code(v / s)));
  if (lane == 0) scales[b] = s;
}

// Indexer scores. A thread owns one entry of a query row: it decodes the packed key once into
// registers as int8 values 2c' (4 per word, dims in order), then for each head in order computes
// the four 32-dim block sums with __dp4a against the row's query codes in shared memory (warp-wide
// broadcasts), turns each into det::fp4_block_dot's value, adds them in order and adds the head
// term to the entry's score — the reference's operations in the reference's order. A block takes
// tiles of 128 entries of one row (grid-strided), staging each tile's keys through shared memory
// with coalesced 16-byte loads; the row's queries are loaded once per block.
constexpr int kIdxEntries = 128;                          // entries (threads) per block
constexpr int kIdxDim = 128;                              // index_head_dim (checked by the launcher)
constexpr int kIdxBlocks = kIdxDim / 32;                  // scale blocks per head
constexpr int kIdxKeyWords = (kIdxDim / 2 + kIdxBlocks) / 4;  // 17 words per packed key
constexpr int kIdxGridBlocks = 4096;                      // grid size aimed at (rows × entry tiles)

// Four E2M1 nibbles (the low 16 bits of s, element 0 lowest) → four int8 values 2c, byte n from
// nibble n: magnitudes and their negatives by table lookups (__byte_perm), the sign bits select.
__device__ __forceinline__ uint32_t e2m1x2_4(uint32_t s) {
  const uint32_t idx = s & 0x7777u;
  const uint32_t pos = __byte_perm(0x03020100u, 0x0c080604u, idx);  // 0 1 2 3 | 4 6 8 12
  const uint32_t neg = __byte_perm(0xfdfeff00u, 0xf4f8fafcu, idx);  // their negatives
  const uint32_t sel = __byte_perm(0x0000ff00u, 0u, (s >> 3) & 0x1111u);  // 0xff where the sign is set
  return (pos & ~sel) | (neg & sel);
}

__global__ void __launch_bounds__(kIdxEntries) k_index_scores(IndexScoreArgs a) {
  extern __shared__ __align__(16) uint32_t ism[];
  const int IH = a.IH, i = blockIdx.y, t = threadIdx.x;
  const RowMeta m = a.meta[i];
  const int64_t vis = (m.pos + 1) / a.ratio;
  if (int64_t(blockIdx.x) * kIdxEntries >= vis) return;  // the whole block: nothing visible here
  uint32_t* tile = ism;                                          // [kIdxEntries][17] packed keys
  uint32_t* qw = tile + kIdxEntries * kIdxKeyWords;              // [IH][32] query codes, 4 per word
  float* qs4 = reinterpret_cast<float*>(qw + IH * kIdxDim / 4);  // [IH][4] 0.25·s_q
  float* wv = qs4 + IH * kIdxBlocks;                             // [IH] rb(weight)·head_scale
  const float head_scale = 1.0f / sqrtf(float(IH)), dim_scale = 1.0f / sqrtf(float(kIdxDim));
  const uint4* qsrc = reinterpret_cast<const uint4*>(a.qc + int64_t(i) * IH * kIdxDim);  // rows 16-byte aligned
  for (int k = t; k < IH * kIdxDim / 16; k += kIdxEntries) reinterpret_cast<uint4*>(qw)[k] = qsrc[k];
  for (int k = t; k < IH * kIdxBlocks; k += kIdxEntries) qs4[k] = 0.25f * a.qs[int64_t(i) * IH * kIdxBlocks + k];
  for (int h = t; h < IH; h += kIdxEntries) wv[h] = rb(a.wts[int64_t(i) * IH + h], a.r) * head_scale;
  const uint8_t* keys = a.seqs[m.seq].ikey[a.src];
  // Tiles of kIdxEntries entries, grid-strided (the launcher caps the grid; the queries stay).
  for (int64_t e0 = int64_t(blockIdx.x) * kIdxEntries; e0 < vis; e0 += int64_t(gridDim.x) * kIdxEntries) {
    // Stage the tile's visible keys (n_e·68 bytes from a 16-byte aligned offset when keys is).
    const int n_e = int(vis - e0 < kIdxEntries ? vis - e0 : kIdxEntries);
    const uint32_t* src = reinterpret_cast<const uint32_t*>(keys + e0 * (kIdxKeyWords * 4));
    const int words = n_e * kIdxKeyWords;
    int done = 0;
    __syncthreads();  // the previous tile is read
    if ((reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
      done = words / 4 * 4;
      for (int k = t; k < words / 4; k += kIdxEntries)
        reinterpret_cast<uint4*>(tile)[k] = __ldg(reinterpret_cast<const uint4*>(src) + k);
    }
    for (int k = done + t; k < words; k += kIdxEntries) tile[k] = __ldg(src + k);
    __syncthreads();
    if (t >= n_e) continue;
    const int64_t e = e0 + t;
    float* out = a.scores + int64_t(i) * a.score_stride + e;
    if (a.cand_mask && !a.cand_mask[int64_t(i) * a.mask_stride + e / a.block]) {
      *out = -INFINITY;
      continue;
    }
    // The key: kc[w] holds dims 4w..4w+3 as int8 2c' (word u of the packed key is dims 8u..8u+7).
    const uint32_t* kt = tile + t * kIdxKeyWords;  // odd stride: conflict-free
    uint32_t kc[kIdxDim / 4];
#pragma unroll
    for (int u = 0; u < kIdxDim / 8; ++u) {
      const uint32_t w = kt[u];
      kc[2 * u] = e2m1x2_4(w);
      kc[2 * u + 1] = e2m1x2_4(w >> 16);
    }
    float ks[kIdxBlocks];
    const uint32_t sw = kt[kIdxDim / 8];
#pragma unroll
    for (int j = 0; j < kIdxBlocks; ++j) ks[j] = e8m0(uint8_t(sw >> (8 * j)));
    float s = 0.0f;
#pragma unroll 4
    for (int h = 0; h < IH; ++h) {
      const uint4* q = reinterpret_cast<const uint4*>(qw + h * (kIdxDim / 4));
      const float4 qsc = reinterpret_cast<const float4*>(qs4)[h];
      const float qsj[kIdxBlocks] = {qsc.x, qsc.y, qsc.z, qsc.w};
      int isum[kIdxBlocks];
#pragma unroll
      for (int j = 0; j < kIdxBlocks; ++j) {
        const uint4 q0 = q[2 * j], q1 = q[2 * j + 1];
        const uint32_t* k = kc + 8 * j;
        int acc = __dp4a(int(k[0]), int(q0.x), 0);
        acc = __dp4a(int(k[1]), int(q0.y), acc);
        acc = __dp4a(int(k[2]), int(q0.z), acc);
        acc = __dp4a(int(k[3]), int(q0.w), acc);
        acc = __dp4a(int(k[4]), int(q1.x), acc);
        acc = __dp4a(int(k[5]), int(q1.y), acc);
        acc = __dp4a(int(k[6]), int(q1.z), acc);
        isum[j] = __dp4a(int(k[7]), int(q1.w), acc);
      }
      // det::seq_sum of det::fp4_block_dot(isum, s_q, s_k) = float(isum)·((0.25·s_q)·s_k); qs4
      // holds the same 0.25·s_q (exact).
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kIdxBlocks; ++j) dot += float(isum[j]) * (qsj[j] * ks[j]);
      s += wv[h] * fmaxf(dot, 0.0f) * dim_scale;
    }
    *out = s;
  }
}

__global__ void k_candidate_block_scores(const float* scores, int64_t score_stride, const RowMeta* meta, int ratio,
                                         int block, float* bscores, int64_t b_stride) {
  const int i = blockIdx.y;
  const int64_t vis = (meta[i].pos + 1) / ratio;
  const int64_t nb = (vis + block - 1) / block;
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= nb) return;
  float m = -INFINITY;
  for (int64_t e = b * block; e < vis && e < (b + 1) * block; ++e) m = fmaxf(m, scores[int64_t(i) * score_stride + e]);
  bscores[int64_t(i) * b_stride + b] = b == nb - 1 ? INFINITY : m;
}

// Order-preserving key of a float (larger float, larger key): topk::key.
__device__ __forceinline__ uint32_t fkey(float f) { return topk::key(f); }

// Inclusive prefix sum over a 256-thread block (warp shuffles, then the 8 warp totals).
__device__ __forceinline__ int block_scan_256(int v, int* warp_tot) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  __syncthreads();
  if (lane == 31) warp_tot[w] = v;
  __syncthreads();
  for (int q = 0; q < w; ++q) v += warp_tot[q];
  return v;
}

// One block per row: radix-select the k-th largest key, then gather (> threshold) and the first ties
// in index order, then sort the picks by (value desc, index asc).
// The row's entries [0, count) in any order, f(j, value): float4 loads spread over the block, four
// in flight per thread (one block reads a whole row; one scalar load at a time per thread left a
// 262,000-entry row latency-bound at ~2 GB/s).
template <int T, typename F>
__device__ __forceinline__ void for_each_entry(const float* __restrict__ row, int64_t count, F f) {
  constexpr int U = 4;
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = count / 4;
    for (int64_t c0 = threadIdx.x; c0 < n4; c0 += int64_t(U) * T) {
      float4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c0 + u * T < n4) v[u] = __ldg(r4 + c0 + u * T);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + u * T;
        if (c >= n4) break;
        f(4 * c, v[u].x), f(4 * c + 1, v[u].y), f(4 * c + 2, v[u].z), f(4 * c + 3, v[u].w);
      }
    }
    done = n4 * 4;
  }
  for (int64_t j = done + threadIdx.x; j < count; j += T) f(j, row[j]);
}
// The entries [lo, hi) of one thread, in index order, f(j, value): float4 loads where aligned, four
// in flight.
template <typename F>
__device__ __forceinline__ void for_range(const float* __restrict__ row, int64_t lo, int64_t hi, F f) {
  int64_t j = lo;
  for (; j < hi && (j & 3); ++j) f(j, row[j]);
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    for (; j + 16 <= hi; j += 16) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __ldg(reinterpret_cast<const float4*>(row + j) + u);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        f(j + 4 * u, v[u].x), f(j + 4 * u + 1, v[u].y), f(j + 4 * u + 2, v[u].z), f(j + 4 * u + 3, v[u].w);
    }
  }
  for (; j < hi; ++j) f(j, row[j]);
}

// One 256-thread block selects the top k of the entries [0, count) of `row` (topk_plan.h: eligible =
// key above key(-inf), order (key desc, index asc)): radix-select the k-th largest key, then gather
// every entry above it and the first ties at it in index order. Calls emit(slot, j, key, value) once
// per pick: slots [0, want − ties) hold the entries above the k-th key in index order, [want − ties,
// want) the ties taken, in index order. Returns want = min(eligible, k), the same in every thread.
// The caller synchronizes before reading what emit wrote.
template <typename Emit>
__device__ __forceinline__ int block_select_256(const float* __restrict__ row, int64_t count, int k, Emit emit) {
  constexpr int T = 256;
  const int t = threadIdx.x;
  const uint32_t neg_inf_key = fkey(-INFINITY);
  __shared__ int hist[256];
  __shared__ int s_eligible;
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_remaining;
  if (t == 0) s_eligible = 0;
  __syncthreads();
  int local = 0;
  for_each_entry<T>(row, count, [&](int64_t, float v) { local += fkey(v) > neg_inf_key; });
  atomicAdd(&s_eligible, local);
  __syncthreads();
  const int eligible = s_eligible;
  const int want = eligible < k ? eligible : k;
  uint32_t threshold = neg_inf_key + 1;  // take every eligible entry
  int ties_to_take = 0;
  if (eligible > k) {
    if (t == 0) s_prefix = 0, s_mask = 0, s_remaining = k;
    __syncthreads();
    __shared__ int warp_tot[8], s_digit, above[257];
    for (int shift = 24; shift >= 0; shift -= 8) {
      hist[t] = 0;
      if (t == 0) s_digit = 0, above[256] = 0;
      __syncthreads();
      const uint32_t mask = s_mask, prefix = s_prefix;
      for_each_entry<T>(row, count, [&](int64_t, float v) {
        const uint32_t key = fkey(v);
        if (key > neg_inf_key && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
      });
      __syncthreads();
      // The digit: the largest d ≥ 1 whose bins d..255 hold at least the remaining count, else 0
      // (bins from the top, as a sequential scan would stop). Suffix sums by a scan of the
      // reversed histogram.
      const int rev = block_scan_256(hist[255 - t], warp_tot);  // Σ hist[255-t..255]
      above[255 - t] = rev;                                    // bins ≥ 255-t
      __syncthreads();
      const int rem = s_remaining;
      if (t >= 1 && above[t] >= rem) atomicMax(&s_digit, t);
      __syncthreads();
      if (t == 0) {
        const int d = s_digit;
        s_remaining -= above[d + 1];
        s_prefix |= uint32_t(d) << shift;
        s_mask |= 255u << shift;
      }
      __syncthreads();
    }
    threshold = s_prefix;  // keys > threshold all taken, s_remaining ties (key == threshold) taken
    ties_to_take = s_remaining;
  }
  // Gather in index order: each thread owns a contiguous range (a multiple of 4 long, so that its
  // loads are aligned float4); exclusive scans give offsets.
  const int64_t per = ((count + T - 1) / T + 3) / 4 * 4;
  const int64_t lo = t * per < count ? t * per : count, hi = lo + per < count ? lo + per : count;
  int n_gt = 0, n_eq = 0;
  for_range(row, lo, hi, [&](int64_t, float v) {
    const uint32_t key = fkey(v);
    if (key <= neg_inf_key) return;
    if (eligible <= k || key > threshold) ++n_gt;
    else if (key == threshold) ++n_eq;
  });
  __shared__ int sc_gt[T], sc_eq[T], scan_tot[8];
  const int inc_gt = block_scan_256(n_gt, scan_tot);
  const int inc_eq = block_scan_256(n_eq, scan_tot);
  sc_gt[t] = inc_gt - n_gt;  // exclusive offsets
  sc_eq[t] = inc_eq - n_eq;
  __syncthreads();
  int og = sc_gt[t], oe = sc_eq[t];
  const int n_gt_total = want - ties_to_take;
  for_range(row, lo, hi, [&](int64_t j, float v) {
    const uint32_t key = fkey(v);
    if (key <= neg_inf_key) return;
    if (eligible <= k || key > threshold) {
      emit(og++, j, key, v);
    } else if (key == threshold && oe < ties_to_take) {
      emit(n_gt_total + oe++, j, key, v);
    }
  });
  return want;
}

// Sorts the block's `want` picks (topk::pick: (key << 32) | ~index) descending — a bitonic sort
// over npow ≥ want entries of shared memory, the tail padded with 0 — and writes their indices to
// out[0, out_stride), −1 padded. The picks must be written and the block synchronized.
__device__ __forceinline__ void sort_picks_write(uint64_t* picks, int want, int32_t* out, int out_stride) {
  constexpr int T = 256;
  const int t = threadIdx.x;
  int npow = 1;
  while (npow < want) npow <<= 1;
  for (int j = want + t; j < npow; j += T) picks[j] = 0;
  __syncthreads();
  // Bitonic sort, descending.
  for (int size = 2; size <= npow; size <<= 1)
    for (int stride2 = size / 2; stride2 > 0; stride2 >>= 1) {
      for (int j = t; j < npow; j += T) {
        int partner = j ^ stride2;
        if (partner > j) {
          bool desc = (j & size) == 0;
          uint64_t a = picks[j], b = picks[partner];
          if (desc ? a < b : a > b) picks[j] = b, picks[partner] = a;
        }
      }
      __syncthreads();
    }
  for (int j = t; j < out_stride; j += T) out[j] = j < want ? topk::pick_index(picks[j]) : -1;
}

__device__ __forceinline__ int64_t top_k_count(const RowMeta* meta, int i, int ratio, int block) {
  int64_t count = (meta[i].pos + 1) / ratio;
  if (block > 0) count = (count + block - 1) / block;
  return count;
}

// The single-block top-k: one block per row.
__global__ void k_top_k(const float* x, int64_t stride, const RowMeta* meta, int ratio, int block, int k, int32_t* out,
                        int out_stride) {
  const int i = blockIdx.x;
  const int64_t count = top_k_count(meta, i, ratio, block);
  extern __shared__ uint64_t picks[];  // (key << 32) | ~index, sorted descending
  const int want = block_select_256(x + int64_t(i) * stride, count, k, [&](int slot, int64_t j, uint32_t key, float) {
    picks[slot] = topk::pick(key, j);
  });
  sort_picks_write(picks, want, out + int64_t(i) * out_stride, out_stride);
}

// Multi-block top-k, stage 1 (topk_plan.h): grid (g_launch, rows). Block (g, i) selects the top k
// of chunk g of row i and writes them — values and row indices — to slots [g·ks, g·ks + want) of
// the row's candidates (stride cand_stride), the rest of its ks = slot_stride(k) slots −inf / −1.
// Rows of one chunk (topk::chunks(...).G = 1) are left to stage 2.
__global__ void k_top_k_chunks(const float* x, int64_t stride, const RowMeta* meta, int ratio, int block, int k,
                               int g_launch, int64_t min_chunk, float* cand_val, int32_t* cand_idx,
                               int64_t cand_stride) {
  const int i = blockIdx.y, g = blockIdx.x;
  const int64_t count = top_k_count(meta, i, ratio, block);
  const topk::Chunks c = topk::chunks(count, k, g_launch, min_chunk);
  if (c.G < 2 || g >= c.G) return;
  const int64_t lo = topk::chunk_lo(c, g), hi = topk::chunk_hi(c, count, g), ks = topk::slot_stride(k);
  float* val = cand_val + int64_t(i) * cand_stride + g * ks;
  int32_t* idx = cand_idx + int64_t(i) * cand_stride + g * ks;
  const int want = block_select_256(x + int64_t(i) * stride + lo, hi - lo, k,
                                    [&](int slot, int64_t j, uint32_t, float v) {
                                      val[slot] = v;
                                      idx[slot] = int32_t(lo + j);
                                    });
  for (int64_t j = want + threadIdx.x; j < ks; j += blockDim.x) val[j] = -INFINITY, idx[j] = -1;
}

// Multi-block top-k, stage 2: one block per row. A row of one chunk is selected from the row itself
// (as k_top_k); otherwise from its G·ks candidates, which stage 1 stored chunk after chunk, so that
// storage order restricted to any one key is index order and "first ties in storage order" is
// "ties to the lower index" (topk_plan.h); the picks carry the candidates' row indices.
__global__ void k_top_k_merge(const float* x, int64_t stride, const RowMeta* meta, int ratio, int block, int k,
                              int g_launch, int64_t min_chunk, const float* cand_val, const int32_t* cand_idx,
                              int64_t cand_stride, int32_t* out, int out_stride) {
  const int i = blockIdx.x;
  const int64_t count = top_k_count(meta, i, ratio, block);
  const int G = topk::chunks(count, k, g_launch, min_chunk).G;
  extern __shared__ uint64_t picks[];
  int want;
  if (G < 2) {
    want = block_select_256(x + int64_t(i) * stride, count, k, [&](int slot, int64_t j, uint32_t key, float) {
      picks[slot] = topk::pick(key, j);
    });
  } else {
    const int32_t* idx = cand_idx + int64_t(i) * cand_stride;
    want = block_select_256(cand_val + int64_t(i) * cand_stride, G * topk::slot_stride(k), k,
                            [&](int slot, int64_t j, uint32_t key, float) { picks[slot] = topk::pick(key, idx[j]); });
  }
  sort_picks_write(picks, want, out + int64_t(i) * out_stride, out_stride);
}

__global__ void k_mask_from_selection(const int32_t* sel, int sel_stride, uint8_t* mask, int64_t mask_stride) {
  const int i = blockIdx.x;
  for (int64_t b = threadIdx.x; b < mask_stride; b += blockDim.x) mask[int64_t(i) * mask_stride + b] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < sel_stride; j += blockDim.x) {
    int32_t b = sel[int64_t(i) * sel_stride + j];
    if (b >= 0) mask[int64_t(i) * mask_stride + b] = 1;
  }
}

// ---- MoE ---------------------------------------------------------------------------------------
// One warp per token: scores computed once per expert in parallel, then k rounds of argmax (largest
// score + bias among the experts not yet taken, ties to the lower id — the reference's sequential
// scan picks the same one for any non-NaN scores).
__global__ void k_route(const float* logits, int E, int k, const float* bias, const float* bias_vl,
                        const uint8_t* image, float temp, float route_scale, int32_t* ids, float* w) {
  extern __shared__ float sv[];  // [E] score s, [E] s + bias, [E] taken flags
  __shared__ float picked[32];
  const int i = blockIdx.x, lane = threadIdx.x;
  const float* l = logits + int64_t(i) * E;
  const float* b = image && image[i] ? bias_vl : bias;
  float* sc = sv;
  float* val = sv + E;
  float* taken = sv + 2 * E;
  for (int e = lane; e < E; e += 32) {
    const float x = l[e] / temp;
    sc[e] = sqrtf(det::softplus(x));
    val[e] = sc[e] + b[e];
    taken[e] = 0.0f;
  }
  __syncwarp();
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float bv = -INFINITY;
    for (int e = lane; e < E; e += 32)
      if (taken[e] == 0.0f && (best < 0 || val[e] > bv)) best = e, bv = val[e];
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int ob = __shfl_xor_sync(0xffffffffu, best, o);
      if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) best = ob, bv = ov;
    }
    const float bs = sc[best];
    sum += bs;
    if (lane == 0) {
      ids[i * k + j] = best;
      picked[j] = bs;
      taken[best] = 1.0f;
    }
    __syncwarp();
  }
  if (lane < k) w[i * k + lane] = picked[lane] / (sum + 1e-20f) * route_scale;
}

__global__ void k_swiglu(float* h1, const float* h3, int64_t rows, int64_t F, const float* weight, float limit,
                         bool clamp, bool r) {
  int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * F) return;
  float g = h1[t], u = h3[t];
  if (clamp && limit > 0) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  const float wt = weight ? weight[t / F] : 1.0f;
  h1[t] = rb(wt * (det::silu(g) * u), r);
}

// The MoE output y = bf16(Σ_j ye_j + ys) of a row, expanded straight into the streams (the FFN
// site's expansion, as hc_expand in the reference): X_k ← bf16(post_k·y + Σ_j C[j][k]·X_j).
template <int HC>
__global__ void k_moe_sum_expand(const float* __restrict__ ye, int k, const float* __restrict__ ys, int n, int64_t D,
                                 const float* __restrict__ mix, int mix_stride, float* __restrict__ X, bool r) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= int64_t(n) * D) return;
  const int64_t i = t / D, d = t % D;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) acc += ye[(i * k + j) * D + d];
  const float yv = rb(acc + ys[t], r);
  const float* m = mix + i * mix_stride;
  float old[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) old[j] = X[(i * HC + j) * D + d];
#pragma unroll
  for (int c = 0; c < HC; ++c) {
    float a = m[HC + c] * yv;
#pragma unroll
    for (int j = 0; j < HC; ++j) a += m[2 * HC + j * HC + c] * old[j];
    X[(i * HC + c) * D + d] = rb(a, r);
  }
}

// ---- Engram ------------------------------------------------------------------------------------
__global__ void k_engram_gather(const int64_t* row_ids, int rows, const uint8_t* table, const uint8_t* scales,
                                int64_t ehd, float* emb) {
  const int i = blockIdx.x;
  for (int64_t t = threadIdx.x; t < rows * ehd; t += blockDim.x) {
    const int64_t r = t / ehd, d = t % ehd;
    const int64_t id = row_ids[int64_t(i) * rows + r];
    emb[int64_t(i) * rows * ehd + t] = e4m3_val(table[id * ehd + d]) * e8m0(scales[id * (ehd / 32) + d / 32]);
  }
}

__global__ void k_engram_gate(float* X, const float* kv, const uint16_t* qw, const uint16_t* kw, const uint8_t* dead,
                              int hc, int64_t D, float eps, bool r) {
  const int i = blockIdx.x, k = blockIdx.y;
  if (dead[i]) return;
  float* x = X + (int64_t(i) * hc + k) * D;
  const float* key = kv + int64_t(i) * (hc + 1) * D + k * D;
  const float* v = kv + int64_t(i) * (hc + 1) * D + hc * D;
  float sx = 0.0f, sk = 0.0f, dot = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    sx += x[d] * x[d];
    sk += key[d] * key[d];
    dot += x[d] * bf16_load(qw, k * D + d) * bf16_load(kw, k * D + d) * key[d];
  }
  sx = block_sum(sx);
  sk = block_sum(sk);
  dot = block_sum(dot);
  const float rx = 1.0f / sqrtf(sx / float(D) + eps), rk = 1.0f / sqrtf(sk / float(D) + eps);
  dot = dot * rx * rk * (1.0f / sqrtf(float(D)));
  const float g = det::sigmoid((dot >= 0 ? 1.0f : -1.0f) * sqrtf(fmaxf(fabsf(dot), 1e-6f)));
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) x[d] = rb(x[d] + g * v[d], r);
}

__global__ void k_gather_rows(const float* X, const float* pre, const int32_t* rows, int hc, int64_t D, float* Xo,
                              float* preo) {
  const int i = blockIdx.x, r = rows[i];
  for (int64_t t = threadIdx.x; t < hc * D; t += blockDim.x) Xo[int64_t(i) * hc * D + t] = X[int64_t(r) * hc * D + t];
  if (threadIdx.x < hc) preo[i * hc + threadIdx.x] = pre[r * hc + threadIdx.x];
}

__global__ void k_add_rows(float* y, const float* x, int64_t n) {
  int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n) y[t] += x[t];
}

__device__ __host__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
__device__ __host__ inline uint8_t e4m3_small(uint64_t r) {
  // sign | exponent 1..7 | mantissa: |value| in [2^-6, 1.875]
  return uint8_t(((r >> 8) & 1) << 7 | (1 + (r % 7)) << 3 | ((r >> 16) & 7));
}
// Element i of p holds the value of element first + i of the whole draw.
__global__ void k_fill(uint8_t* p, size_t bytes, uint64_t seed, Fill mode, uint8_t constant, float sigma,
                       size_t first) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  seed += first * 0x9e3779b97f4a7c15ull;  // seed + (first + i)·φ below, i local
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;; i += stride) {
    switch (mode) {
      case Fill::kBytes:
      case Fill::kE4M3:
      case Fill::kConstant:
        if (i >= bytes) return;
        p[i] = mode == Fill::kConstant ? constant
               : mode == Fill::kBytes  ? uint8_t(mix64(seed + i * 0x9e3779b97f4a7c15ull))
                                       : e4m3_small(mix64(seed + i * 0x9e3779b97f4a7c15ull));
        break;
      case Fill::kBf16Normal:
      case Fill::kBf16One: {
        if (2 * i >= bytes) return;
        const uint64_t r = mix64(seed + i * 0x9e3779b97f4a7c15ull);
        // Irwin–Hall of 4 uniforms: mean 2, variance 1/3.
        float u = 0.0f;
        for (int k = 0; k < 4; ++k) u += float((r >> (16 * k)) & 0xffff) / 65536.0f;
        const float v = mode == Fill::kBf16One ? 1.0f + 0.1f * (u - 2.0f) * 1.7320508f : sigma * (u - 2.0f) * 1.7320508f;
        reinterpret_cast<uint16_t*>(p)[i] = uint16_t(__float_as_uint(v) >> 16);
        break;
      }
      case Fill::kF32Normal:
      case Fill::kF32One: {
        if (4 * i >= bytes) return;
        const uint64_t r = mix64(seed + i * 0x9e3779b97f4a7c15ull);
        float u = 0.0f;
        for (int k = 0; k < 4; ++k) u += float((r >> (16 * k)) & 0xffff) / 65536.0f;
        reinterpret_cast<float*>(p)[i] = mode == Fill::kF32One ? 1.0f : sigma * (u - 2.0f) * 1.7320508f;
        break;
      }
    }
  }
}

}  // namespace

void fill_device_synthetic(uint8_t* p, size_t bytes, uint64_t seed, Fill mode, uint8_t constant, float sigma,
                           cudaStream_t s, size_t first) {
  if (bytes) k_fill<<<1024, 256, 0, s>>>(p, bytes, mix64(seed), mode, constant, sigma, first);
}

void fill_host_synthetic(uint8_t* p, size_t bytes, uint64_t seed, Fill mode, uint8_t constant) {
  const uint64_t sd = mix64(seed);
  const unsigned nt = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < nt; ++t)
    pool.emplace_back([=] {
      for (size_t i = bytes * t / nt; i < bytes * (t + 1) / nt; ++i)
        p[i] = mode == Fill::kConstant ? constant : e4m3_small(mix64(sd + i * 0x9e3779b97f4a7c15ull));
    });
  for (auto& th : pool) th.join();
}

__global__ void k_fill_entries(uint8_t* p, int64_t entries, int64_t entry_bytes, int64_t value_bytes, bool e4m3_values,
                               uint8_t scale, uint64_t seed) {
  const int64_t total = entries * entry_bytes, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t b = i % entry_bytes;
    const uint64_t r = mix64(seed + uint64_t(i) * 0x9e3779b97f4a7c15ull);
    p[i] = b >= value_bytes ? scale : e4m3_values ? e4m3_small(r) : uint8_t(r);
  }
}

void fill_entries_synthetic(uint8_t* p, int64_t entries, int64_t entry_bytes, int64_t value_bytes, bool e4m3_values,
                            uint8_t scale, uint64_t seed, cudaStream_t s) {
  if (entries > 0) k_fill_entries<<<1024, 256, 0, s>>>(p, entries, entry_bytes, value_bytes, e4m3_values, scale, mix64(seed));
}

namespace {
// Off by default: measured on the H200 (docs/perf.md, v6) the step was 1.4 ms slower with it on.
bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DSUF_PDL");
    return v && std::string(v) == "1";
  }();
  return on;
}
// Launches k with programmatic stream serialization (see pdl_wait) when DSUF_PDL=1.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at, cfg.numAttrs = pdl_enabled() ? 1 : 0;
  DSUF_CUDA(cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...));
}
template <typename Kernel>
void set_smem(Kernel k, size_t smem) {
  if (smem > 48 * 1024) DSUF_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}
}  // namespace

void embed(const int32_t* tok, int n, const uint16_t* table, int64_t D, int hc, float* X, float* pre, cudaStream_t s) {
  k_embed<<<n, 256, 0, s>>>(tok, table, D, hc, X, pre);
}
namespace {
// hc (1..8, config.cc's range) as a compile-time constant: per-stream values live in registers.
template <typename F>
void with_hc(int hc, F&& f) {
  switch (hc) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: fail("mHC: hc_mult = ", hc, " (1..8 supported)");
  }
}
// Warps per k_hc_mix block: the G in 4..8 that leaves the fewest idle warps over the M + 1 outputs.
int hc_mix_warps(int outputs) {
  int best = 8;
  for (int g = 8; g >= 4; --g)
    if ((outputs + g - 1) / g * g - outputs < (outputs + best - 1) / best * best - outputs) best = g;
  return best;
}
// Rows per k_hc_mix row tile: one at small batches (most blocks), more when the grid is large
// anyway (each warp's fn values are then read once for R rows).
int hc_mix_rows(int n) { return n >= 128 ? 8 : n >= 64 ? 4 : n >= 32 ? 2 : 1; }
}  // namespace

int64_t hc_mix_part_floats(int rows, int hc) { return int64_t(rows) * (hc_mix_stride(hc) + 1) * 32; }

void hc_mix(const float* fn, const float* base, const float* scale, const float* X, int n, int hc, int64_t D,
            float norm_eps, int iters, float hc_eps, float* out, float* part, unsigned* count, cudaStream_t s) {
  if (n <= 0) return;
  const int64_t N = hc * D;
  const int T = hc_mix_stride(hc) + 1, G = hc_mix_warps(T), groups = (T + G - 1) / G, R = hc_mix_rows(n);
  const int64_t J = (N + 1023) / 1024;
  const size_t smem = size_t(std::max<int64_t>(R * J, R * T) * 32 + R * T) * sizeof(float);
  DSUF_CHECK(smem <= 200 * 1024, "hc_mix: hc·hidden size ", N, " too large");
  with_hc(hc, [&](auto H) {
    auto* k = k_hc_mix<decltype(H)::value>;
    set_smem(k, smem);
    k<<<dim3(32 * groups, (n + R - 1) / R), 32 * G, smem, s>>>(fn, X, n, N, R, norm_eps, base, scale, iters, hc_eps,
                                                                out, part, count);
  });
}
void hc_collapse(const float* pre, int pre_stride, const float* X, int n, int hc, int64_t D, float* u, bool r,
                 cudaStream_t s) {
  k_hc_collapse<<<dim3(blocks_for(D, 256), n), 256, 0, s>>>(pre, pre_stride, X, hc, D, u, r);
}
void collapse_norm(const float* pre, int pre_stride, const float* emix, int emix_stride, const float* y_in, float* X,
                   int n, int hc, int64_t D, const uint16_t* w, float eps, float* y, bool r, cudaStream_t s) {
  if (n <= 0) return;
  const size_t smem = size_t((D + 255) / 256) * 32 * sizeof(float);
  DSUF_CHECK(smem <= 200 * 1024, "collapse_norm: hidden size ", D, " too large");
  with_hc(hc, [&](auto H) {
    auto* k = k_collapse_norm<decltype(H)::value>;
    set_smem(k, smem);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(kNormCluster, n), cfg.blockDim = dim3(256), cfg.dynamicSmemBytes = smem, cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = kNormCluster, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    DSUF_CUDA(cudaLaunchKernelEx(&cfg, k, pre, pre_stride, emix, emix_stride, y_in, X, D, w, eps, y, r));
  });
}
void rmsnorm(const float* x, int64_t rows, int64_t dim, const uint16_t* w, float eps, float* y, bool r, cudaStream_t s) {
  const RmsJob j{x, dim, w, y};
  if (rows > 0) k_rmsnorm<<<dim3(unsigned(rows), 1), 256, 0, s>>>(j, j, eps, r);
}
void rmsnorm2(const RmsJob& a, const RmsJob& b, int64_t rows, float eps, bool r, cudaStream_t s) {
  if (rows > 0) k_rmsnorm<<<dim3(unsigned(rows), 2), 256, 0, s>>>(a, b, eps, r);
}
namespace {
// Outputs per warp: more per warp (more weight bytes in flight per input read) while the grid still
// gives every SM a few blocks.
int outputs_per_warp(int64_t outputs) {
  const int64_t sms = 132;
  return outputs >= 8 * 4 * 4 * sms ? 4 : outputs >= 8 * 2 * 2 * sms ? 2 : 1;
}
struct Fp8Call {
  const uint8_t* W;
  const uint8_t* Ws;
  int64_t out, K;
  LinearInput in;
  int64_t rows;
  float* y;
  int64_t y_stride;
  int groups;
  bool r;
  cudaStream_t s;
  Fp8Pair pair;
};
// DSUF_GEMV=regs|pipe|deep picks how the FP8/FP4 linears fetch weights (see GemvMode); pipe by default.
int gemv_mode() {
  static const int mode = [] {
    const char* v = std::getenv("DSUF_GEMV");
    const std::string m = v ? v : "pipe";
    if (m == "regs") return int(kRegs);
    if (m == "pipe") return int(kRegsPipe);
    if (m == "deep") return int(kDeep);
    fail("DSUF_GEMV=", m, ": expected regs, pipe or deep");
  }();
  return mode;
}
template <int OPW, int R, bool kExact>
void launch_fp8(const Fp8Call& c) {
  const int mode = gemv_mode();
  auto k = mode == kDeep        ? k_fp8_gemv<OPW, R, kExact, kDeep>
           : mode == kRegsPipe ? k_fp8_gemv<OPW, R, kExact, kRegsPipe>
                               : k_fp8_gemv<OPW, R, kExact, kRegs>;
  const int64_t out = std::max(c.out, c.pair.out);
  launch_pdl(k, dim3(blocks_for(out, 8 * OPW), blocks_for(c.rows, R), c.groups), dim3(256), 0, c.s, c.W, c.Ws,
             c.out, c.K, c.in.x, c.in.stride, c.in.group_stride, c.in.scale, c.in.scale_stride, int(c.rows), c.y,
             c.y_stride, c.r, c.pair);
}
template <int R, bool kExact>
void launch_fp8_opw(const Fp8Call& c) {
  switch (outputs_per_warp((c.out * (c.pair.W ? 1 : c.groups) + c.pair.out) * blocks_for(c.rows, R))) {
    case 4: return launch_fp8<4, R, kExact>(c);
    case 2: return launch_fp8<2, R, kExact>(c);
    default: return launch_fp8<1, R, kExact>(c);
  }
}
template <bool kExact>
void launch_fp8_rows(const Fp8Call& c) {
  // Rows per block: each weight row is read once per group of R rows.
  if (c.rows >= 4) return launch_fp8_opw<4, kExact>(c);
  if (c.rows >= 2) return launch_fp8_opw<2, kExact>(c);
  launch_fp8_opw<1, kExact>(c);
}
struct Fp4Call {
  const uint8_t* const* W;
  const uint8_t* const* Ws;
  const int32_t* ids;
  int64_t out, K;
  LinearInput in;
  int x_div;
  int64_t rows;
  float* y;
  bool r;
  cudaStream_t s;
  Fp4Pair pair;
};
template <int OPW, bool kExact>
void launch_fp4(const Fp4Call& c) {
  const int mode = gemv_mode();
  auto k = mode == kDeep        ? k_fp4_gemv<OPW, kExact, kDeep>
           : mode == kRegsPipe ? k_fp4_gemv<OPW, kExact, kRegsPipe>
                               : k_fp4_gemv<OPW, kExact, kRegs>;
  launch_pdl(k, dim3(blocks_for(c.out, 8 * OPW), int(c.rows), c.pair.W ? 2 : 1), dim3(256), 0, c.s, c.W, c.Ws,
             c.ids, c.out, c.K, c.in.x, c.in.stride, c.in.scale, c.in.scale_stride, c.x_div, c.y, c.r, c.pair);
}
template <bool kExact>
void launch_fp4_opw(const Fp4Call& c) {
  switch (outputs_per_warp(c.out * c.rows * (c.pair.W ? 2 : 1))) {
    case 4: return launch_fp4<4, kExact>(c);
    case 2: return launch_fp4<2, kExact>(c);
    default: return launch_fp4<1, kExact>(c);
  }
}
}  // namespace

LinearInput linear_input(const float* x, int64_t x_stride, int64_t rows, int64_t K, bool quantize, float* xq,
                         float* xs, cudaStream_t s, int groups) {
  DSUF_CHECK(K % 32 == 0 && groups >= 1, "linear_input: K = ", K, ", groups = ", groups);
  const int64_t nb = K / 32, kp = interleaved_k(K);
  if (rows > 0)
    k_linear_input<<<dim3(blocks_for(groups * nb, 8), rows), 256, 0, s>>>(x, x_stride, K, groups, quantize, xq, xs);
  return {xq, groups * kp, kp, quantize ? xs : nullptr, groups * nb};
}
void fp8_linear_groups(const uint8_t* W, const uint8_t* Ws, int groups, int64_t out, int64_t K,
                       const LinearInput& in, int64_t rows, float* y, int64_t y_stride, bool r, cudaStream_t s) {
  DSUF_CHECK(K % 32 == 0 && groups >= 1 && (groups == 1 || out % 32 == 0) && in.group_stride == interleaved_k(K),
             "fp8_linear: K = ", K, ", groups = ", groups, ", out = ", out, ", input laid out for ",
             in.group_stride, " per group");
  if (rows <= 0) return;
  const Fp8Call c{W, Ws, out, K, in, rows, y, y_stride, groups, r, s};
  if (in.scale) return launch_fp8_rows<true>(c);
  launch_fp8_rows<false>(c);
}
void fp8_linear(const uint8_t* W, const uint8_t* Ws, int64_t out, int64_t K, const LinearInput& in, int64_t rows,
                float* y, int64_t y_stride, bool r, cudaStream_t s, const Fp8Pair& pair) {
  if (!pair.W) return fp8_linear_groups(W, Ws, 1, out, K, in, rows, y, y_stride, r, s);
  DSUF_CHECK(K % 32 == 0 && in.group_stride == interleaved_k(K) && in.stride == in.group_stride,
             "fp8_linear (pair): K = ", K, ", input laid out for ", in.group_stride);
  if (rows <= 0) return;
  const Fp8Call c{W, Ws, out, K, in, rows, y, y_stride, 2, r, s, pair};
  if (in.scale) return launch_fp8_rows<true>(c);
  launch_fp8_rows<false>(c);
}
void fp4_linear_grouped(const uint8_t* const* W, const uint8_t* const* Ws, const int32_t* ids, int64_t out, int64_t K,
                        const LinearInput& in, int x_div, int64_t rows, float* y, bool r, cudaStream_t s,
                        const Fp4Pair& pair) {
  DSUF_CHECK(K % 32 == 0 && in.group_stride == interleaved_k(K), "fp4_linear: K = ", K, ", input laid out for ",
             in.group_stride);
  if (rows <= 0) return;
  const Fp4Call c{W, Ws, ids, out, K, in, x_div, rows, y, r, s, pair};
  if (in.scale) return launch_fp4_opw<true>(c);
  launch_fp4_opw<false>(c);
}
void bf16_linear(const uint16_t* W, int64_t out, int64_t K, const float* x, int64_t x_stride, int64_t rows, float* y,
                 int64_t y_stride, bool r, cudaStream_t s) {
  k_bf16_linear<<<dim3(blocks_for(out, 8), rows), 256, 0, s>>>(W, out, K, x, x_stride, y, y_stride, r);
}
void rope(float* x, int64_t rows, int heads, int64_t dim, const float* cs, int half, float sign, bool r,
          cudaStream_t s) {
  const int64_t n = rows * heads * half;
  if (n) k_rope<<<blocks_for(n, 256), 256, 0, s>>>(x, rows, heads, dim, cs, half, sign, r);
}
void fp8_fake_quant(float* x, int64_t n, bool r, cudaStream_t s) {
  if (n) k_fp8_fake_quant<<<blocks_for(n / 32, 8), 256, 0, s>>>(x, n / 32, r);
}
void index_q_quant(const float* x, int64_t n, int8_t* codes, float* scales, cudaStream_t s) {
  if (n) k_index_q_quant<<<blocks_for(n / 32, 8), 256, 0, s>>>(x, n / 32, codes, scales);
}
void pack_window(const float* kv, int rows, const RowMeta* meta, const SeqMeta* seqs, int layer, int64_t hd, int W,
                 cudaStream_t s) {
  const int64_t t = int64_t(rows) * (hd / 32);
  if (t > 0) k_pack_window<<<blocks_for(t, 8), 256, 0, s>>>(kv, rows, meta, seqs, layer, hd, W);
}
void attention(const AttentionArgs& a, cudaStream_t s) {
  k_gather_keys<<<dim3(a.rows, a.W + (a.sel ? a.sel_stride : 0)), 128, 0, s>>>(a);
  static const int hpv = [] {
    const char* v = std::getenv("DSUF_PV_HEADS");
    const int h = v ? std::atoi(v) : 2;
    DSUF_CHECK(h == 1 || h == 2 || h == 4, "DSUF_PV_HEADS=", v, ": expected 1, 2 or 4");
    return h;
  }();
  const size_t qk_smem = sizeof(float) * kAttHeadsQK * a.hd, pv_smem = sizeof(float) * hpv * a.kmax;
  set_smem(k_attention_logits, qk_smem);
  k_attention_logits<<<dim3(a.rows, blocks_for(a.H, kAttHeadsQK), kAttKeySplit), 256, qk_smem, s>>>(a);
  auto pv = hpv == 1 ? k_attention_pv<1> : hpv == 2 ? k_attention_pv<2> : k_attention_pv<4>;
  set_smem(pv, pv_smem);
  pv<<<dim3(a.rows, blocks_for(a.H, hpv), blocks_for(a.hd, kAttDimsPV)), kAttDimsPV, pv_smem, s>>>(a);
}
void compress_emit(const CompressArgs& a, cudaStream_t s) {
  if (a.n_jobs <= 0) return;
  const size_t smem = sizeof(float) * (2 * a.hd + a.ihd);
  k_compress_emit<<<a.n_jobs, 256, smem, s>>>(a);
}
void update_pending(const float* ag, const PendingJob* jobs, int n_jobs, const SeqMeta* seqs, int ratio, int64_t hd,
                    cudaStream_t s) {
  if (n_jobs > 0 && ratio > 1)
    k_update_pending<<<dim3(blocks_for(int64_t(ratio) * 2 * hd, 256), n_jobs), 256, 0, s>>>(ag, jobs, seqs, hd);
}
void index_scores(const IndexScoreArgs& a, cudaStream_t s) {
  if (a.max_entries <= 0 || a.rows <= 0) return;
  DSUF_CHECK(a.ihd == kIdxDim, "index_scores: index_head_dim ", a.ihd, " (the kernel is built for ", kIdxDim, ")");
  const size_t smem = sizeof(uint32_t) * kIdxEntries * kIdxKeyWords +
                      size_t(a.IH) * (kIdxDim + sizeof(float) * (kIdxBlocks + 1));
  DSUF_CHECK(smem <= 200 * 1024, "index_scores: ", a.IH, " heads need too much shared memory");
  set_smem(k_index_scores, smem);
  // About kIdxGridBlocks blocks in all (a few waves); a row's tiles beyond its blocks are strided.
  const int bx = int(std::min<int64_t>(blocks_for(a.max_entries, kIdxEntries), std::max(1, kIdxGridBlocks / a.rows)));
  k_index_scores<<<dim3(bx, a.rows), kIdxEntries, smem, s>>>(a);
}
void candidate_block_scores(const float* scores, int64_t score_stride, int rows, const RowMeta* meta, int ratio,
                            int block, float* bscores, int64_t b_stride, cudaStream_t s) {
  k_candidate_block_scores<<<dim3(blocks_for(b_stride, 128), rows), 128, 0, s>>>(scores, score_stride, meta, ratio,
                                                                               block, bscores, b_stride);
}
void top_k(const float* x, int64_t stride, int rows, const RowMeta* meta, int ratio, int block, int k, int32_t* out,
           int out_stride, cudaStream_t s, const TopkScratch& scratch) {
  if (rows <= 0) return;
  int npow = 1;
  while (npow < k) npow <<= 1;
  const size_t smem = sizeof(uint64_t) * npow;
  const int g = scratch.val ? topk::launch_groups(scratch.max_count, rows, k, scratch.min_chunk, scratch.slots) : 1;
  if (g < 2) {
    k_top_k<<<rows, 256, smem, s>>>(x, stride, meta, ratio, block, k, out, out_stride);
    return;
  }
  const int64_t cand_stride = int64_t(g) * topk::slot_stride(k);
  k_top_k_chunks<<<dim3(g, rows), 256, 0, s>>>(x, stride, meta, ratio, block, k, g, scratch.min_chunk, scratch.val,
                                               scratch.idx, cand_stride);
  k_top_k_merge<<<rows, 256, smem, s>>>(x, stride, meta, ratio, block, k, g, scratch.min_chunk, scratch.val, scratch.idx,
                                        cand_stride, out, out_stride);
}
void mask_from_selection(const int32_t* sel, int sel_stride, int n, uint8_t* mask, int64_t mask_stride, cudaStream_t s) {
  k_mask_from_selection<<<n, 128, 0, s>>>(sel, sel_stride, mask, mask_stride);
}
void gather_rows(const float* X, const float* pre, const int32_t* rows, int n, int hc, int64_t D, float* Xo,
                 float* preo, cudaStream_t s) {
  k_gather_rows<<<n, 256, 0, s>>>(X, pre, rows, hc, D, Xo, preo);
}
void route(const float* logits, int n, int E, int k, const float* bias, const float* bias_vl, const uint8_t* image,
           float temp, float route_scale, int32_t* ids, float* w, cudaStream_t s) {
  DSUF_CHECK(k <= 32 && k <= E, "route: top-", k, " of ", E, " experts");
  const size_t smem = sizeof(float) * 3 * E;
  set_smem(k_route, smem);
  if (n) k_route<<<n, 32, smem, s>>>(logits, E, k, bias, bias_vl, image, temp, route_scale, ids, w);
}
void swiglu(float* h1, const float* h3, int64_t rows, int64_t F, const float* weight, float limit, bool clamp, bool r,
            cudaStream_t s) {
  k_swiglu<<<blocks_for(rows * F, 256), 256, 0, s>>>(h1, h3, rows, F, weight, limit, clamp, r);
}
void moe_sum_expand(const float* y_experts, int k, const float* y_shared, int n, int hc, int64_t D, const float* mix,
                    int mix_stride, float* X, bool r, cudaStream_t s) {
  if (n <= 0) return;
  with_hc(hc, [&](auto H) {
    k_moe_sum_expand<decltype(H)::value><<<blocks_for(int64_t(n) * D, 256), 256, 0, s>>>(y_experts, k, y_shared, n, D,
                                                                                       mix, mix_stride, X, r);
  });
}
void engram_gather(const int64_t* row_ids, int n, int rows, const uint8_t* table, const uint8_t* scales, int64_t ehd,
                   float* emb, cudaStream_t s) {
  k_engram_gather<<<n, 256, 0, s>>>(row_ids, rows, table, scales, ehd, emb);
}
void engram_gate(float* X, const float* kv, const uint16_t* qw, const uint16_t* kw, const uint8_t* dead, int n, int hc,
                 int64_t D, float eps, bool r, cudaStream_t s) {
  k_engram_gate<<<dim3(n, hc), 256, 0, s>>>(X, kv, qw, kw, dead, hc, D, eps, r);
}
void add_rows(float* y, const float* x, int64_t n, cudaStream_t s) {
  k_add_rows<<<blocks_for(n, 256), 256, 0, s>>>(y, x, n);
}

}  // namespace dsuf::cuda
