// The device sampler (backend/cuda/sample.cu) against the host's (core/sampling.h), GPU machine
// only (label "gpu"): fresh random rows at the real vocabulary size (129,280), batches of 1 and 64,
// every parameter family (greedy, temperature, top-k with ties at the cut, top-p down to a single
// token, NaN/−inf/+inf rows), and the serial definition run on one device thread as a third
// witness. The tokens must be equal, row for row.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.cuh"
#include "cuda_buf.h"
#include "core/sampling.h"

namespace dsuf {
namespace {

constexpr int64_t kVocab = 129280;
constexpr int kRows = 64;

using cuda_test::Buf;

// A fresh row of one of eight shapes; never all zeros.
std::vector<float> make_row(std::mt19937_64& rng, int kind) {
  std::vector<float> x(kVocab);
  const float inf = std::numeric_limits<float>::infinity();
  auto normal = [&](float mean, float sd) {
    std::normal_distribution<float> nd(mean, sd);
    for (auto& v : x) v = nd(rng);
  };
  switch (kind) {
    case 0:  // a plain model-like row
      normal(0.0f, 2.0f);
      break;
    case 1:  // wide, with a few dominant tokens
      normal(-2.0f, 6.0f);
      for (int i = 0; i < 5; ++i) x[rng() % kVocab] = 30.0f + float(i);
      break;
    case 2:  // quantized: many ties everywhere, also at the top-k and top-p cuts
      normal(0.0f, 3.0f);
      for (auto& v : x) v = std::round(v * 4.0f) / 4.0f;
      break;
    case 3:  // nearly flat: one value almost everywhere
      for (auto& v : x) v = 1.5f;
      for (int i = 0; i < 100; ++i) x[rng() % kVocab] = 1.5f + float(rng() % 3) * 0.5f;
      break;
    case 4:  // NaN, −inf and signed zeros sprinkled in
      normal(0.0f, 3.0f);
      for (int i = 0; i < 200; ++i) x[rng() % kVocab] = std::numeric_limits<float>::quiet_NaN();
      for (int i = 0; i < 200; ++i) x[rng() % kVocab] = -inf;
      for (int i = 0; i < 50; ++i) x[rng() % kVocab] = (i % 2) ? -0.0f : 0.0f;
      break;
    case 5:  // a +inf logit: greedy by definition
      normal(0.0f, 2.0f);
      x[rng() % kVocab] = inf;
      break;
    case 6:  // huge magnitudes
      normal(0.0f, 1e4f);
      break;
    default:  // tiny spread around a large offset
      normal(7.0f, 1e-3f);
      break;
  }
  return x;
}

SamplingParams random_params(std::mt19937_64& rng) {
  const float temps[] = {0.0f, 0.2f, 0.6f, 1.0f, 1.0f, 1.3f, 3.0f};
  const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.9f, 0.5f, 0.05f, 1e-7f};
  const int top_ks[] = {0, 0, 0, 1, 2, 40, 1000, int(kVocab) - 1, int(kVocab), int(kVocab) + 7};
  return {.temperature = temps[rng() % 7],
          .top_p = top_ps[rng() % 7],
          .top_k = top_ks[rng() % 10],
          .seed = rng()};
}

TEST(CudaSampling, DeviceEqualsHostOnFreshRandomRows) {
  std::mt19937_64 rng(20261129);
  Buf<float> logits(size_t(kRows) * kVocab), weights(size_t(kRows) * kVocab);
  Buf<cuda::SampleJob> jobs(kRows);
  Buf<uint32_t> max_key(kRows);
  Buf<int32_t> out(kRows), out_serial(kRows);
  int checked = 0, drawn = 0, serial_checked = 0;
  for (int round = 0; round < 12; ++round) {
    const int n_jobs = round % 4 == 0 ? 1 : kRows;  // batch 1 and batch 64
    std::vector<float> host(size_t(kRows) * kVocab);
    std::vector<int> kind(kRows);
    for (int r = 0; r < kRows; ++r) {
      kind[r] = (round * kRows + r) % 8;
      const std::vector<float> x = make_row(rng, kind[r]);
      std::copy(x.begin(), x.end(), host.begin() + size_t(r) * kVocab);
    }
    std::vector<cuda::SampleJob> job(n_jobs);
    for (int j = 0; j < n_jobs; ++j) {
      // Odd rounds read the rows in reverse (jobs name their row); every 13th job is off.
      const int row = round % 2 ? kRows - 1 - j : j;
      job[j] = {.params = random_params(rng),
                .draw = rng() % 100000,
                .row = row,
                .on = j % 13 == 5 ? 0 : 1};
    }
    DSUF_CUDA(cudaMemcpy(logits.p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    DSUF_CUDA(cudaMemcpy(jobs.p, job.data(), job.size() * sizeof(cuda::SampleJob),
                         cudaMemcpyHostToDevice));
    std::vector<int32_t> sentinel(kRows, -7);
    DSUF_CUDA(cudaMemcpy(out.p, sentinel.data(), kRows * 4, cudaMemcpyHostToDevice));
    cuda::sample(logits.p, kVocab, jobs.p, n_jobs, max_key.p, weights.p, out.p, nullptr);
    DSUF_CUDA(cudaDeviceSynchronize());
    std::vector<int32_t> got(kRows);
    DSUF_CUDA(cudaMemcpy(got.data(), out.p, kRows * 4, cudaMemcpyDeviceToHost));
    // The serial definition on one device thread, for the first jobs of the first rounds.
    const int n_serial = round < 4 ? std::min(n_jobs, 8) : 0;
    std::vector<int32_t> serial(kRows, -7);
    if (n_serial > 0) {
      cuda::sample_serial(logits.p, kVocab, jobs.p, n_serial, weights.p, out_serial.p, nullptr);
      DSUF_CUDA(cudaDeviceSynchronize());
      DSUF_CUDA(cudaMemcpy(serial.data(), out_serial.p, n_serial * 4, cudaMemcpyDeviceToHost));
    }
    for (int j = 0; j < n_jobs; ++j) {
      if (!job[j].on) {
        EXPECT_EQ(got[j], -7) << "job " << j << " is off but was written";
        continue;
      }
      const SamplingParams& p = job[j].params;
      const std::span<const float> row(host.data() + size_t(job[j].row) * kVocab, size_t(kVocab));
      const int32_t want = sample_token(row, p, job[j].draw);
      EXPECT_EQ(got[j], want) << "round " << round << " job " << j << " (row kind "
                              << kind[job[j].row] << ", T " << p.temperature << ", top_p "
                              << p.top_p << ", top_k " << p.top_k << ", seed " << p.seed
                              << ", draw " << job[j].draw << ")";
      if (j < n_serial) {
        EXPECT_EQ(serial[j], want) << "serial form on the device, round " << round << " job " << j;
        ++serial_checked;
      }
      ++checked;
      const sampling::Best b = sampling::best_of(row.data(), kVocab);
      drawn += !sampling::is_greedy(p, b.key) && want != b.index;
    }
  }
  std::printf("%d rows checked (%d serial), %d drawn away from the argmax\n", checked,
              serial_checked, drawn);
  EXPECT_GT(checked, 500);
  EXPECT_GT(drawn, 150);  // the comparison covers real draws, not only greedy rows
}

TEST(CudaSampling, Timing) {
  // Not a pass/fail check: the sampler's device time per step at batch 1 and 64 (the row is
  // L2-resident here as it is after the head).
  std::mt19937_64 rng(7);
  Buf<float> logits(size_t(kRows) * kVocab), weights(size_t(kRows) * kVocab);
  Buf<cuda::SampleJob> jobs(kRows);
  Buf<uint32_t> max_key(kRows);
  Buf<int32_t> out(kRows);
  std::vector<float> host(size_t(kRows) * kVocab);
  for (int r = 0; r < kRows; ++r) {
    const std::vector<float> x = make_row(rng, 0);
    std::copy(x.begin(), x.end(), host.begin() + size_t(r) * kVocab);
  }
  DSUF_CUDA(cudaMemcpy(logits.p, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  DSUF_CUDA(cudaEventCreate(&e0));
  DSUF_CUDA(cudaEventCreate(&e1));
  const std::pair<const char*, SamplingParams> cases[] = {
      {"greedy", {}},
      {"T=1", {.temperature = 1.0f, .seed = 1}},
      {"T=0.7 top_p=0.9", {.temperature = 0.7f, .top_p = 0.9f, .seed = 1}},
      {"T=0.7 top_p=0.9 top_k=50", {.temperature = 0.7f, .top_p = 0.9f, .top_k = 50, .seed = 1}}};
  for (const auto& [name, p] : cases) {
    for (int n : {1, kRows}) {
      std::vector<cuda::SampleJob> job(n);
      for (int j = 0; j < n; ++j) job[j] = {.params = p, .draw = uint64_t(j), .row = j, .on = 1};
      DSUF_CUDA(
          cudaMemcpy(jobs.p, job.data(), n * sizeof(cuda::SampleJob), cudaMemcpyHostToDevice));
      for (int i = 0; i < 3; ++i)
        cuda::sample(logits.p, kVocab, jobs.p, n, max_key.p, weights.p, out.p, nullptr);
      const int iters = 20;
      DSUF_CUDA(cudaEventRecord(e0));
      for (int i = 0; i < iters; ++i)
        cuda::sample(logits.p, kVocab, jobs.p, n, max_key.p, weights.p, out.p, nullptr);
      DSUF_CUDA(cudaEventRecord(e1));
      DSUF_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      DSUF_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      std::printf("sampling %-26s batch %2d: %8.1f us per step\n", name, n, 1000.0 * ms / iters);
    }
  }
  DSUF_CUDA(cudaGetLastError());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace dsuf
