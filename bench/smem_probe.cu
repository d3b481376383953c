// How fast the exact one-row FP8 arithmetic consumes weights that are already in shared memory
// (docs/perf.md, session 33). The question behind a "load the weights during the latency-bound
// segments, compute when the input arrives" design: every FP8 linear of the decode step is slower
// than DRAM allows in its own shape (bench/linear_probe: only 3–27 % faster with its weights in L2),
// so a preload can only pay if the arithmetic itself, fed from shared memory, runs well above DRAM's
// rate. Here each of the GPU's SMs gets one block that
//   1. bulk-copies its slice of the weights (R rows × K E4M3 bytes, ~192 KB) into shared memory, and
//   2. computes its R outputs from there with the quantized path's arithmetic in the canonical order
//      of core/detmath.h: lane l takes the K-blocks kb ≡ l (mod 32); a K-block's 32 products are
//      added one at a time from zero (each product of two E4M3 values is exact, so fma = mul + add);
//      the part times s_act·s_w is added to the lane's sum; the 32 lane sums reduce by tree32.
// Each phase is timed on the device (%globaltimer at entry, after the copy, after the outputs), and
// every output is checked bit for bit against a CPU computation of the same order on fresh random
// inputs before any time is printed. Lines: the configuration, the copy phase (µs, TB/s from DRAM),
// the compute phase (median and slowest block, µs; the bytes over the slowest block's time as TB/s,
// and that against the device-to-device copy rate measured in the same run).
//
//   smem_probe [--reps 20] [--seed 7] [--stream-only | --mma]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "smem_probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four E4M3 bytes as their exact values: two cvt.rn.f16x2.e4m3x2 and four F16 → F32 widenings.
__device__ __forceinline__ void e4m3x4(uint32_t t, float (&v)[4]) {
  uint32_t lo, hi;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(t));
  const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 q = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  v[0] = p.x, v[1] = p.y, v[2] = q.x, v[3] = q.y;
}

// The bit-placement decode (session 36): a byte stored re-encoded at load as s | (e0 m2 m1 m0) << 3 |
// (e3 e2 e1) (place_code below), so that one PRMT puts the stored byte in the F32's top byte and the
// same byte shifted left by one (u = t << 1, once a word) in the next: sign at bit 31, e3..e1 at
// 26..24, e0 m2 m1 m0 at 23..20; the AND clears the rest. The F32 is the E4M3 value times 2^-120
// (subnormals become F32 denormals, which FFMA keeps: no flush to zero in this build), so the inputs
// are staged times 2^100 and the K-block's part comes out times 2^-20, exactly (every nonzero
// product is at least 2^-38 in magnitude).
__device__ __forceinline__ void e4m3x4_place(uint32_t t, float (&v)[4]) {
  const uint32_t u = t << 1;
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = __uint_as_float(__byte_perm(t, u, (e << 12) | ((4 + e) << 8)) & 0x87F00000u);
}
uint8_t place_code(uint8_t c) { return uint8_t((c & 0x80) | ((c & 0x0F) << 3) | ((c >> 4) & 0x07)); }

struct Args {
  const uint8_t* w;      // [blocks][R][K] E4M3: block b's rows contiguous
  const float* scale;    // [blocks · R / 32][K / 32]: s_w of each 32 × 32 weight block (a float here)
  const float* x;        // [K] the input's E4M3 values as floats
  const float* sa;       // [K / 32] the input's scales
  float* y;              // [blocks · R]
  unsigned long long* t; // [blocks][3]: entry, copy done, outputs done (ns)
  int R, K;
};

// Float j's place in the interleaved input row (LAY 1 and 2; as the backend stages inputs): lane l's
// float4 q of K-block kb (kb ≡ l mod 32) beside lane l + 1's.
__device__ __forceinline__ int interleaved(int kb, int q) { return ((kb / 32) * 8 + q) * 32 + kb % 32; }
__device__ __forceinline__ void mbar_wait_parity(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Row j's part of K-block kb (its 32 products added from zero in element order), j < RPW, the row's
// bytes at w + j·K: the inputs from xs (interleaved unless LAY 0), the weights in LAY's layout.
template <int RPW, int DEC, int LAY>
__device__ __forceinline__ void kblock_parts(const float* xs, const uint8_t* w, int K, int kb, float (&part)[RPW]) {
#pragma unroll
  for (int j = 0; j < RPW; ++j) part[j] = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the K-block's two 16-byte halves
    float xv[16];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float4 v = *reinterpret_cast<const float4*>(LAY ? xs + interleaved(kb, 4 * h + c) * 4 : xs + kb * 32 + 16 * h + 4 * c);
      xv[4 * c] = v.x, xv[4 * c + 1] = v.y, xv[4 * c + 2] = v.z, xv[4 * c + 3] = v.w;
    }
    uint4 wv[RPW];
#pragma unroll
    for (int j = 0; j < RPW; ++j)
      wv[j] = *reinterpret_cast<const uint4*>(w + size_t(j) * K + (LAY == 1 ? h * (K / 2) + kb * 16 : kb * 32 + 16 * h));
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      const uint32_t words[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float f[4];
        if constexpr (DEC == 1) e4m3x4_place(words[c], f);
        else e4m3x4(words[c], f);
#pragma unroll
        for (int e = 0; e < 4; ++e) part[j] = __fmaf_rn(xv[4 * c + e], f[e], part[j]);
      }
    }
  }
}

// RPW rows a warp at a time (RPW independent chains a lane), WARPS warps. DEC 0: the cvt decode;
// 1: the bit placement of re-encoded bytes (e4m3x4_place). LAY 0: the input row and the weight rows
// in their natural order in shared memory, so a warp's 32 lanes (32 K-blocks 128 bytes apart) read
// the inputs from one bank group — 32 wavefronts a 16-byte load — and the weights at 32-byte strides;
// LAY 1 (session 36): the inputs interleaved as the backend's kernels stage them (lane l's j-th
// float4 of its K-block next to lane l + 1's) and each weight row's K-block halves grouped (the
// host permutes the rows before the bulk copy), so every load is conflict-free; LAY 2: the inputs as
// LAY 1, the weights in their natural order (a lane's 32 bytes at 32·lane, as the tile kernels read).
template <int RPW, int DEC = 0, int LAY = 0>
__global__ void k_smem_gemv(Args a) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ __align__(8) unsigned long long bar;
  const int R = a.R, K = a.K, nb = K / 32, warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* ws = sm;                                               // [R][K]
  float* xs = reinterpret_cast<float*>(sm + size_t(R) * K);       // [K]
  const uint64_t t0 = now_ns();
  const uint32_t b = smem_addr(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(b));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int64_t bytes = int64_t(R) * K;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(b), "r"(uint32_t(bytes)) : "memory");
    const uint8_t* src = a.w + int64_t(blockIdx.x) * bytes;
    for (int64_t o = 0; o < bytes; o += 32768) {
      const uint32_t n = uint32_t(bytes - o < 32768 ? bytes - o : 32768);
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
              smem_addr(ws + o)),
          "l"(src + o), "r"(n), "r"(b)
          : "memory");
    }
  }
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int kb = i / 32, q = (i % 32) / 4;
    xs[LAY ? interleaved(kb, q) * 4 + i % 4 : i] = DEC ? a.x[i] * 0x1p100f : a.x[i];
  }
  mbar_wait_parity(b, 0);  // the copy (phase 0 of the barrier)
  __syncthreads();
  const uint64_t t1 = now_ns();
  for (int r0 = warp * RPW; r0 < R; r0 += warps * RPW) {
    float sum[RPW];
#pragma unroll
    for (int j = 0; j < RPW; ++j) sum[j] = 0.0f;
    for (int kb = lane; kb < nb; kb += 32) {
      float part[RPW];
      kblock_parts<RPW, DEC, LAY>(xs, ws + size_t(r0) * K, K, kb, part);
      const int64_t row0 = int64_t(blockIdx.x) * R + r0;
#pragma unroll
      for (int j = 0; j < RPW; ++j)
        sum[j] = __fadd_rn(sum[j], __fmul_rn(DEC ? __fmul_rn(part[j], 0x1p20f) : part[j],
                                              __fmul_rn(a.sa[kb], a.scale[((row0 + j) / 32) * nb + kb])));
    }
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      float v = sum[j];
      for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
      if (lane == 0) a.y[int64_t(blockIdx.x) * R + r0 + j] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long* t = a.t + 3 * blockIdx.x;
    t[0] = t0, t[1] = t1, t[2] = now_ns();
  }
}

// Streaming (session 36): the exact one-row FP8 linear fed as the head's BF16 stream is (k_bf16_stream):
// one block an SM (or per_sm) over a contiguous range of rows; its last warp (the producer) bulk-copies CH = W·RPW
// whole rows at a time into a ring of S slots (a full barrier a slot, completed by the copy's bytes;
// an empty barrier, by the W consumer warps), and consumer warp w computes rows w·RPW .. of each chunk
// from shared memory with LAY 1's conflict-free layouts and the same order of operations as
// k_smem_gemv. Timed as a whole launch from DRAM (L2 flushed), against the device's copy rate.
struct StreamArgs {
  const uint8_t* w;     // [rows][K] E4M3, each row's K-block halves grouped (LAY 1)
  const float* scale;   // [rows / 32][K / 32]
  const float* x;       // [K]
  const float* sa;      // [K / 32]
  float* y;             // [rows]
  int rows_per_block, K, S;
  int mode;  // 0: as described; 1: no arithmetic (the ring's copy rate alone); 2: one bulk copy a row;
             // 3: the tensor cores' FP8 MMA (k_stream_mma; not the canonical order)
  const uint8_t* xc = nullptr;  // mode 3: the input's E4M3 codes [K]
};
// The producer's loop (one thread): chunk c of slot_bytes from w + c·slot_bytes into ring slot c mod S
// once the consumers have freed it (the empty barriers at bars + 8·(S + q)), as `pieces` bulk copies
// completing on the slot's full barrier (bars + 8·q).
__device__ void stream_produce(const uint8_t* w, int chunks, int S, int64_t slot_bytes, int pieces, uint8_t* ring,
                               uint32_t bars) {
  for (int c = 0; c < chunks; ++c) {
    const int q = c % S;
    if (c >= S) mbar_wait_parity(bars + 8 * (S + q), uint32_t((c / S - 1) & 1));
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bars + 8 * q), "r"(uint32_t(slot_bytes))
                 : "memory");
    for (int p = 0; p < pieces; ++p)
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
              smem_addr(ring + q * slot_bytes + p * (slot_bytes / pieces))),
          "l"(w + int64_t(c) * slot_bytes + p * (slot_bytes / pieces)), "r"(uint32_t(slot_bytes / pieces)),
          "r"(bars + 8 * q)
          : "memory");
  }
}
// The ring's barriers: S full ones (one arrival and the bytes), then S empty ones (W consumer warps).
__device__ void stream_init_bars(uint32_t bars, int S, int W) {
  for (int q = 0; q < S; ++q) {
    asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(bars + 8 * q));
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(bars + 8 * (S + q)), "r"(W));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
template <int RPW>
__global__ void k_stream_gemv(StreamArgs a) {
  extern __shared__ __align__(128) uint8_t sm[];
  const int K = a.K, nb = K / 32, W = int(blockDim.x / 32) - 1, S = a.S;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int CH = W * RPW, chunks = a.rows_per_block / CH;
  const int64_t slot_bytes = int64_t(CH) * K, row0 = int64_t(blockIdx.x) * a.rows_per_block;
  float* xs = reinterpret_cast<float*>(sm);  // interleaved as LAY 1
  const uint32_t bars = smem_addr(sm + size_t(K) * 4);  // [S] full, then [S] empty (S ≤ 8)
  uint8_t* ring = sm + size_t(K) * 4 + 128;
  if (threadIdx.x == 0) stream_init_bars(bars, S, W);
  for (int i = threadIdx.x; i < K; i += blockDim.x) {
    const int kb = i / 32, q = (i % 32) / 4;
    xs[interleaved(kb, q) * 4 + i % 4] = a.x[i];
  }
  __syncthreads();
  if (warp == W) {  // the producer
    if (lane == 0) stream_produce(a.w + row0 * K, chunks, S, slot_bytes, a.mode == 2 ? CH : 1, ring, bars);
    return;
  }
  for (int c = 0; c < chunks; ++c) {
    const int q = c % S;
    mbar_wait_parity(bars + 8 * q, uint32_t((c / S) & 1));
    const uint8_t* ws = ring + q * slot_bytes + int64_t(warp) * RPW * K;
    const int64_t r0 = row0 + int64_t(c) * CH + warp * RPW;
    float sum[RPW];
#pragma unroll
    for (int j = 0; j < RPW; ++j) sum[j] = 0.0f;
    for (int kb = a.mode == 1 ? nb : lane; kb < nb; kb += 32) {
      float part[RPW];
      kblock_parts<RPW, 0, 1>(xs, ws, K, kb, part);
#pragma unroll
      for (int j = 0; j < RPW; ++j)
        sum[j] = __fadd_rn(sum[j], __fmul_rn(part[j], __fmul_rn(a.sa[kb], a.scale[((r0 + j) / 32) * nb + kb])));
    }
    __syncwarp();
    if (lane == 0) asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(bars + 8 * (S + q)) : "memory");
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      float v = sum[j];
      for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
      if (lane == 0) a.y[r0 + j] = v;
    }
  }
}

// Mode 3 (session 48): what a stream would reach if the bit-exact order were given up — each consumer
// warp takes 16 rows of a chunk (CH = 16·W) and multiplies them by the input with the tensor cores'
// FP8 MMA (mma.m16n8k32 e4m3 × e4m3 → f32; the input in column 0 of B, the other 7 columns zero),
// one MMA a K-block from a zero accumulator, then adds the tile's column times s_a·s_w to the row's
// sum. The MMA's internal order (and precision) is the hardware's, so the outputs are checked against
// a double-precision sum by a relative bound, not bit for bit. The weights land in fragment order
// (host-permuted: a K-block of 16 rows is 512 bytes, lane L's A registers at 16·L), so a lane reads
// its A fragment with one 16-byte load.
__device__ __forceinline__ void mma_e4m3(const uint4& a, uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(0.0f));
}
__global__ void k_stream_mma(StreamArgs a) {
  extern __shared__ __align__(128) uint8_t sm[];
  const int K = a.K, nb = K / 32, W = int(blockDim.x / 32) - 1, S = a.S;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int CH = 16 * W, chunks = a.rows_per_block / CH;
  const int64_t slot_bytes = int64_t(CH) * K, row0 = int64_t(blockIdx.x) * a.rows_per_block;
  uint8_t* xcs = sm;  // the input's codes, K bytes
  const uint32_t bars = smem_addr(sm + K);
  uint8_t* ring = sm + K + 128;
  if (threadIdx.x == 0) stream_init_bars(bars, S, W);
  for (int i = threadIdx.x; i < K; i += blockDim.x) xcs[i] = a.xc[i];
  __syncthreads();
  if (warp == W) {
    if (lane == 0) stream_produce(a.w + row0 * K, chunks, S, slot_bytes, 1, ring, bars);
    return;
  }
  for (int c = 0; c < chunks; ++c) {
    const int q = c % S;
    mbar_wait_parity(bars + 8 * q, uint32_t((c / S) & 1));
    const uint4* frag = reinterpret_cast<const uint4*>(ring + q * slot_bytes + int64_t(warp) * 16 * K);
    const int64_t r0 = row0 + int64_t(c) * CH + 16 * warp;  // 16 rows inside one 32-row scale block
    const float* sw = a.scale + (r0 / 32) * nb;
    float acc0 = 0.0f, acc2 = 0.0f;  // rows r0 + lane/4 and r0 + 8 + lane/4 (column 0: lanes ≡ 0 mod 4)
#pragma unroll 4
    for (int kb = 0; kb < nb; ++kb) {
      const uint4 w = frag[kb * 32 + lane];
      const uint32_t b0 = lane < 4 ? *reinterpret_cast<const uint32_t*>(xcs + 32 * kb + 4 * lane) : 0u;
      const uint32_t b1 = lane < 4 ? *reinterpret_cast<const uint32_t*>(xcs + 32 * kb + 16 + 4 * lane) : 0u;
      float d[4];
      mma_e4m3(w, b0, b1, d);
      const float s = a.sa[kb] * sw[kb];
      acc0 += d[0] * s, acc2 += d[2] * s;
    }
    __syncwarp();
    if (lane == 0) asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(bars + 8 * (S + q)) : "memory");
    if (lane % 4 == 0) a.y[r0 + lane / 4] = acc0, a.y[r0 + 8 + lane / 4] = acc2;
  }
}

// The CPU's E4M3 value of a code (no NaN codes are generated).
float e4m3(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return s ? -v : v;
}
uint8_t random_code(std::mt19937& rng) {
  for (;;) {
    const uint8_t c = uint8_t(rng());
    if ((c & 0x7f) != 0x7f) return c;
  }
}

// Every output against the CPU's sum in the canonical order (lane l's K-blocks l, l + 32, …, each
// K-block's 32 products from zero, times s_a·s_w; tree32 over the lanes), bit for bit: the outputs
// that differ (the first three printed).
int64_t count_differ(const std::vector<float>& y, const std::vector<uint8_t>& w, const std::vector<float>& x,
                     const std::vector<float>& sa, const std::vector<float>& scale, int K) {
  const int nb = K / 32;
  int64_t bad = 0;
  for (int64_t o = 0; o < int64_t(y.size()); ++o) {
    const uint8_t* wr = w.data() + o * K;
    float lane_sum[32] = {};
    for (int l = 0; l < 32; ++l)
      for (int kb = l; kb < nb; kb += 32) {
        float part = 0.0f;
        for (int k = 0; k < 32; ++k) part = part + x[size_t(kb * 32 + k)] * e4m3(wr[kb * 32 + k]);
        lane_sum[l] = lane_sum[l] + part * (sa[size_t(kb)] * scale[size_t((o / 32) * nb + kb)]);
      }
    for (int off = 16; off > 0; off >>= 1)
      for (int l = 0; l < off; ++l) lane_sum[l] = lane_sum[l] + lane_sum[l + off];
    uint32_t gb, wb;
    std::memcpy(&gb, &y[size_t(o)], 4);
    std::memcpy(&wb, &lane_sum[0], 4);
    if (gb != wb && bad++ < 3)
      std::printf("  MISMATCH output %lld: %.9g, CPU %.9g\n", static_cast<long long>(o), y[size_t(o)], lane_sum[0]);
  }
  return bad;
}

// Mode 3's check: every output against a double-precision sum of the same terms, relative to the sum
// of their magnitudes; returns the largest such error (NaN or an unwritten output: infinity).
double max_rel_error(const std::vector<float>& y, const std::vector<uint8_t>& w, const std::vector<float>& x,
                     const std::vector<float>& sa, const std::vector<float>& scale, int K) {
  const int nb = K / 32;
  double worst = 0.0;
  for (int64_t o = 0; o < int64_t(y.size()); ++o) {
    double sum = 0.0, mag = 0.0;
    for (int kb = 0; kb < nb; ++kb) {
      const double s = double(sa[size_t(kb)]) * scale[size_t((o / 32) * nb + kb)];
      for (int k = 0; k < 32; ++k) {
        const double t = double(x[size_t(kb * 32 + k)]) * e4m3(w[size_t(o * K + kb * 32 + k)]) * s;
        sum += t, mag += std::fabs(t);
      }
    }
    const double e = std::isfinite(y[size_t(o)]) ? std::fabs(double(y[size_t(o)]) - sum) / std::max(mag, 1e-30)
                                                  : INFINITY;
    worst = std::max(worst, e);
  }
  return worst;
}

struct Config {
  int rpw, warps, R, K, dec = 0, lay = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  unsigned seed = 7;
  bool stream_only = false;  // --stream-only: the streaming launches only
  bool mma_only = false;     // --mma: mode 3's launches and their same-run references only
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (s == "--seed" && i + 1 < argc) seed = unsigned(std::atoi(argv[++i]));
    else if (s == "--stream-only") stream_only = true;
    else if (s == "--mma") stream_only = mma_only = true;
    else {
      std::fprintf(stderr, "usage: smem_probe [--reps 20] [--seed 7] [--stream-only | --mma]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const int blocks = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs; one block an SM (the stream lines say where two)\n", prop.name, blocks);

  // The copy rate of this device in this run: device-to-device, 1 GiB read + written.
  const size_t cbytes = size_t(1) << 29;
  void *ca = nullptr, *cb = nullptr;
  check(cudaMalloc(&ca, cbytes), "malloc");
  check(cudaMalloc(&cb, cbytes), "malloc");
  check(cudaMemset(ca, 1, cbytes), "memset");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  std::vector<double> copy_ms;
  for (int r = 0; r < 7; ++r) {
    check(cudaEventRecord(e0), "record");
    check(cudaMemcpy(cb, ca, cbytes, cudaMemcpyDeviceToDevice), "copy");
    check(cudaEventRecord(e1), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    copy_ms.push_back(ms);
  }
  const double copy_tbs = 2.0 * double(cbytes) / (median(copy_ms) * 1e-3) / 1e12;
  std::printf("device copy: %.2f TB/s (read + written, median of 7)\n", copy_tbs);

  const Config configs[] = {
      {2, 8, 192, 1024}, {4, 8, 192, 1024}, {8, 8, 192, 1024}, {2, 16, 192, 1024}, {4, 16, 192, 1024},
      {2, 8, 48, 4096},  {1, 16, 48, 4096}, {3, 16, 48, 4096},
      // the bit-placement decode
      {2, 8, 192, 1024, 1}, {4, 8, 192, 1024, 1}, {8, 8, 192, 1024, 1}, {2, 16, 192, 1024, 1},
      {4, 16, 192, 1024, 1}, {2, 8, 48, 4096, 1}, {3, 16, 48, 4096, 1},
      // conflict-free shared-memory layouts (the cvt decode, then the bit placement)
      {2, 8, 192, 1024, 0, 1}, {4, 8, 192, 1024, 0, 1}, {8, 8, 192, 1024, 0, 1}, {2, 16, 192, 1024, 0, 1},
      {4, 16, 192, 1024, 0, 1}, {2, 8, 48, 4096, 0, 1}, {1, 16, 48, 4096, 0, 1}, {3, 16, 48, 4096, 0, 1},
      {8, 8, 192, 1024, 1, 1}, {4, 16, 192, 1024, 1, 1},
      // the inputs conflict-free, the weights at their natural 32-byte lane stride (as the tile kernels read them)
      {2, 8, 192, 1024, 0, 2}, {4, 8, 192, 1024, 0, 2}, {8, 8, 192, 1024, 0, 2}, {2, 16, 192, 1024, 0, 2},
      {4, 16, 192, 1024, 0, 2}, {3, 16, 48, 4096, 0, 2},
  };
  std::mt19937 rng(seed);
  bool all_exact = true;
  for (const Config& c : configs) {
    if (stream_only) break;
    const int R = c.R, K = c.K, nb = K / 32;
    const size_t wbytes = size_t(blocks) * R * K;
    std::vector<uint8_t> w(wbytes);
    for (auto& v : w) v = random_code(rng);
    std::vector<float> scale(size_t(blocks) * R / 32 * nb), x(static_cast<size_t>(K)), sa(static_cast<size_t>(nb));
    for (auto& v : scale) v = std::ldexp(1.0f, int(rng() % 11) - 5);
    for (auto& v : x) v = e4m3(random_code(rng));
    for (auto& v : sa) v = std::ldexp(1.0f, int(rng() % 7) - 3);
    uint8_t* dw = nullptr;
    float *dscale = nullptr, *dx = nullptr, *dsa = nullptr, *dy = nullptr;
    unsigned long long* dt = nullptr;
    check(cudaMalloc(&dw, wbytes), "malloc");
    check(cudaMalloc(&dscale, scale.size() * 4), "malloc");
    check(cudaMalloc(&dx, x.size() * 4), "malloc");
    check(cudaMalloc(&dsa, sa.size() * 4), "malloc");
    check(cudaMalloc(&dy, size_t(blocks) * R * 4), "malloc");
    check(cudaMalloc(&dt, size_t(blocks) * 3 * 8), "malloc");
    {  // the bytes as the bulk copy lands them: re-encoded (dec 1), K-block halves grouped (lay 1)
      std::vector<uint8_t> dev(w.size());
      for (size_t row = 0; row < w.size() / size_t(K); ++row)
        for (int kb = 0; kb < nb; ++kb)
          for (int i = 0; i < 32; ++i) {
            const uint8_t v = w[row * K + size_t(kb) * 32 + i];
            const size_t at = c.lay == 1 ? size_t(i / 16) * (K / 2) + size_t(kb) * 16 + i % 16 : size_t(kb) * 32 + i;
            dev[row * K + at] = c.dec == 1 ? place_code(v) : v;
          }
      check(cudaMemcpy(dw, dev.data(), wbytes, cudaMemcpyHostToDevice), "h2d");
    }
    check(cudaMemcpy(dscale, scale.data(), scale.size() * 4, cudaMemcpyHostToDevice), "h2d");
    check(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "h2d");
    check(cudaMemcpy(dsa, sa.data(), sa.size() * 4, cudaMemcpyHostToDevice), "h2d");
    check(cudaMemset(dy, 0xff, size_t(blocks) * R * 4), "memset");  // NaN until written
    const Args a{dw, dscale, dx, dsa, dy, dt, R, K};
    const size_t smem = size_t(R) * K + size_t(K) * 4;
    using Kernel = void (*)(Args);
    auto pick = [&](auto dec, auto lay) -> Kernel {
      constexpr int D = decltype(dec)::value, Y = decltype(lay)::value;
      return c.rpw == 1   ? k_smem_gemv<1, D, Y>
             : c.rpw == 2 ? k_smem_gemv<2, D, Y>
             : c.rpw == 3 ? k_smem_gemv<3, D, Y>
             : c.rpw == 4 ? k_smem_gemv<4, D, Y>
                          : k_smem_gemv<8, D, Y>;
    };
    using Zero = std::integral_constant<int, 0>;
    using One = std::integral_constant<int, 1>;
    using Two = std::integral_constant<int, 2>;
    const Kernel kernel = c.dec ? (c.lay ? pick(One{}, One{}) : pick(One{}, Zero{}))
                                : (c.lay == 2 ? pick(Zero{}, Two{}) : c.lay ? pick(Zero{}, One{}) : pick(Zero{}, Zero{}));
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), "smem attribute");
    // Correctness first: the same order on the CPU, every output bit for bit.
    kernel<<<blocks, 32 * c.warps, smem>>>(a);
    check(cudaGetLastError(), "launch");
    check(cudaDeviceSynchronize(), "run");
    std::vector<float> y(size_t(blocks) * R);
    check(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost), "d2h");
    const int64_t bad = count_differ(y, w, x, sa, scale, K);
    all_exact = all_exact && bad == 0;
    // Timed: L2 flushed before each launch (the copy phase reads DRAM, as a preload would).
    std::vector<double> copy_us, med_us, max_us;
    std::vector<unsigned long long> t(size_t(blocks) * 3);
    for (int r = 0; r < reps; ++r) {
      check(cudaMemset(ca, r & 0xff, cbytes), "flush");
      kernel<<<blocks, 32 * c.warps, smem>>>(a);
      check(cudaDeviceSynchronize(), "run");
      check(cudaMemcpy(t.data(), dt, t.size() * 8, cudaMemcpyDeviceToHost), "d2h");
      unsigned long long first = ~0ull, copied = 0;
      std::vector<double> comp;
      for (int b = 0; b < blocks; ++b) {
        first = std::min(first, t[3 * b]);
        copied = std::max(copied, t[3 * b + 1]);
        comp.push_back(double(t[3 * b + 2] - t[3 * b + 1]) * 1e-3);
      }
      copy_us.push_back(double(copied - first) * 1e-3);
      std::sort(comp.begin(), comp.end());
      med_us.push_back(comp[comp.size() / 2]);
      max_us.push_back(comp.back());
    }
    const double cu = median(copy_us), mu = median(med_us), xu = median(max_us);
    const double tbs = double(wbytes) / (xu * 1e-6) / 1e12;
    std::printf(
        "%s %s RPW %d, %2d warps, R %3d, K %4d (%3zu KB a block, %5.1f MB): %s | copy %6.2f µs (%.2f TB/s) | "
        "compute median %6.2f µs, slowest %6.2f µs = %.2f TB/s (%.2f× the copy rate)\n",
        c.dec ? "place" : "cvt  ", c.lay == 2 ? "x-free" : c.lay ? "free  " : "plain ", c.rpw, c.warps, R, K, size_t(R) * K / 1024, double(wbytes) / 1e6, bad ? "NOT EXACT" : "exact", cu,
        double(wbytes) / (cu * 1e-6) / 1e12, mu, xu, tbs, tbs / copy_tbs);
    cudaFree(dw), cudaFree(dscale), cudaFree(dx), cudaFree(dsa), cudaFree(dy), cudaFree(dt);
  }
  // Streaming from DRAM (k_stream_gemv): per_sm blocks an SM, each its rows in chunks of W·RPW through a ring.
  // per_sm: blocks an SM (the grid SMs × per_sm). The larger copies-only launches (session 37) give
  // the marginal rate between sizes: the streaming rate without the launch's fixed cost.
  struct StreamConfig {
    int K, rows_per_block, rpw, warps, slots, mode = 0, per_sm = 1;
    bool mma_ref = false;  // also run with --mma (the same run's exact and copies-only references)
  };
  const StreamConfig streams[] = {
      {1024, 256, 4, 8, 4},    {1024, 256, 2, 16, 4},   {1024, 256, 4, 16, 3},   {2048, 160, 2, 16, 3},
      {4096, 96, 1, 16, 3},    {1024, 256, 4, 8, 4, 1}, {1024, 256, 4, 16, 3, 1}, {4096, 96, 1, 16, 3, 1},
      {1024, 256, 4, 8, 4, 2}, {1024, 256, 4, 16, 3, 2}, {4096, 96, 1, 16, 3, 2},
      {4096, 384, 1, 16, 3, 1}, {4096, 768, 1, 16, 3, 1}, {4096, 768, 1, 16, 3, 0},
      {4096, 48, 1, 8, 3, 1, 2}, {4096, 192, 1, 8, 3, 1, 2}, {4096, 384, 1, 8, 3, 1, 2},
      // What fits beside the P·V kernel (≤ ~121 KB): 3 × 32 KB at 8 warps, 2 × 64 KB at 16.
      {4096, 384, 1, 8, 3, 1}, {4096, 768, 1, 8, 3, 1}, {4096, 384, 1, 8, 3, 0}, {4096, 768, 1, 8, 3, 0},
      {4096, 384, 1, 16, 2, 1}, {4096, 768, 1, 16, 2, 1},
      // Session 48: the tensor cores' FP8 MMA (mode 3; rpw unused: 16 rows a warp) at 52 / 208 /
      // 415 MB, 3 slots of 64 KB and 2 (what fits beside the P·V), 2–8 consumer warps, with the
      // exact arithmetic and copies alone at the same sizes for reference.
      {1024, 384, 16, 4, 3, 3}, {1024, 1536, 16, 4, 3, 3}, {1024, 3072, 16, 4, 3, 3},
      {1024, 1536, 16, 4, 2, 3}, {1024, 3072, 16, 4, 2, 3}, {2048, 768, 16, 2, 3, 3}, {2048, 1536, 16, 2, 3, 3},
      {512, 3072, 16, 8, 3, 3}, {512, 6144, 16, 8, 3, 3},
      {4096, 96, 1, 16, 3, 0, 1, true}, {4096, 768, 1, 16, 3, 0, 1, true}, {4096, 384, 1, 16, 3, 1, 1, true},
      {4096, 768, 1, 16, 3, 1, 1, true},
  };
  for (const StreamConfig& c : streams) {
    if (mma_only && c.mode != 3 && !c.mma_ref) continue;
    const bool mma = c.mode == 3;
    const int K = c.K, nb = K / 32, CH = mma ? 16 * c.warps : c.warps * c.rpw;
    const int grid = blocks * c.per_sm;
    const int64_t rows = int64_t(grid) * c.rows_per_block, wbytes = rows * K;
    if (c.rows_per_block % CH != 0 || rows % 32 != 0) continue;
    std::vector<uint8_t> w(static_cast<size_t>(wbytes)), dev(static_cast<size_t>(wbytes));
    for (auto& v : w) v = random_code(rng);
    if (mma) {  // fragment order: 16 rows × a K-block = 512 bytes, lane L's A registers a0..a3 at 16·L
      for (int64_t g = 0; g < rows; g += 16)
        for (int kb = 0; kb < nb; ++kb)
          for (int L = 0; L < 32; ++L)
            for (int j = 0; j < 4; ++j)
              for (int i = 0; i < 4; ++i) {
                const int64_t row = g + L / 4 + (j & 1) * 8;
                const int k = kb * 32 + (L % 4) * 4 + (j >> 1) * 16 + i;
                dev[size_t(g * K + kb * 512 + L * 16 + j * 4 + i)] = w[size_t(row * K + k)];
              }
    } else {
      for (int64_t row = 0; row < rows; ++row)
        for (int kb = 0; kb < nb; ++kb)
          for (int i = 0; i < 32; ++i)
            dev[size_t(row * K + (i / 16) * (K / 2) + kb * 16 + i % 16)] = w[size_t(row * K + kb * 32 + i)];
    }
    std::vector<float> scale(size_t(rows / 32 * nb)), x(static_cast<size_t>(K)), sa(static_cast<size_t>(nb));
    std::vector<uint8_t> xc(static_cast<size_t>(K));
    for (auto& v : scale) v = std::ldexp(1.0f, int(rng() % 11) - 5);
    for (auto& v : xc) v = random_code(rng);
    for (size_t i = 0; i < x.size(); ++i) x[i] = e4m3(xc[i]);
    for (auto& v : sa) v = std::ldexp(1.0f, int(rng() % 7) - 3);
    uint8_t *dw = nullptr, *dxc = nullptr;
    float *dscale = nullptr, *dx = nullptr, *dsa = nullptr, *dy = nullptr;
    check(cudaMalloc(&dxc, xc.size()), "malloc");
    check(cudaMemcpy(dxc, xc.data(), xc.size(), cudaMemcpyHostToDevice), "h2d");
    check(cudaMalloc(&dw, size_t(wbytes)), "malloc");
    check(cudaMalloc(&dscale, scale.size() * 4), "malloc");
    check(cudaMalloc(&dx, x.size() * 4), "malloc");
    check(cudaMalloc(&dsa, sa.size() * 4), "malloc");
    check(cudaMalloc(&dy, size_t(rows) * 4), "malloc");
    check(cudaMemcpy(dw, dev.data(), size_t(wbytes), cudaMemcpyHostToDevice), "h2d");
    check(cudaMemcpy(dscale, scale.data(), scale.size() * 4, cudaMemcpyHostToDevice), "h2d");
    check(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "h2d");
    check(cudaMemcpy(dsa, sa.data(), sa.size() * 4, cudaMemcpyHostToDevice), "h2d");
    check(cudaMemset(dy, 0xff, size_t(rows) * 4), "memset");
    const StreamArgs a{dw, dscale, dx, dsa, dy, c.rows_per_block, K, c.slots, c.mode, dxc};
    const size_t smem = size_t(K) * (mma ? 1 : 4) + 128 + size_t(c.slots) * CH * K;
    auto kernel = mma ? k_stream_mma : c.rpw == 1 ? k_stream_gemv<1> : c.rpw == 2 ? k_stream_gemv<2>
                                     : c.rpw == 4 ? k_stream_gemv<4> : k_stream_gemv<8>;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)), "smem attribute");
    kernel<<<grid, 32 * (c.warps + 1), smem>>>(a);
    check(cudaGetLastError(), "launch");
    check(cudaDeviceSynchronize(), "run");
    std::vector<float> y(static_cast<size_t>(rows));
    check(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost), "d2h");
    // Mode 1 computes nothing; mode 3 is held to a relative bound (2^-10 of the terms' magnitudes).
    const double rel = mma ? max_rel_error(y, w, x, sa, scale, K) : 0.0;
    const int64_t bad = c.mode == 1 ? 0 : mma ? (rel <= 0x1p-10 ? 0 : 1) : count_differ(y, w, x, sa, scale, K);
    if (c.mode != 1) all_exact = all_exact && bad == 0;
    char verdict[64];
    std::snprintf(verdict, sizeof verdict, "%s (max rel. error %.1e)", bad ? "FAR" : "close", rel);
    std::vector<double> us;
    for (int r = 0; r < reps; ++r) {
      check(cudaMemset(ca, r & 0xff, cbytes), "flush");
      check(cudaEventRecord(e0), "record");
      kernel<<<grid, 32 * (c.warps + 1), smem>>>(a);
      check(cudaEventRecord(e1), "record");
      check(cudaEventSynchronize(e1), "sync");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
      us.push_back(ms * 1e3);
    }
    const double mu = median(us), tbs = double(wbytes) / (mu * 1e-6) / 1e12;
    std::printf(
        "stream%s K %4d, %3d rows a block, %d an SM (%5.1f MB), RPW %d x %2d warps, %d slots of %3d KB: %s | %6.2f us = "
        "%.2f TB/s (%.2fx the copy rate)\n",
        c.mode == 1 ? " (copies only)" : c.mode == 2 ? " (a copy a row)" : mma ? " (FP8 MMA)" : "", K, c.rows_per_block,
        c.per_sm, double(wbytes) / 1e6, mma ? 16 : c.rpw, c.warps, c.slots, CH * K / 1024,
        c.mode == 1 ? "not checked" : mma ? verdict : bad ? "NOT EXACT" : "exact",
        mu, tbs, tbs / copy_tbs);
    cudaFree(dw), cudaFree(dxc), cudaFree(dscale), cudaFree(dx), cudaFree(dsa), cudaFree(dy);
  }
  std::printf("%s\n", all_exact ? "every output exact (mode 3's within its bound)" : "SOME OUTPUTS DIFFER");
  return all_exact ? 0 : 1;
}
