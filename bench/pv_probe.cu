// The attention's softmax + P·V (k_attention_pv's arithmetic) in isolation: which form of the
// softmax and of the key loop runs fastest at the step's shapes (8 heads × 32 dims a block, 640
// keys, 128 blocks = one row, 512 = four rows), every form's outputs checked bit for bit against the
// CPU's (same exponentials, the reference's 128-thread denominator order, each output's products
// added in key order from zero) on fresh random logits and keys before anything is timed.
//
//   pv_probe [--rows R] [--keys N] [--reps K]
//
// Forms (template <HPW, SOFT, LOOP>):
//   HPW   heads a thread in the loop (1: 8 warps a block, 2: 4 warps);
//   SOFT  0: each warp its HPW heads' softmax in turn (the backend's); 1: all 8 heads' softmax over
//         the block's first 128 threads at once (HPW = 2: every thread; the reference's own layout);
//   LOOP  0: the backend's loop (8 groups of 4 keys written loads-first; ptxas interleaves them with
//         the sums, one group ahead at most); 1: stages of 8 keys held in registers two stages ahead
//         (loop-carried, so ptxas cannot move a stage's loads next to its sums).
// Prints per form: the launch's median µs over K launches (events), and the blocks' median cycles
// for the softmax and the loop (clock64 inside the kernel).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/detmath.h"

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

constexpr int kHeads = 8, kDims = 32;

__device__ __forceinline__ float wsum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float wmax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

struct Args {
  const float* logits;  // [rows][64 heads][nk]
  const float* keys;    // [rows][nk][512]
  const float* sink;    // [64]
  float* out;           // [rows][64][512]
  long long* cyc;       // [blocks][2]
  int nk, hd, H;
};

// Grid (rows, H / 8, hd / 32).
template <int HPW, int SOFT, int LOOP>
__global__ void __launch_bounds__(32 * kHeads / HPW) k_pv(Args a) {
  constexpr int kThreads = 32 * kHeads / HPW;
  extern __shared__ float4 sm4[];
  const int nk = a.nk, kp = (nk + 3) & ~3;
  float* p = reinterpret_cast<float*>(sm4);
  float* kt = p + kHeads * kp;
  __shared__ float den_s[kHeads], mx_s[4][kHeads], mxf_s[kHeads], q_s[4][kHeads];
  const int i = blockIdx.x, h0 = blockIdx.y * kHeads, d0 = blockIdx.z * kDims;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = threadIdx.x; t < kHeads * nk; t += kThreads)
    p[(t / nk) * kp + t % nk] = a.logits[(int64_t(i) * a.H + h0 + t / nk) * nk + t % nk];
  for (int t = threadIdx.x; t < nk * kDims; t += kThreads)
    kt[t] = a.keys[(int64_t(i) * nk + t / kDims) * a.hd + d0 + t % kDims];
  __syncthreads();
  const long long c0 = clock64();
  if constexpr (SOFT == 0) {
#pragma unroll
    for (int u = 0; u < HPW; ++u) {
      const int h = HPW * warp + u;
      float* ph = p + h * kp;
      float mx = -INFINITY;
      for (int j = lane; j < nk; j += 32) mx = fmaxf(mx, ph[j]);
      mx = wmax(mx);
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int j0 = 0; j0 < nk; j0 += 128) {
        float e[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = j0 + 32 * c + lane;
          e[c] = dsuf::det::fexp_nb((j < nk ? ph[j] : mx) - mx);
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = j0 + 32 * c + lane;
          if (j < nk) part[c] += (ph[j] = e[c]);
        }
      }
      float q[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) q[c] = wsum(part[c]);
      if (lane == 0) den_s[h] = ((q[0] + q[2]) + (q[1] + q[3])) + dsuf::det::fexp_nb(a.sink[h0 + h] - mx);
    }
  } else {
    // Thread t < 128 is the reference's thread t of every head: its partial adds j ≡ t (mod 128)
    // in order; warp w's tree gives q_w; den = ((q0 + q2) + (q1 + q3)) + exp(sink − max).
    if (threadIdx.x < 128) {
      const int t = threadIdx.x;
      float mx[kHeads];
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float m = -INFINITY;
        for (int j = t; j < nk; j += 128) m = fmaxf(m, p[h * kp + j]);
        mx[h] = wmax(m);
      }
      if (lane == 0)
#pragma unroll
        for (int h = 0; h < kHeads; ++h) mx_s[warp][h] = mx[h];
    }
    __syncthreads();
    if (threadIdx.x < 128) {
      const int t = threadIdx.x;
      float mx[kHeads], part[kHeads];
#pragma unroll
      for (int h = 0; h < kHeads; ++h)
        mx[h] = fmaxf(fmaxf(mx_s[0][h], mx_s[1][h]), fmaxf(mx_s[2][h], mx_s[3][h])), part[h] = 0.0f;
      for (int j = t; j < nk; j += 128) {
        float e[kHeads];
#pragma unroll
        for (int h = 0; h < kHeads; ++h) e[h] = dsuf::det::fexp_nb(p[h * kp + j] - mx[h]);
#pragma unroll
        for (int h = 0; h < kHeads; ++h) part[h] += (p[h * kp + j] = e[h]);
      }
#pragma unroll
      for (int h = 0; h < kHeads; ++h) part[h] = wsum(part[h]);
      if (lane == 0)
#pragma unroll
        for (int h = 0; h < kHeads; ++h) q_s[warp][h] = part[h];
      if (t < kHeads) mxf_s[t] = mx[t];
    }
    __syncthreads();
    if (threadIdx.x < kHeads) {
      const int h = threadIdx.x;
      den_s[h] = ((q_s[0][h] + q_s[2][h]) + (q_s[1][h] + q_s[3][h])) + dsuf::det::fexp_nb(a.sink[h0 + h] - mxf_s[h]);
    }
  }
  __syncthreads();
  const long long c1 = clock64();
  float acc[HPW];
  const float* ph[HPW];
#pragma unroll
  for (int u = 0; u < HPW; ++u) ph[u] = p + (HPW * warp + u) * kp, acc[u] = 0.0f;
  int jj = 0;
  if constexpr (LOOP == 0) {
    constexpr int UNR = 8;
    for (; jj + 4 * UNR <= nk; jj += 4 * UNR) {
      float4 w[UNR][HPW];
      float kk[UNR][4];
#pragma unroll
      for (int g = 0; g < UNR; ++g) {
#pragma unroll
        for (int u = 0; u < HPW; ++u) w[g][u] = *reinterpret_cast<const float4*>(ph[u] + jj + 4 * g);
#pragma unroll
        for (int c = 0; c < 4; ++c) kk[g][c] = kt[(jj + 4 * g + c) * kDims + lane];
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
  } else {
    // Stages of 8 keys, two in registers ahead of the one being added: a stage's loads are issued
    // in the iteration before last, so their latency is under a whole stage's sums.
    struct Stage {
      float4 w[HPW][2];
      float k[8];
    };
    auto load = [&](Stage& s, int j) {
#pragma unroll
      for (int u = 0; u < HPW; ++u) {
        s.w[u][0] = *reinterpret_cast<const float4*>(ph[u] + j);
        s.w[u][1] = *reinterpret_cast<const float4*>(ph[u] + j + 4);
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) s.k[c] = kt[(j + c) * kDims + lane];
    };
    auto add = [&](const Stage& s) {
#pragma unroll
      for (int u = 0; u < HPW; ++u) {
        acc[u] += s.w[u][0].x * s.k[0];
        acc[u] += s.w[u][0].y * s.k[1];
        acc[u] += s.w[u][0].z * s.k[2];
        acc[u] += s.w[u][0].w * s.k[3];
        acc[u] += s.w[u][1].x * s.k[4];
        acc[u] += s.w[u][1].y * s.k[5];
        acc[u] += s.w[u][1].z * s.k[6];
        acc[u] += s.w[u][1].w * s.k[7];
      }
    };
    const int ns = nk / 8;
    Stage s0, s1, s2;
    if (ns >= 3) {
      load(s0, 0);
      load(s1, 8);
      int s = 0;
      // Three stages an iteration, the buffers rotating by name (no register moves).
      for (; s + 5 <= ns; s += 3) {
        load(s2, 8 * (s + 2));
        add(s0);
        load(s0, 8 * (s + 3));
        add(s1);
        load(s1, 8 * (s + 4));
        add(s2);
      }
      // s0, s1 hold stages s, s + 1 (both < ns).
      add(s0);
      add(s1);
      jj = 8 * (s + 2);
    }
  }
  for (; jj < nk; ++jj) {
    const float k = kt[jj * kDims + lane];
#pragma unroll
    for (int u = 0; u < HPW; ++u) acc[u] += ph[u][jj] * k;
  }
  const long long c2 = clock64();
#pragma unroll
  for (int u = 0; u < HPW; ++u) {
    const int h = HPW * warp + u;
    a.out[(int64_t(i) * a.H + h0 + h) * a.hd + d0 + lane] = acc[u] / den_s[h];
  }
  if (threadIdx.x == 0) {
    const int b = (blockIdx.x * gridDim.y + blockIdx.y) * gridDim.z + blockIdx.z;
    a.cyc[2 * b] = c1 - c0;
    a.cyc[2 * b + 1] = c2 - c1;
  }
}

// The CPU's value of every output (the reference order).
std::vector<float> cpu_pv(const std::vector<float>& lg, const std::vector<float>& keys, const std::vector<float>& sink,
                          int rows, int H, int nk, int hd) {
  std::vector<float> out(size_t(rows) * H * hd), e(nk);
  for (int i = 0; i < rows; ++i)
    for (int h = 0; h < H; ++h) {
      const float* l = &lg[(size_t(i) * H + h) * nk];
      float mx = -INFINITY;
      for (int j = 0; j < nk; ++j) mx = std::max(mx, l[j]);
      float part[128] = {};
      for (int j = 0; j < nk; ++j) part[j % 128] += (e[j] = dsuf::det::fexp_nb(l[j] - mx));
      float q[4];
      for (int w = 0; w < 4; ++w) {  // the xor butterfly of a warp = tree32
        float v[32];
        for (int t = 0; t < 32; ++t) v[t] = part[32 * w + t];
        for (int o = 16; o > 0; o >>= 1) {
          float n[32];
          for (int t = 0; t < 32; ++t) n[t] = v[t] + v[t ^ o];
          std::memcpy(v, n, sizeof v);
        }
        q[w] = v[0];
      }
      const float den = ((q[0] + q[2]) + (q[1] + q[3])) + dsuf::det::fexp_nb(sink[h] - mx);
      for (int d = 0; d < hd; ++d) {
        float acc = 0.0f;
        for (int j = 0; j < nk; ++j) acc += e[j] * keys[(size_t(i) * nk + j) * hd + d];
        out[(size_t(i) * H + h) * hd + d] = acc / den;
      }
    }
  return out;
}

template <int HPW, int SOFT, int LOOP>
void run(const char* name, const Args& a, int rows, const std::vector<float>& ref, int reps) {
  const int kp = (a.nk + 3) & ~3;
  const size_t smem = sizeof(float) * (kHeads * kp + a.nk * kDims);
  auto* k = k_pv<HPW, SOFT, LOOP>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(rows, a.H / kHeads, a.hd / kDims), block(32 * kHeads / HPW);
  const size_t n = size_t(rows) * a.H * a.hd;
  CK(cudaMemset(a.out, 0xff, n * sizeof(float)));
  k<<<grid, block, smem>>>(a);
  CK(cudaDeviceSynchronize());
  std::vector<float> got(n);
  CK(cudaMemcpy(got.data(), a.out, n * sizeof(float), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t t = 0; t < n; ++t)
    if (std::memcmp(&got[t], &ref[t], 4) != 0) ++bad;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> us;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0));
    for (int t = 0; t < reps; ++t) k<<<grid, block, smem>>>(a);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(1000.0f * ms / float(reps));
  }
  std::sort(us.begin(), us.end());
  const int nb = int(grid.x * grid.y * grid.z);
  std::vector<long long> cyc(2 * size_t(nb));
  CK(cudaMemcpy(cyc.data(), a.cyc, cyc.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::vector<long long> s(nb), l(nb);
  for (int b = 0; b < nb; ++b) s[b] = cyc[2 * b], l[b] = cyc[2 * b + 1];
  std::sort(s.begin(), s.end());
  std::sort(l.begin(), l.end());
  std::printf("%-34s launch %7.2f us (median of 7 x %d)  softmax %6lld cyc  loop %6lld cyc (max %6lld)  %s\n", name,
              us[3], reps, s[nb / 2], l[nb / 2], l[nb - 1], bad ? "DIFFERS" : "exact");
  if (bad) std::printf("  %zu of %zu outputs differ from the CPU\n", bad, n);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

}  // namespace

int main(int argc, char** argv) {
  int rows = 1, nk = 640, reps = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--rows") rows = std::atoi(argv[i + 1]);
    else if (f == "--keys") nk = std::atoi(argv[i + 1]);
    else if (f == "--reps") reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: pv_probe [--rows R] [--keys N] [--reps K]\n");
      return 2;
    }
  }
  const int H = 64, hd = 512;
  std::mt19937 rng(12345u + unsigned(rows) * 7u + unsigned(nk));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> lg(size_t(rows) * H * nk), keys(size_t(rows) * nk * hd), sink(H);
  for (auto& v : lg) v = 3.0f * nd(rng);
  for (auto& v : keys) v = nd(rng);
  for (auto& v : sink) v = nd(rng);
  const auto ref = cpu_pv(lg, keys, sink, rows, H, nk, hd);
  Args a{};
  float *dl, *dk, *ds, *dout;
  long long* dc;
  CK(cudaMalloc(&dl, lg.size() * 4));
  CK(cudaMalloc(&dk, keys.size() * 4));
  CK(cudaMalloc(&ds, sink.size() * 4));
  CK(cudaMalloc(&dout, size_t(rows) * H * hd * 4));
  CK(cudaMalloc(&dc, size_t(rows) * (H / kHeads) * (hd / kDims) * 2 * sizeof(long long)));
  CK(cudaMemcpy(dl, lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, keys.data(), keys.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ds, sink.data(), sink.size() * 4, cudaMemcpyHostToDevice));
  a = Args{dl, dk, ds, dout, dc, nk, hd, H};
  std::printf("pv_probe: rows %d, keys %d, %d blocks of 8 heads x 32 dims\n", rows, nk, rows * (H / 8) * (hd / 32));
  run<1, 0, 0>("HPW 1, warp softmax, loop 0 (now)", a, rows, ref, reps);
  run<1, 0, 1>("HPW 1, warp softmax, loop 1", a, rows, ref, reps);
  run<2, 0, 0>("HPW 2, warp softmax, loop 0 (cp)", a, rows, ref, reps);
  run<2, 0, 1>("HPW 2, warp softmax, loop 1", a, rows, ref, reps);
  run<2, 1, 0>("HPW 2, block softmax, loop 0", a, rows, ref, reps);
  run<2, 1, 1>("HPW 2, block softmax, loop 1", a, rows, ref, reps);
  run<1, 1, 1>("HPW 1, block softmax, loop 1", a, rows, ref, reps);
  return 0;
}
