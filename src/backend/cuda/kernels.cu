// Straightforward kernels mirroring the CPU reference; see kernels.cuh for the contract.
#include "backend/cuda/kernels.cuh"
#include "core/parse.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <thread>
#include <vector>
#include <utility>
#include <tuple>
#include <string>
#include <cstdlib>
#include <cstdio>
#include <cmath>
#include <type_traits>

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <cuda_fp16.h>

#include "backend/cuda/check.h"
#include "backend/cuda/step_policy.h"
#include "backend/cuda/topk_plan.h"
#include "core/class_tree.h"
#include "core/detmath.h"
#include "core/fp4_dp4a.h"

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
// The same value as one float max (no compare and select; the kernels are built without FTZ, so the
// subnormal 2^-127 survives): k_fp4_imma's stage, which is bound by its instructions. (As an integer
// max.u32 in PTX everywhere, session 20 measured +0.22 ms a step: the FP8 GEMVs got slower.)
__device__ __forceinline__ float e8m0_max(uint8_t v) { return fmaxf(__uint_as_float(uint32_t(v) << 23), 0x1p-127f); }
// Exact decodes by bit placement (value·2^-120 / value·2^-126 scaled back exactly): no table, so no
// serialized constant-memory reads when the lanes of a warp look up different codes.
__device__ __forceinline__ float e4m3_bits(uint32_t b) {  // b's low byte: value·2^-120
  return __uint_as_float(((b & 0x7fu) << 20) | ((b & 0x80u) << 24));
}
__device__ __forceinline__ float e2m1_bits(uint32_t n) {  // n's low nibble: value·2^-126
  return __uint_as_float(((n & 0x7u) << 22) | ((n & 0x8u) << 28));
}
// Four E4M3 bytes (t's bytes 0..3) as their exact values, by the hardware's conversion (sm_89+): two
// cvt.rn.f16x2.e4m3x2 (E4M3 fits F16 exactly, subnormals included) and four F16 → F32 widenings,
// about 1.5 instructions a weight against 3 for the bit placement. A NaN code (0x7f/0xff) gives NaN,
// as the CPU's table does.
__device__ __forceinline__ void e4m3x4(uint32_t t, float& a, float& b, float& c, float& d) {
  uint32_t lo, hi;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(t));
  const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 q = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  a = p.x, b = p.y, c = q.x, d = q.y;
}
__device__ __forceinline__ float e4m3_val(uint32_t b) {  // 0x7f/0xff: NaN, as the CPU's table
  return (b & 0x7fu) == 0x7fu ? __uint_as_float(0x7fc00000u) : e4m3_bits(b) * 0x1p120f;
}
__device__ __forceinline__ float e2m1_val(uint32_t n) { return e2m1_bits(n) * 0x1p126f; }
__device__ __forceinline__ float pow2_ceil_lib(float x) {
  int e;
  float m = frexpf(x, &e);
  return m == 0.5f ? x : ldexpf(1.0f, e);
}
// The smallest power of two ≥ x. For a positive normal x below 2^127 (every scale the quantizers
// compute) by its bits — x itself when its mantissa is zero, else 2^(exponent + 1) — instead of
// frexpf and ldexpf (~25 instructions on the step's latency chain, in every input quantization);
// anything else the library's way. Same result on every float (testing::fast_conversion_mismatches).
__device__ __forceinline__ float pow2_ceil(float x) {
  const uint32_t u = __float_as_uint(x), ex = u >> 23;  // a set sign bit puts ex ≥ 256
  if (ex - 1u < 253u) return (u & 0x7fffffu) == 0 ? x : __uint_as_float((ex + 1u) << 23);
  return pow2_ceil_lib(x);
}
// v / s for a power of two s: the product by its reciprocal when both are normal (the same real
// number, rounded once either way), else the division (~10 instructions and a slow-path branch).
__device__ __forceinline__ float div_pow2(float v, float s) {
  const uint32_t u = __float_as_uint(s), ex = u >> 23;
  if ((u & 0x7fffffu) == 0 && ex - 1u < 253u) return v * __uint_as_float((254u - ex) << 23);
  return v / s;
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
// The 8 sums warp_sum(v[h]) (h < 8) at once, by a reduce-scatter butterfly: at the xor steps 16, 8
// and 4 each lane keeps half of its values and sends the other half to its partner, which holds the
// same heads' partial sums of the other lanes (lanes with bit 4 clear keep heads 0–3, then bit 3
// picks two of those, bit 2 one), then steps 2 and 1 as warp_sum. Every head's sum is the same
// butterfly over the same 32 lanes, the two operands of each addition the same values as in
// warp_sum (a + b = b + a exactly), so the result is warp_sum's, bit for bit: 9 shuffles instead of
// 40. Returns the sum of head (lane >> 2) & 7, held by its four lanes 4h … 4h + 3.
__device__ __forceinline__ float warp_sum8_scatter(const float (&v)[8], int lane) {
  float a4[4], a2[2];
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float keep = b4 ? v[4 + u] : v[u], send = b4 ? v[u] : v[4 + u];
    a4[u] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const float keep = b3 ? a4[2 + u] : a4[u], send = b3 ? a4[u] : a4[2 + u];
    a2[u] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  const float keep = b2 ? a2[1] : a2[0], send = b2 ? a2[0] : a2[1];
  float r = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  r += __shfl_xor_sync(0xffffffffu, r, 2);
  r += __shfl_xor_sync(0xffffffffu, r, 1);
  return r;
}
// Asynchronous global → shared copies (sm_80+): issued without waiting, completed by cp_async_wait_all.
__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(uint32_t(__cvta_generic_to_shared(dst))), "l"(src));
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(uint32_t(__cvta_generic_to_shared(dst))),
               "l"(src));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async4_to(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async8_to(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Bulk copies (the copy engine: one instruction a chunk, no registers) completing on an mbarrier of
// the block's shared memory. A phase of the barrier: one arrival that announces the chunk's bytes,
// then the copy's completion; waiters poll its parity.
__device__ __forceinline__ void mbar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
// Makes barrier inits visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Orders this thread's earlier shared-memory accesses (and, after a __syncwarp, its warp's) before
// its later bulk copies' writes: a slot is refilled only after every lane has read it.
__device__ __forceinline__ void async_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// The barrier's one arrival, announcing `bytes` that bulk copies will complete on it.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// A bulk copy completing `bytes` on bar (announced by an mbar_expect_tx of this phase).
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_to_smem(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  mbar_expect_tx(bar, bytes);
  bulk_copy(dst, src, bytes, bar);
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      " poll:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra poll;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// An mbarrier that completes after `count` plain arrivals (mbar_arrive), e.g. one per consumer warp.
__device__ __forceinline__ void mbar_init_count(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
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
// The entry of a kernel whose every memory access depends on earlier kernels (activations, the step's
// state): wait for them, then let the next kernel's blocks start, so that its launch overlaps this
// kernel's run instead of following its last block (launch_step).
// (Triggering before the wait, so that a linear after a norm loads its weights during two kernels,
// measured 0.67 ms a step slower in v21: docs/perf.md.)
__device__ __forceinline__ void pdl_entry() {
  pdl_wait();
  pdl_trigger();
}
// pdl_entry, or (late) only the wait: such a kernel calls pdl_exit(late) at its end, so that the next
// kernel's blocks — a linear loading weights before its own wait — launch when this one is done
// instead of beside it (DSUF_LATE_TRIGGER, late_trigger()).
__device__ __forceinline__ void pdl_entry(bool late) {
  pdl_wait();
  if (!late) pdl_trigger();
}
__device__ __forceinline__ void pdl_exit(bool late) {
  if (late) pdl_trigger();
}

// ---- quantization and linears ------------------------------------------------------------------
// The per-32 quantizers run one warp per block, lane k on element k (the max is order-free).
__device__ __forceinline__ float fp8_block_scale(float v) {
  return pow2_ceil(fmaxf(warp_max(fabsf(v)), 1e-4f) / 448.0f);
}
// The E4M3 code of a value in [−448, 448] (no NaN) by the hardware's conversion (sm_89+: round to
// nearest even, saturating), one instruction for e4m3_code's ~30: the same code for every such
// float (testing::fast_conversion_mismatches checks all of them).
__device__ __forceinline__ uint8_t e4m3_code_clamped(float f) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(d) : "f"(f));
  return uint8_t(d & 0xffu);
}
__device__ __forceinline__ uint8_t fp8_code(float v, float s) {
  return e4m3_code_clamped(fminf(fmaxf(div_pow2(v, s), -448.0f), 448.0f));
}
// A value through the reference's per-32 FP8 fake quantization (E4M3 code at the block's scale, back
// to FP32, rounded as r). The whole warp must call it (the scale is a warp max).
__device__ __forceinline__ float fp8_fake_quant_lane(float v, bool r) {
  const float s = fp8_block_scale(v);
  return rb(e4m3_val(fp8_code(v, s)) * s, r);
}

constexpr float kXStage = 0x1p64f;  // quantized inputs stored as x·2^64

// The linears read their inputs in an interleaved layout (per row and group of K inputs): K-block
// kb's float4 j sits at float4 xpos4(kb, j), so that the 32 lanes of a warp (K-blocks ≡ lane mod 32)
// read 512 contiguous bytes per load. In the plain layout each lane's 16 bytes came from a different
// 128-byte line: 32 L1 wavefronts per load, which capped the linears near 1 TB/s.
__device__ __forceinline__ int64_t xpos4(int kb, int j) { return (int64_t(kb >> 5) * 8 + j) * 32 + (kb & 31); }

// The byte planes of the quantized inputs, for the FP4 linears' integer blocks (core/fp4_dp4a.h):
// K-block kb's 96 bytes (planes lo, mid, hi of X = 512·a, 32 bytes each) are the 16-byte pieces
// j = 2·plane + half at uint4 ppos16(kb, j), so that a lane reads its K-block with six 16-byte loads
// and the 32 lanes of a warp (K-blocks ≡ lane mod 32) read 512 contiguous bytes per load, as xpos4.
__device__ __forceinline__ int64_t ppos16(int kb, int j) { return (int64_t(kb >> 5) * 6 + j) * 32 + (kb & 31); }

// Lane `lane` of a warp holding K-block kb of an input row (element lane, value v) writes it into the
// row's interleaved group xq_group, quantized (E4M3 value times 2^64, the block's scale to *xs) when
// quantize, and then also, when xp_row is set, the value's three plane bytes. The whole warp must
// call it (the scale is a warp max).
__device__ __forceinline__ void emit_input(float v, bool quantize, float* xq_group, float* xs, int kb, int lane,
                                           uint8_t* xp_row = nullptr) {
  float q = v;
  if (quantize) {
    const float sc = fp8_block_scale(v);
    const float a = e4m3_val(fp8_code(v, sc));
    q = a * kXStage;
    if (lane == 0) *xs = sc;
    if (xp_row) {
      const int32_t X = det::e4m3_x512(a);
      uint8_t* b = xp_row + ppos16(kb, lane / 16) * 16 + lane % 16;  // plane p: 2p pieces (1024 B) on
      b[0] = det::x512_plane(X, 0), b[1024] = det::x512_plane(X, 1), b[2048] = det::x512_plane(X, 2);
    }
  }
  xq_group[xpos4(kb, lane / 4) * 4 + lane % 4] = q;
}
// emit_input for row `row` of rows laid out through an InputSink (one group of K inputs).
__device__ __forceinline__ void emit_input(const InputSink& sk, int64_t K, int64_t row, int kb, int lane, float v) {
  emit_input(v, sk.quantize, sk.xq + row * interleaved_k(K), sk.quantize ? sk.xs + row * (K / 32) + kb : nullptr,
             kb, lane, sk.quantize && sk.xp ? sk.xp + row * interleaved_planes(K) : nullptr);
}

// ---- RoPE on the way (FusedRope) -----------------------------------------------------------------
// k_rope's rotation of a pair (2i, 2i+1) in the last 2·half values of a head vector, done by a warp
// that holds 32 consecutive values of it, lane l with value v: the pair is lanes l and l ^ 1 (the
// rotated part starts at the even offset dim − 2·half and dim % 32 == 0, so no pair straddles two
// warps or heads). Element `col` of its head vector (row `row` of the step) is rotated when rot, by
// its pair's c and sign·s, read from cs as k_rope reads them.
struct RopePair {
  bool rot;
  float c, s;
};
__device__ __forceinline__ RopePair rope_pair(const FusedRope& f, int64_t row, int64_t col) {
  const int64_t off = col - (f.dim - 2 * f.half);
  if (off < 0) return {false, 1.0f, 0.0f};
  const int64_t k = (row * f.half + off / 2) * 2;
  return {true, f.cs[k], f.sign * f.cs[k + 1]};
}
// The rotated, rounded value of lane `lane` (k_rope: even a·c − b·s, odd a·s + b·c, a the even value
// and b the odd one). The whole warp must call it (one shuffle).
__device__ __forceinline__ float rope_lane(float v, const RopePair& p, int lane, bool r) {
  const float other = __shfl_xor_sync(0xffffffffu, v, 1);
  if (!p.rot) return v;
  return lane % 2 == 0 ? rb(v * p.c - other * p.s, r) : rb(other * p.s + v * p.c, r);
}

// ---- embedding and mHC -------------------------------------------------------------------------
__global__ void k_embed(const int32_t* tok, const uint16_t* table, int64_t D, int hc, float* X, float* pre) {
  pdl_entry();
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
  // This warp's fn values first, before the dependency wait (weights: nothing in a step writes
  // them): their latency (DRAM) overlaps the previous kernel's end and the staging of the stream
  // values (L2).
  // Written as predicated loads (in_regs && m < M && j < J && idx < N), these shared the wait's basic
  // block and ptxas issued them after it (SASS, session 18: no load before the wait). Unconditional
  // (an index past the end reloads fn's last value, never used) in a block of their own, they stay
  // before it (as k_bf16_linear's weights).
  float f[kMixChunk];
  if (in_regs && m < M) {
#pragma unroll
    for (int j = 0; j < kMixChunk; ++j) {
      const int64_t idx = t + 1024 * int64_t(j);
      f[j] = __ldg(fn + int64_t(m) * N + (idx < N ? idx : N - 1));
    }
  }
  pdl_entry();
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
  pdl_entry();
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
// (Fewer blocks a row, each taking several of those warps, measured +0.8 to +7 ms a step: v19.)
constexpr int kNormPerThread = 4;  // positions per thread per pass (one pass for D ≤ 8192)

// kWide (DSUF_COLLAPSE=wide, the default since session 34): a block of 32·J threads (J = ⌈D/256⌉:
// 640 at D = 5,120), one position a thread, instead of 256 threads of up to kNormPerThread positions
// each: the same values, sums and stores, spread over 2.5× the warps (the kernel is a chain of
// dependent instructions at two warps a scheduler: 0.24 issued a cycle under Nsight, ~1,130
// instructions a warp). With moe.ye set (wide only) the site output it expands is the MoE's sum.
template <int HC, bool kWide = false>
__global__ void __launch_bounds__(kWide ? 1024 : 256) k_collapse_norm(const float* __restrict__ pre, int pre_stride,
                                                       const float* __restrict__ emix, int emix_stride,
                                                       const float* __restrict__ y_in, float* __restrict__ X,
                                                       int64_t D, const uint16_t* __restrict__ w, float eps,
                                                       float* __restrict__ y, bool r, InputSink sink,
                                                       bool w_early, bool late, MoeSumIn moe) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  extern __shared__ float us[];  // [32·J]: u[32c + l + 256j] at 32j + l
  __shared__ float q;
  const int c = int(cluster.block_rank()), i = blockIdx.y, lane = threadIdx.x % 32;
  const int J = int((D + 255) / 256), E = 32 * J;
  constexpr int kPer = kWide ? 1 : kNormPerThread;  // positions a thread a pass
  const int stride = kWide ? int(blockDim.x) : 256;  // threads a pass (a constant for 256)
  const int pass = kPer * stride;
  auto pos = [&](int e) { return int64_t(32 * c + e % 32) + 256 * int64_t(e / 32); };
  // The norm weights of the first pass first: before the dependency wait (w_early, DSUF_W_EARLY=1:
  // nothing in a step writes them), or right after it; their latency overlaps the stream loads.
  float wv[kPer];
  auto load_w = [&] {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int e = threadIdx.x + stride * k;
      wv[k] = w && e < E && pos(e) < D ? bf16_load(w, pos(e)) : 1.0f;
    }
  };
  if (w_early) load_w();
  pdl_entry(late);
  if (!w_early) load_w();
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
  for (int e0 = 0; e0 < E; e0 += pass) {
    float xv[kPer][HC], yv[kPer];
#pragma unroll
    for (int p = 0; p < kPer; ++p) {  // all loads of the pass first
      const int e = e0 + threadIdx.x + stride * p;
      const bool ok = e < E && pos(e) < D;
#pragma unroll
      for (int k = 0; k < HC; ++k) xv[p][k] = ok ? x[int64_t(k) * D + pos(e)] : 0.0f;
      if constexpr (kWide) {
        if (moe.ye) {  // k_moe_sum_expand's y: the k rows added from 0 in order, then the shared row
          float ev[kMoeSumMax];
#pragma unroll
          for (int j = 0; j < kMoeSumMax; ++j)
            ev[j] = ok && j < moe.k ? moe.ye[(int64_t(i) * moe.k + j) * D + pos(e)] : 0.0f;
          const float sv = ok ? moe.ys[int64_t(i) * D + pos(e)] : 0.0f;
          float acc = 0.0f;
#pragma unroll
          for (int j = 0; j < kMoeSumMax; ++j)
            if (j < moe.k) acc += ev[j];
          yv[p] = rb(acc + sv, r);
          continue;
        }
      }
      yv[p] = ok && emix ? y_in[int64_t(i) * D + pos(e)] : 0.0f;
    }
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int e = e0 + threadIdx.x + stride * p;
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
  for (int e0 = 0; e0 < E; e0 += pass) {
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int e = e0 + threadIdx.x + stride * p;
      if (e >= E || pos(e) >= D) continue;
      const float wgt = e0 == 0 ? wv[p] : w ? bf16_load(w, pos(e)) : 1.0f;
      const float v = rb(wgt * (us[e] * rinv), r);
      y[int64_t(i) * D + pos(e)] = v;
      // A warp's 32 elements are one K-block (D % 32 == 0 with a sink: whole warps skip or stay).
      if (sink.xq) emit_input(sink, D, i, int(pos(e) / 32), lane, v);
    }
  }
  pdl_exit(late);
  cluster.sync();  // no block leaves while another may still read its q
}


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
// reference does. The FP4 linear's quantized path is different since its reference changed to an
// exact integer block sum (det::fp4_act_block_isum, docs/numerics.md §3): it reads the inputs' byte
// planes (ppos16) and uses prmt/dp4a (core/fp4_dp4a.h) instead of FMAs, see fp4_kb_mac.
// RMSNorm, a 256-thread block per row of job blockIdx.y (one launch normalizes the rows of one or two
// (x, dim, w, y) jobs): thread t takes x[t + 256k] — the canonical block_sum<256> partials — and keeps
// its first kRmsRegs values and weights in registers, so the output needs no second read. y may
// equal x (a thread rewrites only what it read).
// (8 values a thread in registers, so that V4.1's q_lora_rank of 1,280 needs no second read, measured
// +0.027 ms a step in v28: not kept. 5 (DSUF_RMS_REGS, the default since session 19: −0.007 ms a
// step at 8K, lower in 7 of 7 interleaved rounds): exactly 1,280's share, so that the q norm's fifth
// value is neither loaded after the first four return nor reloaded with its weight after the block
// sum — two dependent L2 round trips on the attention chain in the 4-register form's SASS.)
// w_early (DSUF_W_EARLY=1, the default): the norm weights are loaded before the dependency wait.
template <int kRmsRegs = 4>
__global__ void __launch_bounds__(256) k_rmsnorm(RmsJob a, RmsJob b, float eps, bool r, bool w_early, bool late) {
  const RmsJob jb = blockIdx.y == 0 ? a : b;
  const int64_t dim = jb.dim;
  float xv[kRmsRegs], wv[kRmsRegs];
  auto load_w = [&] {
#pragma unroll
    for (int p = 0; p < kRmsRegs; ++p) {
      const int64_t j = threadIdx.x + 256 * p;
      wv[p] = jb.w && j < dim ? bf16_load(jb.w, j) : 1.0f;
    }
  };
  if (w_early) load_w();  // weights: nothing in a step writes them
  pdl_entry(late);
  if (!w_early) load_w();
  const float* xr = jb.x + int64_t(blockIdx.x) * dim;
  float* yr = jb.y + int64_t(blockIdx.x) * dim;
#pragma unroll
  for (int p = 0; p < kRmsRegs; ++p) {
    const int64_t j = threadIdx.x + 256 * p;
    xv[p] = j < dim ? xr[j] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < kRmsRegs; ++p)
    if (threadIdx.x + 256 * p < dim) ss += xv[p] * xv[p];
  for (int64_t j = threadIdx.x + 256 * kRmsRegs; j < dim; j += 256) ss += xr[j] * xr[j];
  ss = block_sum(ss);
  const float rinv = 1.0f / sqrtf(ss / float(dim) + eps);
  // With a sink or fake_quant (dim % 32 == 0), warp w's elements 256p + 32w + lane are K-block 8p + w,
  // so k_fp8_fake_quant's warp (rope by a shuffle, the block's scale by a warp max) runs as it is.
  const int lane = threadIdx.x % 32, wb = threadIdx.x / 32;
  auto store = [&](int64_t j, float v) {
    if (jb.fake_quant) {
      if (jb.fq_rope.cs) v = rope_lane(v, rope_pair(jb.fq_rope, blockIdx.x, j % jb.fq_rope.dim), lane, jb.fq_rope.r);
      v = fp8_fake_quant_lane(v, r);
    }
    yr[j] = v;
    if (jb.sink.xq) emit_input(jb.sink, dim, blockIdx.x, int(j / 32), lane, v);
  };
#pragma unroll
  for (int p = 0; p < kRmsRegs; ++p)
    if (threadIdx.x + 256 * p < dim) store(threadIdx.x + 256 * p, rb(wv[p] * (xv[p] * rinv), r));
  for (int64_t j = threadIdx.x + 256 * kRmsRegs; j < dim; j += 256)
    store(j, rb((jb.w ? bf16_load(jb.w, j) : 1.0f) * (xr[j] * rinv), r));
  pdl_exit(late);
}

// Lays out rows × groups × K inputs (stride x_stride) for the linears, with the reference's per-32
// FP8 activation quantization on the way when quantize (E4M3 values stored times 2^64, scales to
// xs): once per input row, for every linear that reads it. A warp per 32-block.
// With rope.cs set, the values are first rotated as k_rope would (by shuffles, in registers; x is
// not written): the attention output's inverse rope, fused into wo_a's input.
__global__ void k_linear_input(const float* __restrict__ x, int64_t x_stride, int64_t K, int groups, bool quantize,
                               float* __restrict__ xq, float* __restrict__ xs, FusedRope rope, bool late) {
  pdl_entry(late);
  const int nb = int(K / 32), gb = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (gb >= groups * nb) return;  // whole warps
  const int g = gb / nb, kb = gb % nb;
  const int64_t row = blockIdx.y, kp = interleaved_k(K), col = int64_t(g) * K + kb * 32 + lane;
  float v = x[row * x_stride + col];
  if (rope.cs) v = rope_lane(v, rope_pair(rope, row, col % rope.dim), lane, rope.r);
  emit_input(v, quantize, xq + row * groups * kp + g * kp, quantize ? xs + row * groups * nb + gb : nullptr, kb, lane);
  pdl_exit(late);
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
// mac for a weight that already holds its value (e4m3x4's decode): no scale multiply. (Called as
// mac(…, 1.0f), nvcc kept the ×1 — an FMUL a weight on the unquantized path, `wo_a`'s: 130 FMUL in
// its 349-instruction round of 64 weights a lane; session 28.) The same bits: w·1 is w.
template <bool kExact>
__device__ __forceinline__ float mac_v(float part, float x, float w) {
  if (kExact) return fmaf(x, w, part);
  return __fadd_rn(part, __fmul_rn(x, w));
}

// How a GEMV lane gets its weights (docs/perf.md measures them; DSUF_GEMV picks one):
//   kRegs      it loads a K-block's weights into registers, then uses them (the default);
//   kRegsPipe  the same, with the next K-block's load issued before the current one's arithmetic
//              (twice the bytes in flight, more registers). The default until session 4, when,
//              with the remainder tasks (RemainderTasks) added, it measured 11.55 ms a step at 8K
//              against kRegs' 10.99 in the same run (why is not measured; registers are the suspect).
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
  // xpos4(kb, j) = xpos4(kb, 0) + 32·j: one address, constant offsets (from xpos4 per j, nvcc
  // rebuilt the 64-bit address of each of the 8 loads).
  const float4* p = reinterpret_cast<const float4*>(xr) + xpos4(kb, 0);
#pragma unroll
  for (int j = 0; j < 8; ++j) xv[j] = __ldg(p + 32 * j);
}

// One lane's K-block for OPW outputs from its 32 inputs already in registers: the block sums
// part[o] = Σ x·w in element order (fmaf when quantized); a lane's term is then fp8_kb_term. The
// weights come decoded to their values (e4m3x4); the quantized inputs are x·2^64, so a block's sum is
// Σx·w·2^64, scaled back by 2^-64. Every partial sum is an exact power-of-two multiple of the one
// with the old bit-placed weights (value·2^-120, scaled back by 2^56), all normal floats (nonzero
// products are multiples of 2^46, the sums stay below 2^87), so the bits are the same.
// kFma (kExact, or unquantized inputs that are all BF16 values: LinearInput::bf16) takes each step as
// one fmaf: a BF16 value (8 significant bits, lowest bit ≥ 2^-133) times an E4M3 value (4 bits, ≥ 2^-9)
// has at most 12 significant bits and its lowest bit ≥ 2^-142, so the product is exact in FP32 unless
// it overflows (|x·w| ≥ 2^128: |x| ≥ 2^119) — and fmaf(x, w, p) is then p + x·w rounded once, the
// reference's rounded product (exact) and rounded add.
template <int OPW, bool kExact, bool kFma = kExact>
__device__ __forceinline__ void fp8_kb_parts(const uint4 (&w)[OPW][2], const float4 (&xv)[8], float (&part)[OPW]) {
#pragma unroll
  for (int o = 0; o < OPW; ++o) part[o] = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      float w0, w1, w2, w3;
      e4m3x4(word_of(w[o], j), w0, w1, w2, w3);
      part[o] = mac_v<kFma>(part[o], xv[j].x, w0);
      part[o] = mac_v<kFma>(part[o], xv[j].y, w1);
      part[o] = mac_v<kFma>(part[o], xv[j].z, w2);
      part[o] = mac_v<kFma>(part[o], xv[j].w, w3);
    }
  }
}
// The lane's term of a block sum: scaled back (quantized), times s_act·s_w.
template <bool kExact>
__device__ __forceinline__ float fp8_kb_term(float part, float s_a, float sw) {
  return (kExact ? part * 0x1p-64f : part) * (s_a * sw);
}

// One lane's K-block of OPW weight rows (w, each 4 weights decoded once) against R input rows, the
// float4 j of row rr from load(rr, j): part[o][rr] = Σ x·w in element order, every (o, rr) its own
// chain (fp8_kb_parts' products and order for each row). fp8_kb_mac's kInter form (inputs from
// global memory) and k_fp8_gemv_tiles<…, R> (from shared memory).
template <int OPW, int R, bool kExact, bool kFma = kExact, typename Load>
__device__ __forceinline__ void fp8_kb_parts_rows(const uint4 (&w)[OPW][2], Load&& load, float (&part)[OPW][R]) {
#pragma unroll
  for (int o = 0; o < OPW; ++o)
#pragma unroll
    for (int rr = 0; rr < R; ++rr) part[o][rr] = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float4 xv[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) xv[rr] = load(rr, j);
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      float w0, w1, w2, w3;
      e4m3x4(word_of(w[o], j), w0, w1, w2, w3);
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        part[o][rr] = mac_v<kFma>(part[o][rr], xv[rr].x, w0);
        part[o][rr] = mac_v<kFma>(part[o][rr], xv[rr].y, w1);
        part[o][rr] = mac_v<kFma>(part[o][rr], xv[rr].z, w2);
        part[o][rr] = mac_v<kFma>(part[o][rr], xv[rr].w, w3);
      }
    }
  }
}

// One lane's K-block kb for OPW outputs (weights w, scales sw) and nr ≤ R rows of inputs: added to
// acc, or (kSet) stored there as they are.
// kInter (R > 1; DSUF_FP8_ROWS_FORM=inter): the rows interleaved instead of one after the other —
// per 4 weights of each output, decoded once, the 4 products of every row, so that the OPW·R
// partial sums are independent chains in flight together and the inputs of all rows load at once
// (rows ≥ nr read row 0 and are dropped: no per-row branch). Each partial sum takes the same
// products in the same element order: the same bits.
template <int OPW, int R, bool kExact, bool kSet = false, bool kInter = false, bool kFma = kExact>
__device__ __forceinline__ void fp8_kb_mac(const uint4 (&w)[OPW][2], const float (&sw)[OPW], const float* x,
                                           int64_t x_stride, const float* xs, int64_t xs_stride, int kb, int nr,
                                           float (&acc)[OPW][R]) {
  if constexpr (kInter && R > 1) {
    const float4* p[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr)
      p[rr] = reinterpret_cast<const float4*>(x + (rr < nr ? rr : 0) * x_stride) + xpos4(kb, 0);
    float part[OPW][R];
    fp8_kb_parts_rows<OPW, R, kExact, kFma>(w, [&](int rr, int j) { return __ldg(p[rr] + 32 * j); }, part);
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const float s_a = kExact && rr < nr ? __ldg(xs + rr * xs_stride + kb) : 1.0f;
#pragma unroll
      for (int o = 0; o < OPW; ++o) {
        const float c = (kExact ? part[o][rr] * 0x1p-64f : part[o][rr]) * (s_a * sw[o]);
        acc[o][rr] = kSet ? c : acc[o][rr] + c;
      }
    }
    return;
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    if (rr >= nr) break;
    float4 xv[8];
    load_x(x + rr * x_stride, kb, xv);
    float part[OPW];
    fp8_kb_parts<OPW, kExact, kFma>(w, xv, part);
    const float s_a = kExact ? __ldg(xs + rr * xs_stride + kb) : 1.0f;
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      const float c = fp8_kb_term<kExact>(part[o], s_a, sw[o]);
      acc[o][rr] = kSet ? c : acc[o][rr] + c;
    }
  }
}

__device__ __forceinline__ uint32_t comp(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// One lane's FP4 K-block kb for OPW outputs. Quantized inputs (kExact): the block's exact integer sum
// from the byte planes xp (det::fp4_act_block_isum in the prmt/dp4a form of core/fp4_dp4a.h: per 4
// weights and output 2 prmt, 6 dp4a, and the selector's shift/mask), then det::fp4_act_block_part;
// the float inputs x are not read. Otherwise the sequential FP32 sum of the products, as before.
template <int OPW, bool kExact, bool kSet = false>
__device__ __forceinline__ void fp4_kb_mac(const uint4 (&w)[OPW], const float (&sw)[OPW], const float* x,
                                           const float* xs, const uint8_t* xp, int kb, float (&acc)[OPW]) {
  if constexpr (kExact) {
    uint4 xv[6];  // lo words 0-7 in xv[0..1], mid in xv[2..3], hi in xv[4..5]
    const uint4* p = reinterpret_cast<const uint4*>(xp) + ppos16(kb, 0);  // ppos16(kb, j) = that + 32·j
#pragma unroll
    for (int j = 0; j < 6; ++j) xv[j] = __ldg(p + 32 * j);
    det::Fp4Acc a[OPW];
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const uint32_t lo = comp(xv[m / 4], m % 4), mid = comp(xv[2 + m / 4], m % 4), hi = comp(xv[4 + m / 4], m % 4);
#pragma unroll
      for (int o = 0; o < OPW; ++o) det::fp4_act_x4(comp(w[o], m / 2) >> (16 * (m % 2)), lo, mid, hi, a[o]);
    }
    const float s_a = __ldg(xs + kb);
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      const float c = det::fp4_act_block_part(det::fp4_act_isum(a[o])) * (s_a * sw[o]);
      acc[o] = kSet ? c : acc[o] + c;
    }
    return;
  }
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
  for (int o = 0; o < OPW; ++o) {
    const float c = (kExact ? part[o] * back : part[o]) * (s_a * sw[o]);
    acc[o] = kSet ? c : acc[o] + c;
  }
}

// The last rem = nb mod 32 K-blocks of a warp's OPW rows. In the reference order (lane l adds K-blocks
// l, l+32, … of a row, then the warp tree) they are the last term of lanes 0..rem−1. Taken by those
// lanes for all OPW rows, they cost a whole round for a fraction of the lanes (K = 1280: 40 blocks,
// the second round 8 lanes busy ×4 rows). When OPW·rem ≤ 32 they are spread instead, one task per
// lane: lane t computes row t / rem, K-block 32·full + t mod rem, alone (the same arithmetic), and
// lane j < rem adds row o's term, fetched from lane o·rem + j, as its last one: the same sums.
struct RemainderTasks {
  int full, rem, row, kb;
  bool spread, mine;
  int lane;
  __device__ RemainderTasks(int nb, int opw, int lane_) : full(nb / 32), rem(nb % 32), lane(lane_) {
    spread = rem > 0 && opw * rem <= 32;
    mine = spread && lane < opw * rem;
    row = spread ? lane / rem : 0;
    kb = spread ? 32 * full + lane % rem : 0;
  }
  __device__ int source(int o) const { return o * rem + (lane < rem ? lane : 0); }
  __device__ bool receives() const { return lane < rem; }
  // The lane's rounds over K-blocks kb = lane, lane + 32, … < end(nb): with spread tasks only the
  // full ones (32·full ≤ nb), one compare a round.
  __device__ int end(int nb) const { return spread ? 32 * full : nb; }
  __device__ bool ends_at(int kb, int nb) const { return kb >= end(nb); }
  // What a double-buffered lane loads during round kb: the next round's blocks, or, after the last
  // full round of a spread warp, its task's.
  template <typename Load, typename LoadTask>
  __device__ void prefetch(int kb, int nb, Load&& load, LoadTask&& load_task) const {
    if (!(spread && kb + 32 >= 32 * full)) {
      if (kb + 32 < nb) load(kb + 32);
    } else if (mine) {
      load_task();
    }
  }
};

// Grid.z's slice of an FP8 linear launch: group g of a grouped linear (its weight and scale rows,
// inputs, input scales and outputs), or, with pair.W set, the pair's second linear at z = 1.
__device__ __forceinline__ void fp8_slice(const uint8_t* __restrict__& W, const uint8_t* __restrict__& Ws,
                                          int64_t& out, int64_t K, const float* __restrict__& x, int64_t x_group,
                                          const float* __restrict__& xs, float* __restrict__& y, int64_t& y_stride,
                                          const Fp8Pair& pair) {
  const int nb = int(K / 32), g = blockIdx.z;
  if (!pair.W) {
    W += int64_t(g) * out * K, Ws += int64_t(g) * (out / 32) * nb, x += int64_t(g) * x_group, xs += int64_t(g) * nb;
    y += int64_t(g) * out;
  } else if (g == 1) {
    W = pair.W, Ws = pair.Ws, out = pair.out, y = pair.y, y_stride = pair.y_stride;
  }
}

// Block of kWarps warps (fp8_block_warps: 4 by default); warp w takes outputs
// o0..o0+OPW-1 and the block's R rows (grid.y: row groups).
// grid.z: independent groups (the grouped o-projection): group g uses weight rows g·out.., inputs
// g·K.. of each row (at x_group in the interleaved row, scales g·K/32..) and outputs g·out.. ; or,
// with pair.W set, z = 1 is a second linear of the same inputs (its own weights, outputs, y).
// kSink (v34, DSUF_WOB_INPUT=fused, the default, or fused_late; one row, OPW·kWarps = 32 outputs):
// the block also lays its 32 outputs out as one K-block of the next linear's input through `sink`
// (linear_input's arithmetic on the same rounded values: wo_a's outputs as wo_b's input, one launch
// fewer), triggering its dependents at entry (1) or at its end (2).
template <int OPW, int R, bool kExact, int kMode, int kWarps = 8, int kSink = 0, bool kInter = false>
__global__ void __launch_bounds__(kWarps > 8 ? 32 * kWarps : 256)
    k_fp8_gemv(const uint8_t* __restrict__ W, const uint8_t* __restrict__ Ws, int64_t out, int64_t K,
               const float* __restrict__ x, int64_t x_stride, int64_t x_group, const float* __restrict__ xs,
               int64_t xs_stride, int rows, float* __restrict__ y, int64_t y_stride, bool r, Fp8Pair pair, bool early,
               InputSink sink) {
  static_assert(kSink == 0 || (R == 1 && OPW * kWarps == 32), "a sink block's outputs are one K-block");
  const int nb = int(K / 32);
  fp8_slice(W, Ws, out, K, x, x_group, xs, y, y_stride, pair);
  const int row0 = blockIdx.y * R, nr = min(R, rows - row0);
  x += int64_t(row0) * x_stride, xs += int64_t(row0) * xs_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = (int64_t(blockIdx.x) * kWarps + warp) * OPW;
  if (kSink != 2) pdl_trigger();
  if (o0 >= out) return;  // (never with kSink: out is a multiple of 32, so no warp leaves the barrier)
  auto clamp = [&](int o) { return o0 + o < out ? o0 + o : out - 1; };  // a tail repeats the last row
  // The warp's rows o0..o0+OPW−1 (OPW divides 32, o0 a multiple of OPW; a clamped tail row is
  // out − 1 < o0 + OPW) lie in one 32-row scale block: one scale code a K-block for all of them.
  static_assert(32 % OPW == 0, "a warp's rows share a scale block");
  const uint8_t* __restrict__ ws_row = Ws + (o0 / 32) * nb;
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
  // Full rounds (every lane a K-block of each of the OPW rows), then the nb mod 32 last blocks of
  // each row spread over the lanes (see RemainderTasks), or, when they do not fit, taken by lanes
  // 0.. for all OPW rows as in the full rounds (kRegs, kRegsPipe).
  const RemainderTasks rt(nb, OPW, lane);
  uint4 tw[2];
  uint8_t tsc = 0;  // the task's scale code
  auto load_task = [&] {
    const uint8_t* wr = W + clamp(rt.row) * K + int64_t(rt.kb) * 32;
    tw[0] = __ldg(reinterpret_cast<const uint4*>(wr));
    tw[1] = __ldg(reinterpret_cast<const uint4*>(wr + 16));
    tsc = __ldg(ws_row + rt.kb);
  };
  // kDeep: a lane's K-blocks kb0, kb0 + 32, … (U of them) loaded at once.
  constexpr int U = kMode == kDeep ? deep_u<32 * OPW>() : 1;
  uint4 wu[U][OPW][2];
  float su[U][OPW];
  auto load_chunk = [&](int kb0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kb = kb0 + 32 * u;
      if (kb >= nb) break;
#pragma unroll
      for (int o = 0; o < OPW; ++o) {
        const uint8_t* wr = W + clamp(o) * K + int64_t(kb) * 32;
        wu[u][o][0] = __ldg(reinterpret_cast<const uint4*>(wr));
        wu[u][o][1] = __ldg(reinterpret_cast<const uint4*>(wr + 16));
      }
      const float s = e8m0(__ldg(ws_row + kb));
#pragma unroll
      for (int o = 0; o < OPW; ++o) su[u][o] = s;
    }
  };
  // Weights only before the wait (nothing in a step writes them). With `early` (DSUF_FP8_EARLY,
  // default 1), kRegs: the first round's weights and scale codes and the spread task's, so that
  // their DRAM round trip overlaps the previous kernel's run instead of following it; kDeep: its
  // first U rounds (a small linear's whole share: wq_a+wkv). kRegsPipe: the first round's weights.
  const bool first_early = kMode == kRegs && early;
  uint8_t sc0 = 0;
  if (kMode == kRegsPipe && lane < nb) load(lane);
  if (first_early) {
    if (!rt.ends_at(lane, nb)) {  // the lane has a full round (its first loop iteration uses these)
      load(lane);
      sc0 = __ldg(ws_row + lane);
    }
    if (rt.mine) load_task();
  }
  const bool chunk_early = kMode == kDeep && early;
  if (chunk_early) load_chunk(lane);
  pdl_wait();
  float acc[OPW][R];
#pragma unroll
  for (int o = 0; o < OPW; ++o)
#pragma unroll
    for (int rr = 0; rr < R; ++rr) acc[o][rr] = 0.0f;
  if (kMode == kDeep) {
    for (int kb0 = lane; kb0 < nb; kb0 += 32 * U) {
      if (!(chunk_early && kb0 == lane)) load_chunk(kb0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kb = kb0 + 32 * u;
        if (kb >= nb) break;
        fp8_kb_mac<OPW, R, kExact, false, kInter>(wu[u], su[u], x, x_stride, xs, xs_stride, kb, nr, acc);
      }
    }
  } else {
    // The spread task's weights are loaded with the first round's (kRegs, before the wait when
    // early; kRegsPipe when there is no full round), so its DRAM round trip overlaps theirs instead
    // of following the last round.
    if ((kMode == kRegs || rt.full == 0) && rt.mine && !first_early) load_task();
    const int kb_end = rt.end(nb);
    for (int kb = lane; kb < kb_end; kb += 32) {
      const bool pre = first_early && kb == lane;  // this round's bytes came before the wait
      if (kMode == kRegs && !pre) load(kb);
#pragma unroll
      for (int o = 0; o < OPW; ++o) w[o][0] = wn[o][0], w[o][1] = wn[o][1];
      if (kMode == kRegsPipe) rt.prefetch(kb, nb, load, load_task);
      const float s = e8m0(pre ? sc0 : __ldg(ws_row + kb));
#pragma unroll
      for (int o = 0; o < OPW; ++o) sw[o] = s;
      fp8_kb_mac<OPW, R, kExact, false, kInter>(w, sw, x, x_stride, xs, xs_stride, kb, nr, acc);
    }
    if (rt.spread) {
      float c[1][R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) c[0][rr] = 0.0f;
      if (rt.mine) {
        const uint4 tw1[1][2] = {{tw[0], tw[1]}};
        const float tsw[1] = {e8m0(tsc)};
        fp8_kb_mac<1, R, kExact, true, kInter>(tw1, tsw, x, x_stride, xs, xs_stride, rt.kb, nr, c);
      }
#pragma unroll
      for (int o = 0; o < OPW; ++o)
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const float v = __shfl_sync(0xffffffffu, c[0][rr], rt.source(o));
          if (rt.receives()) acc[o][rr] += v;
        }
    }
  }
  float vo[OPW];  // kSink: the warp's rounded outputs (R = 1)
#pragma unroll
  for (int o = 0; o < OPW; ++o)
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const float v = warp_sum(acc[o][rr]);
      if (rr == 0) vo[o] = rb(v, r);
      if (lane == 0 && rr < nr && o0 + o < out) y[int64_t(row0 + rr) * y_stride + o0 + o] = rb(v, r);
    }
  if constexpr (kSink != 0) {
    __shared__ float so[32];
    if (lane == 0)
#pragma unroll
      for (int o = 0; o < OPW; ++o) so[warp * OPW + o] = vo[o];
    __syncthreads();
    // Output blockIdx.x·32 + lane of group blockIdx.z is input column z·out + that of the next linear.
    if (warp == 0)
      emit_input(sink, int64_t(gridDim.z) * out, row0, int((int64_t(blockIdx.z) * out) / 32) + int(blockIdx.x), lane,
                 so[lane]);
  }
}

// ---- wo_a with its weights on the chip before its input (DSUF_WOA_PRELOAD, session 33) -------------
// The grouped o-projection follows the attention pair, a latency-bound stretch (~24 µs a layer at one
// row) during which DRAM idles; k_fp8_gemv's wo_a blocks, launched beside the P·V kernel under PDL,
// load only their first round before the dependency wait and stream the rest after it (12.2 µs from
// the P·V's end in v44's timeline). Here a block of 8 warps takes 32 rows — one K-block of wo_b's input,
// as k_fp8_gemv's kSink block — and before the wait bulk-copies its rows' first kPreRounds − 1 rounds
// (1 KB a row a round: 96 KB at K = 4,096) into shared memory and loads the last round's weights and
// every scale code into registers. 96 KB leaves room for the P·V kernel's 100 KB beside it, so one block
// an SM is on the chip, its weights loaded, when the P·V ends; the rest start as the P·V's blocks leave.
// After the wait a warp's 4 rows are k_fp8_gemv<…, kRegs>'s: the same block sums and terms
// (fp8_kb_mac) added from 0 in round order, warp_sum's tree, the rounding, and the sink's layout.
// Shapes (launch_fp8_sink): one row, K = 32·32·kPreRounds, out % 32 == 0.
constexpr int kPreWarps = 8, kPreOpw = 4, kPreRounds = 4;
constexpr size_t kPreSmem = size_t(32) * (kPreRounds - 1) * 1024;
template <bool kExact, bool kFma = kExact>
__global__ void __launch_bounds__(32 * kPreWarps) k_fp8_gemv_preload(const uint8_t* __restrict__ W,
                                                                    const uint8_t* __restrict__ Ws, int64_t out,
                                                                    int64_t K, const float* __restrict__ x,
                                                                    int64_t x_group, const float* __restrict__ xs,
                                                                    float* __restrict__ y, bool r, InputSink sink) {
  static_assert(kPreWarps * kPreOpw == 32, "a block's rows are one K-block of the next linear's input");
  constexpr int kPre = kPreRounds - 1;     // rounds in shared memory; the last one in registers
  constexpr int kRowBytes = kPre * 1024;   // a row's shared-memory share
  extern __shared__ __align__(128) uint8_t pre_sm[];  // [32 rows][kRowBytes]
  __shared__ __align__(8) uint64_t bar;
  __shared__ float so[32];
  const int nb = int(K / 32);
  int64_t y_stride = 0;
  fp8_slice(W, Ws, out, K, x, x_group, xs, y, y_stride, Fp8Pair{});
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b0 = int64_t(blockIdx.x) * 32, o0 = b0 + warp * kPreOpw;
  pdl_trigger();  // as k_fp8_gemv's kSink = 1: wo_b's blocks may launch
  const uint32_t sbar = smem_u32(&bar);
  if (threadIdx.x == 0) {
    mbar_init(sbar);
    mbar_init_fence();
  }
  __syncthreads();
  if (warp == 0) {  // lane L copies row b0 + L's first kPre rounds: one barrier phase for all 32
    if (lane == 0) mbar_expect_tx(sbar, 32u * kRowBytes);
    __syncwarp();
    bulk_copy(smem_u32(pre_sm + lane * kRowBytes), W + (b0 + lane) * K, uint32_t(kRowBytes), sbar);
  }
  // The last round's weights (K-block 32·kPre + lane of the warp's rows) and every scale code.
  const uint8_t* __restrict__ ws_row = Ws + (o0 / 32) * nb;
  // (In a basic block of their own — o0 < out always holds — so that ptxas, which moves the wait up
  // within its block, leaves them before it: scripts/wait_loads.py.)
  uint4 wl[kPreOpw][2] = {};
  uint8_t sc[kPreRounds] = {};
  if (o0 < out) {
#pragma unroll
    for (int o = 0; o < kPreOpw; ++o) {
      const uint8_t* wr = W + (o0 + o) * K + int64_t(32 * kPre + lane) * 32;
      wl[o][0] = __ldg(reinterpret_cast<const uint4*>(wr));
      wl[o][1] = __ldg(reinterpret_cast<const uint4*>(wr + 16));
    }
#pragma unroll
    for (int m = 0; m < kPreRounds; ++m) sc[m] = __ldg(ws_row + 32 * m + lane);
  }
  pdl_wait();
  float acc[kPreOpw][1];
#pragma unroll
  for (int o = 0; o < kPreOpw; ++o) acc[o][0] = 0.0f;
  mbar_wait(sbar, 0);
#pragma unroll
  for (int m = 0; m < kPreRounds; ++m) {
    uint4 w[kPreOpw][2];
#pragma unroll
    for (int o = 0; o < kPreOpw; ++o) {
      if (m < kPre) {
        const uint8_t* p = pre_sm + (warp * kPreOpw + o) * kRowBytes + m * 1024 + lane * 32;
        w[o][0] = *reinterpret_cast<const uint4*>(p);
        w[o][1] = *reinterpret_cast<const uint4*>(p + 16);
      } else {
        w[o][0] = wl[o][0], w[o][1] = wl[o][1];
      }
    }
    float sw[kPreOpw];
#pragma unroll
    for (int o = 0; o < kPreOpw; ++o) sw[o] = e8m0(sc[m]);
    fp8_kb_mac<kPreOpw, 1, kExact, false, false, kFma>(w, sw, x, 0, xs, 0, 32 * m + lane, 1, acc);
  }
#pragma unroll
  for (int o = 0; o < kPreOpw; ++o) {
    const float v = rb(warp_sum(acc[o][0]), r);
    if (lane == 0) {
      y[o0 + o] = v;
      so[warp * kPreOpw + o] = v;
    }
  }
  __syncthreads();
  // Output blockIdx.x·32 + lane of group blockIdx.z is input column z·out + that of the next linear.
  if (warp == 0)
    emit_input(sink, int64_t(gridDim.z) * out, 0, int((int64_t(blockIdx.z) * out) / 32) + int(blockIdx.x), lane,
               so[lane]);
}

// ---- One-row FP8 linears as a stream of tiles (DSUF_FP8_TILES) -----------------------------------
// k_fp8_gemv gives each warp of `wq_b` (K = 1,280: 40 K-blocks, one full round and the spread
// remainder) a single round: a DRAM round trip, then ~900 instructions, about half of them its
// prologue, addressing, task setup and trees (docs/perf.md v30), at 2 blocks an SM in ~4 waves that
// each pay the round trip again. Here a warp streams tiles of OPW rows (tile t, t + the grid's warps,
// …), each as its chunks: its full rounds (OPW rows × 1 KB, the 32 lanes' K-blocks of the round, with
// the round's 32 scale codes), the last one also carrying the remainder when nb mod 32 ≠ 0 (OPW rows ×
// rem K-blocks, spread over the lanes as RemainderTasks has it, with their codes: as a chunk of its
// own, wq_b's small remainder left a slot's worth less in flight, +0.08 ms a step). The chunks go
// through a ring of kStages slots of the warp's own in shared memory, filled by cp.async kStages − 1
// chunks ahead across tile boundaries; the input row is staged once a block (its interleaved layout,
// ≤ 32 KB). A row's sum is k_fp8_gemv<OPW, 1, kExact, kRegs>'s: the same block sums (fp8_kb_parts)
// and terms (fp8_kb_term) added from 0 in round order, the spread task's term added last by the lanes
// RemainderTasks names, warp_sum's tree. Shapes (fp8_tiles_fit): one row, one group, nb ≥ 32 with
// nb mod 4 = 0 and the remainder spread. Dynamic shared memory: fp8_tiles_smem.
// A slot: the round's rows at o·1024, the remainder's at OPW·1024 + o·rem·32, then the codes (the
// round's 32, the remainder's rem).
__host__ __device__ constexpr int64_t fp8_tiles_codes(int OPW, int64_t K) { return OPW * (1024 + (K / 32) % 32 * 32); }
__host__ __device__ constexpr int64_t fp8_tiles_slot(int OPW, int64_t K) { return fp8_tiles_codes(OPW, K) + 64; }
__host__ __device__ constexpr int64_t fp8_tiles_x_bytes(int64_t K) { return interleaved_k(K) * 4; }
size_t fp8_tiles_smem(int OPW, int warps, int stages, int64_t K, int R = 1) {
  return size_t(R * fp8_tiles_x_bytes(K) + int64_t(warps) * stages * fp8_tiles_slot(OPW, K));
}
// R = 1: at least 3 blocks of 8 warps an SM (what the shared memory of K = 8,192 allows) or 7 of 4
// (K ≤ 2,048). R > 1 (session 40, DSUF_FP8_TILES_ROWS): R input rows staged a block (grid.y: row
// groups of R), each chunk's weights decoded once for all of them and OPW·R chains a lane; grid.z:
// the groups of a grouped linear or a pair's two linears (fp8_slice), each slice its own tiles.
// kMinB (R > 1, DSUF_FP8_TILES_ROWS_REGS): at least kMinB blocks an SM by registers (4 of 4 warps, 2
// of 8, 1 of 16: 128 registers), so that more warps, and their chunks in flight, fit an SM.
template <int OPW, bool kExact, int kWarps, int kStages, int R = 1, int kMinB = 1, bool kFma = kExact>
__global__ void __launch_bounds__(32 * kWarps, R > 1 ? kMinB : kWarps == 8 ? 3 : 7)
    k_fp8_gemv_tiles(const uint8_t* __restrict__ W, const uint8_t* __restrict__ Ws, int64_t out, int64_t K,
                     const float* __restrict__ x, int64_t x_stride, int64_t x_group, const float* __restrict__ xs,
                     int64_t xs_stride, int rows, float* __restrict__ y, int64_t y_stride, bool r, Fp8Pair pair,
                     bool early) {
  static_assert(kStages >= 2, "a ring of at least two chunks");
  const int nb = int(K / 32), lane = threadIdx.x % 32;
  // (R = 1 takes no slices and one row: its code as before R existed, which the step measured
  // 0.05 ms faster at batch 1 than this block's general form.)
  int row0 = 0, nr = 1;
  if constexpr (R > 1) {
    fp8_slice(W, Ws, out, K, x, x_group, xs, y, y_stride, pair);
    row0 = int(blockIdx.y) * R, nr = min(R, rows - row0);
    x += int64_t(row0) * x_stride, xs += int64_t(row0) * xs_stride;
  }
  const int full = nb / 32, rem = nb % 32;  // a tile's chunks: its full rounds
  const int64_t slot_bytes = fp8_tiles_slot(OPW, K), codes = fp8_tiles_codes(OPW, K);
  const int64_t tiles = (out + OPW - 1) / OPW, nw = int64_t(gridDim.x) * kWarps;
  const int64_t t0 = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  pdl_trigger();
  const bool active = t0 < tiles;  // (only the last block's last warps are not: they stage and leave)
  const RemainderTasks rt(nb, OPW, lane);  // the remainder spread (fp8_tiles_fit)
  extern __shared__ __align__(16) uint8_t fp8_smem[];
  // The input rows, interleaved (xpos4), fp8_tiles_x_bytes(K) apart; rows past nr are row 0 (their
  // sums are dropped).
  const float4* xsm[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr)
    xsm[rr] = reinterpret_cast<const float4*>(fp8_smem + (rr < nr ? rr : 0) * fp8_tiles_x_bytes(K));
  uint8_t* const ring = fp8_smem + R * fp8_tiles_x_bytes(K) + int64_t(threadIdx.x / 32) * kStages * slot_bytes;
  // The next chunk to issue: part ip of tile it, from the tile's rows at this lane's 16-byte offset
  // (src) and its scale codes (csrc), advanced a chunk at a time; the row clamp and 64-bit row
  // arithmetic once a tile (session 28: they were redone for every chunk, ~30 of the ~270
  // instructions a lane spends on a chunk). Each issue is one commit group (empty past the last tile).
  int64_t it = t0;
  int ip = 0;
  const uint8_t* src[OPW];
  const uint8_t* csrc = nullptr;
  auto set_tile = [&] {
    const int64_t o0 = it * OPW;
#pragma unroll
    for (int o = 0; o < OPW; ++o) src[o] = W + (o0 + o < out ? o0 + o : out - 1) * K + 16 * lane;
    csrc = Ws + (o0 / 32) * nb + 4 * lane;
  };
  if (active) set_tile();
  const uint32_t ring_u32 = smem_u32(ring);
  // The slot's layout is fp8_tiles_slot's; the last chunk of a tile also carries the remainder (rem
  // K-blocks of each row after its full rounds, and their rem codes after the round's 32).
  auto issue_next = [&](int slot) {
    if (it < tiles) {
      const uint32_t dst = ring_u32 + uint32_t(slot * slot_bytes);
      const bool last = ip == full - 1 && rem > 0;
#pragma unroll
      for (int o = 0; o < OPW; ++o) {
        cp_async16_to(dst + uint32_t(o * 1024 + 16 * lane), src[o]);
        cp_async16_to(dst + uint32_t(o * 1024 + 512 + 16 * lane), src[o] + 512);
        if (last)  // the row's remainder starts 1 KB past this chunk's start (src[o] − 16·lane)
          for (int c = lane; c < 2 * rem; c += 32)
            cp_async16_to(dst + uint32_t(OPW * 1024 + o * rem * 32 + 16 * c), src[o] + 1024 + 16 * (c - lane));
      }
      if (lane < 8) cp_async4_to(dst + uint32_t(codes + 4 * lane), csrc);
      if (last && lane < rem / 4) cp_async4_to(dst + uint32_t(codes + 32 + 4 * lane), csrc + 32);
#pragma unroll
      for (int o = 0; o < OPW; ++o) src[o] += 1024;
      csrc += 32;
      if (++ip == full) {
        ip = 0, it += nw;
        if (it < tiles) set_tile();
      }
    }
    cp_async_commit();
  };
  if (active && early)
    for (int q = 0; q < kStages - 1; ++q) issue_next(q);  // weights only before the wait
  pdl_wait();
  if (active && !early)
    for (int q = 0; q < kStages - 1; ++q) issue_next(q);
  if constexpr (R == 1) {
    for (int i = threadIdx.x; i < interleaved_k(K) / 4; i += 32 * kWarps)
      reinterpret_cast<float4*>(fp8_smem)[i] = __ldg(reinterpret_cast<const float4*>(x) + i);
  } else {
    for (int rr = 0; rr < nr; ++rr) {
      float4* const xd = reinterpret_cast<float4*>(fp8_smem + rr * fp8_tiles_x_bytes(K));
      const float4* const xg = reinterpret_cast<const float4*>(x + rr * x_stride);
      for (int i = threadIdx.x; i < interleaved_k(K) / 4; i += 32 * kWarps) xd[i] = __ldg(xg + i);
    }
  }
  __syncthreads();
  if (!active) return;
  float sat[R];  // the spread task's input scales
#pragma unroll
  for (int rr = 0; rr < R; ++rr) sat[rr] = kExact && rt.mine ? __ldg(xs + (rr < nr ? rr : 0) * xs_stride + rt.kb) : 1.0f;
  float acc[OPW][R];
#pragma unroll
  for (int o = 0; o < OPW; ++o)
#pragma unroll
    for (int rr = 0; rr < R; ++rr) acc[o][rr] = 0.0f;
  int64_t t = t0;
  int part = 0;
  for (int s = 0;; s = s + 1 == kStages ? 0 : s + 1) {
    cp_async_wait_group<kStages - 2>();
    __syncwarp();
    const uint8_t* slot = ring + s * slot_bytes;
    uint4 w[OPW][2], tw[1][2];
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      w[o][0] = *reinterpret_cast<const uint4*>(slot + o * 1024 + 32 * lane);
      w[o][1] = *reinterpret_cast<const uint4*>(slot + o * 1024 + 32 * lane + 16);
    }
    const uint32_t sc = slot[codes + lane];
    const bool last = part == full - 1 && rem > 0;
    uint32_t tsc = 0;
    if (last && rt.mine) {
      const int j = rt.kb - 32 * full;
      tw[0][0] = *reinterpret_cast<const uint4*>(slot + OPW * 1024 + rt.row * rem * 32 + 32 * j);
      tw[0][1] = *reinterpret_cast<const uint4*>(slot + OPW * 1024 + rt.row * rem * 32 + 32 * j + 16);
      tsc = slot[codes + 32 + j];
    }
    __syncwarp();
    issue_next(s == 0 ? kStages - 1 : s - 1);  // the slot read last
    {
      const int kb = 32 * part + lane;
      const float sw = e8m0(uint8_t(sc));
      if constexpr (R == 1) {
        float4 xv[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) xv[j] = xsm[0][xpos4(kb, j)];
        float p[OPW];
        fp8_kb_parts<OPW, kExact, kFma>(w, xv, p);
        const float sa = kExact ? __ldg(xs + kb) : 1.0f;
#pragma unroll
        for (int o = 0; o < OPW; ++o) acc[o][0] = acc[o][0] + fp8_kb_term<kExact>(p[o], sa, sw);
      } else {
        float p[OPW][R];
        fp8_kb_parts_rows<OPW, R, kExact, kFma>(w, [&](int rr, int j) { return xsm[rr][xpos4(kb, j)]; }, p);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const float sa = kExact ? __ldg(xs + (rr < nr ? rr : 0) * xs_stride + kb) : 1.0f;
#pragma unroll
          for (int o = 0; o < OPW; ++o) acc[o][rr] = acc[o][rr] + fp8_kb_term<kExact>(p[o][rr], sa, sw);
        }
      }
    }
    if (last) {
      float ct[R];
#pragma unroll
      for (int rr = 0; rr < R; ++rr) ct[rr] = 0.0f;
      if (rt.mine) {
        if constexpr (R == 1) {
          float4 xt[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) xt[j] = xsm[0][xpos4(rt.kb, j)];
          float tp[1];
          fp8_kb_parts<1, kExact, kFma>(tw, xt, tp);
          ct[0] = fp8_kb_term<kExact>(tp[0], sat[0], e8m0(uint8_t(tsc)));
        } else {
          float tp[1][R];
          fp8_kb_parts_rows<1, R, kExact, kFma>(tw, [&](int rr, int j) { return xsm[rr][xpos4(rt.kb, j)]; }, tp);
#pragma unroll
          for (int rr = 0; rr < R; ++rr) ct[rr] = fp8_kb_term<kExact>(tp[0][rr], sat[rr], e8m0(uint8_t(tsc)));
        }
      }
#pragma unroll
      for (int o = 0; o < OPW; ++o)
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const float v = __shfl_sync(0xffffffffu, ct[rr], rt.source(o));
          if (rt.receives()) acc[o][rr] += v;
        }
    }
    if (++part < full) continue;
    const int64_t o0 = t * OPW;
    if constexpr (R > 1 && OPW * R % 8 == 0) {
      // Eight sums at a time by one reduce-scatter butterfly (warp_sum's tree, so the same bits: 9
      // shuffles for 8 sums instead of 40); sum c·8 + h lands in lanes 4h … 4h + 3. Session 41:
      // batch 4 −0.50 ms a step, 16 −2.5 (with OPW auto) against 8 warp_sums.
#pragma unroll
      for (int c = 0; c < OPW * R / 8; ++c) {
        float v8[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v8[u] = acc[(8 * c + u) / R][(8 * c + u) % R];
        const float v = warp_sum8_scatter(v8, lane);
        const int q = 8 * c + ((lane >> 2) & 7), o = q / R, rr = q % R;
        if ((lane & 3) == 0 && rr < nr && o0 + o < out) y[int64_t(row0 + rr) * y_stride + o0 + o] = rb(v, r);
      }
#pragma unroll
      for (int o = 0; o < OPW; ++o)
#pragma unroll
        for (int rr = 0; rr < R; ++rr) acc[o][rr] = 0.0f;
    } else {
#pragma unroll
      for (int o = 0; o < OPW; ++o)
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const float v = warp_sum(acc[o][rr]);
          if (lane == 0 && rr < nr && o0 + o < out) y[(R > 1 ? int64_t(row0 + rr) * y_stride : 0) + o0 + o] = rb(v, r);
          acc[o][rr] = 0.0f;
        }
    }
    part = 0;
    if ((t += nw) >= tiles) break;
  }
}

// ---- FP8 linears of many rows: a tiled GEMM with the GEMV's bits --------------------------------
// k_fp8_gemv reads each weight once per R ≤ 4 rows, so a 512-row prefill chunk reads every dense
// weight 128 times and is bound by instruction issue at ~7 TFLOP/s. This kernel stages a K-block of
// TO weight rows (decoded once) and of TR input rows in shared memory and each thread computes a
// 4 × 4 tile of (output, row) sums from there. The bits are the GEMV's: every (output, row) sum is
// computed with the same operations in the same order —
//   block part  p = x₀w₀ + x₁w₁ + … + x₃₁w₃₁ in element order (fp8_kb_mac: fmaf when the inputs are
//               quantized, a rounded product and a rounded add otherwise), then c = (p·2⁻⁶⁴)·(s_a·s_w);
//   lane sum    a_l = ((0 + c_l) + c_{l+32}) + …, over the K-blocks kb ≡ l (mod 32) in order;
//   warp tree   warp_sum's xor tree over l: ((a₀ + a₁₆) + (a₈ + a₂₄)) + … .
// So the K-blocks are visited class by class, l in 5-bit bit-reversed order (0, 16, 8, 24, 4, …),
// and each finished class sum is pushed onto a binary-counter stack (one slot per tree level), which
// adds the pairs the tree adds, in its order. Grid: (outputs / TO, rows / TR, groups or pair) as
// k_fp8_gemv's; 256 threads, thread t: outputs 4·(t mod TO/4).., rows 4·(t / (TO/4))...
// The tile, TO outputs × TR rows (TO · TR = 4096, a thread 4 × 4 of them): 128 × 32 (the default),
// where a warp's 32 threads share their 4 rows, so that each k step's input load is one broadcast and
// only the weights spread over the banks, or 64 × 64 (DSUF_FP8_GEMM_TILE=64x64, the first version,
// measured shared-memory bound; 2 % slower on a 2,048-token prefill: docs/perf.md v15).
template <bool kExact, int TO, int TR>
__global__ void __launch_bounds__(256) k_fp8_gemm(const uint8_t* __restrict__ W, const uint8_t* __restrict__ Ws,
                                                   int64_t out, int64_t K, const float* __restrict__ x,
                                                   int64_t x_stride, int64_t x_group, const float* __restrict__ xs,
                                                   int64_t xs_stride, int rows, float* __restrict__ y,
                                                   int64_t y_stride, bool r, Fp8Pair pair) {
  static_assert(TO * TR == 4096 && TR * 8 % 256 == 0, "256 threads of 4 × 4 sums");
  constexpr int XU = TR * 8 / 256;  // input float4 a thread
  const int nb = int(K / 32);
  fp8_slice(W, Ws, out, K, x, x_group, xs, y, y_stride, pair);
  const int64_t o_base = int64_t(blockIdx.x) * TO;
  if (o_base >= out) return;
  const int row0 = blockIdx.y * TR, nr = min(TR, rows - row0);
  x += int64_t(row0) * x_stride;
  if (kExact) xs += int64_t(row0) * xs_stride;
  __shared__ __align__(16) float wsm[2][32][TO + 4];  // [stage][element k][output]: decoded weights
  __shared__ __align__(16) float xsm[2][32][TR + 4];  // [stage][element k][row]
  __shared__ float ssa[2][TR], ssw[2][TO / 32];       // input scales per row, weight scales per 32 outputs
  const int tid = threadIdx.x, to = tid % (TO / 4), tr = tid / (TO / 4);
  // Loader roles: every thread 16 weight bytes (output tid/2, half tid%2) and XU float4 of inputs
  // (row idx/8, float4 idx%8); threads 0..TR-1 a row's scale, the next TO/32 a weight-scale group's.
  // Two register sets, so that a K-block's loads are issued two K-blocks before it is staged.
  struct Regs {
    uint4 w;
    float4 x[XU];
    float s;
  };
  auto load = [&](Regs& g, int kb) {
    if (tid < 2 * TO) {
      const int64_t o = min(o_base + tid / 2, out - 1);
      g.w = __ldg(reinterpret_cast<const uint4*>(W + o * K + int64_t(kb) * 32 + 16 * (tid % 2)));
    }
#pragma unroll
    for (int u = 0; u < XU; ++u) {
      const int idx = tid + 256 * u, rr = idx / 8, j = idx % 8;
      g.x[u] = rr < nr ? __ldg(reinterpret_cast<const float4*>(x + rr * x_stride) + xpos4(kb, j))
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (tid < TR) g.s = kExact && tid < nr ? __ldg(xs + tid * xs_stride + kb) : 1.0f;
    else if (tid < TR + TO / 32) g.s = e8m0(__ldg(Ws + (min(o_base + 32 * (tid - TR), out - 1) / 32) * nb + kb));
  };
  auto store = [&](int b, const Regs& g) {
    if (tid < 2 * TO) {
      const int o = tid / 2, k0 = 16 * (tid % 2);
      const uint32_t wd[4] = {g.w.x, g.w.y, g.w.z, g.w.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float a, bb, c, d;
        e4m3x4(wd[q], a, bb, c, d);
        wsm[b][k0 + 4 * q][o] = a, wsm[b][k0 + 4 * q + 1][o] = bb, wsm[b][k0 + 4 * q + 2][o] = c;
        wsm[b][k0 + 4 * q + 3][o] = d;
      }
    }
#pragma unroll
    for (int u = 0; u < XU; ++u) {
      const int idx = tid + 256 * u, rr = idx / 8, j = idx % 8;
      xsm[b][4 * j][rr] = g.x[u].x, xsm[b][4 * j + 1][rr] = g.x[u].y;
      xsm[b][4 * j + 2][rr] = g.x[u].z, xsm[b][4 * j + 3][rr] = g.x[u].w;
    }
    if (tid < TR) ssa[b][tid] = g.s;
    else if (tid < TR + TO / 32) ssw[b][tid - TR] = g.s;
  };
  // The K-blocks in the visiting order of core/class_tree.h, the sums through its ClassTree.
  using det::ClassCursor;
  auto advance = [&](ClassCursor c) { return det::class_advance(c, nb); };
  auto kb_of = [](ClassCursor c) { return det::class_kb(c); };
  det::ClassTree<16> tree;
  float(&acc)[16] = tree.acc;
  Regs ga, gb;
  ClassCursor cur, la = cur;  // la: the K-block whose loads are issued next
  load(ga, kb_of(la));
  store(0, ga);
  if (nb > 1) la = advance(la), load(ga, kb_of(la));
  if (nb > 2) la = advance(la), load(gb, kb_of(la));
  __syncthreads();
  // Step t: compute K-block t (stage t mod 2) while set `mine` holds t+1 and `other` t+2; stage t+1,
  // then reload `mine` with t+3.
  auto step = [&](int t, Regs& mine) {
    const int b = t & 1;
    const ClassCursor nx = advance(cur);
    const bool more = t + 1 < nb;
    float part[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) part[e] = 0.0f;
#pragma unroll 8
    for (int k = 0; k < 32; ++k) {
      const float4 wv = *reinterpret_cast<const float4*>(&wsm[b][k][4 * to]);
      const float4 xv = *reinterpret_cast<const float4*>(&xsm[b][k][4 * tr]);
      const float wf[4] = {wv.x, wv.y, wv.z, wv.w}, xf[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) part[4 * i + j] = mac_v<kExact>(part[4 * i + j], xf[j], wf[i]);
    }
    const float sw = ssw[b][to / 8];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = part[4 * i + j];
        acc[4 * i + j] += (kExact ? p * 0x1p-64f : p) * (ssa[b][4 * tr + j] * sw);
      }
    if (more) store(b ^ 1, mine);
    __syncthreads();
    if (t + 3 < nb) la = advance(la), load(mine, kb_of(la));
    if (nx.i != cur.i || !more) {  // class cur.i is complete: push it and the empty classes up to the next
      tree.push(cur.i);
      for (int i = cur.i + 1; i < (more ? nx.i : 32); ++i) tree.push(i);
    }
    cur = nx;
  };
  for (int t = 0; t < nb; t += 2) {
    step(t, ga);
    if (t + 1 < nb) step(t + 1, gb);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t o = o_base + 4 * to + i;
      const int rr = 4 * tr + j;
      if (o < out && rr < nr) y[int64_t(row0 + rr) * y_stride + o] = rb(acc[4 * i + j], r);
    }
}

// Row `row`'s expert weights and scale codes; the ids come from this step's router, so it waits
// for the previous kernel (programmatic dependent launch) first.
struct RoutedExpert {
  const uint8_t* W;
  const uint8_t* S;
};
__device__ __forceinline__ RoutedExpert routed_expert(const uint8_t* const* W, const uint8_t* const* Ws,
                                                      const int32_t* ids, int row) {
  pdl_wait();
  const int e = ids ? ids[row] : 0;
  return {W[e], Ws[e]};
}

// Grouped FP4 (experts): grid.y = rows; row i uses expert ids[i] and input row i / x_div; grid.z = 2
// for a pair (pair: the second weights and outputs). Each packed byte holds two inputs' weights, low
// nibble first; they are added one after the other.
template <int OPW, bool kExact, int kMode>
__global__ void __launch_bounds__(256) k_fp4_gemv(const uint8_t* const* W, const uint8_t* const* Ws,
                                                   const int32_t* ids, int64_t out, int64_t K, const float* x,
                                                   int64_t x_stride, const float* xs, int64_t xs_stride,
                                                   const uint8_t* xp, int64_t xp_stride, int x_div,
                                                   float* y, bool r, Fp4Pair pair) {
  const int nb = int(K / 32);
  const int row = blockIdx.y;
  if (blockIdx.z == 1) W = pair.W, Ws = pair.Ws, y = pair.y;  // the second linear of a pair
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = (int64_t(blockIdx.x) * 8 + warp) * OPW;
  const int64_t row_bytes = K / 2;
  pdl_trigger();
  if (o0 >= out) return;
  const auto [We, Se] = routed_expert(W, Ws, ids, row);
  x += int64_t(row / x_div) * x_stride, xs += int64_t(row / x_div) * xs_stride;
  if (kExact) xp += int64_t(row / x_div) * xp_stride;
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
        fp4_kb_mac<OPW, kExact>(wu[u], su[u], x, xs, xp, kb, acc);
      }
    }
  } else {
    const RemainderTasks rt(nb, OPW, lane);  // as in k_fp8_gemv
    uint4 tw = make_uint4(0, 0, 0, 0);
    uint8_t tsc = 0;
    auto load_task = [&] {
      tw = __ldg(reinterpret_cast<const uint4*>(We + clamp(rt.row) * row_bytes + int64_t(rt.kb) * 16));
      tsc = __ldg(Se + clamp(rt.row) * nb + rt.kb);
    };
    if ((kMode == kRegs || rt.full == 0) && rt.mine) load_task();  // as in k_fp8_gemv
    const int kb_end = rt.end(nb);
    for (int kb = lane; kb < kb_end; kb += 32) {
      if (kMode == kRegs) load(kb);
#pragma unroll
      for (int o = 0; o < OPW; ++o) w[o] = wn[o];
      if (kMode == kRegsPipe) rt.prefetch(kb, nb, load, load_task);
#pragma unroll
      for (int o = 0; o < OPW; ++o) sw[o] = e8m0(__ldg(Se + clamp(o) * nb + kb));
      fp4_kb_mac<OPW, kExact>(w, sw, x, xs, xp, kb, acc);
    }
    if (rt.spread) {
      float c[1] = {0.0f};
      if (rt.mine) {
        const uint4 tw1[1] = {tw};
        const float tsw[1] = {e8m0(tsc)};
        fp4_kb_mac<1, kExact, true>(tw1, tsw, x, xs, xp, rt.kb, c);
      }
#pragma unroll
      for (int o = 0; o < OPW; ++o) {
        const float v = __shfl_sync(0xffffffffu, c[0], rt.source(o));
        if (rt.receives()) acc[o] += v;
      }
    }
  }
#pragma unroll
  for (int o = 0; o < OPW; ++o) {
    const float v = warp_sum(acc[o]);
    if (lane == 0 && o0 + o < out) y[int64_t(row) * out + o0 + o] = rb(v, r);
  }
}

// Group gi of RowGroups: its expert's weights and scale codes, its first slot in `order`, its rows.
struct ExpertGroup {
  const uint8_t* W;
  const uint8_t* S;
  int first, cnt;
};
__device__ __forceinline__ ExpertGroup expert_group(const uint8_t* const* W, const uint8_t* const* Ws,
                                                    const int32_t* __restrict__ groups, int gi) {
  const int e = groups[3 * gi], first = groups[3 * gi + 1], cnt = groups[3 * gi + 2];
  return {W[e], Ws[e], first, cnt};
}

// Grouped FP4 for many rows (prefill chunks, large batches; fp4_linear_grouped with RowGroups):
// grid.y = row groups of one expert (RowGroups: [expert, first, count ≤ R] into order), so that each
// warp loads a K-block's weights once for up to R rows. Per row the arithmetic and order of
// k_fp4_gemv — lane l adds K-blocks l, l+32, … in order, then the warp tree — so the same bits.
template <int OPW, int R, bool kExact>
__global__ void __launch_bounds__(256) k_fp4_gemv_rows(const uint8_t* const* W, const uint8_t* const* Ws,
                                                        const int32_t* __restrict__ groups,
                                                        const int32_t* __restrict__ n_groups,
                                                        const int32_t* __restrict__ order, int64_t out, int64_t K,
                                                        const float* x, int64_t x_stride, const float* xs,
                                                        int64_t xs_stride, const uint8_t* xp, int64_t xp_stride,
                                                        int x_div, float* y, bool r, Fp4Pair pair) {
  const int nb = int(K / 32);
  const int gi = blockIdx.y;
  if (blockIdx.z == 1) W = pair.W, Ws = pair.Ws, y = pair.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = (int64_t(blockIdx.x) * 8 + warp) * OPW;
  const int64_t row_bytes = K / 2;
  pdl_trigger();
  if (o0 >= out) return;
  pdl_wait();  // the groups come from this step's router
  if (gi >= *n_groups) return;
  const auto [We, Se, first, cnt] = expert_group(W, Ws, groups, gi);
  int rows[R];
#pragma unroll
  for (int rr = 0; rr < R; ++rr) rows[rr] = order[first + min(rr, cnt - 1)];
  auto clamp = [&](int o) { return o0 + o < out ? o0 + o : out - 1; };
  float acc[R][OPW];
#pragma unroll
  for (int rr = 0; rr < R; ++rr)
#pragma unroll
    for (int o = 0; o < OPW; ++o) acc[rr][o] = 0.0f;
  for (int kb = lane; kb < nb; kb += 32) {
    uint4 w[OPW];
    float sw[OPW];
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      w[o] = __ldg(reinterpret_cast<const uint4*>(We + clamp(o) * row_bytes + int64_t(kb) * 16));
      sw[o] = e8m0(__ldg(Se + clamp(o) * nb + kb));
    }
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      if (rr >= cnt) break;  // cnt is the block's
      const int64_t in_row = rows[rr] / x_div;
      fp4_kb_mac<OPW, kExact>(w, sw, x + in_row * x_stride, xs + in_row * xs_stride,
                              kExact ? xp + in_row * xp_stride : xp, kb, acc[rr]);
    }
  }
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    if (rr >= cnt) break;
#pragma unroll
    for (int o = 0; o < OPW; ++o) {
      const float v = warp_sum(acc[rr][o]);
      if (lane == 0 && o0 + o < out) y[int64_t(rows[rr]) * out + o0 + o] = rb(v, r);
    }
  }
}

// RowGroups from ids, one block of kGroupThreads: counts per expert by shared-memory atomics, then
// thread t takes experts [t·per, (t+1)·per) — their rows and groups (packed as rows·2^32 + groups),
// exclusive-scanned across the block, give its first position and group — lays them out in expert
// order and cuts each into groups of at most R; then every row takes a slot of its expert. The order
// within an expert is whatever the atomics give: each row is computed on its own. (Until session 23
// thread 0 walked every expert: 9 µs a launch at 96 experts; the scan measured ±0 in the step.)
constexpr int kGroupThreads = 256;
__global__ void __launch_bounds__(kGroupThreads) k_group_rows(const int32_t* __restrict__ ids, int rows, int E, int R,
                                                              int32_t* order, int32_t* groups, int32_t* n_groups) {
  pdl_entry();
  using Scan = cub::BlockScan<long long, kGroupThreads>;
  __shared__ typename Scan::TempStorage scan;
  extern __shared__ int32_t gsm[];  // counts[E], then cursor[E]
  int32_t* counts = gsm;
  int32_t* cursor = gsm + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < rows; i += blockDim.x) atomicAdd(&counts[ids[i]], 1);
  __syncthreads();
  const int per = (E + kGroupThreads - 1) / kGroupThreads;
  const int e0 = min(E, int(threadIdx.x) * per), e1 = min(E, e0 + per);
  long long mine = 0;
  for (int e = e0; e < e1; ++e) mine += (static_cast<long long>(counts[e]) << 32) + (counts[e] + R - 1) / R;
  long long before = 0, total = 0;
  Scan(scan).ExclusiveSum(mine, before, total);
  int pos = int(before >> 32), ng = int(before & 0xffffffffLL);
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e];
    cursor[e] = pos;
    for (int s0 = 0; s0 < c; s0 += R, ++ng)
      groups[3 * ng] = e, groups[3 * ng + 1] = pos + s0, groups[3 * ng + 2] = min(R, c - s0);
    pos += c;
  }
  if (threadIdx.x == 0) *n_groups = int(total & 0xffffffffLL);
  __syncthreads();
  for (int i = threadIdx.x; i < rows; i += blockDim.x) order[atomicAdd(&cursor[ids[i]], 1)] = i;
}

// The quantized FP4 linear by integer MMAs (DSUF_FP4=mma): a block per 16 output rows, a warp per
// round of 32 K-blocks (K up to 8192: 8 warps). Per K-block one mma.m16n8k32 s8×u8 pair gives the 16
// rows' exact block sums S at once (the weights' block as A, the input planes as B's columns:
// core/fp4_dp4a.h, det::fp4_mma_a; emulated on the host by fp4_int_tests). Each warp loads its
// round 8 K-blocks at a time, the next 8 before the current 8's MMAs (rows g and g+8's word q: two
// 4-byte loads a lane; the plane: one 8-byte load), and its lane l's scales (K-block 32w + l, 16
// rows) first of all; then lane l turns its K-block's 16 S into part·(s_a·s_w) (the same expression
// as k_fp4_gemv), and after a barrier warp 0's lane l adds rounds 0, 1, … of each row in order —
// K-blocks l, l+32, …, the reference's lane order — and the warp tree ends it as before.
// (The first version, a warp per 16 rows over every round with the batches' loads not overlapped,
// was exact and slower: docs/perf.md v13.)
constexpr int kMmaMaxRounds = 8;
__device__ __forceinline__ void mma_s8u8(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(  // not volatile: no side effects, so the compiler may overlap independent MMAs
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__global__ void __launch_bounds__(32 * kMmaMaxRounds) k_fp4_mma(const uint8_t* const* W, const uint8_t* const* Ws,
                                                              const int32_t* ids, int64_t out, int64_t K,
                                                              const float* __restrict__ xs, int64_t xs_stride,
                                                              const uint8_t* __restrict__ xp, int64_t xp_stride,
                                                              int x_div, float* y, bool r, Fp4Pair pair) {
  constexpr int U = 8;  // K-blocks a batch
  const int nb = int(K / 32);
  const int row = blockIdx.y;
  if (blockIdx.z == 1) W = pair.W, Ws = pair.Ws, y = pair.y;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int rounds = int(blockDim.x / 32);  // ⌈nb / 32⌉
  const int64_t o0 = int64_t(blockIdx.x) * 16;
  const int64_t row_bytes = K / 2;
  __shared__ int32_t sS[kMmaMaxRounds][16][33];  // [round][row][kb mod 32]: S, then c (padded: no conflicts)
  pdl_trigger();
  const auto [We, Se] = routed_expert(W, Ws, ids, row);
  xs += int64_t(row / x_div) * xs_stride, xp += int64_t(row / x_div) * xp_stride;
  auto clamp = [&](int64_t o) { return o < out ? o : out - 1; };  // a tail repeats the last row
  const int kb0 = 32 * w, kn = min(32, nb - kb0);
  // Lane l's K-block of the round: its input scale and the 16 rows' weight scale codes, first.
  float s_a = 0.0f;
  uint8_t swc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) swc[i] = 0;
  if (lane < kn) {
    s_a = __ldg(xs + kb0 + lane);
#pragma unroll
    for (int i = 0; i < 16; ++i) swc[i] = __ldg(Se + clamp(o0 + i) * nb + kb0 + lane);
  }
  const uint8_t* wg = We + clamp(o0 + g) * row_bytes + 4 * q;
  const uint8_t* wg8 = We + clamp(o0 + g + 8) * row_bytes + 4 * q;
  // B column n = g: plane g's bytes 8q..8q+7 (piece 2g + q/2 of the K-block, at byte 8·(q mod 2)).
  const uint8_t* bp = xp + 8 * (q % 2);
  const uint32_t bconst = g == 3 ? 0x01010101u : 0u;  // column 3 ones, 4..7 zeros
  int32_t(*S)[33] = sS[w];
  auto load = [&](int j, uint32_t(&wa)[U], uint32_t(&wb)[U], uint2(&bv)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kb = kb0 + j + u;
      if (j + u < kn) {
        wa[u] = __ldg(reinterpret_cast<const uint32_t*>(wg + int64_t(kb) * 16));
        wb[u] = __ldg(reinterpret_cast<const uint32_t*>(wg8 + int64_t(kb) * 16));
        bv[u] = g < 3 ? __ldg(reinterpret_cast<const uint2*>(bp + ppos16(kb, 2 * g + q / 2) * 16))
                      : make_uint2(bconst, bconst);
      }
    }
  };
  auto compute = [&](int j, const uint32_t(&wa)[U], const uint32_t(&wb)[U], const uint2(&bv)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (j + u >= kn) break;  // kn is the warp's: every lane takes the MMAs together
      uint32_t b0 = bv[u].x, b1 = bv[u].y;
      if (g == 2) b0 = det::fp4_mma_hi4(b0), b1 = det::fp4_mma_hi4(b1);
      det::Fp4MmaA a;
      det::fp4_mma_a(wa[u], wb[u], a);
      int32_t d[4] = {0, 0, 0, 0};
      mma_s8u8(d, a.pos, b0, b1);
      mma_s8u8(d, a.neg, b0, b1);
      // Lane (g, 0) holds columns lo, mid of rows g and g+8; lane (g, 1) hi+4 and ones.
      const uint32_t hi0 = (uint32_t(d[0]) - 4u * uint32_t(d[1])) << 16;
      const uint32_t hi2 = (uint32_t(d[2]) - 4u * uint32_t(d[3])) << 16;
      const uint32_t f0 = __shfl_down_sync(0xffffffffu, hi0, 1), f2 = __shfl_down_sync(0xffffffffu, hi2, 1);
      if (q == 0) {
        S[g][j + u] = int32_t(uint32_t(d[0]) + (uint32_t(d[1]) << 8) + f0);
        S[g + 8][j + u] = int32_t(uint32_t(d[2]) + (uint32_t(d[3]) << 8) + f2);
      }
    }
  };
  uint32_t wa0[U], wb0[U], wa1[U], wb1[U];
  uint2 bv0[U], bv1[U];
  load(0, wa0, wb0, bv0);
  for (int j = 0; j < kn; j += 2 * U) {  // two batches a turn, so that the buffers stay registers
    if (j + U < kn) load(j + U, wa1, wb1, bv1);
    compute(j, wa0, wb0, bv0);
    if (j + U >= kn) break;
    if (j + 2 * U < kn) load(j + 2 * U, wa0, wb0, bv0);
    compute(j + U, wa1, wb1, bv1);
  }
  __syncwarp();
  if (lane < kn) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float c = det::fp4_act_block_part(S[i][lane]) * (s_a * e8m0(swc[i]));
      S[i][lane] = __float_as_int(c);
    }
  }
  __syncthreads();
  if (w != 0) return;
#pragma unroll 1
  for (int i = 0; i < 16; ++i) {
    float acc = 0.0f;
    for (int v = 0; v < rounds; ++v)
      if (32 * v + lane < nb) acc = acc + __int_as_float(sS[v][i][lane]);
    const float s = warp_sum(acc);
    if (lane == 0 && o0 + i < out) y[int64_t(row) * out + o0 + i] = rb(s, r);
  }
}

// The quantized FP4 linear by integer MMAs with the weights staged through shared memory
// (DSUF_FP4=imma; opt-in until measured): a block of kImmaWarps warps, a warp per 16 output rows
// over the whole K. Each warp streams its rows through a ring of kImmaStages stages in shared
// memory by cp.async (a stage: 2 K-blocks × 16 rows × 16 bytes, one 16-byte copy a lane, 7 stages
// in flight) and reads a stage back with one ldmatrix.x4, which hands lane (g, q) word q of rows g
// and g+8 of both K-blocks — the A fragment layout of k_fp4_mma (det::fp4_mma_a). The block stages
// the input row's byte planes once (plane 2 as hi + 4, a fourth plane of ones), as each lane's B
// registers of a stage with the zeros in place (det::fp4_imma_bpos), so B is one 16-byte shared load
// and no selects (v34: 4 SELs a stage fewer, at twice the staging's shared memory). The stage's two
// K-blocks share one accumulator: the first K-block's planes in B's
// columns 0-3 and the second's in columns 4-7 (each MMA pair sees zeros in the other half), so the
// quad's lanes q = 0, 1 hold the first K-block's column sums and q = 2, 3 the second's, and one
// shuffle gives each lane one exact block sum S (det::fp4_mma_isum's algebra): lane (g, q) row
// g + 8·(q mod 2), K-block 2·stage + q / 2. Then k_fp4_gemv's arithmetic on S, c = part(S)·(s_a·s_w),
// added in order into the lane's class accumulator — lane parity h = q / 2 holds the classes
// kb ≡ 2s + h (mod 32), s = 0..15, so the K loop is unrolled by 32 K-blocks — and warp_sum's xor
// tree over the 32 classes done in registers (the 16 + 8 + 4 + 2 levels inside a lane, the last
// across lanes q and q ^ 2): the same operations in the same order as lane l adding K-blocks
// l, l+32, … and warp_sum, so the same bits.
constexpr int kImmaMaxNb = 256;
__device__ uint32_t kImmaTables[4] = {0x06040200u, 0x18100C08u, 0xFDFEFF00u, 0xF4F8FAFCu};  // det::Fp4Tables
// Lane (g, q)'s exact block sum from a stage's accumulator d: its two rows' partials, the one it sends
// lane q ^ 1, and fp4_imma_isum with the partner's (det::fp4_imma_*, core/fp4_dp4a.h).
__device__ __forceinline__ int32_t imma_lane_sum(const int32_t (&d)[4], int odd, det::Fp4ImmaFactors f) {
  const uint32_t ug = det::fp4_imma_partial(uint32_t(d[0]), uint32_t(d[1]), f);
  const uint32_t ug8 = det::fp4_imma_partial(uint32_t(d[2]), uint32_t(d[3]), f);
  return det::fp4_imma_isum(ug, ug8, odd, f, __shfl_xor_sync(0xffffffffu, det::fp4_imma_send(ug, ug8, odd, f), 1));
}
// kBulk (tiled only, DSUF_TILED=b<slots>,<warps>): a warp's ring of `slots` chunks of kBulkStages
// stages, filled by bulk copies, and a barrier a slot.
constexpr int kBulkStages = 4;  // 2 KB a copy
size_t imma_smem(int64_t nb, int stages, int warps, bool tiled, int bulk = 0, bool glu = false, int rows = 1,
                 bool merged = false) {
  return (tiled ? 0 : size_t(warps) * stages * 512) + size_t(warps) * bulk * (kBulkStages * 512 + 8) +
         size_t(merged ? 1 : rows) * size_t((nb + 1) / 2) * 512 + size_t(rows) * size_t(nb) * 4 +
         size_t(warps) * 16 * nb + (glu ? size_t(rows) * warps * 16 * 4 : 0);
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// kTiled (DSUF_FP4=tiled, k_fp4_imma<…, true>): the weights in det::fp4_tiled_offset's layout (laid out
// so at load, fp4_tile_in_place), so that a lane's stage is one 16-byte load of a contiguous 512-byte
// warp load straight into registers — kImmaStages − 1 stages in flight, no ring, no ldmatrix.
// kBulk > 0 (tiled): the warp's stages (contiguous: nst · 512 bytes) come through a ring of kBulk
// chunks of kBulkStages stages in shared memory instead, each chunk one bulk copy issued by lane 0
// (up to kBulk · 2 KB in flight a warp, 16 warps: 128 KB an SM at kBulk = 4, against 24 KB of
// registers at 4,16), read back with one 16-byte shared load a lane a stage: the same words.
// kGlu (session 20; DSUF_SWIGLU=auto, the default since v35, up to 32 routed rows; with an entry
// trigger +0.15 ms, at the tail −0.055 ms at batch 1, docs/perf.md v35): w1 and w3 of the
// pair in one block — warps w < kImmaWarps/2 take w1's row sets, the others w3's same ones — and the
// block ends with k_swiglu's arithmetic on its rows' outputs (from shared memory: the values it would
// have stored), writing h into y (h1) and laying it out for w2 through glu.sink, so that w2 follows
// the experts' w1/w3 launch directly (the wo_a → wo_b pattern of v34, one launch fewer).
struct GluTail {
  const float* weight = nullptr;  // the routed rows' weights (k_swiglu's weight[row])
  float limit = 0.0f;
  bool clamp = false;
  InputSink sink = {};
};
// kRows > 1 (session 23, DSUF_EXPERT_ROWS): grid.y walks groups [expert, first, count] of up to kRows
// routed rows of one expert (RowGroups built with that size; blocks past *n_groups leave at once),
// and each stage's weights, decoded once, serve every row of the group — per row its own staged
// planes, MMAs, block sums and class accumulators: each row's arithmetic exactly as a row alone.
// kMerged (kRows = 2, DSUF_EXPERT_PAIR=merged): the pair's two rows in one MMA's columns
// (det::fp4_imma_pair_bpos: no zeros staged, one 16-byte load a stage for both), the stage's K-blocks
// in two accumulators; lane (g, q) then ends with input row q / 2's classes of both parities
// (acc[k][s]: class 2s + k), and the tree's last level is inside the lane — the same sums
// (Fp4Tiled.MergedPairEqualsTheReferenceRowSums emulates it against the CPU reference). A group of one
// row runs the one-row path in the same kernel (block-uniform `merge`): the merged form would pay for
// a second row.
template <int kImmaStages, int kImmaWarps, bool kTiled, int kBulk = 0, bool kGlu = false, int kRows = 1,
          bool kMerged = false>
__global__ void __launch_bounds__(32 * kImmaWarps, 16 / kImmaWarps) k_fp4_imma(const uint8_t* const* W, const uint8_t* const* Ws,
                                                                 const int32_t* ids, int64_t out, int64_t K,
                                                                 const float* __restrict__ xs, int64_t xs_stride,
                                                                 const uint8_t* __restrict__ xp, int64_t xp_stride,
                                                                 int x_div, float* y, bool r, Fp4Pair pair,
                                                                 const int32_t* order, GluTail glu,
                                                                 const int32_t* groups, const int32_t* n_groups) {
  static_assert(16 % kImmaStages == 0, "a chunk's 16 stages start on slot 0 of the ring");
  static_assert(!kGlu || (kImmaWarps % 4 == 0 && kBulk > 0), "kGlu: half the warps a matrix, whole K-blocks of h");
  static_assert(kRows == 1 || kTiled, "several rows a block: tiled weights only");
  static_assert(!kMerged || kRows == 2, "a merged pair is two rows");
  extern __shared__ __align__(16) uint8_t imma_sm[];
  const int nb = int(K / 32), nst = (nb + 1) / 2;  // K-blocks; stages of two
  int row = blockIdx.y;
  int rows_of[kRows];  // kRows > 1: the group's routed rows (rows_of[rr] for rr < nr)
  int nr = 1;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  constexpr int kSets = kGlu ? kImmaWarps / 2 : kImmaWarps;  // a block's row sets of one matrix
  const int half = kGlu ? w / kSets : 0;                      // kGlu: 0 w1, 1 w3
  if (kGlu ? half == 1 : blockIdx.z == 1) W = pair.W, Ws = pair.Ws, y = pair.y;
  const int64_t o0 = (int64_t(blockIdx.x) * kSets + (kGlu ? w % kSets : w)) * 16;
  const int64_t row_bytes = K / 2;
  static_assert(kBulk == 0 || kTiled, "bulk copies of the tiled layout only");
  constexpr int kChunk = kBulkStages * 512;
  uint8_t* ring = imma_sm + (threadIdx.x / 32) * kBulk * kChunk;  // kBulk: this warp's slots
  const uint32_t bars = smem_u32(imma_sm + kImmaWarps * kBulk * kChunk) + (threadIdx.x / 32) * kBulk * 8;
  // [stage][lane][16 B]: lane L's B registers of the stage, zeros in place (det::fp4_imma_bpos)
  // (kRows: [rr][stage][lane][16 B], one row's planes after another; a merged pair: one [stage][lane][16 B]
  // for both rows, det::fp4_imma_pair_bpos)
  uint8_t* sB = imma_sm + (kTiled ? 0 : kImmaWarps * kImmaStages * 512) + kImmaWarps * kBulk * (kChunk + 8);
  float* ssa = reinterpret_cast<float*>(sB + (kMerged ? 1 : kRows) * nst * 512);  // [rr][kb]: the input scales
  uint8_t* codes = reinterpret_cast<uint8_t*>(ssa + kRows * nb) + w * 16 * nb;  // [row][kb]: the weight scale codes
  // kGlu triggers w2 at its tail instead (session 21: at entry, w2's whole-SM blocks became resident
  // beside w1/w3 and kept the shared expert's w2 off the SMs, +0.15 ms: docs/perf.md v35).
  if constexpr (!kGlu) pdl_trigger();
  if constexpr (kRows > 1) {
    pdl_wait();
    if (int(blockIdx.y) >= *n_groups) return;  // the whole block: no group (grid.y is a bound)
    const int32_t* gr = groups + 3 * blockIdx.y;
    nr = gr[2];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) rows_of[rr] = order[gr[1] + (rr < nr ? rr : 0)];
    row = rows_of[0];
  } else if (order) {  // grid.y walks the routed rows in expert order (RowGroups::order, from this step's router)
    pdl_wait();
    row = order[row];
  }
  if constexpr (kRows == 1) rows_of[0] = row;
  const auto [We, Se] = routed_expert(W, Ws, ids, row);
  const bool active = o0 < out;  // warp-uniform; an idle warp still stages inputs and meets the barrier
  // kGlu: both halves' rounded outputs, then k_swiglu on the block's kSets·16 columns of h (warp k <
  // kSets / 2 takes K-block k of them). Every thread of the block calls it once (idle warps too), from
  // one of two places: hence the barrier without .aligned (__syncthreads' bar.sync is aligned, which
  // PTX requires to be the same instruction for the whole block).
  // (after the codes: imma_smem's glu share, kRows · 2 · kSets · 16 floats)
  float* glu_out = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(ssa + kRows * nb) + kImmaWarps * 16 * nb);
  auto glu_tail = [&] {
    pdl_trigger();  // every thread once: w2's blocks launch when every block has reached its tail
    asm volatile("barrier.sync 0;\n" ::: "memory");
    const int64_t f = int64_t(blockIdx.x) * kSets * 16 + w * 32 + lane;  // h's column (out % 32 == 0)
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      if (rr >= nr) break;
      const float* go = glu_out + rr * 2 * kSets * 16;
      const int row_r = rows_of[rr];
      if (w < kSets / 2 && f < out) {
        float gv = go[w * 32 + lane], u = go[kSets * 16 + w * 32 + lane];
        if (glu.clamp && glu.limit > 0) {
          gv = fminf(gv, glu.limit);
          u = fminf(fmaxf(u, -glu.limit), glu.limit);
        }
        const float wt = glu.weight ? glu.weight[row_r] : 1.0f;
        const float hv = rb(wt * (det::silu(gv) * u), r);
        y[int64_t(row_r) * out + f] = hv;
        if (glu.sink.xq) emit_input(glu.sink, out, row_r, int(f / 32), lane, hv);
      }
    }
  };
  auto clamp = [&](int64_t o) { return o < out ? o : out - 1; };  // a tail repeats the last row
  // Copy role: row lane % 16, K-block 2·stage + lane / 16; the same offset is its ldmatrix address.
  const uint8_t* wsrc = We + clamp(o0 + lane % 16) * row_bytes + (lane / 16) * 16;
  const uint32_t slot0 = smem_u32(imma_sm + w * (kImmaStages * 512) + (lane / 16) * 256 + (lane % 16) * 16);
  // This lane's copies: stages st < my_nst hold its K-block 2·st + lane / 16.
  const int my_nst = active ? (nb + 1 - lane / 16) / 2 : 0;
  // Tiled: the warp's 16 rows are nst contiguous 512-byte stages; lane L's 16 bytes at L·16.
  const uint4* wt = reinterpret_cast<const uint4*>(We + (active ? o0 / 16 : 0) * int64_t(nst) * 512) + lane;
  uint4 buf[kImmaStages];
  // kBulk: chunk c (stages kBulkStages·c..) into slot c mod kBulk, completing on that slot's barrier.
  const int my_chunks = active ? (nst + kBulkStages - 1) / kBulkStages : 0;
  auto bulk_issue = [&](int c) {  // lane 0
    if (c < my_chunks) {
      const int slot = c % (kBulk > 0 ? kBulk : 1);
      const uint32_t bytes = uint32_t(min(kBulkStages, nst - kBulkStages * c)) * 512;
      bulk_to_smem(smem_u32(ring + slot * kChunk), reinterpret_cast<const uint8_t*>(wt - lane) + int64_t(c) * kChunk,
                   bytes, bars + slot * 8);
    }
  };
  if constexpr (kBulk > 0) {  // before the inputs' staging: the weights' round trip is the long one
    if (lane == 0) {
      for (int i = 0; i < kBulk; ++i) mbar_init(bars + i * 8);
      mbar_init_fence();
      for (int c = 0; c < kBulk; ++c) bulk_issue(c);
    }
    __syncwarp();
  }
  auto issue = [&](int st, int slot) {
    if constexpr (kTiled) {
      if (st < my_nst) buf[slot] = __ldg(wt + int64_t(st) * 32);
    } else {  // every lane commits a group per stage, empty or not: the counts agree
      if (st < my_nst) cp_async16_to(slot0 + slot * 512, wsrc + int64_t(st) * 32);
      cp_async_commit();
    }
  };
  // The input planes, scales and the 16 rows' scale codes: one group, before the ring's stages.
  // Input piece i: K-block i / 16, plane (i / 4) mod 4, bytes 8·(i mod 4).. — 8 bytes of the 16-byte
  // piece 2·plane + (i mod 4) / 2 (ppos16), plane 3 the ones — and its 8 zero bytes beside it.
  // kMerged: a pair in the merged layout; a group of one row as the one-row kernel (below, `merge`).
  const bool merge = kMerged && nr == 2;
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    if (rr >= nr) break;
    const int64_t xrow = rows_of[rr] / x_div;
    const uint8_t* xpr = xp + xrow * xp_stride;
    const float* xsr = xs + xrow * xs_stride;
    if (merge) {
      for (int i = threadIdx.x; i < nb * 16; i += blockDim.x) {
        const int kb = i / 16, p = (i / 4) % 4, q = i % 4, at = det::fp4_imma_pair_bpos(rr, kb, p, q);
        if (p < 3) cp_async8_to(smem_u32(sB + at), xpr + ppos16(kb, 2 * p + q / 2) * 16 + (q % 2) * 8);
        else *reinterpret_cast<uint2*>(sB + at) = make_uint2(0x01010101u, 0x01010101u);
      }
      for (int i = threadIdx.x; i < nb; i += blockDim.x) cp_async4_to(smem_u32(ssa + rr * nb + i), xsr + i);
      continue;
    }
    uint8_t* sBr = sB + rr * nst * 512;
    for (int i = threadIdx.x; i < nb * 16; i += blockDim.x) {
      const int kb = i / 16, p = (i / 4) % 4, q = i % 4, at = det::fp4_imma_bpos(kb, p, q);
      if (p < 3) cp_async8_to(smem_u32(sBr + at), xpr + ppos16(kb, 2 * p + q / 2) * 16 + (q % 2) * 8);
      else *reinterpret_cast<uint2*>(sBr + at) = make_uint2(0x01010101u, 0x01010101u);
      *reinterpret_cast<uint2*>(sBr + (at ^ 8)) = make_uint2(0u, 0u);
    }
    for (int i = threadIdx.x; i < nb; i += blockDim.x) cp_async4_to(smem_u32(ssa + rr * nb + i), xsr + i);
  }
  if (active) {
    if ((reinterpret_cast<uintptr_t>(Se) & 3) == 0) {
      const int n4 = nb / 4;
      for (int i = lane; i < 16 * n4; i += 32) {
        const int rr = i / n4, c4 = i % n4;
        cp_async4_to(smem_u32(codes + rr * nb + 4 * c4), Se + clamp(o0 + rr) * nb + 4 * c4);
      }
    } else {
      for (int i = lane; i < 16 * nb; i += 32) codes[i] = __ldg(Se + clamp(o0 + i / nb) * nb + i % nb);
    }
  }
  cp_async_commit();
  if constexpr (kBulk == 0) {
#pragma unroll
    for (int st = 0; st < kImmaStages - 1; ++st) issue(st, st);
  }
  if constexpr (kTiled) cp_async_wait_group<0>();  // the first group, the only one
  else cp_async_wait_group<kImmaStages - 1>();
  __syncthreads();
  for (int i = threadIdx.x; i < nr * nb * 4; i += blockDim.x) {  // plane 2 → hi + 4, in place
    const int j = i % (nb * 4), rr = i / (nb * 4);
    uint2* p = reinterpret_cast<uint2*>(merge ? sB + det::fp4_imma_pair_bpos(rr, j / 4, 2, j % 4)
                                              : sB + rr * nst * 512 + det::fp4_imma_bpos(j / 4, 2, j % 4));
    const uint2 v = *p;
    *p = make_uint2(det::fp4_mma_hi4(v.x), det::fp4_mma_hi4(v.y));
  }
  __syncthreads();
  if (!active) {
    cp_async_wait_group<0>();
    if constexpr (kGlu) glu_tail();
    return;
  }
  const int h = q / 2, odd = q % 2, my_row = g + 8 * odd;
  const det::Fp4ImmaFactors f = det::fp4_imma_factors(odd);  // lane (g, q)'s term of each row's S
  // The permute tables as loaded values: as immediates the compiler rebuilt them before every prmt.
  det::Fp4Tables tab;
  tab.pos_lo = __ldg(kImmaTables + 0), tab.pos_hi = __ldg(kImmaTables + 1);
  tab.neg_lo = __ldg(kImmaTables + 2), tab.neg_hi = __ldg(kImmaTables + 3);
  float acc[kRows][16];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
    for (int s = 0; s < 16; ++s) acc[rr][s] = 0.0f;
  // 16 stages = 32 K-blocks a chunk, so that lane parity h's class 2s + h is acc[s]; kTail: the last,
  // partial chunk (its stages and K-blocks checked).
  auto chunk = [&](int base, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    const uint8_t* bsrc = sB + base * 512 + lane * 16;
    const uint8_t* mycodes = codes + my_row * nb + 2 * base + h;
    const float* mysa = ssa + 2 * base + h;
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      const int st = base + s;
      if (kTail && st >= nst) break;
      uint32_t wr[4];
      if constexpr (kBulk > 0) {  // base is a multiple of kBulkStages
        const int c = st / kBulkStages, slot = c % kBulk;
        if (s % kBulkStages == 0) mbar_wait(bars + slot * 8, uint32_t(c / kBulk) & 1u);
        const uint4 v = *reinterpret_cast<const uint4*>(ring + slot * kChunk + (s % kBulkStages) * 512 + lane * 16);
        wr[0] = v.x, wr[1] = v.y, wr[2] = v.z, wr[3] = v.w;
        if (s % kBulkStages == kBulkStages - 1) {  // the chunk is read (a partial last one needs no refill)
          __syncwarp();
          if (lane == 0) {
            async_proxy_fence();
            bulk_issue(c + kBulk);
          }
        }
      } else if constexpr (kTiled) {
        const uint4 v = buf[s % kImmaStages];  // base is a multiple of kImmaStages
        wr[0] = v.x, wr[1] = v.y, wr[2] = v.z, wr[3] = v.w;
        issue(st + kImmaStages - 1, (s + kImmaStages - 1) % kImmaStages);
      } else {
        cp_async_wait_group<kImmaStages - 2>();  // this lane's copies of stage st have landed
        __syncwarp();                              // and every lane's; stage st − 1's slot is read
        issue(st + kImmaStages - 1, (s + kImmaStages - 1) % kImmaStages);
        ldmatrix_x4(wr, slot0 + (s % kImmaStages) * 512);
      }
      det::Fp4MmaA a0, a1;
      det::fp4_mma_a(wr[0], wr[1], a0, tab);
      det::fp4_mma_a(wr[2], wr[3], a1, tab);
      if (merge) {  // lanes g < 4: row 0's planes, g ≥ 4: row 1's; bytes 0-7 K-block 2st, 8-15 2st + 1
        const uint4 bv = *reinterpret_cast<const uint4*>(bsrc + s * 512);
        int32_t d[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
        mma_s8u8(d[0], a0.pos, bv.x, bv.y);
        mma_s8u8(d[0], a0.neg, bv.x, bv.y);
        mma_s8u8(d[1], a1.pos, bv.z, bv.w);
        mma_s8u8(d[1], a1.neg, bv.z, bv.w);
        const uint8_t* pc = codes + my_row * nb + 2 * base;  // this lane's weight row
        const float* pa = ssa + h * nb + 2 * base;            // this lane's input row
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int32_t S = imma_lane_sum(d[k], odd, f);
          // An odd nb's last stage has no second K-block: read in range, add nothing.
          const bool in = !kTail || 2 * st + k < nb;
          const int off = in ? 2 * s + k : 2 * s;
          const float c = det::fp4_act_block_part(S) * (pa[off] * e8m0_max(pc[off]));
          if (in) acc[k][s] = acc[k][s] + c;
        }
        continue;
      }
      // An odd nb's last stage has no second K-block: read in range, add nothing.
      const int off = kTail && 2 * st + h >= nb ? 2 * s - 1 : 2 * s;
      const float s_w = e8m0_max(mycodes[off]);
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        if (rr >= nr) break;  // warp-uniform
        // B column g: plane g mod 4 of K-block g / 4
        const uint4 bv = *reinterpret_cast<const uint4*>(bsrc + rr * nst * 512 + s * 512);
        const uint32_t b0 = bv.x, b1 = bv.y, c0 = bv.z, c1 = bv.w;
        int32_t d[4] = {0, 0, 0, 0};
        mma_s8u8(d, a0.pos, b0, b1);
        mma_s8u8(d, a0.neg, b0, b1);
        mma_s8u8(d, a1.pos, c0, c1);
        mma_s8u8(d, a1.neg, c0, c1);
        const int32_t S = imma_lane_sum(d, odd, f);
        const float c = det::fp4_act_block_part(S) * (mysa[rr * nb + off] * s_w);
        if (!kTail || 2 * st + h < nb) acc[rr][s] = acc[rr][s] + c;
      }
    }
  };
  int base = 0;
  for (; base + 16 <= nb / 2; base += 16) chunk(base, std::false_type{});
  if (base < nst) chunk(base, std::true_type{});
  // warp_sum's tree: levels 16 to 2 inside the lane (det::fp4_imma_tree), level 1 across the parities.
  if (merge) {  // both parities in the lane: level 1 inside it too; lane q's input row is q / 2
    const float v = det::fp4_imma_tree(acc[0]) + det::fp4_imma_tree(acc[1]);
    if constexpr (kGlu) {
      glu_out[h * 2 * kSets * 16 + half * kSets * 16 + (w % kSets) * 16 + my_row] = rb(v, r);
    } else {
      if (o0 + my_row < out) y[int64_t(h ? rows_of[1] : rows_of[0]) * out + o0 + my_row] = rb(v, r);
    }
  } else {
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      if (rr >= nr) break;
      const float dd = det::fp4_imma_tree(acc[rr]);
      const float v = dd + __shfl_xor_sync(0xffffffffu, dd, 2);
      if constexpr (kGlu) {  // the outputs stay in the block (h is what leaves it)
        if (h == 0) glu_out[rr * 2 * kSets * 16 + half * kSets * 16 + (w % kSets) * 16 + my_row] = rb(v, r);
      } else {
        if (h == 0 && o0 + my_row < out) y[int64_t(rows_of[rr]) * out + o0 + my_row] = rb(v, r);
      }
    }
  }
  if constexpr (kGlu) glu_tail();
}

// Grouped FP4 experts by integer MMAs, for the prefill (DSUF_FP4_ROWS=mma, the default for grouped
// rows with byte planes): a block of kMmaRowWarps warps takes 16 output rows a warp and one group of
// up to 8 input rows of one expert. Per K-block a warp builds A from the 16 rows' weights once, as
// one signed matrix (det::fp4_mma_a_signed), and takes one mma.m16n8k32 per pair of input rows, the
// pair's planes in the columns of det::fp4_pair_column. Three shuffles a pair give each lane one
// exact block sum S: lane (g, q) row g + 8·(q / 2), input row 2p + q mod 2. The rest is
// k_fp4_gemv's arithmetic on S — c = part(S)·(s_a·s_w), each lane's K-blocks kb ≡ l (mod 32) added in
// order, then warp_sum's tree — done per (row, input row) as in k_fp8_gemm: the K-blocks visited
// class by class in bit-reversed order (core/class_tree.h: one cursor for the loads, one for the
// sums), the finished class sums pushed onto a binary-counter stack. Only the input scales of the
// group's rows are staged in shared memory; the weight scale codes come with each batch of weights.
constexpr int kMmaRowWarps = 4;
constexpr int kMmaRowMaxNb = 384;  // K up to 12288: the staging fits the default 48 KB
size_t mma_rows_smem(int64_t nb) { return size_t(nb) * kRowGroup * 4; }
// kTiled (DSUF_FP4=tiled): the weights as det::fp4_tiled_offset's tiles; a K-block's two words (rows
// g and g+8, word q) are then one 8-byte load at lane (g, q)'s 16 bytes of the tile, offset 8·(kb mod 2).
template <bool kTiled>
__global__ void __launch_bounds__(32 * kMmaRowWarps) k_fp4_mma_rows(
    const uint8_t* const* W, const uint8_t* const* Ws, const int32_t* __restrict__ groups,
    const int32_t* __restrict__ n_groups, const int32_t* __restrict__ order, int64_t out, int64_t K,
    const float* __restrict__ xs, int64_t xs_stride, const uint8_t* __restrict__ xp, int64_t xp_stride, int x_div,
    float* y, bool r, Fp4Pair pair) {
  constexpr int R = kRowGroup, NP = R / 2, O = 16 * kMmaRowWarps, U = 4;
  static_assert(R == 8, "four pairs of input rows");
  static_assert(U <= 4, "a batch's weight scale codes are the bytes of one register");
  const int nb = int(K / 32);
  const int gi = blockIdx.y;
  if (blockIdx.z == 1) W = pair.W, Ws = pair.Ws, y = pair.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int64_t ob = int64_t(blockIdx.x) * O, o0 = ob + 16 * warp;
  const int64_t row_bytes = K / 2;
  pdl_trigger();
  if (ob >= out) return;
  pdl_wait();  // the groups come from this step's router
  if (gi >= *n_groups) return;
  const auto [We, Se, first, cnt] = expert_group(W, Ws, groups, gi);
  auto clamp = [&](int64_t o) { return o < out ? o : out - 1; };  // a tail repeats the last row
  extern __shared__ float sa[];  // [R][nb] input scales
  for (int i = tid; i < R * nb; i += blockDim.x) {
    const int rr = i / nb;
    sa[i] = __ldg(xs + int64_t(order[first + min(rr, cnt - 1)] / x_div) * xs_stride + i % nb);
  }
  __syncthreads();
  // This lane's A words (rows g and g+8, word q of each K-block) and B column g (det::fp4_pair_column).
  const uint8_t* wg = We + clamp(o0 + g) * row_bytes + 4 * q;
  const uint8_t* wg8 = We + clamp(o0 + g + 8) * row_bytes + 4 * q;
  // Tiled (out a multiple of 16): this warp's tile row (the last one for a warp past the end).
  const uint8_t* wt = We + (min(o0, out - 16) / 16) * int64_t(nb / 2) * 512 + lane * 16;
  const det::Fp4PairColumn col = det::fp4_pair_column(g);
  const uint32_t bconst = g == 5 ? 0x01010101u : 0u;
  const uint8_t* bp[NP];
#pragma unroll
  for (int p = 0; p < NP; ++p)
    bp[p] = xp + int64_t(order[first + min(2 * p + col.row, cnt - 1)] / x_div) * xp_stride + 8 * (q % 2);
  // Lane (g, q)'s sums: output row ol = 16·warp + g + 8·(q / 2), input rows 2p + q mod 2.
  const int ol = 16 * warp + g + 8 * (q / 2);
  const uint8_t* sg = Se + clamp(ob + ol) * nb;  // its weight scale codes
  // The K-blocks in core/class_tree.h's visiting order, a cursor for the loads and one for the sums
  // (no schedule in shared memory, nothing staged but the input scales).
  det::ClassCursor lc, cc;
  struct Batch {
    uint32_t wa[U], wb[U];
    uint2 b[U][NP];
    uint32_t sw;  // the U weight scale codes, byte u
  };
  auto load = [&](Batch& bt, int t0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t0 + u >= nb) break;
      const int kb = det::class_kb(lc);
      lc = det::class_advance(lc, nb);
      if (u == 0) bt.sw = 0;
      bt.sw |= uint32_t(__ldg(sg + kb)) << (8 * u);
      if constexpr (kTiled) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(wt + int64_t(kb / 2) * 512 + (kb % 2) * 8));
        bt.wa[u] = v.x, bt.wb[u] = v.y;
      } else {
        bt.wa[u] = __ldg(reinterpret_cast<const uint32_t*>(wg + int64_t(kb) * 16));
        bt.wb[u] = __ldg(reinterpret_cast<const uint32_t*>(wg8 + int64_t(kb) * 16));
      }
#pragma unroll
      for (int p = 0; p < NP; ++p)
        bt.b[u][p] = col.plane >= 0
                         ? __ldg(reinterpret_cast<const uint2*>(bp[p] + ppos16(kb, 2 * col.plane + q / 2) * 16))
                         : make_uint2(bconst, bconst);
    }
  };
  det::ClassTree<NP> tree;
  float(&acc)[NP] = tree.acc;
  auto compute = [&](const Batch& bt, int t0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + u;
      if (t >= nb) break;
      const int kb = det::class_kb(cc);
      uint32_t a[4];
      det::fp4_mma_a_signed(bt.wa[u], bt.wb[u], a);
      const float sw = e8m0(uint8_t(bt.sw >> (8 * u)));
      uint32_t ones_g = 0, ones_g8 = 0;
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        uint32_t b0 = bt.b[u][p].x, b1 = bt.b[u][p].y;
        if (col.plane == 2) b0 = det::fp4_mma_hi4(b0), b1 = det::fp4_mma_hi4(b1);
        int32_t d[4] = {0, 0, 0, 0};
        mma_s8u8(d, a, b0, b1);
        const uint32_t d0 = uint32_t(d[0]), d1 = uint32_t(d[1]), d2 = uint32_t(d[2]), d3 = uint32_t(d[3]);
        if (p == 0) {  // the ones column (weight sums) is the same for every pair: lane q = 2 holds it
          const uint32_t u1 = __shfl_up_sync(0xffffffffu, d1, 1), u3 = __shfl_up_sync(0xffffffffu, d3, 1);
          ones_g = q == 2 ? d1 : u1, ones_g8 = q == 2 ? d3 : u3;
        }
        // q < 2: lo + mid·2^8 of rows g (kept) and g+8 (sent to q + 2); q ≥ 2: (hi+4 − 4·ones)·2^16
        // of rows g (sent to q − 2) and g+8 (kept).
        const uint32_t keep = q < 2 ? d0 + (d1 << 8) : (d2 - 4u * ones_g8) << 16;
        const uint32_t send = q < 2 ? d2 + (d3 << 8) : (d0 - 4u * ones_g) << 16;
        const int32_t S = int32_t(keep + __shfl_xor_sync(0xffffffffu, send, 2));
        acc[p] += det::fp4_act_block_part(S) * (sa[(2 * p + q % 2) * nb + kb] * sw);
      }
      const det::ClassCursor nx = det::class_advance(cc, nb);
      const bool more = t + 1 < nb;
      if (nx.i != cc.i || !more) {  // class cc.i is complete: push it and the empty ones up to the next
        tree.push(cc.i);
        for (int i = cc.i + 1; i < (more ? nx.i : 32); ++i) tree.push(i);
      }
      cc = nx;
    }
  };
  Batch b0, b1;
  load(b0, 0);
  for (int t0 = 0; t0 < nb; t0 += 2 * U) {  // two batches a turn, so that the buffers stay registers
    if (t0 + U < nb) load(b1, t0 + U);
    compute(b0, t0);
    if (t0 + U >= nb) break;
    if (t0 + 2 * U < nb) load(b0, t0 + 2 * U);
    compute(b1, t0 + U);
  }
  const int64_t o = ob + ol;
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    const int rr = 2 * p + q % 2;
    if (rr < cnt && o < out) y[int64_t(order[first + rr]) * out + o] = rb(acc[p], r);
  }
}

// One chunk of 8 inputs against 8 BF16 weights, added to acc one product at a time: a rounded
// product and a rounded add each (the reference's), or with kFma one fmaf each — the same bits when
// every input of the row qualifies under the matrix's Bf16FmaLimits (core/bf16_fma.h: the products
// are then exact in FP32), which k_bf16_wide<…, kFmaOk> checks on the rows it stages (bf16_stage_ok).
template <bool kFma>
__device__ __forceinline__ float bf16_mac(float acc, float w, float x) {
  if constexpr (kFma) return __fmaf_rn(w, x, acc);
  else return acc + w * x;
}
template <bool kFma = false>
__device__ __forceinline__ float bf16_chunk(float acc, const uint4& wv, const float* xc) {
  const float4 x0 = *reinterpret_cast<const float4*>(xc);
  const float4 x1 = *reinterpret_cast<const float4*>(xc + 4);
  acc = bf16_mac<kFma>(acc, __uint_as_float(wv.x << 16), x0.x);
  acc = bf16_mac<kFma>(acc, __uint_as_float(wv.x & 0xffff0000u), x0.y);
  acc = bf16_mac<kFma>(acc, __uint_as_float(wv.y << 16), x0.z);
  acc = bf16_mac<kFma>(acc, __uint_as_float(wv.y & 0xffff0000u), x0.w);
  acc = bf16_mac<kFma>(acc, __uint_as_float(wv.z << 16), x1.x);
  acc = bf16_mac<kFma>(acc, __uint_as_float(wv.z & 0xffff0000u), x1.y);
  acc = bf16_mac<kFma>(acc, __uint_as_float(wv.w << 16), x1.z);
  acc = bf16_mac<kFma>(acc, __uint_as_float(wv.w & 0xffff0000u), x1.w);
  return acc;
}
// Whether the 4 staged inputs v qualify for the FMA under fl (a thread's share of a block's flag).
__device__ __forceinline__ bool bf16_stage_ok(const float4& v, const Bf16FmaLimits& fl) {
  return bf16_fma_input_ok(v.x, fl.lo, fl.hi) & bf16_fma_input_ok(v.y, fl.lo, fl.hi) &
         bf16_fma_input_ok(v.z, fl.lo, fl.hi) & bf16_fma_input_ok(v.w, fl.lo, fl.hi);
}
// Chunks a lane loads at once (all of them for K ≤ 8·32·kBf16Deep = 5120: the router, the compressors,
// the indexer projections and the head at the real dimensions), so that a warp's row is one DRAM
// round trip instead of one per 4 chunks; DSUF_BF16=loop keeps the 4-deep loop (measuring aid).
constexpr int kBf16Deep = 20;
// DSUF_BF16=staged (the default since v32): the input row staged in shared memory by the whole block
// after the dependency wait — its kBf16Deep / 4 16-byte loads a thread issued together, one L2 round
// trip — instead of each lane loading its chunks' inputs one chunk at a time in the sum's loop (the
// compiler cannot hoist them past the loop's exit test: 16 dependent L2 round trips a warp at K =
// 4096). Measured in place: the router 7.1 → 2.75 µs after its input, −0.046 ms a step at 8K,
// batches 16 and 64 −1.4 % (docs/perf.md v32). Stored so that a warp's reads are conflict-free: chunk
// c's two float4 halves at float4 index (c / 32 · 2 + half) · 32 + c mod 32.
__device__ __forceinline__ int bf16_stage_slot(int j) {  // j: the row's float4 index
  const int c = j / 2, half = j % 2;
  return ((c / 32) * 2 + half) * 32 + c % 32;
}
size_t bf16_linear_smem(int64_t K, bool staged, int R = 1) {
  return staged && K <= 8 * 32 * kBf16Deep ? size_t(R) * size_t(K) * 4 : 0;
}
// Input rows a k_bf16_linear block takes on the staged path when a linear has several (its weights
// read once per kBf16Rows rows: 80 KB of staged inputs at K = 5,120; one 8-warp block an SM, as the
// one-row form: 153 and 136 registers a thread).
constexpr int kBf16Rows = 4;
// k_bf16_stream (session 21, DSUF_BF16_STREAM): a one-row BF16 linear with many outputs — the head,
// 129,280 × 5,120, 1.32 GB a step — as one persistent stream a block (one block an SM). k_bf16_linear
// runs it as 16,160 blocks of 8 rows, each loading its weights at entry and computing after they
// land, so an SM's loads come in waves with nothing in flight between a block's last load and the
// next block's first (~3.3 TB/s in place, v34's timeline: 400 µs). Here block b takes the rows
// [b·out/G, (b+1)·out/G) in stages of kW rows (kW·K·2 contiguous bytes: one bulk copy), a producer
// warp keeping kS stages in flight through a ring of shared memory (its copies need no wait: nothing
// in a step writes the weights), and kW consumer warps each summing one row of a stage with
// k_bf16_linear's staged arithmetic — lane l's chunks l, l+32, … in order, bf16_chunk, warp_sum — on
// the input row staged once by the block: the same bits.
template <int kW, int kS>
__global__ void __launch_bounds__(32 * (kW + 1), 1)
    k_bf16_stream(const uint16_t* __restrict__ W, int64_t out, int64_t K, const float* __restrict__ x,
                  float* __restrict__ y, bool r) {
  extern __shared__ __align__(16) uint8_t bs_sm[];  // [kS][kW rows][K] bf16 | the input (float4s) | bars
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = out * blockIdx.x / gridDim.x, r1 = out * (blockIdx.x + 1) / gridDim.x;
  const int nst = int((r1 - r0 + kW - 1) / kW);
  const uint32_t row_bytes = uint32_t(K) * 2, stage_bytes = kW * row_bytes;
  float4* xs = reinterpret_cast<float4*>(bs_sm + size_t(kS) * stage_bytes);
  const uint32_t ring = smem_u32(bs_sm), full = smem_u32(xs + K / 4), empty = full + 8 * kS;
  if (threadIdx.x == 32 * kW) {
    for (int i = 0; i < kS; ++i) mbar_init(full + 8 * i), mbar_init_count(empty + 8 * i, kW);
    mbar_init_fence();
  }
  __syncthreads();  // the barriers exist before anyone waits on them
  if (warp == kW) {  // the producer: stage j into slot j mod kS once the consumers have left it
    if (lane == 0)
      for (int j = 0; j < nst; ++j) {
        const int slot = j % kS;
        if (j >= kS) {
          mbar_wait(empty + 8 * slot, uint32_t(j / kS - 1) & 1u);
          async_proxy_fence();
        }
        const int64_t row = r0 + int64_t(j) * kW;
        const uint32_t bytes = uint32_t(r1 - row < kW ? r1 - row : kW) * row_bytes;
        bulk_to_smem(ring + slot * stage_bytes, W + row * K, bytes, full + 8 * slot);
      }
    return;
  }
  pdl_wait();  // the input is the previous kernel's output
  for (int i = int(threadIdx.x); i < int(K / 4); i += 32 * kW)
    xs[bf16_stage_slot(i)] = reinterpret_cast<const float4*>(x)[i];
  asm volatile("bar.sync 1, %0;\n" ::"r"(32 * kW) : "memory");  // the consumers only
  const int nc = int(K / 8);
  for (int j = 0; j < nst; ++j) {
    const int slot = j % kS;
    mbar_wait(full + 8 * slot, uint32_t(j / kS) & 1u);
    const int64_t o = r0 + int64_t(j) * kW + warp;
    if (o < r1) {
      const uint4* wr = reinterpret_cast<const uint4*>(bs_sm + size_t(slot) * stage_bytes + size_t(warp) * row_bytes);
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kBf16Deep; ++i) {
        if (lane + 32 * i >= nc) break;
        const uint4 wv = wr[lane + 32 * i];
        float4 xc[2] = {xs[(2 * i) * 32 + lane], xs[(2 * i + 1) * 32 + lane]};
        acc = bf16_chunk(acc, wv, reinterpret_cast<const float*>(xc));
      }
      acc = warp_sum(acc);
      if (lane == 0) y[o] = rb(acc, r);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * slot);
  }
}
size_t bf16_stream_smem(int kW, int kS, int64_t K) { return size_t(kS) * kW * K * 2 + size_t(K) * 4 + 16 * kS; }

// One warp per output; lane l takes 8-element chunks l, l+32, … (chunk_lane_sum<8>): one 16-byte
// weight load and two float4 input loads per chunk when K and the strides allow, else scalars in
// the same order. R > 1 (session 21; the staged path only): block row y takes input rows R·y.. (up
// to R of them, all staged), each warp's weights in registers used for every one — one read of the
// weights per R rows instead of per row (the head at batch 64 read its 1.32 GB 64 times).
template <int R>
__global__ void k_bf16_linear(const uint16_t* __restrict__ W, int64_t out, int64_t K, const float* __restrict__ x,
                              int64_t x_stride, float* __restrict__ y, int64_t y_stride, bool r, bool deep,
                              bool staged, int64_t rows) {
  extern __shared__ float4 bf16_xs[];  // staged: the input rows, each in bf16_stage_slot's order
  pdl_trigger();
  const int64_t o = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int row = blockIdx.y * R, lane = threadIdx.x % 32;
  const int nr = R == 1 ? 1 : int(rows - row < R ? rows - row : R);  // (R = 1: v34's code, instruction for instruction)
  const bool active = o < out;  // warp-uniform
  const uint16_t* wr = W + o * K;
  const float* xr = x + int64_t(row) * x_stride;
  float acc = 0.0f;
  const bool vec = K % 8 == 0 && x_stride % 4 == 0 && (reinterpret_cast<uintptr_t>(W) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  if (vec && staged && K <= 8 * 32 * kBf16Deep) {
    // The row's weights before the wait, for real (session 18): the deep path's loads below are
    // issued after it — ptxas moves griddepcontrol.wait to the top of its basic block, and those
    // loads, predicated on c·8 < K, share the wait's block (SASS). Here the loads are unconditional
    // (a lane past the row's end reloads its last chunk) in a block of their own (`if (active)`),
    // which ptxas leaves before the wait.
    uint4 wv[kBf16Deep];
    const int64_t nc = K / 8;
    if (active) {
#pragma unroll
      for (int i = 0; i < kBf16Deep; ++i) {
        const int64_t c = lane + 32 * i;
        wv[i] = __ldg(reinterpret_cast<const uint4*>(wr + (c < nc ? c : nc - 1) * 8));
      }
    }
    pdl_wait();
    constexpr int kPer = 8 * 32 * kBf16Deep / 4 / 256;  // float4s a thread stages (blocks of 256)
    const int n4 = int(K / 4);
    for (int rr = 0; rr < nr; ++rr) {
      const float* xq = xr + rr * x_stride;
      float4 t[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = int(threadIdx.x) + 256 * j;
        if (i < n4) t[j] = reinterpret_cast<const float4*>(xq)[i];
      }
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = int(threadIdx.x) + 256 * j;
        if (i < n4) bf16_xs[rr * n4 + bf16_stage_slot(i)] = t[j];
      }
    }
    __syncthreads();  // every warp meets it; one past `out` loaded no weights and stores nothing
    if (!active) return;
    float accs[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) accs[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < kBf16Deep; ++i) {
      if (lane + 32 * i >= nc) break;
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        if (rr >= nr) break;
        const float4* xs = bf16_xs + rr * n4;
        float4 xc[2] = {xs[(2 * i) * 32 + lane], xs[(2 * i + 1) * 32 + lane]};
        accs[rr] = bf16_chunk(accs[rr], wv[i], reinterpret_cast<const float*>(xc));
      }
    }
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      if (rr >= nr) break;
      const float v = warp_sum(accs[rr]);
      if (lane == 0) y[int64_t(row + rr) * y_stride + o] = rb(v, r);
    }
    return;
  }
  if (!active) return;  // a whole warp; the grid's other warps wait
  if (vec && deep && K <= 8 * 32 * kBf16Deep) {
    // The row's weights before the dependency wait (nothing in a step writes them), as the FP8
    // GEMVs do: their DRAM round trip overlaps the previous kernel's end.
    uint4 wv[kBf16Deep];
#pragma unroll
    for (int i = 0; i < kBf16Deep; ++i) {
      const int64_t c = lane + 32 * i;
      if (c * 8 < K) wv[i] = __ldg(reinterpret_cast<const uint4*>(wr + c * 8));
    }
    pdl_wait();
#pragma unroll
    for (int i = 0; i < kBf16Deep; ++i) {
      const int64_t c = lane + 32 * i;
      if (c * 8 >= K) break;
      acc = bf16_chunk(acc, wv[i], xr + c * 8);
    }
  } else if (vec) {
    pdl_wait();
#pragma unroll 4
    for (int64_t c = lane; c * 8 < K; c += 32) {
      const uint4 wv = __ldg(reinterpret_cast<const uint4*>(wr + c * 8));
      acc = bf16_chunk(acc, wv, xr + c * 8);
    }
  } else {
    pdl_wait();
    for (int64_t c = lane; c * 8 < K; c += 32)
      for (int64_t k = c * 8; k < c * 8 + 8 && k < K; ++k) acc += bf16_load(wr, k) * xr[k];
  }
  acc = warp_sum(acc);
  if (lane == 0) y[int64_t(row) * y_stride + o] = rb(acc, r);
}

// k_bf16_wide (session 22, DSUF_BF16_WIDE): a BF16 linear of several rows and many outputs — the
// head at batch > 1 — with OPW outputs a warp. k_bf16_linear<R> gives a warp one output, so each
// product reads its input from shared memory (two 16-byte loads for 8 products: the head at batch 4
// took 928 µs for 1.32 GB, 3.2 ms at 16). Here a warp's lanes take the same chunks
// (lane l: chunks l, l+32, … of each of its OPW rows, in order), the 8 inputs of a chunk of each
// input row are read once for the OPW outputs, and the weights stream through registers D chunks
// ahead (the first D before the dependency wait). Each (output, row) sum is bf16_chunk's sequence
// over the lane's chunks in order, then warp_sum: k_bf16_linear's bits. Rows past the last read
// row 0's inputs and are dropped (no per-row branch).
// kPersist (session 45, DSUF_BF16_WIDE_LOOP; the 4-row form, and since session 46 the 8-row forms at
// 12 warps): a block stays resident and takes tiles
// blockIdx.x, blockIdx.x + gridDim.x, … of kWarps·OPW outputs, staging its input rows once instead of
// once a tile (the head at batch 4: 4,040 tiles of 80 KB of staged inputs each), and its weight loads
// run D rounds ahead across a tile's end into the next tile's rows, so that an SM's loads do not come
// in waves. The same sums in the same order.
template <int OPW, int R, int D, int kWarps = 8, int kMinBlocks = 1, bool kFmaOk = false, bool kPersist = false>
__global__ void __launch_bounds__(32 * kWarps, kMinBlocks)
    k_bf16_wide(const uint16_t* __restrict__ W, int64_t out, int64_t K, const float* __restrict__ x, int64_t x_stride,
                float* __restrict__ y, int64_t y_stride, bool r, int64_t rows, Bf16FmaLimits fl) {
  extern __shared__ float4 bf16_xs[];  // the block's input rows, each in bf16_stage_slot's order
  pdl_trigger();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.y * R, nr = int(rows - row < R ? rows - row : R);
  const int nc = int(K / 8), ni = (nc + 31) / 32, n4 = int(K / 4);  // chunks; a lane's rounds
  // This warp's first weight row of tile t; its OPW rows follow (those past the end: the last row,
  // read and dropped). A row index, not OPW pointers: the persistent 8-row form holds this tile's and
  // the next one's, and its registers are the limit (session 46: OPW pointers each spilled).
  auto tile_row = [&](int64_t t) { return (t * kWarps + warp) * OPW; };
  int64_t wr = tile_row(blockIdx.x);
  // Chunk c of row ob + o (past the end: of the last row).
  auto chunk = [&](int64_t ob, int o, int c) {
    return __ldg(reinterpret_cast<const uint4*>(W + (ob + o < out ? ob + o : out - 1) * K + int64_t(c) * 8));
  };
  uint4 wq[D][OPW];
  // Round i's chunk of each of the rows from ob (past the end: the last).
  auto load_from = [&](int64_t ob, int i, uint4 (&dst)[OPW]) {
    const int c = lane + 32 * i < nc ? lane + 32 * i : nc - 1;
#pragma unroll
    for (int o = 0; o < OPW; ++o) dst[o] = chunk(ob, o, c);
  };
  auto load = [&](int i, uint4 (&dst)[OPW]) { load_from(wr, i, dst); };
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < ni) load(d, wq[d]);
  pdl_wait();
  const float* xr = x + int64_t(row) * x_stride;
  bool ok = kFmaOk;
  for (int rr = 0; rr < nr; ++rr)
    for (int i = int(threadIdx.x); i < n4; i += 32 * kWarps) {
      const float4 v = reinterpret_cast<const float4*>(xr + rr * x_stride)[i];
      if constexpr (kFmaOk) ok &= bf16_stage_ok(v, fl);
      bf16_xs[rr * n4 + bf16_stage_slot(i)] = v;
    }
  float acc[OPW][R];
#pragma unroll
  for (int o = 0; o < OPW; ++o)
#pragma unroll
    for (int rr = 0; rr < R; ++rr) acc[o][rr] = 0.0f;
  // The sums, the products by one fmaf each when kFma (kFmaOk: where every staged input qualifies).
  // Only the products sit under the branch: a warp shuffle under it (warp_sum) is compiled as
  // divergent code (WARPSYNC and ENDCOLLECTIVE around each: session 44's first form).
  // wn, more (the persistent form): the next tile's rows, whose first D rounds the last D rounds of
  // this one load — into slot d, where they are read, as a tile's rounds are a multiple of D (the
  // launch checks). The one-tile form passes more = false.
  auto sums = [&](auto kf, int64_t wn, bool more) {
    constexpr bool kFma = decltype(kf)::value;
    for (int i0 = 0; i0 < ni; i0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int i = i0 + d;
        if (i >= ni) break;
        if (lane + 32 * i < nc) {
          if constexpr (kFma) {  // a row's inputs at a time (8 registers live, not 8·R: fewer spills at R = 8)
#pragma unroll
            for (int rr = 0; rr < R; ++rr) {
              const float4* xs = bf16_xs + (rr < nr ? rr : 0) * n4;
              const float4 xc[2] = {xs[(2 * i) * 32 + lane], xs[(2 * i + 1) * 32 + lane]};
#pragma unroll
              for (int o = 0; o < OPW; ++o)
                acc[o][rr] = bf16_chunk<true>(acc[o][rr], wq[d][o], reinterpret_cast<const float*>(xc));
            }
          } else {
            float4 xc[R][2];
#pragma unroll
            for (int rr = 0; rr < R; ++rr) {
              const float4* xs = bf16_xs + (rr < nr ? rr : 0) * n4;
              xc[rr][0] = xs[(2 * i) * 32 + lane], xc[rr][1] = xs[(2 * i + 1) * 32 + lane];
            }
#pragma unroll
            for (int o = 0; o < OPW; ++o)
#pragma unroll
              for (int rr = 0; rr < R; ++rr)
                acc[o][rr] = bf16_chunk<false>(acc[o][rr], wq[d][o], reinterpret_cast<const float*>(xc[rr]));
          }
        }
        if (i + D < ni) load(i + D, wq[d]);
        else if (more) load_from(wn, i + D - ni, wq[d]);
      }
    }
  };
  // A block whose inputs do not qualify for the FMA (tiny or huge values against this matrix, or
  // inputs that are not BF16 values: rare) takes the plain products by a lean loop — a chunk at a
  // time from global memory, the same order — so that the fast path's registers are the FMA form's
  // alone (with the pipelined plain form beside it, the kernel spilled 68 loads, against 18).
  auto lean = [&] {
#pragma unroll 1
    for (int i = 0; i < ni; ++i) {
      const int c = lane + 32 * i;
      if (c >= nc) break;
#pragma unroll
      for (int o = 0; o < OPW; ++o) {
        const uint4 w = chunk(wr, o, c);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const float4* xs = bf16_xs + (rr < nr ? rr : 0) * n4;
          const float4 xc[2] = {xs[(2 * i) * 32 + lane], xs[(2 * i + 1) * 32 + lane]};
          acc[o][rr] = bf16_chunk(acc[o][rr], w, reinterpret_cast<const float*>(xc));
        }
      }
    }
  };
  auto store = [&](int64_t ob) {  // the (output, row) sums of outputs ob.. by warp_sum
#pragma unroll
    for (int o = 0; o < OPW; ++o)
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const float v = warp_sum(acc[o][rr]);
        if (lane == 0 && rr < nr && ob + o < out) y[int64_t(row + rr) * y_stride + ob + o] = rb(v, r);
      }
  };
  if constexpr (kPersist) {
    // The FMA decided once a block (its rows are staged once), the branch around the products only.
    bool fma = false;
    if constexpr (kFmaOk) fma = __syncthreads_and(ok);
    else __syncthreads();
    const int64_t tiles = (out + kWarps * OPW - 1) / (kWarps * OPW);
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      const int64_t tn = t + gridDim.x < tiles ? t + gridDim.x : t;
      const int64_t wn = tile_row(tn);  // the next tile's rows (where there is none: this tile's, not loaded)
      if constexpr (kFmaOk) {
        if (fma) sums(std::true_type{}, wn, tn != t);
        else lean();
      } else {
        sums(std::false_type{}, wn, tn != t);
      }
      store(wr);
      wr = wn;
#pragma unroll
      for (int o = 0; o < OPW; ++o)
#pragma unroll
        for (int rr = 0; rr < R; ++rr) acc[o][rr] = 0.0f;
    }
    return;
  }
  if constexpr (kFmaOk) {
    if (__syncthreads_and(ok)) sums(std::true_type{}, wr, false);
    else lean();
  } else {
    __syncthreads();
    sums(std::false_type{}, wr, false);  // v52's code
  }
  store(wr);
}

// ---- RoPE and KV packing -----------------------------------------------------------------------
__global__ void k_rope(float* x, int64_t rows, int heads, int64_t dim, const float* cs, int half, float sign,
                       bool r) {
  pdl_entry();
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

// A warp per 32-block; with rope.cs set, k_rope's rotation first (the window KV: rope then fake-quant
// in one launch, the quantizer seeing the rotated, rounded values as after k_rope).
__global__ void k_fp8_fake_quant(float* x, int64_t blocks, bool r, FusedRope rope) {
  pdl_entry();
  const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (b >= blocks) return;  // whole warps
  const int lane = threadIdx.x % 32;
  const int64_t e = b * 32 + lane;
  float v = x[e];
  if (rope.cs) v = rope_lane(v, rope_pair(rope, e / (rope.heads * rope.dim), e % rope.dim), lane, rope.r);
  x[e] = fp8_fake_quant_lane(v, r);
}

__device__ __forceinline__ uint8_t* ring_of(const SeqMeta& sq, int layer, int W, int64_t hd) {
  return sq.window + (int64_t(layer) * W) * (hd + hd / 32);
}

__global__ void k_pack_window(const float* kv, int rows, const RowMeta* meta, const SeqMeta* seqs, int layer,
                              int64_t hd, int W) {
  pdl_entry();
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
  pdl_entry();
  const int i = blockIdx.x, j = blockIdx.y;
  const RowMeta m = a.meta[i];
  const SeqMeta& sq = a.seqs[m.seq];
  const int64_t pos = m.pos, hd = a.hd;
  const int64_t w0 = pos - a.W + 1 > 0 ? pos - a.W + 1 : 0;
  const int n_win = int(pos - w0 + 1);
  if (j < n_win) {
    float* dst = a.keys + (int64_t(i) * a.kmax + j) * hd;
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
  int slot = j - n_win;
  int32_t e;
  if (a.picks) {
    // The pick's rank: how many of the row's picks come before it (picks are distinct: distinct
    // indices), counted by the block; that is its slot in the sorted selection.
    const uint64_t* pk = a.picks + int64_t(i) * a.sel_stride;
    const uint64_t mine = pk[slot];
    if (mine == 0) return;  // past the row's picks: the whole block
    int before = 0;
    for (int q = threadIdx.x; q < a.sel_stride; q += blockDim.x) before += pk[q] > mine;
    before = __reduce_add_sync(0xffffffffu, before);
    __shared__ int warp_before[32];
    if (threadIdx.x % 32 == 0) warp_before[threadIdx.x / 32] = before;
    __syncthreads();
    slot = 0;
    for (int w = 0; w < int(blockDim.x / 32); ++w) slot += warp_before[w];
    e = topk::pick_index(mine);
    if (threadIdx.x == 0) a.sel_out[int64_t(i) * a.sel_stride + slot] = e;
  } else {
    e = a.sel[int64_t(i) * a.sel_stride + slot];
    if (e < 0) return;
  }
  float* dst = a.keys + (int64_t(i) * a.kmax + n_win + slot) * hd;
  const uint8_t* entry = sq.ckv[a.src] + int64_t(e) * (hd / 2 + hd / 16);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = ckv_elem(entry, hd, d);
}

// Attention, in two kernels that keep the reference's arithmetic and spread it over the GPU:
// logits (one warp per (key, 8 heads): the lane-strided dot of core/detmath.h for each head), then
// softmax and P·V (below). Logit blocks: grid.z splits a row's keys, 80 ways at batch 1 (a key a
// warp at 640 keys), fewer for more rows, since every block stages its heads' queries.
constexpr int kAttHeadsQK = 8, kAttLoads = 16;
// DSUF_ATT_SPLIT=N sets the split at batch 1 and N / rows (at least 4) beyond (a measuring aid: each
// logit is computed the same way whichever warp takes its key; default 80: v18 measured 0.08 ms a
// step faster than 40, 20 0.3 ms slower). Every block stages its 8 heads' queries and scans the
// row's selection, so fewer splits amortize that over more keys, more split the keys' latency.
int attention_key_split(int rows) {
  static const int split1 = [] {
    const char* v = std::getenv("DSUF_ATT_SPLIT");
    const int n = v ? std::atoi(v) : 80;
    DSUF_CHECK(n >= 1 && n <= 1024, "DSUF_ATT_SPLIT=", v ? v : "", ": expected 1..1024");
    return n;
  }();
  return std::max(4, split1 / std::max(1, rows));
}

// DSUF_ATT_TRACE (AttentionArgs::trace; a diagnostic): a block's phase stamps, kept in shared memory
// and written out at its end under a ticket taken then (the blocks of one launch take consecutive
// tickets: the step's launches of a kernel never overlap one another).
constexpr int kAttTraceStamps = 6, kAttTraceRing = 1 << 16;  // stamps a block; blocks kept a kernel
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Stamp 0 (the entry) and the others cleared: thread 0, before any barrier.
__device__ __forceinline__ void att_trace_entry(const AttentionArgs& a, unsigned long long* st) {
  if (a.trace && threadIdx.x == 0) {
    for (int e = 1; e < kAttTraceStamps; ++e) st[e] = 0;
    st[0] = global_ns();
  }
}
// Stamp e by thread 0 (called by the whole block right after a barrier: the block's moment).
__device__ __forceinline__ void att_stamp(const AttentionArgs& a, unsigned long long* st, int e) {
  if (a.trace && threadIdx.x == 0) st[e] = global_ns();
}
// Stamp e as the latest of the warps' moments (each warp's lane 0; read after a later barrier).
__device__ __forceinline__ void att_stamp_warps(const AttentionArgs& a, unsigned long long* st, int e) {
  if (a.trace && threadIdx.x % 32 == 0) atomicMax(st + e, global_ns());
}
// The last stamp (e, the latest warp), then the block's stamps out. The whole block calls it.
__device__ void att_trace_out(const AttentionArgs& a, unsigned long long* st, int e, int kernel) {
  if (!a.trace) return;
  att_stamp_warps(a, st, e);
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned t = atomicAdd(a.trace_tickets + kernel, 1u);
    unsigned long long* o = a.trace + (size_t(kernel) * kAttTraceRing + t % kAttTraceRing) * (kAttTraceStamps + 2);
    o[0] = t;
    o[1] = gridDim.x * gridDim.y * gridDim.z;
    for (int k = 0; k < kAttTraceStamps; ++k) o[2 + k] = k <= e ? st[k] : 0;
  }
}

__device__ __forceinline__ int attention_keys(const AttentionArgs& a, int i, int* first_free) {
  // The row's keys: its window, then the selection up to its first -1 (found in parallel).
  const int64_t pos = a.meta[i].pos;
  const int64_t w0 = pos - a.W + 1 > 0 ? pos - a.W + 1 : 0;
  // Each thread stops at its first −1 (its smallest), then one atomic per warp: a shared-memory atomic
  // per −1 entry serialized hundreds of them on one address in the rows with few compressed entries.
  if (threadIdx.x == 0) *first_free = a.sel ? a.sel_stride : 0;
  __syncthreads();
  if (a.sel) {
    // Four entries a thread per round, their loads issued together: a loop that stopped at each
    // entry's value made the rounds (4 for the P·V kernel's 128 threads at 512 entries) dependent
    // round trips. Same result: the thread's smallest j with a −1.
    constexpr int U = 4;
    int mine = a.sel_stride;
    const int32_t* sel = a.sel + int64_t(i) * a.sel_stride;
    for (int j0 = threadIdx.x; j0 < a.sel_stride && mine == a.sel_stride; j0 += U * blockDim.x) {
      int32_t v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = j0 + u * int(blockDim.x);
        v[u] = j < a.sel_stride ? __ldg(sel + j) : 0;
      }
#pragma unroll
      for (int u = U - 1; u >= 0; --u)  // the smallest j last: it wins
        if (v[u] < 0) mine = j0 + u * int(blockDim.x);
    }
    for (int o = 16; o > 0; o >>= 1) mine = min(mine, __shfl_xor_sync(0xffffffffu, mine, o));
    if (threadIdx.x % 32 == 0 && mine < a.sel_stride) atomicMin(first_free, mine);
  }
  __syncthreads();
  return int(pos - w0 + 1) + *first_free;
}

// MINB > 0: at least MINB blocks an SM (the compiler keeps the registers under 65536 / (256·MINB)), so
// that more of the 8 × 80 blocks of a batch-1 step run at once: at 88 registers (MINB 0) two fit an
// SM, three waves; 64 (4) two waves; 48 (5) one wave of 660 slots (DSUF_LOGITS_BLOCKS=5|4|0: 5 the
// default since v26, −0.10 ms a step; no spills in either).
// KPP = 2 (DSUF_LOGITS_PAIR, where a warp has two or more keys: several rows): a warp takes two keys a
// pass (key j and j + the grid's warps), so that each query value it loads from shared memory serves
// both; each key's dot is the same lane-strided sequence and tree (warp_sum8_scatter) as one at a time.
// QU > 0 (KPP = 2, hd = 32·QU; DSUF_LOGITS_QT): the queries also laid out lane-major (qt: lane l's QU
// values l, l + 32, … of a head contiguous, a row of QS floats), so that a lane takes them four at a
// time (LDS.128) instead of one, and the key loop runs with hd known: no bounds or 64-bit compares
// (session 42's SASS of the pair loop: ~37 % of its instructions were neither loads nor the products).
// The same products, added in the same order.
// A lane's row of the lane-major queries: QU values padded to a multiple of 4 whose quarter is odd,
// so that the 8 lanes of an LDS.128 phase fall in distinct 16-byte bank groups.
__host__ __device__ constexpr int logits_qt_stride(int qu) { return (qu / 4) % 2 ? qu : qu + 4; }
template <int MINB, bool kScatter, int KPP = 1, int QU = 0>
__global__ void __launch_bounds__(256, MINB > 0 ? MINB : 1) k_attention_logits(AttentionArgs a) {
  static_assert(KPP == 1 || (KPP == 2 && kScatter), "two keys a pass with the scatter tree");
  static_assert(QU == 0 || (KPP == 2 && QU % 4 == 0), "lane-major queries: two keys a pass, 4 values a load");
  __shared__ unsigned long long att_st[kAttTraceStamps];
  att_trace_entry(a, att_st);
  pdl_entry(a.logits_late);
  att_stamp(a, att_st, 1);
  extern __shared__ __align__(16) float qs[];  // [kAttHeadsQK][hd]
  __shared__ int first_free;
  __shared__ __align__(8) uint64_t stage_bar;
  const int i = blockIdx.x, h0 = blockIdx.y * kAttHeadsQK;
  const int64_t hd = a.hd;
  const int nh = min(kAttHeadsQK, a.H - h0);  // the last group may be partial
  const float* qsrc = a.q + (int64_t(i) * a.H + h0) * hd;
  const uint32_t bar = smem_u32(&stage_bar), qbytes = uint32_t(nh * hd * sizeof(float));
  const bool bulk = a.bulk && qbytes % 16 == 0 && (reinterpret_cast<uintptr_t>(qsrc) & 15) == 0;
  if (bulk) {  // one copy (the barrier's init is visible to the other threads after attention_keys' barrier)
    if (threadIdx.x == 0) {
      mbar_init(bar);
      mbar_init_fence();
      bulk_to_smem(smem_u32(qs), qsrc, qbytes, bar);
    }
    for (int64_t t = nh * hd + threadIdx.x; t < kAttHeadsQK * hd; t += blockDim.x) qs[t] = 0.0f;
  } else if (a.stage16 && hd % 4 == 0 && (reinterpret_cast<uintptr_t>(qsrc) & 15) == 0) {  // 16 bytes a copy
    for (int64_t t = 4 * threadIdx.x; t < kAttHeadsQK * hd; t += 4 * blockDim.x) {
      if (t < nh * hd)
        cp_async16(qs + t, qsrc + t);
      else
        *reinterpret_cast<float4*>(qs + t) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  } else {
    for (int64_t t = threadIdx.x; t < kAttHeadsQK * hd; t += blockDim.x) {  // asynchronous: one round trip
      if (t < nh * hd)
        cp_async4(qs + t, qsrc + t);
      else
        qs[t] = 0.0f;
    }
  }
  const int nk = attention_keys(a, i, &first_free);
  if (bulk)
    mbar_wait(bar, 0);
  else
    cp_async_wait_all();
  __syncthreads();
  if (a.q_rope.cs) {  // the queries' rope (k_rope's arithmetic, a thread per pair), here instead of a launch
    const FusedRope& f = a.q_rope;
    for (int t = threadIdx.x; t < nh * f.half; t += blockDim.x) {
      const int h = t / f.half, k = t % f.half;
      float* v = qs + h * hd + hd - 2 * f.half;
      const float c = f.cs[(int64_t(i) * f.half + k) * 2], s = f.sign * f.cs[(int64_t(i) * f.half + k) * 2 + 1];
      const float x0 = v[2 * k], x1 = v[2 * k + 1];
      v[2 * k] = rb(x0 * c - x1 * s, f.r);
      v[2 * k + 1] = rb(x0 * s + x1 * c, f.r);
    }
    __syncthreads();
  }
  att_stamp(a, att_st, 2);
  const float scale = 1.0f / sqrtf(float(hd));
  const int lane = threadIdx.x % 32;
  const int gw = blockIdx.z * (blockDim.x / 32) + threadIdx.x / 32, nw = gridDim.z * (blockDim.x / 32);
  const float* keys = a.keys + int64_t(i) * a.kmax * hd;
  // A pass's two keys (KPP = 2): each key's 8 head sums by one butterfly, head h stored by lane 4h.
  auto store_pair = [&](const float (&dot)[2][kAttHeadsQK], int j, int j1, bool two) {
    const int h = (lane >> 2) & 7;
    const float v0 = warp_sum8_scatter(dot[0], lane);
    if ((lane & 3) == 0 && h < nh) a.att[(int64_t(i) * a.H + h0 + h) * a.kmax + j] = v0 * scale;
    if (two) {
      const float v1 = warp_sum8_scatter(dot[1], lane);
      if ((lane & 3) == 0 && h < nh) a.att[(int64_t(i) * a.H + h0 + h) * a.kmax + j1] = v1 * scale;
    }
  };
  if constexpr (QU > 0) {
    constexpr int QS = logits_qt_stride(QU), V = QU < 8 ? QU : 8;
    float* qt = qs + kAttHeadsQK * 32 * QU;  // [kAttHeadsQK][32][QS]
    for (int t = threadIdx.x; t < kAttHeadsQK * 32 * QU; t += blockDim.x) {
      const int h = t / (32 * QU), r = t % (32 * QU);
      qt[(h * 32 + r % 32) * QS + r / 32] = qs[t];
    }
    __syncthreads();
    const float* ql = qt + lane * QS;
    for (int j = gw; j < nk; j += 2 * nw) {
      const int j1 = j + nw;
      const bool two = j1 < nk;  // warp-uniform; without a second key the first is read twice, not stored
      const float* k0p = keys + int64_t(j) * (32 * QU) + lane;
      const float* k1p = keys + int64_t(two ? j1 : j) * (32 * QU) + lane;
      float dot[2][kAttHeadsQK];
#pragma unroll
      for (int h = 0; h < kAttHeadsQK; ++h) dot[0][h] = 0.0f, dot[1][h] = 0.0f;
#pragma unroll
      for (int v = 0; v < QU; v += V) {
        float k0[V], k1[V];
#pragma unroll
        for (int u = 0; u < V; ++u) k0[u] = k0p[32 * (v + u)], k1[u] = k1p[32 * (v + u)];
#pragma unroll
        for (int h = 0; h < kAttHeadsQK; ++h)
#pragma unroll
          for (int w = 0; w < V; w += 4) {
            const float4 q = *reinterpret_cast<const float4*>(ql + h * 32 * QS + v + w);
            dot[0][h] += q.x * k0[w];
            dot[1][h] += q.x * k1[w];
            dot[0][h] += q.y * k0[w + 1];
            dot[1][h] += q.y * k1[w + 1];
            dot[0][h] += q.z * k0[w + 2];
            dot[1][h] += q.z * k1[w + 2];
            dot[0][h] += q.w * k0[w + 3];
            dot[1][h] += q.w * k1[w + 3];
          }
      }
      store_pair(dot, j, j1, two);
    }
  } else if constexpr (KPP == 2) {
    constexpr int L = kAttLoads / 2;  // a lane's key values a chunk, per key
    for (int j = gw; j < nk; j += 2 * nw) {
      const int j1 = j + nw;
      const bool two = j1 < nk;  // warp-uniform
      float dot[2][kAttHeadsQK];
#pragma unroll
      for (int h = 0; h < kAttHeadsQK; ++h) dot[0][h] = 0.0f, dot[1][h] = 0.0f;
      for (int64_t c = lane; c < hd; c += 32 * L) {
        float k0[L], k1[L];
#pragma unroll
        for (int u = 0; u < L; ++u) {
          const bool in = c + 32 * u < hd;
          k0[u] = in ? keys[int64_t(j) * hd + c + 32 * u] : 0.0f;
          k1[u] = in && two ? keys[int64_t(j1) * hd + c + 32 * u] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < L; ++u) {
          if (c + 32 * u >= hd) break;
#pragma unroll
          for (int h = 0; h < kAttHeadsQK; ++h) {
            const float q = qs[h * hd + c + 32 * u];
            dot[0][h] += q * k0[u];
            dot[1][h] += q * k1[u];
          }
        }
      }
      store_pair(dot, j, j1, two);
    }
  } else
  for (int j = gw; j < nk; j += nw) {
    float dot[kAttHeadsQK];
#pragma unroll
    for (int h = 0; h < kAttHeadsQK; ++h) dot[h] = 0.0f;
    // A lane's 16 key values of a chunk are loaded together (one round trip for hd = 512), then
    // added in the lane-strided order.
    for (int64_t c = lane; c < hd; c += 32 * kAttLoads) {
      float k[kAttLoads];
#pragma unroll
      for (int u = 0; u < kAttLoads; ++u) k[u] = c + 32 * u < hd ? keys[int64_t(j) * hd + c + 32 * u] : 0.0f;
#pragma unroll
      for (int u = 0; u < kAttLoads; ++u) {
        if (c + 32 * u >= hd) break;
#pragma unroll
        for (int h = 0; h < kAttHeadsQK; ++h) dot[h] += qs[h * hd + c + 32 * u] * k[u];
      }
    }
    if constexpr (kScatter) {
      static_assert(kAttHeadsQK == 8, "warp_sum8_scatter sums 8 heads");
      const float v = warp_sum8_scatter(dot, lane);
      const int h = (lane >> 2) & 7;
      if ((lane & 3) == 0 && h < nh) a.att[(int64_t(i) * a.H + h0 + h) * a.kmax + j] = v * scale;
    } else {
#pragma unroll
      for (int h = 0; h < kAttHeadsQK; ++h) {
        const float v = warp_sum(dot[h]);
        if (lane == h && h < nh) a.att[(int64_t(i) * a.H + h0 + h) * a.kmax + j] = v * scale;
      }
    }
  }
  pdl_exit(a.logits_late);
  att_trace_out(a, att_st, 3, 0);
}

// Softmax and P·V. A block takes 8 heads × 32 output dims of a row, HPW heads a warp (8 / HPW
// warps): it copies the 8 heads' logits and its 32-dim slice of every key into shared memory with
// asynchronous copies (one round trip), warp w turns its heads HPW·w … HPW·w + HPW − 1 into
// exp(logit − max) and their denominators, then thread (w, lane) adds up dim lane of those heads
// over the keys in order from zero, as the reference. A denominator is the reference's 128-thread
// block_sum, computed by one warp: lane l keeps the four partials t = l + 32c (c < 4) of that sum,
// the warp tree of each gives q_c, and the tree of q_0..q_3 padded with zeros is
// (q_0 + q_2) + (q_1 + q_3). The 16 blocks of a head group each redo the group's softmax (8 × nk
// exponentials) rather than wait for one another. Rows longer than the key tile take several tiles
// (not at V4.1's 640 keys). HPW = 2 (128 threads, DSUF_PV=cp): 21.3 µs a launch at 8K under Nsight,
// one warp a scheduler, each warp ~9,000 dependent instructions (docs/perf.md v18); HPW = 1 (256
// threads, DSUF_PV=warps, the default) halves a warp's chain (one head's softmax and sums) for
// 1.6× the instructions of a block: 0.06 ms a step faster (v18). k_attention_pv_tiles below
// (DSUF_PV=tiles) tiles the keys 64 rows at a time.
constexpr int kPvHeads = 8, kPvDims = 32, kPvMaxTile = 640;

// The attention output v of row i, head h (of the rank's H), dim d, held by lane `lane` of a warp
// that holds 32 consecutive dims of the head, laid out as wo_a's input: k_linear_input's arithmetic
// (the inverse rope, then the quantization) for its group of o_group values. Whole warps.
__device__ __forceinline__ void emit_attention_out(const AttentionArgs& a, int i, int h, int64_t d, int lane, float v) {
  const int64_t K = a.o_group, kp = interleaved_k(K), nb = K / 32, groups = a.H * a.hd / K;
  const int64_t col = int64_t(h) * a.hd + d;
  if (a.o_rope.cs) v = rope_lane(v, rope_pair(a.o_rope, i, col % a.o_rope.dim), lane, a.o_rope.r);
  const int64_t g = col / K;
  const int kb = int((col % K) / 32);
  emit_input(v, a.o_sink.quantize, a.o_sink.xq + (int64_t(i) * groups + g) * kp,
             a.o_sink.quantize ? a.o_sink.xs + (int64_t(i) * groups + g) * nb + kb : nullptr, kb, lane);
}

// UNR > 2: the P·V loop takes UNR groups of 4 keys at a time, all their shared loads issued before
// the products (DSUF_PV_UNROLL: 8, the v23 candidate; 2: v22's loop alone); every accumulator adds
// its keys in order either way.
// DW > 1 (DSUF_PV=cpw, session 43): a block takes DW·32 dims (DW warps across the dims of each group
// of HPW heads), so that the 8 heads' softmax is computed once for DW·32 dims (by kPvHeads / warps
// heads a warp: SPW) while each key value a lane loads still serves HPW heads.
template <int HPW, int UNR, int DW = 1>
__global__ void __launch_bounds__(32 * kPvHeads / HPW * DW) k_attention_pv(AttentionArgs a, int tile) {
  constexpr int kThreads = 32 * kPvHeads / HPW * DW, kWarps = kThreads / 32, kDims = kPvDims * DW;
  static_assert(kWarps <= kPvHeads && kPvHeads % kWarps == 0, "the softmax: whole heads a warp");
  constexpr int SPW = kPvHeads / kWarps;
  // The warp's heads' attention sinks (weights: nothing in a step writes them) before the dependency
  // wait, so that their DRAM latency is not paid after the softmax (DSUF_W_EARLY=1; 0: after it).
  float sink_v[SPW];
  auto load_sinks = [&] {
#pragma unroll
    for (int u = 0; u < SPW; ++u) {
      const int h = SPW * int(threadIdx.x / 32) + u;
      sink_v[u] = threadIdx.x % 32 == 0 && h < min(kPvHeads, a.H - int(blockIdx.y) * kPvHeads)
                      ? a.sink[blockIdx.y * kPvHeads + h]
                      : 0.0f;
    }
  };
  __shared__ unsigned long long att_st[kAttTraceStamps];
  att_trace_entry(a, att_st);
  if (a.w_early) load_sinks();
  extern __shared__ float4 pv_smem4[];
  const int kp = (a.kmax + 3) & ~3;
  float* p = reinterpret_cast<float*>(pv_smem4);  // [kPvHeads][kp] logits, then exp(logit − max)
  float* kt = p + kPvHeads * kp;                  // [tile][kDims] key slice
  __shared__ float den_s[kPvHeads];
  __shared__ int first_free;
  const int i = blockIdx.x, h0 = blockIdx.y * kPvHeads, d0 = blockIdx.z * kDims;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hg = warp / DW, ds = warp % DW;  // the loop's: heads HPW·hg …, dims d0 + 32·ds + lane
  const int64_t hd = a.hd;
  // pv_keys_early: the key count and the first key tile before the wait (gather_keys wrote them at
  // least two launches back; the logits kernel triggers this one only after its own wait).
  if (!a.pv_keys_early) pdl_entry(a.pv_late), att_stamp(a, att_st, 1);
  if (!a.w_early) load_sinks();
  const int nk = attention_keys(a, i, &first_free);
  const int nh = min(kPvHeads, a.H - h0);
  const float* keys = a.keys + int64_t(i) * a.kmax * hd + d0;
  const bool vec = hd % 4 == 0 && d0 + kDims <= hd;
  auto stage_keys = [&](int j0) {
    const int n = min(tile, nk - j0);
    if (vec) {
      for (int t = threadIdx.x; t < n * (kDims / 4); t += kThreads)
        cp_async16(kt + 4 * t, keys + int64_t(j0 + t / (kDims / 4)) * hd + 4 * (t % (kDims / 4)));
    } else {
      for (int t = threadIdx.x; t < n * kDims; t += kThreads)
        kt[t] = d0 + t % kDims < hd ? keys[int64_t(j0 + t / kDims) * hd + t % kDims] : 0.0f;
    }
  };
  if (a.pv_keys_early) {
    stage_keys(0);
    pdl_entry(a.pv_late);
    att_stamp(a, att_st, 1);
  }
  const float* att = a.att + (int64_t(i) * a.H + h0) * a.kmax;
  if (a.stage16 && a.kmax % 4 == 0 && (reinterpret_cast<uintptr_t>(att) & 15) == 0) {
    // 16 bytes a copy: up to 3 entries past nk (within the row's kmax) land in p, never read.
    const int n4 = (nk + 3) / 4;
    for (int t = threadIdx.x; t < nh * n4; t += kThreads) {
      const int h = t / n4, j = 4 * (t % n4);
      cp_async16(p + h * kp + j, att + int64_t(h) * a.kmax + j);
    }
  } else {
    for (int h = 0; h < nh; ++h)
      for (int j = threadIdx.x; j < nk; j += kThreads) cp_async4(p + h * kp + j, att + int64_t(h) * a.kmax + j);
  }
  if (!a.pv_keys_early) stage_keys(0);
  cp_async_wait_all();
  __syncthreads();
  att_stamp(a, att_st, 2);
#pragma unroll
  for (int u = 0; u < SPW; ++u) {
    const int h = SPW * warp + u;
    if (h >= nh) break;
    float* ph = p + h * kp;
    float mx = -INFINITY;
    for (int j = lane; j < nk; j += 32) mx = fmaxf(mx, ph[j]);
    mx = warp_max(mx);
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (a.exp_nb) {  // the four exponentials of a round without branches, so that they interleave
      for (int j0 = 0; j0 < nk; j0 += 128) {
        float e[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = j0 + 32 * c + lane;
          e[c] = det::fexp_nb((j < nk ? ph[j] : mx) - mx);
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = j0 + 32 * c + lane;
          if (j < nk) part[c] += (ph[j] = e[c]);
        }
      }
    } else {
      for (int j0 = 0; j0 < nk; j0 += 128)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = j0 + 32 * c + lane;
          if (j < nk) part[c] += (ph[j] = det::fexp(ph[j] - mx));
        }
    }
    float q[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) q[c] = warp_sum(part[c]);
    if (lane == 0) den_s[h] = ((q[0] + q[2]) + (q[1] + q[3])) + det::fexp(sink_v[u] - mx);
  }
  __syncthreads();
  att_stamp(a, att_st, 3);
  const float* ph[HPW];
  float acc[HPW];
#pragma unroll
  for (int u = 0; u < HPW; ++u) ph[u] = p + (HPW * hg + u) * kp, acc[u] = 0.0f;
  const int dl = 32 * ds + lane;  // the lane's column of the key tile (lane where DW = 1)
  for (int j0 = 0; j0 < nk; j0 += tile) {
    if (j0 > 0) {
      __syncthreads();
      stage_keys(j0);
      cp_async_wait_all();
      __syncthreads();
    }
    const int n = min(tile, nk - j0);
    int jj = 0;
    if constexpr (UNR > 2) {
      // UNR groups of 4 keys: every group's weights and keys loaded first, then the products in key
      // order (the compiler, left to itself, reuses one group's registers and keeps ~1 group ahead).
      for (; jj + 4 * UNR <= n; jj += 4 * UNR) {
        float4 w[UNR][HPW];
        float kk[UNR][4];
#pragma unroll
        for (int g = 0; g < UNR; ++g) {
#pragma unroll
          for (int u = 0; u < HPW; ++u) w[g][u] = *reinterpret_cast<const float4*>(ph[u] + j0 + jj + 4 * g);
#pragma unroll
          for (int c = 0; c < 4; ++c) kk[g][c] = kt[(jj + 4 * g + c) * kDims + dl];
        }
#pragma unroll
        for (int g = 0; g < UNR; ++g)
#pragma unroll
          for (int u = 0; u < HPW; ++u) {
            acc[u] += w[g][u].x * kk[g][0];
            acc[u] += w[g][u].y * kk[g][1];
            acc[u] += w[g][u].z * kk[g][2];
            acc[u] += w[g][u].w * kk[g][3];
          }
      }
    }
#pragma unroll 2
    for (; jj + 4 <= n; jj += 4) {
      float4 w[HPW];
#pragma unroll
      for (int u = 0; u < HPW; ++u) w[u] = *reinterpret_cast<const float4*>(ph[u] + j0 + jj);
      const float k0 = kt[(jj + 0) * kDims + dl], k1 = kt[(jj + 1) * kDims + dl];
      const float k2 = kt[(jj + 2) * kDims + dl], k3 = kt[(jj + 3) * kDims + dl];
#pragma unroll
      for (int u = 0; u < HPW; ++u) {
        acc[u] += w[u].x * k0;
        acc[u] += w[u].y * k1;
        acc[u] += w[u].z * k2;
        acc[u] += w[u].w * k3;
      }
    }
    for (; jj < n; ++jj) {
      const float k = kt[jj * kDims + dl];
#pragma unroll
      for (int u = 0; u < HPW; ++u) acc[u] += ph[u][j0 + jj] * k;
    }
  }
  att_stamp_warps(a, att_st, 4);
  pdl_exit(a.pv_late);
  const int64_t d = d0 + dl;
  if (a.o_sink.xq) {  // wo_a's input, as k_linear_input lays it out (whole warps: attention() checks)
    if (DW == 1 || d0 + 32 * ds < hd)
#pragma unroll
      for (int u = 0; u < HPW; ++u)
        emit_attention_out(a, i, h0 + HPW * hg + u, d, lane, rb(acc[u] / den_s[HPW * hg + u], a.r));
    att_trace_out(a, att_st, 5, 1);
    return;
  }
  if (d < hd) {
    float* o = a.out + (int64_t(i) * a.H + h0) * hd + d;
#pragma unroll
    for (int u = 0; u < HPW; ++u)
      if (HPW * hg + u < nh) o[(HPW * hg + u) * hd] = rb(acc[u] / den_s[HPW * hg + u], a.r);
  }
  att_trace_out(a, att_st, 5, 1);
}

// The tiled alternative (DSUF_PV=tiles; session 4's first rewrite, measured 711 µs a step at 8K against
// 809 for k_attention_pv, docs/perf.md v11). A block per (8 heads, 32 dims) of a row, 256 threads:
// first the two 128-thread halves each run one head's softmax at a time (the reference's 128-thread
// block_sum order: thread t's partial over j ≡ t mod 128, then the warp trees and (q0 + q2) + (q1 + q3)),
// exp(logit − max) kept in shared memory; then thread (head, dim) adds up its dim over the keys in
// order from zero, the keys' 32-dim slice staged 64 rows at a time through registers (the next tile's
// loads issued before this tile's arithmetic). Dynamic shared memory: kPvHeads·kmax floats.
constexpr int kPvTileRows = 64, kPvTileThreads = kPvHeads * kPvDims;

// Sum (max) over one 128-thread half `half` of a 256-thread block: the warp trees, then the tree of
// the half's four warp values (q0 + q2) + (q1 + q3). Every thread of the block must call it.
__device__ __forceinline__ float half_block_sum(float v, float (*part)[4], int half) {
  v = warp_sum(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) part[half][(threadIdx.x / 32) % 4] = v;
  __syncthreads();
  return (part[half][0] + part[half][2]) + (part[half][1] + part[half][3]);
}
__device__ __forceinline__ float half_block_max(float v, float (*part)[4], int half) {
  v = warp_max(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) part[half][(threadIdx.x / 32) % 4] = v;
  __syncthreads();
  return fmaxf(fmaxf(part[half][0], part[half][2]), fmaxf(part[half][1], part[half][3]));
}

__global__ void __launch_bounds__(kPvTileThreads) k_attention_pv_tiles(AttentionArgs a) {
  pdl_entry();
  extern __shared__ float4 pvt_smem4[];
  float* p = reinterpret_cast<float*>(pvt_smem4);  // [kPvHeads][kmax]: exp(logit − max)
  __shared__ __align__(16) float kt[kPvTileRows][kPvDims];  // written as float4: 16-byte aligned
  __shared__ float part[2][4];
  __shared__ float den_s[kPvHeads];
  __shared__ int first_free;
  const int i = blockIdx.x, h0 = blockIdx.y * kPvHeads, d0 = blockIdx.z * kPvDims;
  const int64_t hd = a.hd;
  const int nk = attention_keys(a, i, &first_free);
  const int nh = min(kPvHeads, a.H - h0);
  const int half = threadIdx.x / 128, t128 = threadIdx.x % 128;
  for (int hp = 0; hp < kPvHeads; hp += 2) {  // uniform trip count: both halves reach every barrier
    const int h = hp + half;
    const bool live = h < nh;
    const float* lg = a.att + (int64_t(i) * a.H + h0 + h) * a.kmax;
    float* ph = p + h * a.kmax;
    float mx = -INFINITY;
    if (live)
      for (int j = t128; j < nk; j += 128) mx = fmaxf(mx, lg[j]);
    mx = half_block_max(mx, part, half);
    float den = 0.0f;
    if (live)
      for (int j = t128; j < nk; j += 128) den += (ph[j] = det::fexp(lg[j] - mx));
    den = half_block_sum(den, part, half);
    if (live && t128 == 0) den_s[h] = den + det::fexp(a.sink[h0 + h] - mx);
  }
  const float* keys = a.keys + int64_t(i) * a.kmax * hd + d0;
  const int lr = threadIdx.x / 8, lc = threadIdx.x % 8;  // tile rows lr and lr + 32, float4 lc
  const bool vec = hd % 4 == 0 && d0 + kPvDims <= hd;
  auto fetch = [&](int j0, float4 (&v)[2]) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = j0 + lr + 32 * u;
      v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (j >= nk) continue;
      const float* src = keys + int64_t(j) * hd + 4 * lc;
      if (vec) {
        v[u] = __ldg(reinterpret_cast<const float4*>(src));
      } else {
        float* e = &v[u].x;
        for (int c = 0; c < 4; ++c)
          if (d0 + 4 * lc + c < hd) e[c] = src[c];
      }
    }
  };
  const int hl = threadIdx.x / kPvDims, dl = threadIdx.x % kPvDims;
  const float* ph = p + hl * a.kmax;
  float acc = 0.0f;
  float4 next[2];
  fetch(0, next);
  for (int j0 = 0; j0 < nk; j0 += kPvTileRows) {
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 2; ++u) reinterpret_cast<float4*>(kt[lr + 32 * u])[lc] = next[u];
    __syncthreads();
    if (j0 + kPvTileRows < nk) fetch(j0 + kPvTileRows, next);
    const int n = min(kPvTileRows, nk - j0);
    if (n == kPvTileRows) {
#pragma unroll 16
      for (int jj = 0; jj < kPvTileRows; ++jj) acc += ph[j0 + jj] * kt[jj][dl];
    } else {
      for (int jj = 0; jj < n; ++jj) acc += ph[j0 + jj] * kt[jj][dl];
    }
  }
  const int64_t d = d0 + dl;
  if (a.o_sink.xq) {  // warp hl holds head hl's 32 dims (whole warps: attention() checks)
    emit_attention_out(a, i, h0 + hl, d, dl, rb(acc / den_s[hl], a.r));
    return;
  }
  if (hl < nh && d < hd) a.out[(int64_t(i) * a.H + h0 + hl) * hd + d] = rb(acc / den_s[hl], a.r);
}

// ---- compressor --------------------------------------------------------------------------------
// One block per emitted entry: pool the ratio tokens, norm, indexer key (a warp per output), RoPE,
// FP4 packing. 1,024 threads, the indexer key's matrix prefetched into L2 before the dependency
// wait, and the FP4 packing a lane per value (the block's amax by shuffles, a pair's two codes
// joined by a shuffle): with 256 threads, cold weights and a thread per 16/32-block it took ~36 µs
// at batch 1, on the indexer's path (docs/perf.md v19). Needs hd % 32 == 0 and ihd % 32 == 0.
constexpr int kCompressThreads = 1024;
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__global__ void __launch_bounds__(kCompressThreads) k_compress_emit(CompressArgs a) {
  {  // weights only (PDL: nothing an earlier kernel of the step writes)
    const char* wk = reinterpret_cast<const char*>(a.wk);
    for (int64_t b = int64_t(threadIdx.x) * 128; b < a.ihd * a.hd * 2; b += int64_t(blockDim.x) * 128)
      prefetch_l2(wk + b);
  }
  pdl_entry();
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
  // Compressed entry: FP4 with E4M3 scales per 16; key: FP4 with E8M0 scales per 32. A lane per
  // value, whole warps (hd, ihd multiples of 32); the max is order-free, so the bits are the
  // reference's.
  uint8_t* ent = sq.ckv[a.src] + w * (hd / 2 + hd / 16);
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    const float v = latent[d];
    float amax = fmaxf(0.0f, fabsf(v));
    for (int o = 1; o < 16; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const uint8_t sc = e4m3_code(fmaxf(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f);
    const uint32_t code = e2m1_code(v / e4m3_val(sc));
    const uint32_t next = __shfl_down_sync(0xffffffffu, code, 1);
    if (lane % 2 == 0) ent[d / 2] = uint8_t(code | (next << 4));
    if (lane % 16 == 0) ent[hd / 2 + d / 16] = sc;
  }
  uint8_t* key = sq.ikey[a.src] + w * (ihd / 2 + ihd / 32);
  for (int64_t d = threadIdx.x; d < ihd; d += blockDim.x) {
    const float v = kv[d];
    const float s = pow2_ceil(fmaxf(warp_max(fmaxf(0.0f, fabsf(v))), 6.0f * ldexpf(1.0f, -126)) / 6.0f);
    const uint32_t code = e2m1_code(v / s);
    const uint32_t next = __shfl_down_sync(0xffffffffu, code, 1);
    if (lane % 2 == 0) key[d / 2] = uint8_t(code | (next << 4));
    if (lane == 0) key[ihd / 2 + d / 32] = e8m0_code(s);
  }
}

__global__ void k_update_pending(const float* ag, const PendingJob* jobs, const SeqMeta* seqs, int64_t hd) {
  pdl_entry();
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
// With rope.cs set, k_rope's rotation first (rows of rope.heads·rope.dim values; x is not written).
__global__ void k_index_q_quant(const float* x, int64_t blocks, int8_t* codes, float* scales, FusedRope rope) {
  pdl_entry();
  const int64_t b = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (b >= blocks) return;
  const int lane = threadIdx.x % 32;
  float v = x[b * 32 + lane];
  if (rope.cs) {
    const int64_t row_len = int64_t(rope.heads) * rope.dim, j = b * 32 + lane;
    v = rope_lane(v, rope_pair(rope, j / row_len, j % rope.dim), lane, rope.r);
  }
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

// G > 1 (DSUF_IDX_SPLIT=auto where the grid is small, or heads; session 28): a block takes
// kIdxEntries / G entries, warp-groups of them each one G-th of the heads (thread t: entry t mod
// EPB, heads group t / EPB); every head term is computed as above and kept in shared memory, then
// the first group adds an entry's terms in head order from zero — the same sum, G times the blocks
// (at 8K, one row: 64 blocks instead of 16 for the 2,048 compressed entries, each thread a quarter
// of the dp4a chain).
template <int G>
__global__ void __launch_bounds__(kIdxEntries) k_index_scores(IndexScoreArgs a) {
  constexpr int EPB = kIdxEntries / G;  // entries a tile
  pdl_entry();
  extern __shared__ __align__(16) uint32_t ism[];
  const int IH = a.IH, i = blockIdx.y, t = threadIdx.x;
  const int el = t % EPB, g = t / EPB, hn = IH / G, h0 = g * hn;
  const RowMeta m = a.meta[i];
  const int64_t vis = (m.pos + 1) / a.ratio;
  if (int64_t(blockIdx.x) * EPB >= vis) return;  // the whole block: nothing visible here
  uint32_t* tile = ism;                                          // [EPB][17] packed keys
  uint32_t* qw = tile + EPB * kIdxKeyWords;                      // [IH][32] query codes, 4 per word
  float* qs4 = reinterpret_cast<float*>(qw + IH * kIdxDim / 4);  // [IH][4] 0.25·s_q
  float* wv = qs4 + IH * kIdxBlocks;                             // [IH] rb(weight)·head_scale
  float* terms = wv + IH;                                        // G > 1: [IH][EPB] head terms
  const float head_scale = 1.0f / sqrtf(float(IH)), dim_scale = 1.0f / sqrtf(float(kIdxDim));
  const uint4* qsrc = reinterpret_cast<const uint4*>(a.qc + int64_t(i) * IH * kIdxDim);  // rows 16-byte aligned
  for (int k = t; k < IH * kIdxDim / 16; k += kIdxEntries) reinterpret_cast<uint4*>(qw)[k] = qsrc[k];
  for (int k = t; k < IH * kIdxBlocks; k += kIdxEntries) qs4[k] = 0.25f * a.qs[int64_t(i) * IH * kIdxBlocks + k];
  for (int h = t; h < IH; h += kIdxEntries) wv[h] = rb(a.wts[int64_t(i) * IH + h], a.r) * head_scale;
  const uint8_t* keys = a.seqs[m.seq].ikey[a.src];
  // Tiles of EPB entries, grid-strided (the launcher caps the grid; the queries stay).
  for (int64_t e0 = int64_t(blockIdx.x) * EPB; e0 < vis; e0 += int64_t(gridDim.x) * EPB) {
    // Stage the tile's visible keys (n_e·68 bytes from a 16-byte aligned offset when keys is).
    const int n_e = int(vis - e0 < EPB ? vis - e0 : EPB);
    const uint32_t* src = reinterpret_cast<const uint32_t*>(keys + e0 * (kIdxKeyWords * 4));
    const int words = n_e * kIdxKeyWords;
    int done = 0;
    __syncthreads();  // the previous tile (and its terms) are read
    if ((reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
      done = words / 4 * 4;
      for (int k = t; k < words / 4; k += kIdxEntries)
        reinterpret_cast<uint4*>(tile)[k] = __ldg(reinterpret_cast<const uint4*>(src) + k);
    }
    for (int k = done + t; k < words; k += kIdxEntries) tile[k] = __ldg(src + k);
    __syncthreads();
    const int64_t e = e0 + el;
    float* out = a.scores + int64_t(i) * a.score_stride + e;
    const bool live = el < n_e;
    const bool masked = live && a.cand_mask && !a.cand_mask[int64_t(i) * a.mask_stride + e / a.block];
    float s = 0.0f;
    if (live && !masked) {
      // The key: kc[w] holds dims 4w..4w+3 as int8 2c' (word u of the packed key is dims 8u..8u+7).
      const uint32_t* kt = tile + el * kIdxKeyWords;  // odd stride: conflict-free
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
#pragma unroll 4
      for (int h = h0; h < h0 + hn; ++h) {
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
        const float term = wv[h] * fmaxf(dot, 0.0f) * dim_scale;
        if constexpr (G == 1)
          s += term;
        else
          terms[h * EPB + el] = term;
      }
    }
    if constexpr (G > 1) {
      __syncthreads();  // every group's terms are in
      if (g != 0 || !live) continue;
      if (!masked)
        for (int h = 0; h < IH; ++h) s += terms[h * EPB + el];  // head order, from zero
    } else if (!live) {
      continue;
    }
    *out = masked ? -INFINITY : s;
  }
}

__global__ void k_candidate_block_scores(const float* scores, int64_t score_stride, const RowMeta* meta, int ratio,
                                         int block, float* bscores, int64_t b_stride) {
  pdl_entry();
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

// Inclusive prefix sum over a block of T threads (warp shuffles, then the T / 32 warp totals).
template <int T = 256>
__device__ __forceinline__ int block_scan(int v, int* warp_tot) {  // warp_tot: T / 32 ints
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

// One block of T threads selects the top k of the entries [0, count) of `row` (topk_plan.h: eligible =
// key above key(-inf), order (key desc, index asc)): radix-select the k-th largest key, then gather
// every entry above it and the first ties at it in index order. Calls emit(slot, j, key, value) once
// per pick: slots [0, want − ties) hold the entries above the k-th key in index order, [want − ties,
// want) the ties taken, in index order. Returns want = min(eligible, k), the same in every thread.
// The caller synchronizes before reading what emit wrote.
// T threads (a multiple of 32, ≥ 256, ≤ 1024): the histogram and its scan take the first 256, the
// passes over the row all T; the picks and their slots do not depend on T.
// lean (DSUF_TOPK_SELECT=lean|classic, lean the default since v26: −0.016 ms; k_top_k only): the same
// digits and picks with fewer barriers — no counting pass (the first histogram's total is the eligible count), the histograms
// double-buffered (the next one zeroed during this pass), the digit found by the one thread whose bin
// d has above[d] ≥ remaining > above[d + 1] (its scan value and its own bin give both) instead of an
// atomicMax and two more barriers, and for rows under 2^15 entries the gather's two counts in one scan:
// 4 barriers a radix pass instead of 7. Needs k ≥ 1 (the remaining count never reaches 0).
template <int T = 256, typename Emit>
__device__ __forceinline__ int block_select(const float* __restrict__ row, int64_t count, int k, Emit emit,
                                            bool lean = false) {
  static_assert(T % 32 == 0 && T >= 256 && T <= 1024, "block_select: 256..1024 threads");
  const int t = threadIdx.x;
  const uint32_t neg_inf_key = fkey(-INFINITY);
  __shared__ int hist[256];
  __shared__ int s_eligible;
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int s_remaining;
  // One radix pass's histogram into h: the digit at `shift` of every eligible entry whose key matches
  // prefix under mask. The first pass (every entry, binned by sign and exponent: a handful of bins
  // for a row of scores, and 32 lanes' atomics on one shared address serialize) takes one atomic per
  // distinct bin of a warp, the lowest lane of each bin's lanes adding their count; the later passes,
  // where few entries match the prefix, one per entry.
  auto histogram = [&](int* h, int shift, uint32_t mask, uint32_t prefix) {
    if (shift == 24) {
      for_each_entry<T>(row, count, [&](int64_t, float v) {
        const uint32_t key = fkey(v);
        const bool in = key > neg_inf_key;
        const int bin = in ? int(key >> 24) : 256;
        const unsigned same = __match_any_sync(__activemask(), bin);
        if (in && t % 32 == __ffs(same) - 1) atomicAdd(&h[bin], __popc(same));
      });
    } else {
      for_each_entry<T>(row, count, [&](int64_t, float v) {
        const uint32_t key = fkey(v);
        if (key > neg_inf_key && (key & mask) == prefix) atomicAdd(&h[(key >> shift) & 255], 1);
      });
    }
  };
  lean = lean && k >= 1;  // before the counting pass it would skip (k = 0 takes the classic path)
  int eligible = 0;
  if (!lean) {
    if (t == 0) s_eligible = 0;
    __syncthreads();
    int local = 0;
    for_each_entry<T>(row, count, [&](int64_t, float v) { local += fkey(v) > neg_inf_key; });
    atomicAdd(&s_eligible, local);
    __syncthreads();
    eligible = s_eligible;
  }
  uint32_t threshold = neg_inf_key + 1;  // take every eligible entry
  int ties_to_take = 0;
  if (lean) {
    __shared__ int lhist[2][256];
    if (t < 256) lhist[0][t] = 0, lhist[1][t] = 0;
    if (t == 0) s_prefix = 0, s_mask = 0, s_remaining = k, s_eligible = 0;
    __syncthreads();
    __shared__ int lwarp_tot[T / 32];
    bool selected = true;
    for (int pass = 0, shift = 24; shift >= 0; ++pass, shift -= 8) {
      int* h = lhist[pass & 1];
      const uint32_t mask = s_mask, prefix = s_prefix;
      const int rem = s_remaining;  // read before the scan's barriers; one thread rewrites it after them
      histogram(h, shift, mask, prefix);
      if (t < 256) lhist[(pass + 1) & 1][t] = 0;  // last read by the previous pass's scan
      __syncthreads();
      const int hv = t < 256 ? h[255 - t] : 0;
      const int rev = block_scan<T>(hv, lwarp_tot);  // thread t < 256, bin d = 255 − t: above[d]
      if (t < 256) {
        const int d = 255 - t, above_next = rev - hv;  // above[d + 1]
        if (shift == 24 && d == 0) s_eligible = rev;   // every eligible entry is in a bin
        if (topk::digit_is_mine(d, rev, hv, rem)) {  // the largest d ≥ 1 with above[d] ≥ rem, else 0
          s_remaining = rem - above_next;
          s_prefix = prefix | uint32_t(d) << shift;
          s_mask = mask | 255u << shift;
        }
      }
      __syncthreads();
      if (shift == 24) {
        eligible = s_eligible;
        if (eligible <= k) {  // the same in every thread: no selection
          selected = false;
          break;
        }
      }
    }
    if (selected) {
      threshold = s_prefix;
      ties_to_take = s_remaining;
    }
  } else if (eligible > k) {
    if (t == 0) s_prefix = 0, s_mask = 0, s_remaining = k;
    __syncthreads();
    __shared__ int warp_tot[T / 32], s_digit, above[257];
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (t < 256) hist[t] = 0;
      if (t == 0) s_digit = 0, above[256] = 0;
      __syncthreads();
      const uint32_t mask = s_mask, prefix = s_prefix;
      histogram(hist, shift, mask, prefix);
      __syncthreads();
      // The digit: the largest d ≥ 1 whose bins d..255 hold at least the remaining count, else 0
      // (bins from the top, as a sequential scan would stop). Suffix sums by a scan of the
      // reversed histogram.
      const int rev = block_scan<T>(t < 256 ? hist[255 - t] : 0, warp_tot);  // Σ hist[255-t..255]
      if (t < 256) above[255 - t] = rev;                                      // bins ≥ 255-t
      __syncthreads();
      const int rem = s_remaining;
      if (t >= 1 && t < 256 && above[t] >= rem) atomicMax(&s_digit, t);
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
  const int want = eligible < k ? eligible : k;
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
  __shared__ int sc_gt[T], sc_eq[T], scan_tot[T / 32];
  if (lean && count < 32768) {  // both counts in one scan: each total < 2^15, no carry, no sign
    const int inc = block_scan<T>(n_gt | (n_eq << 16), scan_tot);
    sc_gt[t] = (inc & 0xffff) - n_gt;  // exclusive offsets
    sc_eq[t] = (inc >> 16) - n_eq;
  } else {
    const int inc_gt = block_scan<T>(n_gt, scan_tot);
    const int inc_eq = block_scan<T>(n_eq, scan_tot);
    sc_gt[t] = inc_gt - n_gt;  // exclusive offsets
    sc_eq[t] = inc_eq - n_eq;
  }
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
// over npow ≥ want entries, the tail padded with 0 — and writes their indices to out[0,
// out_stride), −1 padded. The picks must be written and the block synchronized.
// With reg_sort and npow ≤ T (the caller then provides 2·npow entries of shared memory): element j
// lives in thread j's register; stages of stride < 32 exchange by warp shuffles, the others through
// shared memory (two buffers in turn: one barrier a stage): 10 barriers for 512 picks instead of 45.
// Otherwise every stage in shared memory. The same network (topk::bitonic_keep), the same order.
template <int T = 256>
__device__ __forceinline__ void sort_picks_write(uint64_t* picks, int want, int32_t* out, int out_stride,
                                                 bool reg_sort = false, bool idle_skip = false) {
  const int t = threadIdx.x;
  int npow = 1;
  while (npow < want) npow <<= 1;
  for (int j = want + t; j < npow; j += T) picks[j] = 0;
  __syncthreads();
  if (reg_sort && npow <= T && idle_skip && (t & ~31) >= npow) {
    // A warp past the picks (half the block for 512 picks on 1,024 threads) only keeps the barrier
    // count: it holds nothing to sort, and running the stages cost ~1/5 of the kernel's instructions.
    for (int size = 64; size <= npow; size <<= 1)
      for (int stride = size / 2; stride >= 32; stride >>= 1) __syncthreads();
    for (int j = t; j < out_stride; j += T) out[j] = -1;  // j ≥ npow ≥ want
    return;
  }
  if (reg_sort && npow <= T) {
    uint64_t v = t < npow ? picks[t] : 0;
    int cur = 0;  // the buffer the next cross-warp stage goes through: picks, then picks + npow
    for (int size = 2; size <= npow; size <<= 1)
      for (int stride = size / 2; stride > 0; stride >>= 1) {
        uint64_t other;
        if (stride >= 32) {
          uint64_t* buf = picks + cur * npow;
          if (t < npow) buf[t] = v;
          __syncthreads();  // also orders the other buffer's reads of two stages ago before its next writes
          other = t < npow ? buf[t ^ stride] : 0;
          cur ^= 1;
        } else {
          other = __shfl_xor_sync(0xffffffffu, v, stride);  // whole warps: every thread runs every stage
        }
        if (t < npow) v = topk::bitonic_keep(v, other, t, size, stride);
      }
    for (int j = t; j < out_stride; j += T) out[j] = j == t && j < want ? topk::pick_index(v) : -1;
    return;
  }
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

// The single-block top-k: one block of T threads per row (1,024 by default: a decode step's rows
// of 8,192 scores took ~30 µs on 256, on the indexer layers' chain; DSUF_TOPK_THREADS=256).
template <int T>
__global__ void __launch_bounds__(T) k_top_k(const float* x, int64_t stride, const RowMeta* meta, int ratio, int block,
                                             int k, int32_t* out, int out_stride, bool reg_sort, bool lean,
                                             bool idle_skip, uint64_t* picks_out) {
  pdl_entry();
  const int i = blockIdx.x;
  const int64_t count = top_k_count(meta, i, ratio, block);
  if (picks_out) {  // top_k_picks: the picks unsorted, for gather_keys to place
    uint64_t* po = picks_out + int64_t(i) * out_stride;
    const int want = block_select<T>(
        x + int64_t(i) * stride, count, k,
        [&](int slot, int64_t j, uint32_t key, float) { po[slot] = topk::pick(key, j); }, lean);
    int32_t* o = out + int64_t(i) * out_stride;
    for (int j = want + threadIdx.x; j < out_stride; j += T) po[j] = 0, o[j] = -1;
    return;
  }
  extern __shared__ uint64_t picks[];  // (key << 32) | ~index, sorted descending
  const int want = block_select<T>(
      x + int64_t(i) * stride, count, k,
      [&](int slot, int64_t j, uint32_t key, float) { picks[slot] = topk::pick(key, j); }, lean);
  sort_picks_write<T>(picks, want, out + int64_t(i) * out_stride, out_stride, reg_sort, idle_skip);
}

// top_k_picks over a cluster of kTopkCluster blocks a row (DSUF_TOPK_PICKS=cluster, the default since v29;
// rows ≤ kTopkClusterMaxCount entries, k ≥ 1): the same select as block_select's lean path, spread so
// that each block reads an eighth of the row. Block c takes the contiguous entries [lo_c, hi_c) (a
// multiple of 4 long). A radix pass: each block bins its entries into its own histogram (two buffers,
// alternating), one cluster.sync, then every block adds the cluster's histograms bin by bin through
// distributed shared memory and scans them — the same sums in every block, so every block decides the
// same digit (topk::digit_is_mine) with no further exchange. The buffer a pass writes was last read by
// the other blocks two passes back, before the previous pass's cluster.sync; it is zeroed after this
// pass's. The gather: each block counts its entries above the threshold and its ties (a packed scan,
// each count < 2^15), publishes its totals, and after a cluster.sync offsets them by the lower ranks'
// totals, so the ties taken are the lowest indices of the row, as in block_select. The picks land in
// [0, want) in no particular order (top_k_picks' contract); the last cluster.sync keeps every block
// until the others have read its totals.
constexpr int kTopkCluster = 8, kTopkClusterThreads = 512;
constexpr int64_t kTopkClusterMaxCount = int64_t(kTopkCluster) * 16384;
__global__ void __launch_bounds__(kTopkClusterThreads) k_top_k_cluster(const float* x, int64_t stride,
                                                                       const RowMeta* meta, int ratio, int k,
                                                                       int32_t* out, int out_stride,
                                                                       uint64_t* picks_out) {
  namespace cg = cooperative_groups;
  constexpr int T = kTopkClusterThreads;
  cg::cluster_group cluster = cg::this_cluster();
  pdl_entry();
  const int c = int(cluster.block_rank()), C = int(cluster.num_blocks()), i = blockIdx.y, t = threadIdx.x;
  const int64_t count = top_k_count(meta, i, ratio, 0);
  const int64_t per = ((count + C - 1) / C + 3) / 4 * 4;
  const int64_t lo = min(int64_t(c) * per, count), hi = min(lo + per, count);
  const float* row = x + int64_t(i) * stride;
  const uint32_t neg_inf_key = fkey(-INFINITY);
  __shared__ int hist[2][256];
  __shared__ int warp_tot[T / 32];
  __shared__ int s_remaining, s_eligible, s_gt, s_eq;
  __shared__ uint32_t s_prefix, s_mask;
  if (t < 256) hist[0][t] = 0, hist[1][t] = 0;
  __syncthreads();
  uint32_t prefix = 0, mask = 0;
  int rem = k, eligible = 0;
  bool selected = true;
  for (int pass = 0, shift = 24; shift >= 0; ++pass, shift -= 8) {
    int* h = hist[pass & 1];
    if (shift == 24) {  // sign and exponent: few bins, one atomic per distinct bin of a warp
      for (int64_t j = lo + t; j < hi; j += T) {
        const uint32_t key = fkey(row[j]);
        const bool in = key > neg_inf_key;
        const int bin = in ? int(key >> 24) : 256;
        const unsigned same = __match_any_sync(__activemask(), bin);
        if (in && t % 32 == __ffs(same) - 1) atomicAdd(&h[bin], __popc(same));
      }
    } else {
      for (int64_t j = lo + t; j < hi; j += T) {
        const uint32_t key = fkey(row[j]);
        if (key > neg_inf_key && (key & mask) == prefix) atomicAdd(&h[(key >> shift) & 255], 1);
      }
    }
    cluster.sync();  // every block's histogram of this pass complete and visible
    int hv = 0;  // bin 255 − t of the cluster's histogram
    if (t < 256)
      for (int r = 0; r < C; ++r) hv += cluster.map_shared_rank(h, r)[255 - t];
    const int rev = block_scan<T>(hv, warp_tot);  // above[255 − t]
    if (t < 256) {
      const int d = 255 - t;
      if (shift == 24 && d == 0) s_eligible = rev;
      if (topk::digit_is_mine(d, rev, hv, rem)) {
        s_remaining = rem - (rev - hv);
        s_prefix = prefix | uint32_t(d) << shift;
        s_mask = mask | 255u << shift;
      }
      hist[(pass + 1) & 1][t] = 0;  // read by the other blocks two passes back, before this pass's sync
    }
    __syncthreads();
    prefix = s_prefix, mask = s_mask, rem = s_remaining;
    if (shift == 24) {
      eligible = s_eligible;
      if (eligible <= k) {  // the same in every block: no selection
        selected = false;
        break;
      }
    }
  }
  const uint32_t threshold = selected ? prefix : neg_inf_key + 1;
  const int ties_to_take = selected ? rem : 0;
  const int want = eligible < k ? eligible : k;
  // This thread's contiguous part of the block's entries, a multiple of 4 long.
  const int64_t tper = ((hi - lo + T - 1) / T + 3) / 4 * 4;
  const int64_t tlo = min(lo + t * tper, hi), thi = min(tlo + tper, hi);
  auto is_gt = [&](uint32_t key) { return key > neg_inf_key && (!selected || key > threshold); };
  auto is_tie = [&](uint32_t key) { return selected && key == threshold; };
  int n_gt = 0, n_eq = 0;
  for_range(row, tlo, thi, [&](int64_t, float v) {
    const uint32_t key = fkey(v);
    n_gt += is_gt(key), n_eq += is_tie(key);
  });
  const int inc = block_scan<T>(n_gt | (n_eq << 16), warp_tot);  // each block total < 2^15
  if (t == T - 1) s_gt = inc & 0xffff, s_eq = inc >> 16;
  cluster.sync();  // every block's totals written
  int base_gt = 0, base_eq = 0;
  for (int r = 0; r < c; ++r) {
    base_gt += *cluster.map_shared_rank(&s_gt, r);
    base_eq += *cluster.map_shared_rank(&s_eq, r);
  }
  int og = base_gt + (inc & 0xffff) - n_gt, oe = base_eq + (inc >> 16) - n_eq;
  const int n_gt_total = want - ties_to_take;
  uint64_t* po = picks_out + int64_t(i) * out_stride;
  for_range(row, tlo, thi, [&](int64_t j, float v) {
    const uint32_t key = fkey(v);
    if (is_gt(key)) {
      po[og++] = topk::pick(key, j);
    } else if (is_tie(key) && oe < ties_to_take) {
      po[n_gt_total + oe++] = topk::pick(key, j);
    }
  });
  int32_t* o = out + int64_t(i) * out_stride;
  for (int j = want + c * T + t; j < out_stride; j += C * T) po[j] = 0, o[j] = -1;
  cluster.sync();  // no block leaves while another may still read its totals
}

// Multi-block top-k, stage 1 (topk_plan.h): grid (g_launch, rows). Block (g, i) selects the top k
// of chunk g of row i and writes them — values and row indices — to slots [g·ks, g·ks + want) of
// the row's candidates (stride cand_stride), the rest of its ks = slot_stride(k) slots −inf / −1.
// Rows of one chunk (topk::chunks(...).G = 1) are left to stage 2.
__global__ void k_top_k_chunks(const float* x, int64_t stride, const RowMeta* meta, int ratio, int block, int k,
                               int g_launch, int64_t min_chunk, float* cand_val, int32_t* cand_idx,
                               int64_t cand_stride) {
  pdl_entry();
  const int i = blockIdx.y, g = blockIdx.x;
  const int64_t count = top_k_count(meta, i, ratio, block);
  const topk::Chunks c = topk::chunks(count, k, g_launch, min_chunk);
  if (c.G < 2 || g >= c.G) return;
  const int64_t lo = topk::chunk_lo(c, g), hi = topk::chunk_hi(c, count, g), ks = topk::slot_stride(k);
  float* val = cand_val + int64_t(i) * cand_stride + g * ks;
  int32_t* idx = cand_idx + int64_t(i) * cand_stride + g * ks;
  const int want = block_select(x + int64_t(i) * stride + lo, hi - lo, k,
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
  pdl_entry();
  const int i = blockIdx.x;
  const int64_t count = top_k_count(meta, i, ratio, block);
  const int G = topk::chunks(count, k, g_launch, min_chunk).G;
  extern __shared__ uint64_t picks[];
  int want;
  if (G < 2) {
    want = block_select(x + int64_t(i) * stride, count, k, [&](int slot, int64_t j, uint32_t key, float) {
      picks[slot] = topk::pick(key, j);
    });
  } else {
    const int32_t* idx = cand_idx + int64_t(i) * cand_stride;
    want = block_select(cand_val + int64_t(i) * cand_stride, G * topk::slot_stride(k), k,
                            [&](int slot, int64_t j, uint32_t key, float) { picks[slot] = topk::pick(key, idx[j]); });
  }
  sort_picks_write(picks, want, out + int64_t(i) * out_stride, out_stride);
}

// top_k_mask's one-block form: k_top_k's selection, each pick marked in the row's mask (zeroed first).
__global__ void k_top_k_mask(const float* x, int64_t stride, const RowMeta* meta, int ratio, int block, int k,
                             uint8_t* mask, int64_t mask_stride) {
  pdl_entry();
  const int i = blockIdx.x;
  uint8_t* m = mask + int64_t(i) * mask_stride;
  for (int64_t b = threadIdx.x; b < mask_stride; b += blockDim.x) m[b] = 0;
  __syncthreads();  // block_select synchronizes again before its first pick
  const int64_t count = top_k_count(meta, i, ratio, block);
  block_select(x + int64_t(i) * stride, count, k, [&](int, int64_t j, uint32_t, float) { m[j] = 1; });
}

__global__ void k_mask_from_selection(const int32_t* sel, int sel_stride, uint8_t* mask, int64_t mask_stride) {
  pdl_entry();
  const int i = blockIdx.x;
  for (int64_t b = threadIdx.x; b < mask_stride; b += blockDim.x) mask[int64_t(i) * mask_stride + b] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < sel_stride; j += blockDim.x) {
    int32_t b = sel[int64_t(i) * sel_stride + j];
    if (b >= 0) mask[int64_t(i) * mask_stride + b] = 1;
  }
}

// ---- MoE ---------------------------------------------------------------------------------------
// One block per token (a thread per expert, up to 1,024): scores computed once per expert in
// parallel, then warp 0's k rounds of argmax (largest score + bias among the experts not yet taken,
// ties to the lower id — the reference's sequential scan picks the same one for any non-NaN scores).
// DSUF_ROUTE=redux (session 18, measuring; kRedux): warp 0 holds the values in registers (expert
// lane + 32m in slot m, at most 32·kRouteSlots experts) and finds each pick with two warp reductions
// (redux.sync: the largest value as an order-preserving key, then the lowest index holding it) instead
// of the shared-memory scan and five shuffle rounds of two — the same pick for every finite value
// (the largest, ties to the lowest index; −0 is keyed as +0, as == treats them).
constexpr int kRouteSlots = 16;
__device__ __forceinline__ uint32_t route_key(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// kSlots (session 34): the slots a lane scans, the fewest that hold E (4 for the bench's 96 experts, 12
// for the model's 384): each pick's scan is a chain of compare-selects through every slot, so slots
// past the last expert cost ~4 dependent instructions each a pick.
template <bool kRedux, int kSlots = kRouteSlots>
__global__ void k_route(const float* logits, int E, int k, const float* bias, const float* bias_vl,
                        const uint8_t* image, float temp, float route_scale, int32_t* ids, float* w,
                        bool w_early, bool late) {
  // A thread's first expert's two biases before the dependency wait (w_early, DSUF_W_EARLY=1: weights;
  // which one applies depends on the step's image flags, read after it).
  const bool early = w_early && threadIdx.x < E;
  const float b0 = early ? bias[threadIdx.x] : 0.0f;
  const float bv0 = early && bias_vl ? bias_vl[threadIdx.x] : 0.0f;
  pdl_entry(late);
  extern __shared__ float sv[];  // [E] score s, [E] s + bias, [E] taken flags
  __shared__ float picked[32];
  const int i = blockIdx.x, lane = threadIdx.x;
  const float* l = logits + int64_t(i) * E;
  const bool vl = image && image[i];
  const float* b = vl ? bias_vl : bias;
  float* sc = sv;
  float* val = sv + E;
  float* taken = sv + 2 * E;
  // The scores a thread per expert (each a software exp and log1p: ~3 in a row on one warp at 96
  // experts, 12 at 384, were most of the kernel's time on the step's chain), then the picks by warp 0.
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float x = l[e] / temp;
    sc[e] = sqrtf(det::softplus(x));
    val[e] = sc[e] + (early && e == threadIdx.x ? (vl ? bv0 : b0) : b[e]);
    taken[e] = 0.0f;
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  float sum = 0.0f;
  if constexpr (kRedux) {
    static_assert(kSlots <= kRouteSlots, "at most kRouteSlots slots");
    float vr[kSlots];
    uint32_t avail = 0;
#pragma unroll
    for (int m = 0; m < kSlots; ++m) {
      const int e = lane + 32 * m;
      vr[m] = e < E ? val[e] : 0.0f;
      if (e < E) avail |= 1u << m;
    }
    for (int j = 0; j < k; ++j) {
      int lm = -1;
      float lb = 0.0f;
#pragma unroll
      for (int m = 0; m < kSlots; ++m)
        if (((avail >> m) & 1u) && (lm < 0 || vr[m] > lb)) lb = vr[m], lm = m;
      const uint32_t key = lm < 0 ? 0u : route_key(lb);
      const uint32_t kmax = __reduce_max_sync(0xffffffffu, key);
      const uint32_t best =
          __reduce_min_sync(0xffffffffu, lm >= 0 && key == kmax ? uint32_t(lane + 32 * lm) : 0xffffffffu);
      if (int(best % 32) == lane) avail &= ~(1u << (best / 32));
      const float bs = sc[best];
      sum += bs;
      if (lane == 0) {
        ids[i * k + j] = int32_t(best);
        picked[j] = bs;
      }
    }
    __syncwarp();
  } else {
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
  }
  if (lane < k) w[i * k + lane] = picked[lane] / (sum + 1e-20f) * route_scale;
  pdl_exit(late);
}

__global__ void k_swiglu(float* h1, const float* h3, int64_t rows, int64_t F, const float* weight, float limit,
                         bool clamp, bool r, InputSink sink, bool late) {
  pdl_entry(late);
  int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * F) return;  // with a sink, F % 32 == 0: whole warps return
  float g = h1[t], u = h3[t];
  if (clamp && limit > 0) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  const float wt = weight ? weight[t / F] : 1.0f;
  const float h = rb(wt * (det::silu(g) * u), r);
  h1[t] = h;
  if (sink.xq) emit_input(sink, F, t / F, int((t % F) / 32), int(t % 32), h);
  pdl_exit(late);
}

// The MoE output y = bf16(Σ_j ye_j + ys) of a row, expanded straight into the streams (the FFN
// site's expansion, as hc_expand in the reference): X_k ← bf16(post_k·y + Σ_j C[j][k]·X_j).
template <int HC>
__global__ void k_moe_sum_expand(const float* __restrict__ ye, int k, const float* __restrict__ ys, int n, int64_t D,
                                 const float* __restrict__ mix, int mix_stride, float* __restrict__ X, bool r) {
  pdl_entry();
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
// A block per token: its `rows` table rows (E4M3 codes, an E8M0 scale per 32) decoded to FP32. The
// tables live in host memory, so each read is a PCIe round trip (~1 µs): a byte a thread at a time,
// one after another, took ~55 µs a launch (docs/perf.md v19/v20). With ehd % 16 == 0 a thread
// issues all its 16-byte pieces (up to kEngramPer) and their scales before decoding any.
constexpr int kEngramPer = 8;
__global__ void k_engram_gather(const int64_t* row_ids, int rows, const uint8_t* table, const uint8_t* scales,
                                int64_t ehd, float* emb) {
  pdl_entry();
  const int i = blockIdx.x;
  const int64_t* ids = row_ids + int64_t(i) * rows;
  float* out = emb + int64_t(i) * rows * ehd;
  const bool aligned = ((reinterpret_cast<uintptr_t>(table) | reinterpret_cast<uintptr_t>(emb)) & 15) == 0;
  if (ehd % 16 != 0 || !aligned) {
    for (int64_t t = threadIdx.x; t < rows * ehd; t += blockDim.x) {
      const int64_t r = t / ehd, d = t % ehd, id = ids[r];
      out[t] = e4m3_val(table[id * ehd + d]) * e8m0(scales[id * (ehd / 32) + d / 32]);
    }
    return;
  }
  const int64_t n16 = rows * ehd / 16;
  for (int64_t t0 = threadIdx.x; t0 < n16; t0 += int64_t(blockDim.x) * kEngramPer) {
    uint4 v[kEngramPer];
    uint8_t sc[kEngramPer];
#pragma unroll
    for (int u = 0; u < kEngramPer; ++u) {
      const int64_t t = t0 + int64_t(u) * blockDim.x;
      if (t >= n16) break;
      const int64_t r = t * 16 / ehd, d = t * 16 % ehd, id = ids[r];
      v[u] = *reinterpret_cast<const uint4*>(table + id * ehd + d);
      sc[u] = scales[id * (ehd / 32) + d / 32];
    }
#pragma unroll
    for (int u = 0; u < kEngramPer; ++u) {
      const int64_t t = t0 + int64_t(u) * blockDim.x;
      if (t >= n16) break;
      const float s = e8m0(sc[u]);
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
      float4* o = reinterpret_cast<float4*>(out + t * 16);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        o[q] = make_float4(e4m3_val(w[q] & 0xffu) * s, e4m3_val((w[q] >> 8) & 0xffu) * s,
                           e4m3_val((w[q] >> 16) & 0xffu) * s, e4m3_val(w[q] >> 24) * s);
    }
  }
}

// The gate from the three sums over D: Σx², Σkey², Σ x·q·k·key (the reference's arithmetic).
__device__ __forceinline__ float engram_gate_value(float sx, float sk, float dot, int64_t D, float eps) {
  const float rx = 1.0f / sqrtf(sx / float(D) + eps), rk = 1.0f / sqrtf(sk / float(D) + eps);
  dot = dot * rx * rk * (1.0f / sqrtf(float(D)));
  return det::sigmoid((dot >= 0 ? 1.0f : -1.0f) * sqrtf(fmaxf(fabsf(dot), 1e-6f)));
}
// A block per (token, stream): the stream's gate from the RMS-normalized stream and key (their dot
// product through q and k), then stream += gate · value. kBatch: rows of the block's loops a thread
// loads before it adds any (1: one at a time, each load's round trip in turn — ~17 µs a launch at one
// token, 20 rounds of D = 5,120; 10: two rounds). Every thread adds its elements in the same order
// either way (block_sum<256>'s partials): the same bits.
template <int kBatch>
__global__ void k_engram_gate(float* X, const float* kv, const uint16_t* qw, const uint16_t* kw, const uint8_t* dead,
                              int hc, int64_t D, float eps, bool r) {
  pdl_entry();
  const int i = blockIdx.x, k = blockIdx.y;
  if (dead[i]) return;
  float* x = X + (int64_t(i) * hc + k) * D;
  const float* key = kv + int64_t(i) * (hc + 1) * D + k * D;
  const float* v = kv + int64_t(i) * (hc + 1) * D + hc * D;
  const int64_t step = blockDim.x;
  float sx = 0.0f, sk = 0.0f, dot = 0.0f;
  for (int64_t d0 = threadIdx.x; d0 < D; d0 += step * kBatch) {
    float xv[kBatch], kv_[kBatch], qv[kBatch], wv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t d = d0 + u * step;
      if (d >= D) break;
      xv[u] = x[d], kv_[u] = key[d], qv[u] = bf16_load(qw, k * D + d), wv[u] = bf16_load(kw, k * D + d);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (d0 + u * step >= D) break;
      sx += xv[u] * xv[u];
      sk += kv_[u] * kv_[u];
      dot += xv[u] * qv[u] * wv[u] * kv_[u];
    }
  }
  sx = block_sum(sx);
  sk = block_sum(sk);
  dot = block_sum(dot);
  const float g = engram_gate_value(sx, sk, dot, D, eps);
  for (int64_t d0 = threadIdx.x; d0 < D; d0 += step * kBatch) {
    float xv[kBatch], vv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t d = d0 + u * step;
      if (d >= D) break;
      xv[u] = x[d], vv[u] = v[d];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t d = d0 + u * step;
      if (d >= D) break;
      x[d] = rb(xv[u] + g * vv[u], r);
    }
  }
}

// The same gate over a cluster of kNormCluster blocks a (token, stream), as k_collapse_norm spreads
// its norm: block c takes the positions of block_sum<256>'s warp c (32c + l + 256j), so each of the
// three sums keeps the canonical order — block c's warp 0 adds its 32 partials position by position
// (lane l: f(32c + l), f(32c + l + 256), …), tree-reduces them, and every block reads the 8 warp sums
// from the cluster's shared memory. The products are rounded as k_engram_gate's (no FMA contraction:
// --fmad=false), so the bits are the same. Dynamic shared memory: 3 · 32 · ⌈D / 256⌉ floats.
__global__ void __launch_bounds__(256) k_engram_gate_cluster(float* X, const float* kv, const uint16_t* qw,
                                                             const uint16_t* kw, const uint8_t* dead, int hc,
                                                             int64_t D, float eps, bool r) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  pdl_entry();
  const int c = int(cluster.block_rank()), k = blockIdx.y, i = blockIdx.z, lane = threadIdx.x % 32;
  if (dead[i]) return;  // the whole cluster: dead is per token
  extern __shared__ float gs[];  // [3][32·J]: x², key², the dot's terms, at 32j + l
  __shared__ float q[3];
  const int J = int((D + 255) / 256), E = 32 * J;
  float* x = X + (int64_t(i) * hc + k) * D;
  const float* key = kv + int64_t(i) * (hc + 1) * D + k * D;
  const float* v = kv + int64_t(i) * (hc + 1) * D + hc * D;
  auto pos = [&](int e) { return int64_t(32 * c + e % 32) + 256 * int64_t(e / 32); };
  constexpr int kPer = 4;  // positions a thread (E ≤ 1,024: D ≤ 8,192)
  float xv[kPer], vv[kPer];
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int e = int(threadIdx.x) + 256 * p;
    const bool ok = e < E && pos(e) < D;
    const int64_t d = ok ? pos(e) : 0;
    xv[p] = ok ? x[d] : 0.0f, vv[p] = ok ? v[d] : 0.0f;
    const float kd = ok ? key[d] : 0.0f, qd = ok ? bf16_load(qw, k * D + d) : 0.0f,
                wd = ok ? bf16_load(kw, k * D + d) : 0.0f;
    if (e < E) {
      gs[e] = xv[p] * xv[p];
      gs[E + e] = kd * kd;
      gs[2 * E + e] = xv[p] * qd * wd * kd;
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float sx = 0.0f, sk = 0.0f, dot = 0.0f;
    for (int j = 0; j < J; ++j) {
      if (pos(32 * j + lane) >= D) continue;
      sx += gs[32 * j + lane];
      sk += gs[E + 32 * j + lane];
      dot += gs[2 * E + 32 * j + lane];
    }
    sx = warp_sum(sx), sk = warp_sum(sk), dot = warp_sum(dot);
    if (lane == 0) q[0] = sx, q[1] = sk, q[2] = dot;
  }
  cluster.sync();  // every block's warp sums written and visible
  float t[3];
#pragma unroll
  for (int m = 0; m < 3; ++m) t[m] = warp_sum(lane < kNormCluster ? *cluster.map_shared_rank(&q[m], lane) : 0.0f);
  const float g = engram_gate_value(t[0], t[1], t[2], D, eps);
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int e = int(threadIdx.x) + 256 * p;
    if (e < E && pos(e) < D) x[pos(e)] = rb(xv[p] + g * vv[p], r);
  }
  cluster.sync();  // no block leaves while another may still read its q
}

__global__ void k_gather_rows(const float* X, const float* pre, const int32_t* rows, int hc, int64_t D, float* Xo,
                              float* preo) {
  pdl_entry();
  const int i = blockIdx.x, r = rows[i];
  for (int64_t t = threadIdx.x; t < hc * D; t += blockDim.x) Xo[int64_t(i) * hc * D + t] = X[int64_t(r) * hc * D + t];
  if (threadIdx.x < hc) preo[i * hc + threadIdx.x] = pre[r * hc + threadIdx.x];
}

__global__ void k_add_rows(float* y, const float* x, int64_t n) {
  pdl_entry();
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

// DSUF_PRIORITY=auto|latency|none: with latency, every kernel of the step but the weight kernels
// (launch_step) is launched at the device's greatest priority, so that when a linear's many blocks
// hold the SMs, a latency-bound kernel's pending blocks (often on a side stream: the gather, the
// router, the indexer's) are dispatched first as slots free up. Decode graphs honour it
// (cudaGraphInstantiateFlagUseNodePriority). Scheduling only: the same bits. auto (the default):
// never since session 35 (it had been for one-row steps; step_policy.h says why).
bool latency_priority_on() {
  static const auto mode = PriorityMode(env_choice("DSUF_PRIORITY", {"auto", "latency", "none"}));
  return latency_priority_for(mode);
}
namespace {
// Programmatic dependent launch, DSUF_PDL=1|gemv|0: every kernel of the step (the default), only
// the weight kernels (launch_pdl; v6 measured them 1.4 ms slower, v18 — loading their first stages
// before pdl_wait — 0.32 ms faster: docs/perf.md), or none.
enum PdlLevel { kPdlAll = 0, kPdlGemv = 1, kPdlOff = 2 };
int pdl_level() {
  static const int level = env_choice("DSUF_PDL", {"1", "gemv", "0"});  // in PdlLevel's order
  return level;
}
// The device's greatest launch priority (numerically the least), for latency-bound kernels under
// DSUF_PRIORITY=latency (latency_priority_on()); read once per process (every GPU of a host here
// reports the same range).
int latency_priority() {
  static const int p = [] {
    int least = 0, greatest = 0;
    DSUF_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    return greatest;
  }();
  return p;
}
// Launches k, programmatically when `on`, in clusters of `cluster` blocks along x when cluster > 0,
// at the greatest priority when `urgent`.
template <typename... KArgs, typename... Args>
void launch_with_pdl(bool on, unsigned cluster, bool urgent, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cudaLaunchAttribute at[3];
  unsigned n = 0;
  if (on) {
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 0) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n++].val.clusterDim = {cluster, 1, 1};
  }
  if (urgent) {
    at[n].id = cudaLaunchAttributePriority;
    at[n++].val.priority = latency_priority();
  }
  cfg.attrs = at, cfg.numAttrs = n;
  DSUF_CUDA(cudaLaunchKernelEx(&cfg, k, std::forward<Args>(args)...));
}
// A weight kernel (pdl_wait after its first weight loads): programmatic unless DSUF_PDL=0.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_with_pdl(pdl_level() != kPdlOff, 0, false, k, grid, block, smem, s, std::forward<Args>(args)...);
}
// Any other kernel of the step (pdl_entry() first): programmatic with DSUF_PDL=1, the default;
// `cluster` blocks a cluster when set.
template <typename... KArgs, typename... Args>
void launch_step_in(unsigned cluster, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                    Args&&... args) {
  launch_with_pdl(pdl_level() == kPdlAll, cluster, latency_priority_on(), k, grid, block, smem, s,
                  std::forward<Args>(args)...);
}
template <typename... KArgs, typename... Args>
void launch_step(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_step_in(0, k, grid, block, smem, s, std::forward<Args>(args)...);
}
template <typename Kernel>
void set_smem(Kernel k, size_t smem) {
  if (smem > 48 * 1024) DSUF_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
}

}  // namespace

void embed(const int32_t* tok, int n, const uint16_t* table, int64_t D, int hc, float* X, float* pre, cudaStream_t s) {
  launch_step(k_embed, dim3(n), dim3(256), 0, s, tok, table, D, hc, X, pre);
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
// Rows per k_hc_mix row tile: one at batch 1..3, more from 4 rows (each warp's fn values read once
// for R rows). Session 23 (bench_decode, H200, against R = 1 / the old rule's 4 at 64): batch 4 with 2
// −0.24 ms, 16 with 2 −0.7 (4: −0.55), 64 with 8 −0.28. (Was 1 below 32 rows, 2 to 63, 4 to 127.)
// DSUF_MIX_ROWS=1|2|4|8 fixes it (a measuring aid).
int hc_mix_rows(int n) {
  static const int forced = [] {
    const char* v = std::getenv("DSUF_MIX_ROWS");
    return v ? std::atoi(v) : 0;
  }();
  if (forced == 1 || forced == 2 || forced == 4 || forced == 8) return forced;
  return n >= 64 ? 8 : n >= 4 ? 2 : 1;
}
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
    launch_step(k, dim3(32 * groups, (n + R - 1) / R), dim3(32 * G), smem, s, fn, X, n, N, R, norm_eps, base, scale,
                iters, hc_eps, out, part, count);
  });
}
void hc_collapse(const float* pre, int pre_stride, const float* X, int n, int hc, int64_t D, float* u, bool r,
                 cudaStream_t s) {
  launch_step(k_hc_collapse, dim3(blocks_for(D, 256), n), dim3(256), 0, s, pre, pre_stride, X, hc, D, u, r);
}
// DSUF_W_EARLY=1|0: whether the norms and the route load their weights (norm weights, biases) before
// the dependency wait (1, the default since v24) or after it.
namespace {
bool weights_early() {
  static const bool early = !env_picks("DSUF_W_EARLY", "1", "0");
  return early;
}
// DSUF_LATE_TRIGGER=name,… (rmsnorm, collapse, route, linear_input, swiglu; none: none, the v25
// behaviour; unset: linear_input, the v26 default): those kernels trigger their dependents at their end
// (pdl_exit) instead of at entry, so that the linear after them does not load its first weights beside
// them. v26 measured linear_input −0.05 ms (wo_b after it), rmsnorm +0.02, route +0.02, swiglu +0.01,
// collapse +0.24 (wq_a+wkv and the router lose their head start) — docs/perf.md v26.
enum LateTrigger : unsigned { kLateRmsnorm = 1, kLateCollapse = 2, kLateRoute = 4, kLateLinearInput = 8, kLateSwiglu = 16 };
bool late_trigger(unsigned which) {
  static const unsigned mask = [] {
    const char* v = std::getenv("DSUF_LATE_TRIGGER");
    unsigned m = 0;
    if (!v) return unsigned(kLateLinearInput);  // the default since v26 (−0.05 ms; the others measured worse)
    if (std::string(v) == "none" || !*v) return m;
    const std::pair<const char*, unsigned> names[] = {{"rmsnorm", kLateRmsnorm}, {"collapse", kLateCollapse},
                                                      {"route", kLateRoute}, {"linear_input", kLateLinearInput},
                                                      {"swiglu", kLateSwiglu}};
    std::string rest = v;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string name = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      bool known = false;
      for (const auto& [n, bit] : names)
        if (name == n) m |= bit, known = true;
      DSUF_CHECK(known, "DSUF_LATE_TRIGGER: unknown kernel '", name,
                 "' (rmsnorm, collapse, route, linear_input, swiglu, none)");
    }
    return m;
  }();
  return (mask & which) != 0;
}
}  // namespace
namespace {
// DSUF_COLLAPSE=wide|narrow: one thread a position (wide, k_collapse_norm<HC, true>, up to 1,024 positions
// a block, D ≤ 8,192; the default since session 34: −0.089 to −0.100 ms a step at batch 1 and 8K in two
// calls, −0.096 at 128K, −0.123 at batch 4: docs/perf.md v46) or 256 threads a block (narrow, v45).
bool collapse_wide(int64_t D) {
  static const bool wide = !env_picks("DSUF_COLLAPSE", "wide", "narrow");
  return wide && (D + 255) / 256 * 32 <= 1024;
}
}  // namespace
bool moe_sum_fits(int64_t D, int k) { return collapse_wide(D) && k >= 1 && k <= kMoeSumMax; }
void collapse_norm(const float* pre, int pre_stride, const float* emix, int emix_stride, const float* y_in, float* X,
                   int n, int hc, int64_t D, const uint16_t* w, float eps, float* y, bool r, cudaStream_t s,
                   const InputSink& sink, const MoeSumIn& moe) {
  if (n <= 0) return;
  DSUF_CHECK(!moe.ye || (emix && moe.ys && moe_sum_fits(D, moe.k)),
             "collapse_norm: the MoE's sum needs the mix, the shared rows and the wide kernel with k ≤ ", kMoeSumMax);
  DSUF_CHECK(!sink.xq || D % 32 == 0, "collapse_norm: an input sink needs D % 32 == 0");
  const int64_t E = (D + 255) / 256 * 32;  // a block's positions: its shared floats, the wide kernel's threads
  const size_t smem = size_t(E) * sizeof(float);
  DSUF_CHECK(smem <= 200 * 1024, "collapse_norm: hidden size ", D, " too large");
  const bool wide = collapse_wide(D);
  with_hc(hc, [&](auto H) {
    auto* k = wide ? k_collapse_norm<decltype(H)::value, true> : k_collapse_norm<decltype(H)::value>;
    set_smem(k, smem);
    launch_step_in(kNormCluster, k, dim3(kNormCluster, n), dim3(wide ? unsigned(E) : 256u), smem, s, pre, pre_stride, emix,
                   emix_stride, y_in, X, D, w, eps, y, r, sink, weights_early(), late_trigger(kLateCollapse), moe);
  });
}
namespace {
// DSUF_RMS_REGS=5|4: the values a k_rmsnorm thread keeps in registers (5, the default since session 19;
// 4 before: see there).
auto rmsnorm_kernel() {
  static const bool four = env_picks("DSUF_RMS_REGS", "5", "4");
  return four ? k_rmsnorm<4> : k_rmsnorm<5>;
}
}  // namespace
void rmsnorm(const float* x, int64_t rows, int64_t dim, const uint16_t* w, float eps, float* y, bool r, cudaStream_t s) {
  const RmsJob j{x, dim, w, y};
  if (rows > 0) launch_step(rmsnorm_kernel(), dim3(unsigned(rows), 1), dim3(256), 0, s, j, j, eps, r, weights_early(),
                            late_trigger(kLateRmsnorm));
}
namespace {
void check_fused_rope(const FusedRope& f, const char* what) {
  DSUF_CHECK(!f.cs || (f.dim % 32 == 0 && f.half > 0 && 2 * f.half <= f.dim && f.heads >= 1), what,
             ": a fused rope needs dim % 32 == 0 and 0 < 2·half ≤ dim (dim ", f.dim, ", half ", f.half, ")");
}
}  // namespace
void rmsnorm2(const RmsJob& a, const RmsJob& b, int64_t rows, float eps, bool r, cudaStream_t s) {
  for (const RmsJob* j : {&a, &b}) {
    DSUF_CHECK((!j->sink.xq && !j->fake_quant) || j->dim % 32 == 0,
               "rmsnorm2: an input sink or fake quantization needs dim % 32 == 0 (dim ", j->dim, ")");
    check_fused_rope(j->fq_rope, "rmsnorm2");
    DSUF_CHECK(!j->fq_rope.cs || (j->fake_quant && j->fq_rope.heads == 1 && j->fq_rope.dim == j->dim),
               "rmsnorm2: a fused rope goes with fake_quant, one head of dim values");
  }
  if (rows > 0) launch_step(rmsnorm_kernel(), dim3(unsigned(rows), 2), dim3(256), 0, s, a, b, eps, r, weights_early(),
                            late_trigger(kLateRmsnorm));
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
  int tile_sm = 0;  // > 0: k_fp8_gemv_tiles at most this many blocks an SM (fp8_linear's tile_sm)
};
// DSUF_GEMV=regs|pipe|deep picks how the FP8/FP4 linears fetch weights (see GemvMode); regs by default.
// DSUF_FP8_EARLY=1|0: the FP8 GEMV's kRegs loads its first round (weights, scale codes, the spread
// task), kDeep its first U rounds, before the dependency wait (1, the default since v22) or after it
// (0, v21).
bool fp8_early() {
  static const bool early = !env_picks("DSUF_FP8_EARLY", "1", "0");
  return early;
}
int gemv_mode() {
  static const int mode = env_choice("DSUF_GEMV", {"regs", "pipe", "deep"});  // kRegs, kRegsPipe, kDeep
  return mode;
}
// The FP4 linears' mode: DSUF_FP4_GEMV=pipe|regs|deep, pipe by default (in the step, the routed
// experts' w1/w3 took 41.9 µs a launch with pipe against 45.9 with regs, while every FP8 linear was
// fastest with regs: docs/perf.md v15); DSUF_GEMV still sets both when DSUF_FP4_GEMV is not set.
int fp4_gemv_mode() {
  static const int mode = [] {
    if (!std::getenv("DSUF_FP4_GEMV") && std::getenv("DSUF_GEMV")) return gemv_mode();
    constexpr int modes[] = {kRegsPipe, kRegs, kDeep};
    return modes[env_choice("DSUF_FP4_GEMV", {"pipe", "regs", "deep"})];
  }();
  return mode;
}
// The warps of a kRegs FP8 GEMV block (kDeep, kRegsPipe: 8): DSUF_FP8_BLOCK=auto|8|4|2; auto (the
// default) is 4 (session 17: 4 for the R-row forms, batch 4 at 8K 19.19 → 17.80 ms gpu, batch 16
// 61.02 → 59.54 — the R-row kernels hold more registers, fewer blocks an SM, and smaller blocks spread
// them more evenly over the SMs; session 29: 4 for one row too, where the shared expert's w1/w3 pair
// is the one such launch of a batch-1 step — 288 blocks of 8 warps at 3 an SM put 3 on 24 SMs and 2
// on the rest, beside the routed experts — the step 6.330 / 6.346 / 6.351 against 8's 6.421 / 6.412
// / 6.416, 2 warps 6.345 / 6.348 / 6.351; in session 17, when every one-row linear took this kernel,
// 4 had measured ±0 at one row; pipe with 4 or 2 warps and at most 2 or 1 outputs a warp lost +0.27 to
// +0.40 ms at batch 1 in session 18).
int fp8_block_warps() {
  static const int pick = env_choice("DSUF_FP8_BLOCK", {"auto", "8", "4", "2"});
  constexpr int warps[] = {0, 8, 4, 2};
  return pick ? warps[pick] : 4;
}
// DSUF_FP8_ROWS_FORM=auto|rows|inter: the R-row GEMVs' rows one after the other in each K-block
// (rows, v35's form) or interleaved (fp8_kb_mac's kInter); auto (the default since v36): interleaved
// when the rows take several row groups (grid.y > 1, each a pass over the weights), else rows.
// Measured (docs/perf.md v36): interleaved, batch 16 56.66 → 54.84 ms gpu, batch 4 16.97 → 18.43.
bool fp8_rows_inter(int64_t rows, int R) {
  static const int pick = env_choice("DSUF_FP8_ROWS_FORM", {"auto", "rows", "inter"});
  return pick == 0 ? rows > R : pick == 2;
}
// DSUF_FP8_TILES=all|off|one|mid: the one-row FP8 linears that k_fp8_gemv_tiles can take (one row,
// one group, no pair, 32 ≤ nb, nb mod 4 = 0, the remainder spread, K ≤ 8,192, weights and codes
// aligned for its copies) as k_fp8_gemv_tiles — all (the default since v38: wq_b, wo_b, the shared
// expert's w2, Engram's wkv), one: those of one full round (wq_b), mid: up to two (also w2), off:
// none (k_fp8_gemv, v37). Measured (session 24, batch 1 at 8K, gpu ms, 3 rounds interleaved):
// all 6.609 / 6.608 / 6.595, mid 6.659 / 6.672 / 6.660, one 6.681 / 6.673 / 6.669, off 6.691 /
// 6.667 / 6.672.
bool fp8_tiles_fit(const Fp8Call& c, int opw) {
  static const int mode = env_choice("DSUF_FP8_TILES", {"all", "off", "one", "mid"});
  const int64_t nb = c.K / 32, rem = nb % 32;
  return mode != 1 && nb < (mode == 2 ? 64 : mode == 3 ? 96 : 1 << 30) && gemv_mode() == kRegs && c.rows == 1 &&
         c.groups == 1 && !c.pair.W && nb >= 32 && nb % 4 == 0 && c.K <= 8192 && (rem == 0 || opw * rem <= 32) &&
         reinterpret_cast<uintptr_t>(c.W) % 16 == 0 && reinterpret_cast<uintptr_t>(c.Ws) % 4 == 0;
}
// The grid: as many blocks an SM as fit (or DSUF_FP8_TILES_SM), or fewer so that every warp takes the
// same number of tiles; 4 warps a block up to K = 2,048, else 8 (the staged input row is a block's).
// DSUF_FP8_TILES_OPW=2|4: rows a tile; DSUF_FP8_TILES_RING=2|3|4: slots of a warp's ring. Measured
// on wq_b alone (session 24, batch 1 at 8K, gpu ms, 3 rounds; the ring then held a whole tile a
// slot): 2 rows with 2 slots 6.640 / 6.634 / 6.636, 3 slots 6.643 / 6.639 / 6.643, two register
// sets instead of the ring 6.669 / 6.651 / 6.657, k_fp8_gemv 6.696 / 6.699 / 6.688; 4 rows +0.06
// against 2; 4 blocks an SM instead of 7 +0.22 (the more warps an SM, the faster).
int sm_count();
// R > 1 (launch_fp8_tiles_rows): grid.y the row groups of R, grid.z the groups or the pair's two
// linears; the SMs' warps shared among those slices (each strides over its own tiles).
template <int OPW, bool kExact, int kWarps, int kStages, int R = 1, int kMinB = 1, bool kFma = kExact>
void launch_fp8_tiles_k(const Fp8Call& c) {
  auto k = k_fp8_gemv_tiles<OPW, kExact, kWarps, kStages, R, kMinB, kFma>;
  const size_t smem = fp8_tiles_smem(OPW, kWarps, kStages, c.K, R);
  DSUF_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int fit = 0;
  DSUF_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k, 32 * kWarps, smem));
  static const int want = [] {
    const char* v = std::getenv("DSUF_FP8_TILES_SM");
    const int n = v ? std::atoi(v) : 32;
    DSUF_CHECK(n >= 1 && n <= 32, "DSUF_FP8_TILES_SM=", v ? v : "", ": expected 1..32");
    return n;
  }();
  const int gy = int(blocks_for(c.rows, R)), gz = c.pair.W ? 2 : c.groups;
  const int64_t per_sm = std::max(1, std::min({fit, want, c.tile_sm > 0 ? c.tile_sm : fit}));
  const int64_t tiles = (std::max(c.out, c.pair.out) + OPW - 1) / OPW;
  const int64_t most = std::max<int64_t>(kWarps, int64_t(sm_count()) * per_sm * kWarps / (int64_t(gy) * gz));
  const int64_t per_warp = (tiles + most - 1) / most, warps = (tiles + per_warp - 1) / per_warp;
  launch_pdl(k, dim3(blocks_for(warps, kWarps), gy, gz), dim3(32 * kWarps), smem, c.s, c.W, c.Ws, c.out, c.K, c.in.x,
             c.in.stride, c.in.group_stride, c.in.scale, c.in.scale_stride, int(c.rows), c.y, c.y_stride, c.r, c.pair,
             fp8_early());
}
template <int OPW, bool kExact, int kWarps>
void launch_fp8_tiles_w(const Fp8Call& c) {
  static const int stages = env_choice("DSUF_FP8_TILES_RING", {"2", "3", "4"}) + 2;
  switch (stages) {
    case 3: return launch_fp8_tiles_k<OPW, kExact, kWarps, 3>(c);
    case 4: return launch_fp8_tiles_k<OPW, kExact, kWarps, 4>(c);
    default: return launch_fp8_tiles_k<OPW, kExact, kWarps, 2>(c);
  }
}
template <int OPW, bool kExact>
void launch_fp8_tiles(const Fp8Call& c) {
  if (c.K <= 2048) return launch_fp8_tiles_w<OPW, kExact, 4>(c);
  launch_fp8_tiles_w<OPW, kExact, 8>(c);
}
// DSUF_FP8_TILES_ROWS=auto|off|2|4 (session 40): FP8 linears of 2 to fp8_gemm_rows() − 1 rows
// (batches 2–63) as k_fp8_gemv_tiles<…, R> — R input rows a block, so that a chunk's weights come
// from DRAM once for them and are decoded once — with groups (wo_a) and pairs (wq_a+wkv, the shared
// expert's w1/w3) as grid.z's slices; off: k_fp8_gemv's R-row forms (v36–v48). auto and 4: R = 4 from
// 3 rows (2 for 2), 2: R = 2. DSUF_FP8_TILES_ROWS_OPW=auto|2|4: weight rows a tile; auto (session 41)
// 4 where the remainder then fills the lanes (nb mod 32 = 8: wq_b), else 2 — batch 4 −0.14 ms against
// 2. DSUF_FP8_TILES_ROWS_REGS=cap|full: R = 4 at most 128 registers (cap) or as many as it takes
// (full: 168–219).
// DSUF_FP8_TILES_ROWS_WARPS=16|8: the warps of a block past K = 2,048 (4 up to it; 16 at 128 registers
// is one block an SM, whose 4 staged rows the 16 warps share). A ring of 2 slots a warp (3 measured
// slower: its shared memory costs blocks). Measured (docs/perf.md, session 40; gpu ms against off):
// batch 4 15.09 against 15.61, 16 46.69 against 49.70; 102 registers for blocks of 4 ±0 (removed).
// Blocks of 20 warps at ≤ 102 registers (one tile a warp over 128 SMs for wo_b and the shared w2 at
// batch 4) measured +0.04 ms at batch 4, 14 warps with rings of 3 slots +0.31 (session 42; removed).
// Where the shared memory (R input rows at K ≤ 8,192 and the rings) does not fit, fewer warps, else
// k_fp8_gemv.
constexpr size_t kMaxBlockSmem = 227 * 1024;  // a block's shared memory on sm_90 and sm_100
template <int OPW, bool kExact, int R, bool kFma = kExact>
bool launch_fp8_tiles_rows_r(const Fp8Call& c) {
  static const bool full = env_picks("DSUF_FP8_TILES_ROWS_REGS", "cap", "full");
  static const bool wide = !env_picks("DSUF_FP8_TILES_ROWS_WARPS", "16", "8");
  auto fits = [&](int w) { return fp8_tiles_smem(OPW, w, 2, c.K, R) <= kMaxBlockSmem; };
  const bool cap = R > 2 && !full;
  if (c.K > 2048 && wide && fits(16)) return launch_fp8_tiles_k<OPW, kExact, 16, 2, R, 1, kFma>(c), true;
  if (c.K > 2048 && fits(8)) {
    if (cap) launch_fp8_tiles_k<OPW, kExact, 8, 2, R, 2, kFma>(c);
    else launch_fp8_tiles_k<OPW, kExact, 8, 2, R, 1, kFma>(c);
    return true;
  }
  if (!fits(4)) return false;
  if (cap) launch_fp8_tiles_k<OPW, kExact, 4, 2, R, 4, kFma>(c);
  else launch_fp8_tiles_k<OPW, kExact, 4, 2, R, 1, kFma>(c);
  return true;
}
// DSUF_FP8_BF16_FMA=on|off (session 43): an unquantized FP8 linear whose inputs are all BF16 values
// (LinearInput::bf16: wo_a's, from the P·V kernel) takes each product and add as one fmaf — the same
// bits (fp8_kb_parts: the product is exact) in half the arithmetic instructions — in the multi-row
// tiles (2 rows a tile) and wo_a's one-row preload kernel; off: the rounded product and add.
bool fp8_bf16_fma(const Fp8Call& c) {
  static const bool on = !env_picks("DSUF_FP8_BF16_FMA", "on", "off");
  return on && c.in.bf16 && !c.in.scale;
}
template <bool kExact>
bool launch_fp8_tiles_rows(const Fp8Call& c) {
  static const int pick = env_choice("DSUF_FP8_TILES_ROWS", {"auto", "off", "2", "4"});
  static const int opw_pick = env_choice("DSUF_FP8_TILES_ROWS_OPW", {"auto", "2", "4"});
  const int64_t nb = c.K / 32, rem = nb % 32;
  // auto: 4 rows a tile where the remainder then fills the 32 lanes (rem = 8: wq_b's K = 1,280), else 2.
  const int opw = opw_pick == 2 || (opw_pick == 0 && rem == 8) ? 4 : 2;
  auto aligned = [](const void* p, int a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  if (pick == 1 || c.rows < 2 || gemv_mode() != kRegs || nb < 32 || nb % 4 != 0 || c.K > 8192 ||
      (rem != 0 && opw * rem > 32) || !aligned(c.W, 16) || !aligned(c.Ws, 4) ||
      (c.pair.W && (!aligned(c.pair.W, 16) || !aligned(c.pair.Ws, 4))) || (c.groups > 1 && c.out % 32 != 0))
    return false;
  if constexpr (!kExact)
    if (opw == 2 && fp8_bf16_fma(c))
      return pick == 2 || c.rows < 3 ? launch_fp8_tiles_rows_r<2, false, 2, true>(c)
                                     : launch_fp8_tiles_rows_r<2, false, 4, true>(c);
  if (pick == 2 || c.rows < 3)
    return opw == 4 ? launch_fp8_tiles_rows_r<4, kExact, 2>(c) : launch_fp8_tiles_rows_r<2, kExact, 2>(c);
  return opw == 4 ? launch_fp8_tiles_rows_r<4, kExact, 4>(c) : launch_fp8_tiles_rows_r<2, kExact, 4>(c);
}
template <int OPW, int R, bool kExact>
void launch_fp8(const Fp8Call& c) {
  const int mode = gemv_mode();
  const bool early = fp8_early();
  if constexpr (R == 1 && OPW >= 2) {
    // 2 rows a tile (the launch's 4 where DSUF_FP8_TILES_OPW=4 and it fits).
    static const bool four = env_picks("DSUF_FP8_TILES_OPW", "2", "4");
    if (OPW == 4 && four && fp8_tiles_fit(c, 4)) return launch_fp8_tiles<4, kExact>(c);
    if (fp8_tiles_fit(c, 2)) return launch_fp8_tiles<2, kExact>(c);
  }
  // DSUF_FP8_SMALL=deep|regs: a one-output-a-warp linear whose lanes hold at most kDeep's U rounds
  // (wq_a+wkv, the indexer's wq_b) takes kDeep under the default regs mode, so that with `early` its
  // whole weight share is loaded before the wait (deep: the v22 candidate; regs: as the others).
  static const bool small_deep = !env_picks("DSUF_FP8_SMALL", "deep", "regs");
  const bool deep = mode == kDeep || (small_deep && mode == kRegs && OPW == 1 && c.K / 32 <= 32 * deep_u<32>());
  const int warps = deep || mode != kRegs ? 8 : fp8_block_warps();
  // The interleaved form only where the grid below is sized for its 4 warps.
  auto pick = [&] {
    if constexpr (R > 1)
      if (!deep && mode == kRegs && warps == 4 && fp8_rows_inter(c.rows, R)) return k_fp8_gemv<OPW, R, kExact, kRegs, 4, 0, true>;
    return deep                 ? k_fp8_gemv<OPW, R, kExact, kDeep>
           : mode == kRegsPipe ? k_fp8_gemv<OPW, R, kExact, kRegsPipe>
           : warps == 4        ? k_fp8_gemv<OPW, R, kExact, kRegs, 4>
           : warps == 2        ? k_fp8_gemv<OPW, R, kExact, kRegs, 2>
                               : k_fp8_gemv<OPW, R, kExact, kRegs>;
  };
  auto k = pick();
  const int64_t out = std::max(c.out, c.pair.out);
  const dim3 grid(blocks_for(out, warps * OPW), blocks_for(c.rows, R), c.groups);
  launch_pdl(k, grid, dim3(32 * warps), 0, c.s, c.W, c.Ws, c.out, c.K, c.in.x, c.in.stride, c.in.group_stride, c.in.scale,
             c.in.scale_stride, int(c.rows), c.y, c.y_stride, c.r, c.pair, early, InputSink{});
}
template <int R, bool kExact>
void launch_fp8_opw(const Fp8Call& c) {
  switch (outputs_per_warp((c.out * (c.pair.W ? 1 : c.groups) + c.pair.out) * blocks_for(c.rows, R))) {
    case 4: return launch_fp8<4, R, kExact>(c);
    case 2: return launch_fp8<2, R, kExact>(c);
    default: return launch_fp8<1, R, kExact>(c);
  }
}
// DSUF_FP8_GEMM_ROWS: rows from which an FP8 linear runs as the tiled k_fp8_gemm (0: never).
int64_t fp8_gemm_rows() {
  static const int64_t v = [] {
    const char* e = std::getenv("DSUF_FP8_GEMM_ROWS");
    return e ? std::atoll(e) : int64_t(64);
  }();
  return v;
}
// One-row k_fp8_gemv with a sink (kSink): 16 warps of 2 outputs (the OPW the launch would pick for
// wo_a at batch 1) so that a block holds one K-block of outputs; false where that shape does not apply.
template <bool kExact>
bool launch_fp8_sink(const Fp8Call& c, const InputSink& sink, bool late) {
  if (c.rows != 1 || c.pair.W || c.out % 32 != 0 || gemv_mode() != kRegs || c.K / 32 < 32 ||
      outputs_per_warp(c.out * c.groups) != 2 || (fp8_gemm_rows() > 0 && c.rows >= fp8_gemm_rows()))
    return false;
  // DSUF_WOA_PRELOAD=on|off: wo_a's weights on the chip before its input (k_fp8_gemv_preload; on, the
  // default since session 33: −0.070 and −0.088 ms a step at batch 1 and 8K in two calls, −0.077 at
  // 128K; 4 warps of 8 rows a block instead of 8 of 4 measured +0.17 against it: docs/perf.md v45).
  static const bool preload = !env_picks("DSUF_WOA_PRELOAD", "on", "off");
  if (preload && !late && c.K == 32 * 32 * kPreRounds) {
    auto kp = !kExact && fp8_bf16_fma(c) ? k_fp8_gemv_preload<kExact, true> : k_fp8_gemv_preload<kExact>;
    set_smem(kp, kPreSmem);
    launch_pdl(kp, dim3(int(c.out / 32), 1, c.groups), dim3(32 * kPreWarps), kPreSmem, c.s, c.W, c.Ws, c.out, c.K,
               c.in.x, c.in.group_stride, c.in.scale, c.y, c.r, sink);
    return true;
  }
  const bool early = fp8_early();
  auto k = late ? k_fp8_gemv<2, 1, kExact, kRegs, 16, 2> : k_fp8_gemv<2, 1, kExact, kRegs, 16, 1>;
  launch_pdl(k, dim3(int(c.out / 32), 1, c.groups), dim3(512), 0, c.s, c.W, c.Ws, c.out, c.K, c.in.x, c.in.stride,
             c.in.group_stride, c.in.scale, c.in.scale_stride, int(c.rows), c.y, c.y_stride, c.r, c.pair, early, sink);
  return true;
}
template <bool kExact>
void launch_fp8_rows(const Fp8Call& c) {
  if (fp8_gemm_rows() > 0 && c.rows >= fp8_gemm_rows()) {
    const int64_t out = std::max(c.out, c.pair.out);
    static const bool square = env_picks("DSUF_FP8_GEMM_TILE", "128x32", "64x64");
    auto launch = [&](auto k, int to, int tr) {
      k<<<dim3(blocks_for(out, to), blocks_for(c.rows, tr), c.groups), 256, 0, c.s>>>(
          c.W, c.Ws, c.out, c.K, c.in.x, c.in.stride, c.in.group_stride, c.in.scale, c.in.scale_stride,
          int(c.rows), c.y, c.y_stride, c.r, c.pair);
    };
    if (square) launch(k_fp8_gemm<kExact, 64, 64>, 64, 64);
    else launch(k_fp8_gemm<kExact, 128, 32>, 128, 32);
    DSUF_CUDA(cudaGetLastError());
    return;
  }
  // Rows per block: each weight row is read once per group of R rows (8 rows a block from 8 rows,
  // DSUF_FP8_R8 in session 17-18: batch 16 59.5 → 67.0 ms gpu; removed).
  // DSUF_FP8_ROWS_MAX=auto|4|2: at most 4 rows a block, or 2. auto (the default since v36): 4 when that
  // makes several row groups (rows > 4), else 2 — batch 4 in two row groups of 2, and so interleaved
  // under DSUF_FP8_ROWS_FORM=auto: 16.51 → 16.38 ms gpu against one group of 4 (session 22, call 6).
  if (launch_fp8_tiles_rows<kExact>(c)) return;
  static const int most = env_choice("DSUF_FP8_ROWS_MAX", {"auto", "4", "2"});
  if (c.rows >= 4 && (most == 1 || (most == 0 && c.rows > 4))) return launch_fp8_opw<4, kExact>(c);
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
  const int32_t* order = nullptr;  // k_fp4_imma only: grid.y row i is routed row order[i]
  const GluTail* glu = nullptr;     // k_fp4_imma<…, kGlu> (w1 and w3 with SwiGLU's tail; tiled)
  const RowGroups* multi = nullptr;  // k_fp4_imma<…, kRows = multi->size> over multi's groups (tiled)
};
template <int OPW, bool kExact>
void launch_fp4(const Fp4Call& c) {
  const int mode = fp4_gemv_mode();
  auto k = mode == kDeep        ? k_fp4_gemv<OPW, kExact, kDeep>
           : mode == kRegsPipe ? k_fp4_gemv<OPW, kExact, kRegsPipe>
                               : k_fp4_gemv<OPW, kExact, kRegs>;
  launch_pdl(k, dim3(blocks_for(c.out, 8 * OPW), int(c.rows), c.pair.W ? 2 : 1), dim3(256), 0, c.s, c.W, c.Ws,
             c.ids, c.out, c.K, c.in.x, c.in.stride, c.in.scale, c.in.scale_stride, c.in.planes, c.in.plane_stride,
             c.x_div, c.y, c.r, c.pair);
}
// DSUF_FP4=tiled|dp4a|mma|imma picks the quantized FP4 linear's kernel: k_fp4_imma over weights laid
// out in tiles at load (the default, where the model allows it: fp4_tiled_wanted()), k_fp4_gemv (the
// row-major layout's default), k_fp4_mma or k_fp4_imma.
enum Fp4Kernel { kFp4Tiled = 0, kFp4Dp4a = 1, kFp4Mma = 2, kFp4Imma = 3 };
int fp4_kernel() {
  static const int k = env_choice("DSUF_FP4", {"tiled", "dp4a", "mma", "imma"});  // in Fp4Kernel's order
  return k;
}
}  // namespace

Fp4TiledWish fp4_tiled_wanted() {
  if (fp4_kernel() != kFp4Tiled) return Fp4TiledWish::kNo;
  return std::getenv("DSUF_FP4") ? Fp4TiledWish::kRequired : Fp4TiledWish::kWhereAllowed;
}

namespace {
// Row-major E2M1 bytes → det::fp4_tiled_offset's tiles, a 4-byte word a thread.
__global__ void k_fp4_tile(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t rows, int64_t nb) {
  const int64_t words = rows * nb * 4, per_row = nb * 4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < words; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, byte = 4 * (i % per_row);
    *reinterpret_cast<uint32_t*>(dst + det::fp4_tiled_offset(row, byte, nb)) =
        *reinterpret_cast<const uint32_t*>(src + row * (nb * 16) + byte);
  }
}
// Whether the grouped FP4 linear of `rows` routed rows over `experts` runs as k_fp4_mma_rows (the
// rest: k_fp4_gemv_rows): from DSUF_FP4_MMA_ROWS routed rows per expert on average (default 16; 0:
// always; DSUF_FP4_ROWS=dp4a: never). Its blocks stage the scales of 8 rows and pay for empty row
// pairs, so it needs full groups: at 4 rows per expert (batch 64 at 96 experts) it measured slower.
bool fp4_rows_mma(int64_t rows, int64_t experts) {
  static const bool on = !env_picks("DSUF_FP4_ROWS", "mma", "dp4a");
  static const int64_t per_expert = [] {
    const char* v = std::getenv("DSUF_FP4_MMA_ROWS");
    return v ? std::atoll(v) : int64_t(16);
  }();
  return on && rows >= per_expert * experts;
}
// Over tiled weights, whether grouped rows (groups set, K within the grouped kernel's staging) run as
// k_fp4_mma_rows<true> (else k_fp4_imma<…, true> a row at a time, in expert order): from
// DSUF_TILED_MMA_ROWS routed rows per expert on average
// (default 16; 0: always). At 4 rows per expert (batch 64 at 96 experts) the grouped kernel, paying
// for 8 rows a group, made the step 10.7 % slower than row-major weights (v17); a row at a time in
// expert order, 22 % faster than the grouped kernel (v18: 214 against 273 ms).
int64_t tiled_mma_rows_per_expert() {
  static const int64_t per_expert = [] {
    const char* v = std::getenv("DSUF_TILED_MMA_ROWS");
    return v ? std::atoll(v) : int64_t(16);
  }();
  return per_expert;
}
bool tiled_rows_mma(const RowGroups* groups, int64_t K) {
  return groups && groups->size == kRowGroup && K / 32 <= kMmaRowMaxNb &&
         groups->rows >= tiled_mma_rows_per_expert() * groups->experts;
}
// k_fp4_imma's launch: DSUF_IMMA=stages,warps (the ring's depth in stages of 2 K-blocks, the warps a
// block) or, tiled, DSUF_TILED=auto|stages,warps (stages − 1 in flight)|bS,warps (a ring of S
// bulk-copied chunks a warp). auto (the default since session 19): b2,16 for up to kImmaBulkRows
// routed rows, 4,16 above (docs/perf.md v33: b2,16 measured −0.008 ms at batch 1, −0.9 % at batch 4,
// −0.8 % at 16, +0.8 % at 64 — 384 rows).
constexpr int64_t kImmaBulkRows = 128;
constexpr int64_t kSwigluFusedRows = 32;  // DSUF_SWIGLU=auto's fused range (routed rows)
// (v18 also tried per launch the fewest warps whose grid fits one block an SM: the same time as 4,16.)
template <bool kTiled>
void launch_imma(const Fp4Call& c) {
  struct Shape {
    decltype(&k_fp4_imma<8, 8, kTiled>) k;
    int stages, warps, bulk = 0;
  };
  static const int pick = kTiled ? env_choice("DSUF_TILED", {"auto", "4,16", "4,8", "2,16", "8,8", "b2,16", "b4,16"}) : 0;
  static const std::array<Shape, 7> tiled{Shape{},
                                          Shape{k_fp4_imma<4, 16, true>, 4, 16},
                                          Shape{k_fp4_imma<4, 8, true>, 4, 8},
                                          Shape{k_fp4_imma<2, 16, true>, 2, 16},
                                          Shape{k_fp4_imma<8, 8, true>, 8, 8},
                                          Shape{k_fp4_imma<4, 16, true, 2>, 4, 16, 2},
                                          Shape{k_fp4_imma<4, 16, true, 4>, 4, 16, 4}};
  static const std::array<Shape, 4> ring{Shape{k_fp4_imma<8, 8, false>, 8, 8}, Shape{k_fp4_imma<8, 4, false>, 8, 4},
                                         Shape{k_fp4_imma<16, 4, false>, 16, 4}, Shape{k_fp4_imma<16, 8, false>, 16, 8}};
  static const int ring_pick = kTiled ? 0 : env_choice("DSUF_IMMA", {"8,8", "8,4", "16,4", "16,8"});
  const bool glu = kTiled && c.glu;  // kGlu: b2,16 whatever DSUF_TILED says
  if (kTiled && c.multi) {  // pairs of routed rows of one expert a block: b2 rings, 16 warps
    // DSUF_EXPERT_PAIR=merged|split: both rows in one MMA's columns (merged, kMerged, the default: half
    // the MMAs and the staging; session 23 against split: batch 16 −0.69 ms in two rounds, 64 −9.5 in
    // one) or each row its own MMAs (split).
    static const bool merged = !env_picks("DSUF_EXPERT_PAIR", "merged", "split");
    const RowGroups& g = *c.multi;
    const Shape sh = merged ? (glu ? Shape{k_fp4_imma<4, 16, true, 2, true, 2, true>, 4, 16, 2}
                                   : Shape{k_fp4_imma<4, 16, true, 2, false, 2, true>, 4, 16, 2})
                            : (glu ? Shape{k_fp4_imma<4, 16, true, 2, true, 2>, 4, 16, 2}
                                   : Shape{k_fp4_imma<4, 16, true, 2, false, 2>, 4, 16, 2});
    DSUF_CHECK(g.size == 2 && g.max_groups <= 65535, "fp4 experts: groups of ", g.size, ", ", g.max_groups,
               " of them");
    const size_t smem = imma_smem(c.K / 32, sh.stages, sh.warps, true, sh.bulk, glu, g.size, merged);
    if (smem > kMaxBlockSmem) {  // the rows' staged inputs do not fit (K past ~5,120): a row at a time
      Fp4Call one = c;
      one.multi = nullptr, one.order = g.order;
      return launch_imma<true>(one);
    }
    set_smem(sh.k, smem);
    launch_pdl(sh.k, dim3(blocks_for(c.out, 16 * (glu ? sh.warps / 2 : sh.warps)), int(g.max_groups),
                          glu || !c.pair.W ? 1 : 2),
               dim3(32 * sh.warps), smem, c.s, c.W, c.Ws, c.ids, c.out, c.K, c.in.scale, c.in.scale_stride,
               c.in.planes, c.in.plane_stride, c.x_div, c.y, c.r, c.pair, g.order, glu ? *c.glu : GluTail{},
               g.groups, g.n_groups);
    return;
  }
  const Shape sh = glu        ? Shape{k_fp4_imma<4, 16, true, 2, true>, 4, 16, 2}
                   : !kTiled ? ring[ring_pick]
                   : pick     ? tiled[pick]
                              : tiled[c.rows <= kImmaBulkRows ? 5 : 1];
  // Every call, not once: the attribute is per device, and tensor-parallel ranks launch on several.
  // (A bulk ring of 4 slots at the largest K would pass the 227 KB an SM has: this call's K.)
  set_smem(sh.k, imma_smem(sh.bulk ? c.K / 32 : kImmaMaxNb, sh.stages, sh.warps, kTiled, sh.bulk, glu));
  // grid.y holds at most 65535 rows: a long prefill chunk (rows = tokens × top-k) goes in slices of
  // whole input rows (a multiple of x_div), each with its ids, outputs and inputs offset — or, in
  // expert order, its piece of the order (which names absolute rows).
  const int64_t slice = 65535 / c.x_div * c.x_div;
  for (int64_t b = 0; b < c.rows; b += slice) {
    const int64_t n = std::min(slice, c.rows - b), rb0 = c.order ? 0 : b, xr = rb0 / c.x_div;
    Fp4Pair pair = c.pair;
    if (pair.y) pair.y += rb0 * c.out;
    launch_pdl(sh.k, dim3(blocks_for(c.out, 16 * (glu ? sh.warps / 2 : sh.warps)), int(n), glu || !c.pair.W ? 1 : 2),
               dim3(32 * sh.warps), imma_smem(c.K / 32, sh.stages, sh.warps, kTiled, sh.bulk, glu), c.s, c.W, c.Ws,
               c.ids ? c.ids + rb0 : nullptr, c.out, c.K, c.in.scale + xr * c.in.scale_stride, c.in.scale_stride,
               c.in.planes + xr * c.in.plane_stride, c.in.plane_stride, c.x_div, c.y + rb0 * c.out, c.r, pair,
               c.order ? c.order + b : nullptr, glu ? *c.glu : GluTail{}, nullptr, nullptr);
  }
}
template <bool kExact>
void launch_fp4_opw(const Fp4Call& c) {
  const int64_t rounds = (c.K / 32 + 31) / 32, nb = c.K / 32;
  if (kExact && fp4_kernel() == kFp4Imma && c.in.planes && nb % 4 == 0 && nb <= kImmaMaxNb)
    return launch_imma<false>(c);
  if (kExact && fp4_kernel() == kFp4Mma && c.in.planes && rounds <= kMmaMaxRounds) {
    launch_pdl(k_fp4_mma, dim3(blocks_for(c.out, 16), int(c.rows), c.pair.W ? 2 : 1), dim3(32 * rounds), 0,
               c.s, c.W, c.Ws, c.ids, c.out, c.K, c.in.scale, c.in.scale_stride, c.in.planes, c.in.plane_stride,
               c.x_div, c.y, c.r, c.pair);
    return;
  }
  // DSUF_FP4_OPW=1|2|4 fixes the outputs per warp (a measuring aid; by default from the size).
  static const int forced = [] {
    const char* v = std::getenv("DSUF_FP4_OPW");
    return v ? std::atoi(v) : 0;
  }();
  switch (forced ? forced : outputs_per_warp(c.out * c.rows * (c.pair.W ? 2 : 1))) {
    case 4: return launch_fp4<4, kExact>(c);
    case 2: return launch_fp4<2, kExact>(c);
    default: return launch_fp4<1, kExact>(c);
  }
}
}  // namespace

LinearInput linear_input(const float* x, int64_t x_stride, int64_t rows, int64_t K, bool quantize, float* xq,
                         float* xs, cudaStream_t s, int groups, const FusedRope& rope) {
  DSUF_CHECK(K % 32 == 0 && groups >= 1, "linear_input: K = ", K, ", groups = ", groups);
  check_fused_rope(rope, "linear_input");
  const int64_t nb = K / 32, kp = interleaved_k(K);
  if (rows > 0)
    launch_step(k_linear_input, dim3(blocks_for(groups * nb, 8), rows), dim3(256), 0, s, x, x_stride, K, groups,
                quantize, xq, xs, rope, late_trigger(kLateLinearInput));
  return {xq, groups * kp, kp, quantize ? xs : nullptr, groups * nb};
}
LinearInput sink_input(const InputSink& sink, int64_t K) {
  DSUF_CHECK(K % 32 == 0 && sink.xq, "sink_input: K = ", K);
  const int64_t kp = interleaved_k(K);
  const bool planes = sink.quantize && sink.xp;
  return {sink.xq, kp, kp, sink.quantize ? sink.xs : nullptr, K / 32, planes ? sink.xp : nullptr,
          planes ? interleaved_planes(K) : 0};
}
void fp8_linear_groups(const uint8_t* W, const uint8_t* Ws, int groups, int64_t out, int64_t K,
                       const LinearInput& in, int64_t rows, float* y, int64_t y_stride, bool r, cudaStream_t s,
                       const InputSink& sink, int tile_sm) {
  DSUF_CHECK(K % 32 == 0 && groups >= 1 && (groups == 1 || out % 32 == 0) && in.group_stride == interleaved_k(K),
             "fp8_linear: K = ", K, ", groups = ", groups, ", out = ", out, ", input laid out for ",
             in.group_stride, " per group");
  if (rows <= 0) return;
  const Fp8Call c{W, Ws, out, K, in, rows, y, y_stride, groups, r, s, {}, tile_sm};
  if (sink.xq) {
    const bool late = fp8_sink_mode() == 2;
    if (in.scale ? launch_fp8_sink<true>(c, sink, late) : launch_fp8_sink<false>(c, sink, late)) return;
  }
  if (in.scale) launch_fp8_rows<true>(c);
  else launch_fp8_rows<false>(c);
  if (sink.xq) linear_input(y, y_stride, rows, groups * out, sink.quantize, sink.xq, sink.xs, s);
}
int fp8_sink_mode() {  // fused by default since v34 (−0.10 ms at batch 1 and 8K; fused_late −0.05)
  static const int v = std::array{1, 0, 2}[size_t(env_choice("DSUF_WOB_INPUT", {"fused", "separate", "fused_late"}))];
  return v;
}
void fp8_linear(const uint8_t* W, const uint8_t* Ws, int64_t out, int64_t K, const LinearInput& in, int64_t rows,
                float* y, int64_t y_stride, bool r, cudaStream_t s, const Fp8Pair& pair, int tile_sm) {
  if (!pair.W) return fp8_linear_groups(W, Ws, 1, out, K, in, rows, y, y_stride, r, s, {}, tile_sm);
  DSUF_CHECK(K % 32 == 0 && in.group_stride == interleaved_k(K) && in.stride == in.group_stride,
             "fp8_linear (pair): K = ", K, ", input laid out for ", in.group_stride);
  if (rows <= 0) return;
  const Fp8Call c{W, Ws, out, K, in, rows, y, y_stride, 2, r, s, pair};
  if (in.scale) return launch_fp8_rows<true>(c);
  launch_fp8_rows<false>(c);
}
int64_t group_bound(int64_t rows, int experts, int size) {
  return std::min<int64_t>(rows, (rows + size - 1) / size + experts);
}
void group_rows(const int32_t* ids, int64_t rows, int experts, RowGroups& g, cudaStream_t s, int size) {
  DSUF_CHECK(size >= 1 && size <= kRowGroup, "group_rows: groups of ", size);
  g.max_groups = group_bound(rows, experts, size);
  g.rows = rows, g.experts = experts, g.size = size;
  if (rows <= 0) return;
  launch_step(k_group_rows, dim3(1), dim3(kGroupThreads), size_t(2) * experts * sizeof(int32_t), s, ids, int(rows),
              experts, size, g.order, g.groups, g.n_groups);
  DSUF_CUDA(cudaGetLastError());
}
int imma_row_group(int64_t rows, int experts) {
  // auto: pairs from one routed row an expert on average (session 23, 96 experts, against a row at a
  // time: batch 16 −1.67 ms, 64 −10.7 ms; at batch 4, 24 rows, few pairs: +0.60 ms — the grouping
  // launch and the pair kernel's blocks for single rows). Groups of 4 (8-warp blocks: their staging
  // at K = 5,120 leaves no room for 16) measured slower at every batch (+4, +11, +19 ms) and went.
  static const int pick = env_choice("DSUF_EXPERT_ROWS", {"auto", "1", "2"});
  const int size = pick == 0 ? (rows >= experts ? 2 : 0) : pick == 2 ? 2 : 0;
  // Not where the grouped MMA kernel takes the rows (tiled_rows_mma: groups of kRowGroup), nor past
  // grid.y's range.
  if (size < 2 || rows < 2 || rows >= tiled_mma_rows_per_expert() * experts ||
      group_bound(rows, experts, size) > 65535)
    return 0;
  return size;
}
namespace {
void check_fp4_input(int64_t K, const LinearInput& in) {
  DSUF_CHECK(K % 32 == 0 && in.group_stride == interleaved_k(K), "fp4_linear: K = ", K, ", input laid out for ",
             in.group_stride);
  DSUF_CHECK(!in.scale || (in.planes && in.plane_stride >= interleaved_planes(K)),
             "fp4_linear: quantized inputs without their byte planes (InputSink::xp)");
}
}  // namespace
void fp4_linear_grouped(const uint8_t* const* W, const uint8_t* const* Ws, const int32_t* ids, int64_t out, int64_t K,
                        const LinearInput& in, int x_div, int64_t rows, float* y, bool r, cudaStream_t s,
                        const Fp4Pair& pair, const RowGroups* groups, bool tiled) {
  check_fp4_input(K, in);
  if (rows <= 0) return;
  const bool tiles = tiled && det::fp4_tileable(out, K);
  if (groups && groups->size != kRowGroup) {  // imma_row_group's groups: for k_fp4_imma<…, kRows> only
    if (tiles) {
      DSUF_CHECK(in.scale && in.planes, "fp4_linear (tiled weights): needs quantized inputs with byte planes");
      launch_imma<true>(Fp4Call{W, Ws, ids, out, K, in, x_div, rows, y, r, s, pair, nullptr, nullptr, groups});
      return;
    }
    groups = nullptr;  // a row at a time by ids
  }
  if (tiles) {  // the weights are tiles: full groups through
    // k_fp4_mma_rows<true>, the rest through k_fp4_imma<…, true>, a row at a time (grouped: in the
    // groups' expert order, so that an expert's rows run together and share its weights in L2)
    DSUF_CHECK(in.scale && in.planes, "fp4_linear (tiled weights): needs quantized inputs with byte planes");
    if (tiled_rows_mma(groups, K)) {
      launch_pdl(k_fp4_mma_rows<true>, dim3(blocks_for(out, 16 * kMmaRowWarps), int(groups->max_groups),
                                            pair.W ? 2 : 1),
                 dim3(32 * kMmaRowWarps), mma_rows_smem(K / 32), s, W, Ws, groups->groups, groups->n_groups,
                 groups->order, out, K, in.scale, in.scale_stride, in.planes, in.plane_stride, x_div, y, r, pair);
      return;
    }
    launch_imma<true>(Fp4Call{W, Ws, ids, out, K, in, x_div, rows, y, r, s, pair, groups ? groups->order : nullptr});
    return;
  }
  if (groups && in.scale && fp4_rows_mma(groups->rows, groups->experts) && K / 32 <= kMmaRowMaxNb) {
    launch_pdl(k_fp4_mma_rows<false>, dim3(blocks_for(out, 16 * kMmaRowWarps), int(groups->max_groups), pair.W ? 2 : 1),
               dim3(32 * kMmaRowWarps), mma_rows_smem(K / 32), s, W, Ws, groups->groups, groups->n_groups,
               groups->order, out, K, in.scale, in.scale_stride, in.planes, in.plane_stride, x_div, y, r, pair);
    return;
  }
  if (groups) {
    const dim3 grid(blocks_for(out, 8 * 2), int(groups->max_groups), pair.W ? 2 : 1);
    auto k = in.scale ? k_fp4_gemv_rows<2, kRowGroup, true> : k_fp4_gemv_rows<2, kRowGroup, false>;
    launch_pdl(k, grid, dim3(256), 0, s, W, Ws, groups->groups, groups->n_groups, groups->order, out, K, in.x,
               in.stride, in.scale, in.scale_stride, in.planes, in.plane_stride, x_div, y, r, pair);
    return;
  }
  const Fp4Call c{W, Ws, ids, out, K, in, x_div, rows, y, r, s, pair};
  if (in.scale) return launch_fp4_opw<true>(c);
  launch_fp4_opw<false>(c);
}
void fp4_tile_in_place(uint8_t* W, int64_t out, int64_t K, uint8_t* scratch, cudaStream_t s) {
  if (!det::fp4_tileable(out, K)) return;
  const int64_t bytes = out * K / 2;
  k_fp4_tile<<<int(std::min<int64_t>(blocks_for(bytes / 4, 256), 4096)), 256, 0, s>>>(W, scratch, out, K / 32);
  DSUF_CUDA(cudaGetLastError());
  DSUF_CUDA(cudaMemcpyAsync(W, scratch, size_t(bytes), cudaMemcpyDeviceToDevice, s));
}
namespace {
// The smallest max(exponent field, 1) of a BF16 matrix's nonzero values, its largest field, and
// whether any is Inf or NaN (field 255): v[0] min, v[1] max (atomics over a grid-stride scan).
__global__ void k_bf16_exponents(const uint16_t* __restrict__ W, int64_t n, int* v) {
  int lo = 255, hi = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int e = (W[i] >> 7) & 0xff;
    if (W[i] & 0x7fff) lo = min(lo, max(e, 1));
    hi = max(hi, e);
  }
  for (int d = 16; d > 0; d /= 2) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, d));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, d));
  }
  if (threadIdx.x % 32 == 0) atomicMin(v, lo), atomicMax(v + 1, hi);
}
// DSUF_BF16_FMA=on|off: the head's 8-rows-a-block form (k_bf16_wide<…, kFmaOk>) takes each product
// and add as one fmaf where the caller passed the weights' limits and the staged inputs qualify (on,
// the default since session 44), or never (off).
int bf16_fma_mode() {
  static const int mode = env_choice("DSUF_BF16_FMA", {"on", "off"});
  return mode;
}
Bf16FmaLimits bf16_fma_setting(const Bf16FmaLimits& fl) { return bf16_fma_mode() == 1 ? Bf16FmaLimits{} : fl; }
}  // namespace
Bf16FmaLimits bf16_fma_limits(const uint16_t* W, int64_t n, cudaStream_t s) {
  if (!W || n <= 0 || bf16_fma_mode() == 1) return {};
  int* d = nullptr;
  DSUF_CUDA(cudaMallocAsync(&d, 8, s));
  const int init[2] = {255, 0};
  DSUF_CUDA(cudaMemcpyAsync(d, init, 8, cudaMemcpyHostToDevice, s));
  k_bf16_exponents<<<int(std::min<int64_t>(blocks_for(n, 256), 4 * sm_count())), 256, 0, s>>>(W, n, d);
  DSUF_CUDA(cudaGetLastError());
  int v[2];
  DSUF_CUDA(cudaMemcpyAsync(v, d, 8, cudaMemcpyDeviceToHost, s));
  DSUF_CUDA(cudaFreeAsync(d, s));
  DSUF_CUDA(cudaStreamSynchronize(s));
  return dsuf::bf16_fma_limits(v[0], v[1], v[1] == 255);
}
namespace {
// DSUF_BF16_STREAM=auto|off|all: k_bf16_stream for one-row BF16 linears of at least
// kBf16StreamMinOut outputs (auto: the head), none (off: k_bf16_linear as in v34), or every one-row
// BF16 linear it can take (all: the router, compressors and indexer projections too — an exactness
// check, not a speed setting). DSUF_BF16_STREAM_SHAPE=8x2|4x4|2x8: consumer warps × ring stages
// (session 21, batch 1 at 8K: 8x2 −0.087 ms against k_bf16_linear, 4x4 −0.080, 2x8 +0.14; the head
// alone under Nsight 307 µs at 4.3 TB/s against ~390).
constexpr int64_t kBf16StreamMinOut = 16384;
int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    DSUF_CUDA(cudaGetDevice(&dev));
    DSUF_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}
template <int kW, int kS>
void launch_bf16_stream(const uint16_t* W, int64_t out, int64_t K, const float* x, float* y, bool r, cudaStream_t s) {
  const size_t smem = bf16_stream_smem(kW, kS, K);
  set_smem(k_bf16_stream<kW, kS>, smem);
  const int64_t grid = std::min<int64_t>(sm_count(), (out + kW - 1) / kW);
  launch_pdl(k_bf16_stream<kW, kS>, dim3(unsigned(grid)), dim3(32 * (kW + 1)), smem, s, W, out, K, x, y, r);
}
// Whether k_bf16_linear's staged path (and so k_bf16_stream) takes a linear: 16-byte loads of the
// weight rows and of every input row, the whole input row in shared memory (its in-kernel `vec` and
// K bound, tested on the host to pick the form).
// K a multiple of 256 (whole rounds of 32 chunks): bf16_stage_slot's layout fills a row's K / 4
// float4s only then — at K = 320 it places the last chunks' halves past the row (float4 103 of 80),
// into the next row or past the block's shared memory. A hidden size that is a multiple of 32 but
// not of 256 (config.cc accepts it; V4.1's 5,120 is not one) takes the unstaged forms.
bool bf16_stageable(int64_t K) { return K % 256 == 0 && K <= 8 * 32 * kBf16Deep; }
bool bf16_staged_fits(const uint16_t* W, int64_t K, const float* x, int64_t x_stride) {
  return bf16_stageable(K) && x_stride % 4 == 0 && (reinterpret_cast<uintptr_t>(W) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(x) & 15) == 0;
}
bool bf16_stream(const uint16_t* W, int64_t out, int64_t K, const float* x, int64_t rows, float* y, bool r,
                 cudaStream_t s) {
  static const int mode = env_choice("DSUF_BF16_STREAM", {"auto", "off", "all"});
  static const int shape = env_choice("DSUF_BF16_STREAM_SHAPE", {"8x2", "4x4", "2x8"});
  const bool fits = rows == 1 && bf16_staged_fits(W, K, x, 0);
  if (!fits || mode == 1 || (mode == 0 && out < kBf16StreamMinOut)) return false;
  if (shape == 0) launch_bf16_stream<8, 2>(W, out, K, x, y, r, s);
  else if (shape == 1) launch_bf16_stream<4, 4>(W, out, K, x, y, r, s);
  else launch_bf16_stream<2, 8>(W, out, K, x, y, r, s);
  return true;
}
}  // namespace
void bf16_linear(const uint16_t* W, int64_t out, int64_t K, const float* x, int64_t x_stride, int64_t rows, float* y,
                 int64_t y_stride, bool r, cudaStream_t s, Bf16FmaLimits fl) {
  if (bf16_stream(W, out, K, x, rows, y, r, s)) return;
  // DSUF_BF16=staged (the default since v32) | deep (v15-v31) | loop (measuring aids): see kBf16Deep
  // and the staged path.
  static const int mode = env_choice("DSUF_BF16", {"staged", "deep", "loop"});
  const bool deep = mode != 2, staged = mode == 0 && bf16_stageable(K);
  // A warp per output, 8 warps a block (v21 tried blocks of ⌈outputs·rows/132⌉ warps, so that the
  // router's 96 rows are read by 96 SMs instead of 12: the same step time, docs/perf.md).
  // Several rows on the staged path (DSUF_BF16_ROWS=8|4|1): 8 a block from 8 rows on, else kBf16Rows
  // (8, the default since v36: 160 KB of inputs at K = 5,120; measured on the head before k_bf16_wide
  // took it — batch 16 −0.34 ms, 64 −1.2 ms, docs/perf.md — and kept for the small multi-row BF16
  // linears, not measured on them alone); 4: kBf16Rows only (v35); 1: v34's row a block.
  static const int per = std::array{8, kBf16Rows, 1}[size_t(env_choice("DSUF_BF16_ROWS", {"8", "4", "1"}))];
  // DSUF_BF16_WIDE=auto|off|4|all: several rows of a linear with at least kBf16StreamMinOut outputs
  // (the head) through k_bf16_wide, 4 outputs a warp and up to 4 rows a block, 8 from 8 rows on
  // (auto), 4 always (4), or every linear of several rows (all: a checking aid); off: k_bf16_linear<R>.
  static const int wide = env_choice("DSUF_BF16_WIDE", {"auto", "off", "4", "all"});
  if (wide != 1 && rows > 1 && staged && (out >= kBf16StreamMinOut || wide == 3) &&
      bf16_staged_fits(W, K, x, x_stride)) {
    // The FMA (DSUF_BF16_FMA, fl) at 8 rows a block only: at 4 the head streams at ~3.3 TB/s either
    // way (session 44's timeline at batch 4: 403 µs plain, 424 with the FMA's branch).
    const Bf16FmaLimits wfl = bf16_fma_setting(fl);
    // DSUF_BF16_WIDE_LOOP=on|off|4: k_bf16_wide's persistent form (kPersist: resident blocks over the
    // tiles, the inputs staged once a block; two blocks an SM of 8 warps below 8 rows, one of 12 warps
    // at 8) or a block a tile (off); 4: below 8 rows only (v54's default). It carries its loads across a
    // tile's end into the same registers, so a tile's rounds (K / 256) must be a multiple of the depth
    // D = 2. Session 45 (docs/perf.md v54): below 8 rows the head at batch 4 402 → 376 µs in place, the
    // step −0.03 to −0.07 ms; the 8-row forms at 16 warps spilled (136 bytes of stack). Session 46
    // (v55): at 12 warps (163 registers) and with a warp's rows as an index, not OPW pointers, no stack
    // — batch 8 −0.07 to −0.10, 16 −0.28, 64 −1.4 against v54, one call, two rounds each.
    static const int wide_loop = env_choice("DSUF_BF16_WIDE_LOOP", {"on", "off", "4"});
    const bool loop_fits = K % (256 * 2) == 0;
    // per_sm > 0: the persistent form, one resident wave over the tiles; else a block a tile.
    auto launch = [&](auto k, int R, int warps, int per_sm = 0) {  // both shapes: 4 outputs a warp
      const size_t smem = size_t(R) * size_t(K) * 4;
      set_smem(k, smem);
      const int64_t tiles = blocks_for(out, warps * 4), ry = blocks_for(rows, R);
      const int64_t gx = per_sm > 0 ? std::clamp<int64_t>(per_sm * sm_count() / ry, 1, tiles) : tiles;
      launch_step(k, dim3(unsigned(gx), unsigned(ry)), dim3(32 * warps), smem, s, W, out, K, x, x_stride, y, y_stride,
                  r, rows, wfl);
    };
    // The shapes (session 22, call 5; docs/perf.md v36): 4 rows with 4 outputs a warp, D = 2, 8 warps,
    // two blocks an SM (110 registers; 124 persistent); 8 rows with 4 outputs, D = 2, 16 warps (128
    // registers, 16 bytes of stack in the plain form; the persistent forms take 12 warps). Against
    // <4 outputs, D 4, 8 warps, one block an SM> (156 and 168 registers): batch 4 −0.24 ms, 16 −0.53,
    // 64 −2.1; 16 warps at 4 rows and <2, D 4, 16 warps> at 8 between.
    // Without limits (DSUF_BF16_FMA=off, inputs that are not BF16 values by construction, Inf or NaN
    // weights) the 8-row form is v52's kernel, not the FMA form's lean fallback on every block.
    const bool eight = wide != 2 && rows >= 8;
    const bool loop = loop_fits && (eight ? wide_loop == 0 : wide_loop != 1);
    if (eight && wfl.on()) {
      if (loop) launch(k_bf16_wide<4, 8, 2, 12, 1, true, true>, 8, 12, 1);
      else launch(k_bf16_wide<4, 8, 2, 16, 1, true>, 8, 16);
    } else if (eight) {
      if (loop) launch(k_bf16_wide<4, 8, 2, 12, 1, false, true>, 8, 12, 1);
      else launch(k_bf16_wide<4, 8, 2, 16>, 8, 16);
    } else {
      if (loop) launch(k_bf16_wide<4, 4, 2, 8, 2, false, true>, 4, 8, 2);
      else launch(k_bf16_wide<4, 4, 2, 8, 2>, 4, 8);
    }
    return;
  }
  if (per > 1 && rows > 1 && staged && bf16_staged_fits(W, K, x, x_stride)) {
    auto launch = [&](auto k, int R) {
      const size_t smem = bf16_linear_smem(K, staged, R);
      set_smem(k, smem);
      launch_step(k, dim3(blocks_for(out, 8), blocks_for(rows, R)), dim3(256), smem, s, W, out, K, x, x_stride, y,
                  y_stride, r, deep, staged, rows);
    };
    if (per == 8 && rows >= 8) launch(k_bf16_linear<8>, 8);
    else launch(k_bf16_linear<kBf16Rows>, kBf16Rows);
    return;
  }
  launch_step(k_bf16_linear<1>, dim3(blocks_for(out, 8), rows), dim3(256), bf16_linear_smem(K, staged), s, W, out, K,
              x, x_stride, y, y_stride, r, deep, staged, rows);
}
void rope(float* x, int64_t rows, int heads, int64_t dim, const float* cs, int half, float sign, bool r,
          cudaStream_t s) {
  const int64_t n = rows * heads * half;
  if (n) launch_step(k_rope, dim3(blocks_for(n, 256)), dim3(256), 0, s, x, rows, heads, dim, cs, half, sign, r);
}
void fp8_fake_quant(float* x, int64_t n, bool r, cudaStream_t s, const FusedRope& rope) {
  check_fused_rope(rope, "fp8_fake_quant");
  DSUF_CHECK(!rope.cs || n % (rope.heads * rope.dim) == 0, "fp8_fake_quant: ", n, " values, rows of ",
             rope.heads * rope.dim);
  if (n) launch_step(k_fp8_fake_quant, dim3(blocks_for(n / 32, 8)), dim3(256), 0, s, x, n / 32, r, rope);
}
void index_q_quant(const float* x, int64_t n, int8_t* codes, float* scales, cudaStream_t s, const FusedRope& rope) {
  check_fused_rope(rope, "index_q_quant");
  DSUF_CHECK(!rope.cs || n % (int64_t(rope.heads) * rope.dim) == 0, "index_q_quant: ", n, " values, rows of ",
             rope.heads * rope.dim);
  if (n) launch_step(k_index_q_quant, dim3(blocks_for(n / 32, 8)), dim3(256), 0, s, x, n / 32, codes, scales, rope);
}
void pack_window(const float* kv, int rows, const RowMeta* meta, const SeqMeta* seqs, int layer, int64_t hd, int W,
                 cudaStream_t s) {
  const int64_t t = int64_t(rows) * (hd / 32);
  if (t > 0) launch_step(k_pack_window, dim3(blocks_for(t, 8)), dim3(256), 0, s, kv, rows, meta, seqs, layer, hd, W);
}
// DSUF_PV=auto|warps|cp|tiles|cpw picks the softmax + P·V kernel: k_attention_pv<1, UNR> (warps, a
// head a warp: v18 measured 0.06 ms a step faster than two; UNR by DSUF_PV_UNROLL),
// k_attention_pv<2, UNR> (cp: two heads a thread: each key slice value loaded once for both, half the
// shared-memory wavefronts of the loop, twice each warp's softmax), k_attention_pv<2, UNR, 2> (cpw:
// cp's loop in blocks of 64 dims, 8 warps, each warp one head's softmax, so that a head group's
// softmax is done by 8 blocks instead of 16 and a warp's is no longer two heads in turn) or
// k_attention_pv_tiles. auto: tiles for 16 to 128 rows (session 23: batch 16 −0.2 to −0.25 ms in three
// rounds over two sessions, 64 −0.6 in two); cpw for 3–15 rows (session 43: batch 4 −0.054 ms against
// cp in three rounds, 8 −0.143 in two; cp itself, session 42: batch 4 −0.12, 8 −0.23 against warps —
// there the loop is bound by the shared-memory wavefronts, which two heads a thread cut by 40 %);
// warps otherwise (batch 1–2, where one head a warp's shorter chains win: v18; cpw +0.18 at batch 1,
// its 64 blocks on half the SMs; prefill chunks of more rows: not re-measured). Blocks of 128 dims at
// 4 heads a thread (a quarter of the wavefronts; session 42, DW = 4, exact) measured −0.016 at batch
// 4, short of cp; removed.
enum PvKernel { kPvOneHead = 0, kPvTwoHeads = 1, kPvTiles = 2, kPvTwoHeadsWide = 3 };
// The rows (3–15) for which the P·V's auto settings differ from batch 1's: cpw and key tiles of 256.
static bool pv_mid_rows(int rows) { return rows >= 3 && rows < 16; }
int pv_kernel(int rows, int forced) {
  static const int k = env_choice("DSUF_PV", {"auto", "warps", "cp", "tiles", "cpw"});
  if (forced >= 0) {
    DSUF_CHECK(forced <= kPvTwoHeadsWide, "attention: pv_form ", forced, ": expected −1..", int(kPvTwoHeadsWide));
    return forced;
  }
  if (k == 0) return rows >= 16 && rows <= 128 ? kPvTiles : pv_mid_rows(rows) ? kPvTwoHeadsWide : kPvOneHead;
  return k - 1;  // in PvKernel's order
}
void gather_keys(const AttentionArgs& a, cudaStream_t s) {
  DSUF_CHECK(!a.window_only || !a.picks, "gather_keys: a layer with picks gathers its selection");
  launch_step(k_gather_keys, dim3(a.rows, a.W + (a.sel && !a.window_only ? a.sel_stride : 0)), dim3(128), 0, s, a);
}
namespace {
unsigned long long* g_att_trace = nullptr;  // att_trace_init: 2 kernels × kAttTraceRing blocks × (2 + stamps)
unsigned* g_att_tickets = nullptr;
int g_att_device = -1;  // the device holding the ring: only its ranks' kernels stamp (one GPU's trace)
const size_t kAttTraceWords = size_t(2) * kAttTraceRing * (kAttTraceStamps + 2);
}  // namespace
void att_trace_init() {
  if (!std::getenv("DSUF_ATT_TRACE") || g_att_trace) return;
  DSUF_CUDA(cudaGetDevice(&g_att_device));
  DSUF_CUDA(cudaMalloc(&g_att_trace, kAttTraceWords * sizeof(unsigned long long)));
  DSUF_CUDA(cudaMemset(g_att_trace, 0, kAttTraceWords * sizeof(unsigned long long)));
  DSUF_CUDA(cudaMalloc(&g_att_tickets, 2 * sizeof(unsigned)));
  DSUF_CUDA(cudaMemset(g_att_tickets, 0, 2 * sizeof(unsigned)));
}
// The ring's pointers for a launch on the current device: null on any other (a tensor-parallel
// rank's kernels must not write another GPU's memory).
static std::pair<unsigned long long*, unsigned*> att_trace_here() {
  if (!g_att_trace) return {nullptr, nullptr};
  int d = -1;
  DSUF_CUDA(cudaGetDevice(&d));
  return d == g_att_device ? std::pair{g_att_trace, g_att_tickets} : std::pair<unsigned long long*, unsigned*>{};
}
uint32_t whatif() {
  static const uint32_t mask = [] {
    const uint32_t m = env_flags("DSUF_WHATIF", {"mix", "sinkhorn", "logits", "pv", "gather", "qnorm", "wq_a", "wq_b",
                                                 "wo_a", "wo_b", "router", "w13", "w2", "shared", "ffn_collapse"});
    if (m)
      std::fprintf(stderr, "DSUF_WHATIF=%s: pieces of every layer left out; the results are wrong (a timing diagnostic)\n",
                   std::getenv("DSUF_WHATIF"));
    return m;
  }();
  return mask;
}
void att_trace_dump() {
  const char* file = std::getenv("DSUF_ATT_TRACE");
  if (!file || !g_att_trace) return;
  std::vector<unsigned long long> h(kAttTraceWords);
  DSUF_CUDA(cudaMemcpy(h.data(), g_att_trace, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(file, "w");
  DSUF_CHECK(f, "DSUF_ATT_TRACE=", file, ": cannot write it");
  const size_t w = kAttTraceStamps + 2;
  for (size_t b = 0; b < h.size() / w; ++b) {
    const unsigned long long* o = h.data() + b * w;
    if (o[1] == 0) continue;
    std::fprintf(f, "%zu %llu %llu", b / kAttTraceRing, o[0], o[1]);
    for (size_t e = 0; e < size_t(kAttTraceStamps); ++e) std::fprintf(f, " %llu", o[2 + e]);
    std::fputc('\n', f);
  }
  std::fclose(f);
}
LinearInput attention(const AttentionArgs& a, cudaStream_t s, bool gathered) {
  const FusedRope& qr = a.q_rope;
  DSUF_CHECK(!qr.cs || (qr.dim == a.hd && qr.heads == a.H && qr.half > 0 && 2 * qr.half <= qr.dim),
             "attention: the queries' rope must cover H = ", a.H, " heads of ", a.hd, " dims");
  const int64_t ho = int64_t(a.H) * a.hd;
  DSUF_CHECK(!a.o_sink.xq || (a.o_group > 0 && a.o_group % 32 == 0 && ho % a.o_group == 0),
             "attention: output groups of ", a.o_group, " values for ", ho, " outputs a row");
  // Both P·V kernels lay out the output themselves when their warps hold whole 32-blocks of it.
  const bool emit = a.o_sink.xq && a.hd % kPvDims == 0 && a.H % kPvHeads == 0;
  auto layout = [&] {
    if (!a.o_sink.xq) return LinearInput{};
    if (!emit)
      return linear_input(a.out, ho, a.rows, a.o_group, a.o_sink.quantize, a.o_sink.xq, a.o_sink.xs, s,
                          int(ho / a.o_group), a.o_rope);
    const int64_t kp = interleaved_k(a.o_group), groups = ho / a.o_group;
    // Unquantized, every value a BF16 when the output and its inverse rotation round (fp8_bf16_fma).
    const bool bf16 = !a.o_sink.quantize && a.r && (!a.o_rope.cs || a.o_rope.r);
    return LinearInput{a.o_sink.xq, groups * kp, kp, a.o_sink.quantize ? a.o_sink.xs : nullptr,
                       groups * (a.o_group / 32), nullptr, 0, bf16};
  };
  if (!gathered && !(whatif() & kWhatIfGather)) gather_keys(a, s);
  const size_t qk_smem = sizeof(float) * kAttHeadsQK * a.hd;
  // DSUF_LOGITS_BLOCKS=4|5|0: 4 the default since v40 (−0.035 ms at batch 1 against 5 under v39's
  // schedule, three rounds); 5 from v26 (one wave, −0.10 ms then against v25's three waves, 0).
  static const int minb = std::array<int, 3>{4, 5, 0}[env_choice("DSUF_LOGITS_BLOCKS", {"4", "5", "0"})];
  // DSUF_LOGITS_TREE=scatter|warp: the 8 heads' sums by warp_sum8_scatter (default since v27: −0.04 ms
  // a step) or 8 warp_sums.
  static const bool tree_scatter = !env_picks("DSUF_LOGITS_TREE", "scatter", "warp");
  // DSUF_PV_KEYS_EARLY=1|0: the P·V kernel stages its keys before the dependency wait (default since
  // v28: −0.04 ms a step).
  static const bool pv_keys_early = !env_picks("DSUF_PV_KEYS_EARLY", "1", "0");
  // DSUF_LOGITS_PAIR=auto|off: two keys a warp's pass (k_attention_logits<…, 2>) where the grid's
  // warps have two keys or more each (several rows), with the scatter tree; off: one at a time.
  static const bool pair_on = !env_picks("DSUF_LOGITS_PAIR", "auto", "off");
  const bool pair = pair_on && tree_scatter && a.kmax > 8 * attention_key_split(a.rows);
  // DSUF_LOGITS_QT=on|off: with the pairs, the queries also laid out lane-major for hd = 512 and 128
  // (k_attention_logits<…, 2, QU>; the default since session 42: batch 16 −0.185 ms, 8 −0.07 beside
  // DSUF_PV=cp, 4 ±0; batch 1 takes no pairs).
  static const bool qt_on = !env_picks("DSUF_LOGITS_QT", "on", "off");
  const int qu = pair && qt_on && (a.hd == 512 || a.hd == 128) ? int(a.hd / 32) : 0;
  auto* logits_k = qu == 16 ? (minb == 5   ? k_attention_logits<5, true, 2, 16>
                               : minb == 4 ? k_attention_logits<4, true, 2, 16>
                                           : k_attention_logits<0, true, 2, 16>)
                 : qu == 4 ? (minb == 5   ? k_attention_logits<5, true, 2, 4>
                              : minb == 4 ? k_attention_logits<4, true, 2, 4>
                                          : k_attention_logits<0, true, 2, 4>)
                 : pair ? (minb == 5 ? k_attention_logits<5, true, 2> : minb == 4 ? k_attention_logits<4, true, 2>
                                                                               : k_attention_logits<0, true, 2>)
                 : tree_scatter ? (minb == 5   ? k_attention_logits<5, true>
                                   : minb == 4 ? k_attention_logits<4, true>
                                               : k_attention_logits<0, true>)
                                : (minb == 5   ? k_attention_logits<5, false>
                                   : minb == 4 ? k_attention_logits<4, false>
                                               : k_attention_logits<0, false>);
  const size_t logits_smem = qk_smem + (qu ? sizeof(float) * kAttHeadsQK * 32 * logits_qt_stride(qu) : 0);
  set_smem(logits_k, logits_smem);
  // DSUF_LOGITS_TRIGGER=late (default since v25: −0.14 to −0.19 ms at batch 1; ±0 at 16 and 64) or entry.
  static const bool logits_late = !env_picks("DSUF_LOGITS_TRIGGER", "late", "entry");
  AttentionArgs la = a;
  la.logits_late = logits_late;
  std::tie(la.trace, la.trace_tickets) = att_trace_here();
  // DSUF_ATT_STAGE=16|4: the staging copies of 16 bytes (the P·V kernel's logits; the logits kernel's
  // queries where the bulk copy does not apply) or 4. 16 measured +0.02 ms a step at v27 and +0.04 at
  // v40; on v55 (session 47) −0.013 (5.924–5.936 against 5.933–5.949 gpu ms, six rounds interleaved,
  // lower in each): the default since then.
  static const bool stage16 = !env_picks("DSUF_ATT_STAGE", "16", "4");
  la.stage16 = stage16;
  // DSUF_ATT_BULK=q|off: the queries by one bulk copy (AttentionArgs::bulk). Session 26 at batch 1,
  // 8K: −0.04 ms a step against off (four rounds), the default since v40. The same for the P·V kernel's
  // key slices and logits (a copy a key, a copy a head, from one warp; commit 4cc96e0's `all`) measured
  // +0.50: the P·V kernel 17.3 → 32.5 µs under Nsight; removed.
  static const bool bulk = !env_picks("DSUF_ATT_BULK", "q", "off");
  la.bulk = bulk;
  if (!(whatif() & kWhatIfLogits))
    launch_step(logits_k, dim3(a.rows, blocks_for(a.H, kAttHeadsQK), attention_key_split(a.rows)), dim3(256),
                logits_smem, s, la);
  const dim3 pv_grid(a.rows, blocks_for(a.H, kPvHeads), blocks_for(a.hd, kPvDims));
  const int pv = pv_kernel(a.rows, a.pv_form);
  if (pv == kPvTiles) {
    const size_t smem = sizeof(float) * size_t(kPvHeads) * a.kmax;
    DSUF_CHECK(smem <= 200 * 1024, "attention: ", a.kmax, " keys a row need too much shared memory");
    // Above 48 KB in all (with the 8 KB key tile) the dynamic part needs the opt-in.
    if (smem + sizeof(float) * kPvTileRows * kPvDims + 1024 > 48 * 1024)
      DSUF_CUDA(cudaFuncSetAttribute(k_attention_pv_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    AttentionArgs pa = a;
    if (!emit) pa.o_sink = {};
    launch_step(k_attention_pv_tiles, dim3(pv_grid), dim3(kPvTileThreads), smem, s, pa);
    return layout();
  }
  // DSUF_PV_TILE=auto|N (N a multiple of 4, 4..640): at most N keys a tile, so that a block holds
  // less shared memory and more blocks fit an SM (100 KB at 640 keys: two an SM), at a staging round
  // a tile on the block's path. auto (session 41): 256 (52 KB, four an SM: one wave instead of two)
  // for 3–15 rows, whose full-tile grid needs more than two blocks an SM — batch 4 at 8K −0.15 ms a
  // step, two rounds (320 −0.03, 160 −0.12) — else the row's keys in one tile (batch 1 and 2 fit
  // one wave as they are; 16–128 rows take k_attention_pv_tiles; longer prefill chunks not measured).
  // The tiles double-buffered (the next tile's copies in flight under the sums; 128 keys, the same
  // 52 KB) measured +0.024 at batch 4 and 256 double-buffered +0.085 (session 42; removed, exact).
  static const int tile_pick = [] {
    const char* v = std::getenv("DSUF_PV_TILE");
    if (!v || std::string(v) == "auto") return 0;
    const int n = std::atoi(v);
    DSUF_CHECK(n >= 4 && n <= kPvMaxTile && n % 4 == 0, "DSUF_PV_TILE=", v, ": expected auto or a multiple of 4 in 4..",
               kPvMaxTile);
    return n;
  }();
  const int tile_max = tile_pick ? tile_pick : pv_mid_rows(a.rows) ? 256 : kPvMaxTile;
  const int kp = (a.kmax + 3) & ~3, tile = std::min({kp, kPvMaxTile, tile_max});
  const int dw = pv == kPvTwoHeadsWide ? 2 : 1;  // warps across a head group's dims
  const size_t pv_smem = sizeof(float) * (size_t(kPvHeads) * kp + size_t(tile) * kPvDims * dw);
  DSUF_CHECK(pv_smem <= 200 * 1024, "attention: ", a.kmax, " keys a row need too much shared memory");
  AttentionArgs pa = a;
  if (!emit) pa.o_sink = {};
  pa.w_early = weights_early();
  pa.stage16 = stage16;
  pa.pv_keys_early = pv_keys_early;
  pa.trace = la.trace, pa.trace_tickets = la.trace_tickets;
  // DSUF_PV_EXP=nb|branch: the softmax's exponentials by det::fexp_nb (the same values for every
  // float, without branches, so that a round's four interleave; the default since session 38: −0.048
  // ms a step at batch 1, 8K, three rounds) or by det::fexp.
  static const bool exp_nb = !env_picks("DSUF_PV_EXP", "nb", "branch");
  pa.exp_nb = exp_nb;
  // DSUF_PV_TRIGGER=entry (default) or late: −0.03 ms with the logits' trigger at entry, ±0 with it late.
  static const bool pv_late = env_picks("DSUF_PV_TRIGGER", "entry", "late");
  pa.pv_late = pv_late;
  const int hpw = pv == kPvOneHead ? 1 : 2;
  static const bool deep_unroll = !env_picks("DSUF_PV_UNROLL", "8", "2");
  auto* k = dw == 2     ? (deep_unroll ? k_attention_pv<2, 8, 2> : k_attention_pv<2, 2, 2>)
            : hpw == 2 ? (deep_unroll ? k_attention_pv<2, 8> : k_attention_pv<2, 2>)
                       : deep_unroll ? k_attention_pv<1, 8> : k_attention_pv<1, 2>;
  set_smem(k, pv_smem);
  const dim3 grid(pv_grid.x, pv_grid.y, unsigned(blocks_for(a.hd, kPvDims * dw)));
  if (!(whatif() & kWhatIfPv)) launch_step(k, grid, dim3(32 * kPvHeads / hpw * dw), pv_smem, s, pa, tile);
  return layout();
}
void compress_emit(const CompressArgs& a, cudaStream_t s) {
  if (a.n_jobs <= 0) return;
  DSUF_CHECK(a.hd % 32 == 0 && a.ihd % 32 == 0, "compress_emit: head dims ", a.hd, ", ", a.ihd,
             " must be multiples of 32");
  const size_t smem = sizeof(float) * (2 * a.hd + a.ihd);
  launch_step(k_compress_emit, dim3(a.n_jobs), dim3(kCompressThreads), smem, s, a);
}
void update_pending(const float* ag, const PendingJob* jobs, int n_jobs, const SeqMeta* seqs, int ratio, int64_t hd,
                    cudaStream_t s) {
  if (n_jobs > 0 && ratio > 1)
    launch_step(k_update_pending, dim3(blocks_for(int64_t(ratio) * 2 * hd, 256), n_jobs), dim3(256), 0, s, ag, jobs,
                seqs, hd);
}
void index_scores(const IndexScoreArgs& a, cudaStream_t s) {
  if (a.max_entries <= 0 || a.rows <= 0) return;
  DSUF_CHECK(a.ihd == kIdxDim, "index_scores: index_head_dim ", a.ihd, " (the kernel is built for ", kIdxDim, ")");
  // DSUF_IDX_SPLIT=auto|heads|off: heads splits an entry's heads over 4 threads where the heads
  // divide by 4 (k_index_scores<4>); off: a thread an entry (<1>); auto (the default since v41): the
  // split where a thread an entry would give fewer blocks than SMs. Measured (session 28, call 8,
  // batch 1): 8K (2,048 entries, 16 blocks against 64) heads −0.02 ms against off (3 rounds); 128K
  // (256 blocks) heads +0.03 (one round) — the keys decoded 4 times and the extra pass cost more
  // than the parallelism brings once the grid fills the GPU.
  static const int split = env_choice("DSUF_IDX_SPLIT", {"auto", "heads", "off"});
  const bool few = int64_t(blocks_for(a.max_entries, kIdxEntries)) * a.rows < sm_count();
  const int G = a.IH % 4 == 0 && (split == 1 || (split == 0 && few)) ? 4 : 1, epb = kIdxEntries / G;
  const size_t smem = sizeof(uint32_t) * epb * kIdxKeyWords +
                      size_t(a.IH) * (kIdxDim + sizeof(float) * (kIdxBlocks + 1)) +
                      (G > 1 ? sizeof(float) * size_t(a.IH) * epb : 0);
  DSUF_CHECK(smem <= 200 * 1024, "index_scores: ", a.IH, " heads need too much shared memory");
  auto* k = G > 1 ? k_index_scores<4> : k_index_scores<1>;
  set_smem(k, smem);
  // About kIdxGridBlocks blocks in all (a few waves); a row's tiles beyond its blocks are strided.
  const int bx = int(std::min<int64_t>(blocks_for(a.max_entries, epb), std::max(1, kIdxGridBlocks / a.rows)));
  launch_step(k, dim3(bx, a.rows), dim3(kIdxEntries), smem, s, a);
}
void candidate_block_scores(const float* scores, int64_t score_stride, int rows, const RowMeta* meta, int ratio,
                            int block, float* bscores, int64_t b_stride, cudaStream_t s) {
  launch_step(k_candidate_block_scores, dim3(blocks_for(b_stride, 128), rows), dim3(128), 0, s, scores, score_stride,
              meta, ratio, block, bscores, b_stride);
}
namespace {
// Whether k_top_k_cluster can take a picks launch of k picks over rows of at most scratch.max_count.
bool cluster_fits(int k, const TopkScratch& scratch) {
  return k >= 1 && scratch.max_count > 0 && scratch.max_count <= kTopkClusterMaxCount;
}
void top_k_launch(const float* x, int64_t stride, int rows, const RowMeta* meta, int ratio, int block, int k,
                  int32_t* out, int out_stride, cudaStream_t s, const TopkScratch& scratch, uint64_t* picks,
                  bool* picked, bool cluster = false) {
  *picked = false;
  if (rows <= 0) return;
  if (picks && cluster && block == 0 && cluster_fits(k, scratch)) {
    // (Clusters of 4 or 2 blocks, the kernel being generic in its cluster size, measured the same as
    // 8 at 8K: v29.)
    launch_step_in(kTopkCluster, k_top_k_cluster, dim3(kTopkCluster, rows), dim3(kTopkClusterThreads), 0, s, x,
                   stride, meta, ratio, k, out, out_stride, picks);
    *picked = true;
    return;
  }
  int npow = 1;
  while (npow < k) npow <<= 1;
  const size_t smem = sizeof(uint64_t) * npow;
  const int g = scratch.val ? topk::launch_groups(scratch.max_count, rows, k, scratch.min_chunk, scratch.slots) : 1;
  if (g < 2) {
    static const bool wide = !env_picks("DSUF_TOPK_THREADS", "1024", "256");
    // DSUF_TOPK_SORT=regs|smem: the picks' sort in registers and shuffles (default, v23 candidate) or
    // every stage in shared memory (v22); regs needs npow ≤ threads and twice the picks' space.
    // regs-all: v26's register sort in which the warps past the picks also run every stage (v27: they
    // only keep the barriers; −0.006 ms under DSUF_TOPK_RANK=sort, within noise; the batch-1 step's
    // indexer top-k no longer sorts).
    static const int sort_mode = env_choice("DSUF_TOPK_SORT", {"regs", "smem", "regs-all"});
    static const bool reg_sort = sort_mode != 1, idle_skip = sort_mode == 0;
    // DSUF_TOPK_SELECT=lean|classic: block_select's barriers (lean, the default since v26: 4 a radix
    // pass instead of 7, no counting pass).
    static const bool lean = !env_picks("DSUF_TOPK_SELECT", "lean", "classic");
    const int threads = wide ? 1024 : 256;
    const size_t sm = picks ? 0 : reg_sort && npow <= threads ? 2 * smem : smem;
    if (wide)
      launch_step(k_top_k<1024>, dim3(rows), dim3(1024), sm, s, x, stride, meta, ratio, block, k, out, out_stride,
                  reg_sort, lean, idle_skip, picks);
    else
      launch_step(k_top_k<256>, dim3(rows), dim3(256), sm, s, x, stride, meta, ratio, block, k, out, out_stride,
                  reg_sort, lean, idle_skip, picks);
    *picked = picks != nullptr;
    return;
  }
  const int64_t cand_stride = int64_t(g) * topk::slot_stride(k);
  launch_step(k_top_k_chunks, dim3(g, rows), dim3(256), 0, s, x, stride, meta, ratio, block, k, g, scratch.min_chunk,
              scratch.val, scratch.idx, cand_stride);
  launch_step(k_top_k_merge, dim3(rows), dim3(256), smem, s, x, stride, meta, ratio, block, k, g, scratch.min_chunk,
              scratch.val, scratch.idx, cand_stride, out, out_stride);
}
}  // namespace
void top_k(const float* x, int64_t stride, int rows, const RowMeta* meta, int ratio, int block, int k, int32_t* out,
           int out_stride, cudaStream_t s, const TopkScratch& scratch) {
  bool picked;
  top_k_launch(x, stride, rows, meta, ratio, block, k, out, out_stride, s, scratch, nullptr, &picked);
}
bool top_k_picks(const float* x, int64_t stride, int rows, const RowMeta* meta, int ratio, int k, uint64_t* picks,
                 int32_t* out, int out_stride, cudaStream_t s, const TopkScratch& scratch, TopkPicks how) {
  DSUF_CHECK(picks && out_stride >= k, "top_k_picks: needs picks and out_stride (", out_stride, ") ≥ k (", k, ")");
  // DSUF_TOPK_PICKS=cluster|block (how = kAuto): a cluster of 8 blocks a row (v29, the default: −0.033 ms
  // a batch-1 step at 8K, −0.07 at 128K) or one block a row (v27/v28).
  static const bool env_cluster = !env_picks("DSUF_TOPK_PICKS", "cluster", "block");
  // Asked for by name (the tests), the cluster form must be able to run: it never falls back silently.
  DSUF_CHECK(how != TopkPicks::kCluster || cluster_fits(k, scratch),
             "top_k_picks: the cluster form needs k ≥ 1 and scratch.max_count in 1..", kTopkClusterMaxCount,
             " (k ", k, ", max_count ", scratch.max_count, ")");
  const bool cluster = how == TopkPicks::kCluster || (how == TopkPicks::kAuto && env_cluster);
  bool picked;
  top_k_launch(x, stride, rows, meta, ratio, 0, k, out, out_stride, s, scratch, picks, &picked, cluster);
  return picked;
}
void mask_from_selection(const int32_t* sel, int sel_stride, int n, uint8_t* mask, int64_t mask_stride, cudaStream_t s) {
  launch_step(k_mask_from_selection, dim3(n), dim3(128), 0, s, sel, sel_stride, mask, mask_stride);
}
void top_k_mask(const float* x, int64_t stride, int rows, const RowMeta* meta, int ratio, int block, int k,
                int32_t* sel, uint8_t* mask, int64_t mask_stride, cudaStream_t s, const TopkScratch& scratch) {
  if (rows <= 0) return;
  const int g = scratch.val ? topk::launch_groups(scratch.max_count, rows, k, scratch.min_chunk, scratch.slots) : 1;
  if (g < 2) {
    launch_step(k_top_k_mask, dim3(rows), dim3(256), 0, s, x, stride, meta, ratio, block, k, mask, mask_stride);
    return;
  }
  top_k(x, stride, rows, meta, ratio, block, k, sel, k, s, scratch);
  mask_from_selection(sel, k, rows, mask, mask_stride, s);
}
void gather_rows(const float* X, const float* pre, const int32_t* rows, int n, int hc, int64_t D, float* Xo,
                 float* preo, cudaStream_t s) {
  launch_step(k_gather_rows, dim3(n), dim3(256), 0, s, X, pre, rows, hc, D, Xo, preo);
}
void route(const float* logits, int n, int E, int k, const float* bias, const float* bias_vl, const uint8_t* image,
           float temp, float route_scale, int32_t* ids, float* w, cudaStream_t s) {
  DSUF_CHECK(k <= 32 && k <= E, "route: top-", k, " of ", E, " experts");
  const size_t smem = sizeof(float) * 3 * E;
  static const bool redux_pick = !env_picks("DSUF_ROUTE", "redux", "scan");  // redux: the default since v32
  // DSUF_ROUTE_SLOTS=fit|all: the redux form's scan over the fewest slots that hold E (fit, the default
  // since session 34: −0.027 ms a step at batch 1 and 8K with the bench's 96 experts, docs/perf.md v46)
  // or all kRouteSlots (v32 to v46).
  static const bool all_slots = env_picks("DSUF_ROUTE_SLOTS", "fit", "all");
  const int64_t slots = (E + 31) / 32;
  auto* kern = !redux_pick || E > 32 * kRouteSlots ? k_route<false>
               : all_slots || slots > 12          ? k_route<true>
               : slots > 8                        ? k_route<true, 12>
               : slots > 4                        ? k_route<true, 8>
                                                  : k_route<true, 4>;
  set_smem(kern, smem);
  const int threads = int(std::clamp<int64_t>((E + 31) / 32 * 32, 32, 1024));
  if (n) launch_step(kern, dim3(n), dim3(threads), smem, s, logits, E, k, bias, bias_vl, image, temp, route_scale,
                     ids, w, weights_early(), late_trigger(kLateRoute));
}
void swiglu(float* h1, const float* h3, int64_t rows, int64_t F, const float* weight, float limit, bool clamp, bool r,
            cudaStream_t s, const InputSink& sink) {
  DSUF_CHECK(!sink.xq || F % 32 == 0, "swiglu: F = ", F, " with an input sink");
  launch_step(k_swiglu, dim3(blocks_for(rows * F, 256)), dim3(256), 0, s, h1, h3, rows, F, weight, limit, clamp, r,
              sink, late_trigger(kLateSwiglu));
}
void fp4_swiglu_grouped(const uint8_t* const* W1, const uint8_t* const* S1, const uint8_t* const* W3,
                        const uint8_t* const* S3, const int32_t* ids, int64_t F, int64_t K, const LinearInput& in,
                        int x_div, int64_t rows, float* h1, float* h3, bool r, cudaStream_t s, const RowGroups* groups,
                        bool tiled, const float* weight, float limit, bool clamp, const InputSink& sink) {
  // DSUF_SWIGLU=auto (the default since v35: fused up to kSwigluFusedRows routed rows) | separate |
  // fused (up to kImmaBulkRows). Measured (session 21): batch 1 −0.055 ms, batch 4 (24 rows) −0.12,
  // batch 16 (96 rows) +0.14 against separate.
  static const int mode = env_choice("DSUF_SWIGLU", {"auto", "separate", "fused"});
  const bool fused = mode == 2 || (mode == 0 && rows <= kSwigluFusedRows);
  if (fused && tiled && det::fp4_tileable(F, K) && F % 32 == 0 && in.scale && in.planes &&
      !tiled_rows_mma(groups, K) && rows > 0 && rows <= kImmaBulkRows) {
    check_fp4_input(K, in);
    const GluTail glu{weight, limit, clamp, sink};
    const bool multi = groups && groups->size != kRowGroup;
    launch_imma<true>(Fp4Call{W1, S1, ids, F, K, in, x_div, rows, h1, r, s, {.W = W3, .Ws = S3, .y = h3},
                              groups && !multi ? groups->order : nullptr, &glu, multi ? groups : nullptr});
    return;
  }
  fp4_linear_grouped(W1, S1, ids, F, K, in, x_div, rows, h1, r, s, {.W = W3, .Ws = S3, .y = h3}, groups, tiled);
  swiglu(h1, h3, rows, F, weight, limit, clamp, r, s, sink);
}
void moe_sum_expand(const float* y_experts, int k, const float* y_shared, int n, int hc, int64_t D, const float* mix,
                    int mix_stride, float* X, bool r, cudaStream_t s) {
  if (n <= 0) return;
  with_hc(hc, [&](auto H) {
    launch_step((k_moe_sum_expand<decltype(H)::value>), dim3(blocks_for(int64_t(n) * D, 256)), dim3(256), 0, s,
                y_experts, k, y_shared, n, D, mix, mix_stride, X, r);
  });
}
void engram_gather(const int64_t* row_ids, int n, int rows, const uint8_t* table, const uint8_t* scales, int64_t ehd,
                   float* emb, cudaStream_t s) {
  launch_step(k_engram_gather, dim3(n), dim3(256), 0, s, row_ids, rows, table, scales, ehd, emb);
}
void engram_gate(float* X, const float* kv, const uint16_t* qw, const uint16_t* kw, const uint8_t* dead, int n, int hc,
                 int64_t D, float eps, bool r, cudaStream_t s) {
  // DSUF_ENGRAM_GATE=cluster|batched|loop: k_engram_gate_cluster (the default since session 32, for
  // D ≤ 8,192; else batched), k_engram_gate<10> or <1> (the form before session 32). Measured (docs/perf.md
  // v44, batch 1 at 8K, gpu ms): batched −0.006 and −0.013 against loop; cluster −0.007 against batched
  // (5 rounds), and in session 33 −0.010 at batch 4, −0.016 at 128K.
  static const int mode = env_choice("DSUF_ENGRAM_GATE", {"cluster", "batched", "loop"});
  if (mode == 0 && D <= 8192) {
    const size_t smem = size_t(3) * 32 * size_t((D + 255) / 256) * sizeof(float);
    set_smem(k_engram_gate_cluster, smem);
    launch_step_in(kNormCluster, k_engram_gate_cluster, dim3(kNormCluster, hc, n), dim3(256), smem, s, X, kv, qw, kw,
                   dead, hc, D, eps, r);
    return;
  }
  launch_step(mode == 2 ? k_engram_gate<1> : k_engram_gate<10>, dim3(n, hc), dim3(256), 0, s, X, kv, qw, kw, dead, hc,
              D, eps, r);
}
void add_rows(float* y, const float* x, int64_t n, cudaStream_t s) {
  launch_step(k_add_rows, dim3(blocks_for(n, 256)), dim3(256), 0, s, y, x, n);
}

// ---- checks of the fast conversions (cuda_backend_tests) ----------------------------------------
namespace {
// Every float32 bit pattern u (grid-stride over 2^32): [0] e4m3_code_clamped against e4m3_code
// for |x| ≤ 448, [1] pow2_ceil against frexpf/ldexpf for every x, [2] div_pow2(x, s) against the
// division for one divisor per x — a power of two, or one non-power, with an exponent field from a
// hash of u (2^32 of the 2^40 pairs; the product by an exact reciprocal is the same real number
// rounded once, so the sample checks the code, not the arithmetic) — NaNs equal when both are NaN;
// [3..5] how many inputs each compared.
__global__ void k_fast_conversion_check(unsigned long long* out) {
  unsigned long long bad[4] = {0, 0, 0, 0}, seen[4] = {0, 0, 0, 0};
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  auto same = [](float a, float b) { return __float_as_uint(a) == __float_as_uint(b) || (isnan(a) && isnan(b)); };
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 32); i += stride) {
    const uint32_t u = uint32_t(i);
    const float x = __uint_as_float(u);
    if (fabsf(x) <= 448.0f) {
      ++seen[0];
      bad[0] += e4m3_code_clamped(x) != e4m3_code(x);
    }
    ++seen[1];
    bad[1] += !same(pow2_ceil(x), pow2_ceil_lib(x));
    const uint32_t h = u * 2654435761u;
    const uint32_t ex = h >> 24;  // 0..255: zero, subnormal, normal, inf/NaN scales too
    const float sc = (h & 0x100u) ? __uint_as_float(ex << 23) : __uint_as_float((ex << 23) | 0x400000u);
    ++seen[2];
    bad[2] += !same(div_pow2(x, sc), x / sc);
    ++seen[3];  // the branch-free exponential: the same bits, NaN payloads included
    bad[3] += __float_as_uint(det::fexp_nb(x)) != __float_as_uint(det::fexp(x));
  }
  for (int k = 0; k < 4; ++k) atomicAdd(out + k, bad[k]), atomicAdd(out + 4 + k, seen[k]);
}
}  // namespace
namespace testing {
void fast_conversion_mismatches(unsigned long long out[8]) {
  unsigned long long* d = nullptr;
  DSUF_CUDA(cudaMalloc(&d, 8 * sizeof(unsigned long long)));
  DSUF_CUDA(cudaMemset(d, 0, 8 * sizeof(unsigned long long)));
  k_fast_conversion_check<<<1024, 256>>>(d);
  DSUF_CUDA(cudaGetLastError());
  DSUF_CUDA(cudaMemcpy(out, d, 8 * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  DSUF_CUDA(cudaFree(d));
}
}  // namespace testing

}  // namespace dsuf::cuda
