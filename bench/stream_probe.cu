// What a plain read of the routed experts' weights achieves on this GPU, for the 85 % per-kernel
// target of the decode step (docs/perf.md): the same bytes in the same places as one batch-1 MoE
// step's FP4 linears (6 of E experts, gate and up as two 2304 × 2560-byte matrices each, down as
// 5120 × 1152 bytes), read by kernels that do nothing but load and fold the bytes, with the
// launch shapes the GEMVs use and with simpler ones. L2 is flushed before every timed launch (the
// step never finds its weights in L2). Each line: median µs over the repetitions, TB/s, and the
// ratio to a contiguous read of the same byte count measured in the same run. Then what one launch
// reaches at the sizes of the step's linears (2–71 MB), the two 42 MB FP8 linears read in
// k_fp8_gemv's shape, and what launch boundaries cost: the experts' gate+up and down bytes read by one launch, by the step's two, and
// by eighteen, back to back and as a CUDA graph, and by one persistent launch with a grid barrier
// between them.
//
//   stream_probe [--experts 96] [--reps 30] [--seed 7]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "stream_probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ (v.y * 3u) ^ (v.z * 5u) ^ (v.w * 7u); }

// Fills n 16-byte words with a hash of their index (not zeros: nothing may be skipped or compressed).
__global__ void k_fill(uint4* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = make_uint4(h, h * 3u + 1u, h * 5u + 2u, h * 7u + 3u);
  }
}

// The GEMVs' shape: grid (row groups, experts, matrices); a warp takes OPW consecutive rows of its
// expert's matrix, lane l the 16-byte K-blocks l, l+32, … of each (512 contiguous bytes a warp
// load), U rounds of OPW loads issued before they are folded.
struct Regions {
  const uint8_t* const* base;  // [matrix][expert] → first byte
  const int32_t* ids;          // the chosen experts
  int64_t rows, row_bytes;
};
template <int OPW, int U, int KB = 16>
__global__ void __launch_bounds__(256) k_rows(Regions r, uint32_t* sink) {
  // KB bytes a K-block and lane: 16 for E2M1 (k_fp4_gemv), 32 for E4M3 (k_fp8_gemv: two loads).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t o0 = (int64_t(blockIdx.x) * 8 + warp) * OPW;
  if (o0 >= r.rows) return;
  const uint8_t* m = r.base[blockIdx.z * 1024 + r.ids[blockIdx.y]];
  const int nb = int(r.row_bytes / KB);
  uint32_t acc = 0;
  for (int kb0 = lane; kb0 < nb; kb0 += 32 * U) {
    uint4 v[U][OPW][KB / 16];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int o = 0; o < OPW; ++o) {
        const int kb = kb0 + 32 * u;
        const int64_t row = o0 + o < r.rows ? o0 + o : r.rows - 1;
#pragma unroll
        for (int h = 0; h < KB / 16; ++h)
          v[u][o][h] = kb < nb ? __ldg(reinterpret_cast<const uint4*>(m + row * r.row_bytes + int64_t(kb) * KB) + h)
                               : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int o = 0; o < OPW; ++o)
#pragma unroll
        for (int h = 0; h < KB / 16; ++h) acc += fold(v[u][o][h]);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; practically never taken
}

// Contiguous chunks: block b reads chunk b (or, persistent, chunks b, b + grid, …) of the regions laid
// end to end, each thread U 16-byte loads in flight.
struct Chunks {
  const uint8_t* const* region;  // region i's first byte
  int64_t region_bytes, chunk_bytes;
  int regions;
};
template <int U>
__global__ void __launch_bounds__(256) k_chunks(Chunks c, int64_t n_chunks, uint32_t* sink) {
  const int64_t per_region = c.region_bytes / c.chunk_bytes;
  uint32_t acc = 0;
  for (int64_t b = blockIdx.x; b < n_chunks; b += gridDim.x) {
    const uint4* p = reinterpret_cast<const uint4*>(c.region[b / per_region] + (b % per_region) * c.chunk_bytes);
    const int n = int(c.chunk_bytes / 16);
    for (int i0 = threadIdx.x; i0 < n; i0 += 256 * U) {
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = i0 + 256 * u < n ? __ldg(p + i0 + 256 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < U; ++u) acc += fold(v[u]);
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// A persistent grid (every block resident) reading a's chunks, then — after a grid-wide barrier, as
// a layer kernel whose second linear needs the first one's outputs — b's: what a launch boundary
// costs when it becomes a barrier. The barrier counts arrivals on `counter` and never resets it:
// launch n's blocks wait for the count to reach (n + 1)·gridDim.x.
__global__ void __launch_bounds__(256) k_two_phase(Chunks a, int64_t na, Chunks b, int64_t nbk, unsigned* counter,
                                                   uint32_t* sink) {
  uint32_t acc = 0;
  auto phase = [&](const Chunks& c, int64_t n) {
    const int64_t per_region = c.region_bytes / c.chunk_bytes;
    for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
      const uint4* p = reinterpret_cast<const uint4*>(c.region[k / per_region] + (k % per_region) * c.chunk_bytes);
      const int m = int(c.chunk_bytes / 16);
      for (int i0 = threadIdx.x; i0 < m; i0 += 256 * 4) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = i0 + 256 * u < m ? __ldg(p + i0 + 256 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; ++u) acc += fold(v[u]);
      }
    }
  };
  phase(a, na);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned ticket = atomicAdd(counter, 1u), target = (ticket / gridDim.x + 1) * gridDim.x;
    while (atomicAdd(counter, 0u) < target) {
    }
  }
  __syncthreads();
  phase(b, nbk);
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

template <typename Launch>
double median_us(int reps, const uint8_t* flush, int64_t flush_bytes, uint32_t* sink, Launch launch) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event"), check(cudaEventCreate(&b), "event");
  std::vector<double> t;
  const uint8_t* fr[1] = {flush};
  const uint8_t** dfr = nullptr;
  check(cudaMalloc(&dfr, sizeof(fr)), "malloc");
  check(cudaMemcpy(dfr, fr, sizeof(fr), cudaMemcpyHostToDevice), "copy");
  const Chunks fc{dfr, flush_bytes, 1 << 20, 1};
  for (int i = 0; i < reps + 2; ++i) {
    k_chunks<4><<<1056, 256>>>(fc, flush_bytes >> 20, sink);  // evicts the L2
    check(cudaEventRecord(a), "record");
    launch();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    if (i >= 2) t.push_back(1000.0 * ms);
  }
  check(cudaGetLastError(), "launch");
  cudaFree(dfr), cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int experts = 96, reps = 30;
  uint32_t seed = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--experts") experts = std::atoi(argv[i + 1]);
    else if (k == "--reps") reps = std::atoi(argv[i + 1]);
    else if (k == "--seed") seed = uint32_t(std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: stream_probe [--experts 96] [--reps 30] [--seed 7]\n");
      return 2;
    }
  }
  if (experts < 6 || experts > 1024 || reps < 1) {
    std::fprintf(stderr, "stream_probe: --experts must be 6..1024 and --reps ≥ 1\n");
    return 2;
  }
  // V4.1-Flash's routed experts: hidden 5120, moe_intermediate 2304, MXFP4 (two weights a byte).
  const int64_t gu_rows = 2304, gu_bytes = 5120 / 2, dn_rows = 5120, dn_bytes = 2304 / 2;
  const int64_t gu_mat = gu_rows * gu_bytes, dn_mat = dn_rows * dn_bytes;
  const int64_t flush_bytes = int64_t(512) << 20;
  uint8_t *gu = nullptr, *dn = nullptr, *flat = nullptr, *flush = nullptr;
  uint32_t* sink = nullptr;
  check(cudaMalloc(&gu, 2 * experts * gu_mat), "malloc gate/up");
  check(cudaMalloc(&dn, experts * dn_mat), "malloc down");
  check(cudaMalloc(&flat, 12 * gu_mat), "malloc flat");
  check(cudaMalloc(&flush, flush_bytes), "malloc flush");
  check(cudaMalloc(&sink, 64), "malloc sink");
  k_fill<<<2048, 256>>>(reinterpret_cast<uint4*>(gu), 2 * experts * gu_mat / 16, seed);
  k_fill<<<2048, 256>>>(reinterpret_cast<uint4*>(dn), experts * dn_mat / 16, seed + 1);
  k_fill<<<2048, 256>>>(reinterpret_cast<uint4*>(flat), 12 * gu_mat / 16, seed + 2);
  k_fill<<<2048, 256>>>(reinterpret_cast<uint4*>(flush), flush_bytes / 16, seed + 3);
  check(cudaDeviceSynchronize(), "fill");
  // Six distinct experts, as the router picks them (no repeats).
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(experts);
  for (int i = 0; i < experts; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(6);
  // Pointer tables: [matrix][expert] for the row kernels (gate = matrix 0, up = 1; down alone).
  std::vector<const uint8_t*> gu_tab(2048, nullptr), dn_tab(1024, nullptr);
  for (int e = 0; e < experts; ++e) {
    gu_tab[e] = gu + (2 * int64_t(e)) * gu_mat, gu_tab[1024 + e] = gu + (2 * int64_t(e) + 1) * gu_mat;
    dn_tab[e] = dn + int64_t(e) * dn_mat;
  }
  std::vector<const uint8_t*> gu_reg, dn_reg, flat_reg;
  for (int i = 0; i < 6; ++i) {
    gu_reg.push_back(gu_tab[ids[i]]), gu_reg.push_back(gu_tab[1024 + ids[i]]);
    dn_reg.push_back(dn_tab[ids[i]]);
  }
  flat_reg.push_back(flat);
  auto upload = [](const auto& v) {
    void* d = nullptr;
    check(cudaMalloc(&d, v.size() * sizeof(v[0])), "malloc table");
    check(cudaMemcpy(d, v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice), "copy table");
    return d;
  };
  auto* d_ids = static_cast<const int32_t*>(upload(ids));
  auto* d_gu_tab = static_cast<const uint8_t* const*>(upload(gu_tab));
  auto* d_dn_tab = static_cast<const uint8_t* const*>(upload(dn_tab));
  auto* d_gu_reg = static_cast<const uint8_t* const*>(upload(gu_reg));
  auto* d_dn_reg = static_cast<const uint8_t* const*>(upload(dn_reg));
  auto* d_flat = static_cast<const uint8_t* const*>(upload(flat_reg));
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("stream_probe: %s, %d SMs; 6 of %d experts (ids", prop.name, sms, experts);
  for (int i : ids) std::printf(" %d", i);
  std::printf("); L2 flushed (512 MB read) before each timed launch; median of %d\n", reps);

  const int64_t gu_total = 12 * gu_mat, dn_total = 6 * dn_mat;
  // The contiguous reference: the same byte count in one region, 64 KB chunks, 4 loads in flight.
  auto flat_read = [&](int64_t bytes) {
    const Chunks c{d_flat, bytes, 64 << 10, 1};
    return median_us(reps, flush, flush_bytes, sink, [&] { k_chunks<4><<<bytes / (64 << 10), 256>>>(c, bytes / (64 << 10), sink); });
  };
  const double ref_gu = flat_read(gu_total), ref_dn = flat_read(dn_total);
  auto line = [&](const char* what, int64_t bytes, double us, double ref) {
    std::printf("  %-58s %7.1f µs %6.2f TB/s %5.0f %%\n", what, us, bytes / us * 1e-6, 100.0 * ref / us);
  };
  std::printf("gate+up: %.1f MB (12 matrices of %.2f MB)                      µs     TB/s  vs contiguous\n",
              gu_total / 1e6, gu_mat / 1e6);
  line("contiguous, 64 KB chunks (the reference)", gu_total, ref_gu, ref_gu);
  auto rows = [&](auto kernel, int opw, const uint8_t* const* tab, int64_t nrows, int64_t row_bytes, int z) {
    const Regions r{tab, d_ids, nrows, row_bytes};
    const dim3 grid(unsigned((nrows + 8 * opw - 1) / (8 * opw)), 6, unsigned(z));
    return median_us(reps, flush, flush_bytes, sink, [&] { kernel<<<grid, 256>>>(r, sink); });
  };
  line("rows, 4 a warp, 1 round in flight (k_fp4_gemv's shape)", gu_total,
       rows(k_rows<4, 1>, 4, d_gu_tab, gu_rows, gu_bytes, 2), ref_gu);
  line("rows, 4 a warp, 2 rounds in flight", gu_total, rows(k_rows<4, 2>, 4, d_gu_tab, gu_rows, gu_bytes, 2), ref_gu);
  line("rows, 4 a warp, 5 rounds in flight (the whole row)", gu_total,
       rows(k_rows<4, 5>, 4, d_gu_tab, gu_rows, gu_bytes, 2), ref_gu);
  line("rows, 1 a warp, 5 rounds in flight", gu_total, rows(k_rows<1, 5>, 1, d_gu_tab, gu_rows, gu_bytes, 2), ref_gu);
  auto chunks = [&](auto kernel, const uint8_t* const* reg, int n, int64_t region_bytes, int64_t chunk, int grid) {
    const int64_t n_chunks = n * (region_bytes / chunk);
    const Chunks c{reg, region_bytes, chunk, n};
    const int g = grid > 0 ? grid : int(n_chunks);
    return median_us(reps, flush, flush_bytes, sink, [&] { kernel<<<g, 256>>>(c, n_chunks, sink); });
  };
  // Chunk sizes must divide the matrices: gate/up 5,898,240 B = 2^17 · 45; down 5,898,240 B too.
  line("12 regions, 32 KB chunks a block, 4 loads in flight", gu_total,
       chunks(k_chunks<4>, d_gu_reg, 12, gu_mat, 32 << 10, 0), ref_gu);
  line("12 regions, 128 KB chunks a block, 4 loads in flight", gu_total,
       chunks(k_chunks<4>, d_gu_reg, 12, gu_mat, 128 << 10, 0), ref_gu);
  line("12 regions, 32 KB chunks, persistent (8 blocks an SM)", gu_total,
       chunks(k_chunks<4>, d_gu_reg, 12, gu_mat, 32 << 10, 8 * sms), ref_gu);
  line("12 regions, 32 KB chunks, 8 loads in flight", gu_total,
       chunks(k_chunks<8>, d_gu_reg, 12, gu_mat, 32 << 10, 0), ref_gu);

  std::printf("down: %.1f MB (6 matrices of %.2f MB)\n", dn_total / 1e6, dn_mat / 1e6);
  line("contiguous, 64 KB chunks (the reference)", dn_total, ref_dn, ref_dn);
  line("rows, 4 a warp, 1 round in flight (k_fp4_gemv's shape)", dn_total,
       rows(k_rows<4, 1>, 4, d_dn_tab, dn_rows, dn_bytes, 1), ref_dn);
  line("rows, 4 a warp, 3 rounds in flight (the whole row)", dn_total,
       rows(k_rows<4, 3>, 4, d_dn_tab, dn_rows, dn_bytes, 1), ref_dn);
  line("6 regions, 32 KB chunks a block, 4 loads in flight", dn_total,
       chunks(k_chunks<4>, d_dn_reg, 6, dn_mat, 32 << 10, 0), ref_dn);
  line("6 regions, 32 KB chunks, 8 loads in flight", dn_total,
       chunks(k_chunks<8>, d_dn_reg, 6, dn_mat, 32 << 10, 0), ref_dn);
  const int64_t ch = 32 << 10;
  // What one launch of a given size reaches (each linear's own denominator): contiguous reads of the
  // sizes of the step's weight-streaming launches, 32 KB a block.
  std::printf("one contiguous launch of the size of a step's linear (32 KB a block, 4 loads in flight; %% of the\n"
              "71 MB launch's rate)\n");
  const int64_t sizes[] = {64, 200, 400, 800, 1280, 2160};  // blocks: 2.1, 6.6, 13, 26, 42, 71 MB
  double t[6];
  for (int i = 0; i < 6; ++i) {
    const Chunks c{d_flat, sizes[i] * ch, ch, 1};
    t[i] = median_us(reps, flush, flush_bytes, sink, [&] { k_chunks<4><<<sizes[i], 256>>>(c, sizes[i], sink); });
  }
  for (int i = 0; i < 6; ++i) {
    char what[64];
    std::snprintf(what, sizeof(what), "%.1f MB", sizes[i] * ch / 1e6);
    line(what, sizes[i] * ch, t[i], t[5] * double(sizes[i]) / double(sizes[5]));  // rate ratio
  }
  // The FP8 GEMVs' shapes (k_fp8_gemv: a warp OPW rows, lane l the 32-byte K-blocks l, l+32, …) on
  // the two 42 MB linears, against the contiguous 42 MB launch above.
  std::printf("42 MB FP8 linears in k_fp8_gemv's shape (%% of the contiguous 41.9 MB launch)\n");
  const std::vector<const uint8_t*> flat_tab{flat};
  const std::vector<int32_t> zero_id{0};
  auto* d_flat_tab = static_cast<const uint8_t* const*>(upload(flat_tab));
  auto* d_zero = static_cast<const int32_t*>(upload(zero_id));
  auto fp8_rows = [&](auto kernel, int opw, int64_t nrows, int64_t row_bytes) {
    const Regions r{d_flat_tab, d_zero, nrows, row_bytes};
    const dim3 grid(unsigned((nrows + 8 * opw - 1) / (8 * opw)), 1, 1);
    return median_us(reps, flush, flush_bytes, sink, [&] { kernel<<<grid, 256>>>(r, sink); });
  };
  line("wq_b: 32768 rows x 1280 B, 4 rows a warp", sizes[4] * ch, fp8_rows(k_rows<4, 1, 32>, 4, 32768, 1280), t[4]);
  line("wo_b: 5120 rows x 8192 B, 2 rows a warp, 1 round in flight", sizes[4] * ch,
       fp8_rows(k_rows<2, 1, 32>, 2, 5120, 8192), t[4]);
  line("wo_b, 2 rows a warp, 4 rounds in flight", sizes[4] * ch, fp8_rows(k_rows<2, 4, 32>, 2, 5120, 8192), t[4]);
  // Launch boundaries: the routed experts' 106 MB (gate+up, then down) as one launch, as the step's
  // two launches, and as 18 launches of one matrix each; back to back on one stream, and as a graph.
  std::vector<const uint8_t*> all_reg(gu_reg);
  all_reg.insert(all_reg.end(), dn_reg.begin(), dn_reg.end());
  auto* d_all_reg = static_cast<const uint8_t* const*>(upload(all_reg));
  const int64_t per = gu_mat / ch;
  const Chunks c_all{d_all_reg, gu_mat, ch, 18}, c_gu{d_gu_reg, gu_mat, ch, 12}, c_dn{d_dn_reg, dn_mat, ch, 6};
  std::vector<Chunks> c_one;
  for (int i = 0; i < 18; ++i) c_one.push_back(Chunks{d_all_reg + i, gu_mat, ch, 1});
  auto seq_two = [&](cudaStream_t st) {
    k_chunks<4><<<12 * per, 256, 0, st>>>(c_gu, 12 * per, sink);
    k_chunks<4><<<6 * per, 256, 0, st>>>(c_dn, 6 * per, sink);
  };
  auto seq_18 = [&](cudaStream_t st) {
    for (const Chunks& c : c_one) k_chunks<4><<<per, 256, 0, st>>>(c, per, sink);
  };
  auto graph_of = [&](auto seq) {
    cudaStream_t st;
    check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
    cudaGraph_t gr;
    cudaGraphExec_t ex;
    check(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
    seq(st);
    check(cudaStreamEndCapture(st, &gr), "capture end");
    check(cudaGraphInstantiate(&ex, gr, 0), "instantiate");
    cudaStreamDestroy(st);
    return ex;
  };
  const cudaGraphExec_t g_two = graph_of(seq_two), g_18 = graph_of(seq_18);
  const int64_t all_total = gu_total + dn_total;
  const double one = median_us(reps, flush, flush_bytes, sink, [&] { k_chunks<4><<<18 * per, 256>>>(c_all, 18 * per, sink); });
  std::printf("gate+up and down: %.1f MB (18 matrices)\n", all_total / 1e6);
  line("one launch, 32 KB chunks (the reference)", all_total, one, one);
  line("two launches (gate+up, down), back to back", all_total, median_us(reps, flush, flush_bytes, sink, [&] { seq_two(0); }), one);
  line("two launches, one graph", all_total, median_us(reps, flush, flush_bytes, sink, [&] { check(cudaGraphLaunch(g_two, 0), "graph"); }), one);
  line("18 launches (a matrix each), back to back", all_total, median_us(reps, flush, flush_bytes, sink, [&] { seq_18(0); }), one);
  line("18 launches, one graph", all_total, median_us(reps, flush, flush_bytes, sink, [&] { check(cudaGraphLaunch(g_18, 0), "graph"); }), one);
  int resident = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, k_two_phase, 256, 0), "occupancy");
  unsigned* counter = nullptr;
  check(cudaMalloc(&counter, sizeof(unsigned)), "malloc counter");
  check(cudaMemset(counter, 0, sizeof(unsigned)), "memset counter");
  const int pgrid = resident * sms;
  line("one persistent launch, a grid barrier between gate+up and down", all_total,
       median_us(reps, flush, flush_bytes, sink, [&] { k_two_phase<<<pgrid, 256>>>(c_gu, 12 * per, c_dn, 6 * per, counter, sink); }),
       one);
  // The big-copy figure bench_decode's bound uses, for scale.
  const double big = median_us(reps, flush, flush_bytes, sink, [&] {
    const Chunks c{d_flat, 12 * gu_mat, 64 << 10, 1};
    k_chunks<4><<<sms * 8, 256>>>(c, 12 * gu_mat / (64 << 10), sink);
  });
  std::printf("contiguous %.1f MB, persistent grid: %.1f µs, %.2f TB/s\n", 12 * gu_mat / 1e6, big,
              12 * gu_mat / big * 1e-6);
  return 0;
}
