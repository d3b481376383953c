// The CUDA backend against the CPU reference on the tiny checkpoint (GPU machine only; CTest label
// "gpu", not run by `make test`). The first CUDA backend computes in the reference's order with the
// shared deterministic math (core/detmath.h, --fmad=false), so the tolerance is zero: per-layer
// residual streams, logits, 64 greedy steps and the packed KV state must be bit-identical.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>

#include <unistd.h>

#include "core/error.h"
#include "core/numerics.h"

#include "backend/cuda/cuda_backend.h"
#include "engine/sampler.h"
#include "model/tiny.h"
#include "tiny_fixture.h"

namespace dsuf {
namespace {

using testing::compressed_ids;
using testing::random_prompt;
using testing::real_dims_model;
using testing::run;
using testing::tiny_model;
using Logits = ForwardItem::Logits;

CpuBackend& cpu() {
  static CpuBackend b(tiny_model(), compressed_ids(), CpuNumerics{}, 4);
  return b;
}
CudaBackend& gpu() {
  static CudaBackend b(tiny_model(), compressed_ids(), CudaOptions{.max_context = 1024, .max_chunk = 256, .numerics = {}});
  return b;
}

struct Diff {
  double max_abs = 0, ref_rms = 0, rel_rms = 0;
};
Diff diff(const std::vector<float>& a, const std::vector<float>& ref) {
  Diff d;
  double se = 0, sr = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = double(a[i]) - ref[i];
    d.max_abs = std::max(d.max_abs, std::fabs(e));
    se += e * e;
    sr += double(ref[i]) * ref[i];
  }
  d.ref_rms = std::sqrt(sr / std::max<size_t>(1, ref.size()));
  d.rel_rms = std::sqrt(se / std::max(sr, 1e-30));
  return d;
}


TEST(CudaVsCpu, PrefillLayerByLayerAndLogits) {
  std::vector<int32_t> prompt = random_prompt(200, 11);
  SequenceState sc = cpu().new_sequence(), sg = gpu().new_sequence();
  std::vector<std::vector<float>> tc, tg;
  std::vector<float> lc = run(cpu(), sc, prompt, Logits::kLast, &tc);
  std::vector<float> lg = run(gpu(), sg, prompt, Logits::kLast, &tg);
  ASSERT_EQ(tc.size(), tg.size());
  for (size_t l = 0; l < tc.size(); ++l) {
    Diff d = diff(tg[l], tc[l]);
    std::printf("layer %zu: streams rel-rms diff %.3g, max abs %.3g (ref rms %.3g)\n", l, d.rel_rms, d.max_abs, d.ref_rms);
    EXPECT_EQ(d.max_abs, 0.0) << "layer " << l;
    if (d.max_abs > 0) {  // where it first goes wrong: per-token and per-stream detail
      const size_t per_tok = tc[l].size() / prompt.size();
      for (size_t i = 0; i < prompt.size(); ++i) {
        std::vector<float> a(tg[l].begin() + i * per_tok, tg[l].begin() + (i + 1) * per_tok);
        std::vector<float> b(tc[l].begin() + i * per_tok, tc[l].begin() + (i + 1) * per_tok);
        Diff t = diff(a, b);
        if (t.max_abs > 0) std::printf("  token %zu (id %d): rel-rms %.3g\n", i, prompt[i], t.rel_rms);
      }
    }
  }
  Diff d = diff(lg, lc);
  std::printf("logits: max abs diff %.4g, rel-rms %.3g (ref rms %.3g)\n", d.max_abs, d.rel_rms, d.ref_rms);
  EXPECT_EQ(d.max_abs, 0.0);
  EXPECT_EQ(argmax(lg), argmax(lc));
}

TEST(CudaVsCpu, GreedyTokensIdenticalOver64Steps) {
  std::vector<int32_t> prompt = random_prompt(200, 5);
  SequenceState sc = cpu().new_sequence(), sg = gpu().new_sequence();
  std::vector<float> lc = run(cpu(), sc, prompt, Logits::kLast), lg = run(gpu(), sg, prompt, Logits::kLast);
  std::vector<int32_t> tc, tg;
  double worst = 0;
  for (int step = 0; step < 64; ++step) {
    const int32_t a = argmax(lc), b = argmax(lg);
    tc.push_back(a);
    tg.push_back(b);
    worst = std::max(worst, diff(lg, lc).max_abs);
    lc = run(cpu(), sc, {a}, Logits::kLast);
    lg = run(gpu(), sg, {a}, Logits::kLast);  // both continue with the reference's token
  }
  std::printf("64 decode steps: worst max-abs logit diff %.4g\n", worst);
  EXPECT_EQ(worst, 0.0);
  EXPECT_EQ(tg, tc);
}

TEST(CudaSelf, ChunkedPrefillEqualsOneShot) {
  std::vector<int32_t> prompt = random_prompt(160, 42);
  SequenceState s1 = gpu().new_sequence();
  std::vector<float> ref = run(gpu(), s1, prompt, Logits::kLast);
  for (std::vector<int> sizes : {std::vector<int>{1}, {7}, {64}, {5, 1, 16, 2, 33, 9, 17}}) {
    SequenceState st = gpu().new_sequence();
    std::vector<float> l = testing::prefill_chunked(gpu(), st, prompt, sizes);
    EXPECT_EQ(diff(l, ref).max_abs, 0.0) << "chunk sizes starting " << sizes[0];
  }
}

TEST(CudaSelf, StateDownloadUploadContinuesIdentically) {
  std::vector<int32_t> prompt = random_prompt(97, 3);
  SequenceState a = gpu().new_sequence();
  run(gpu(), a, prompt, Logits::kNone);
  gpu().download(a);
  const std::string bytes = a.serialize(gpu().layout());
  SequenceState b = SequenceState::deserialize(gpu().layout(), bytes);
  for (int32_t t : random_prompt(10, 8, false)) {
    std::vector<float> la = run(gpu(), a, {t}, Logits::kLast), lb = run(gpu(), b, {t}, Logits::kLast);
    EXPECT_EQ(diff(la, lb).max_abs, 0.0);
  }
  // The GPU's packed state and the CPU's agree closely after the same prompt.
  SequenceState c = cpu().new_sequence();
  run(cpu(), c, prompt, Logits::kNone);
  SequenceState g = gpu().new_sequence();
  run(gpu(), g, prompt, Logits::kNone);
  gpu().download(g);
  ASSERT_EQ(g.ckv[0].size(), c.ckv[0].size());
  size_t same = 0;
  for (size_t i = 0; i < g.ckv[0].size(); ++i) same += g.ckv[0][i] == c.ckv[0][i];
  std::printf("compressed KV bytes identical: %zu of %zu\n", same, g.ckv[0].size());
  EXPECT_EQ(same, g.ckv[0].size());
  EXPECT_EQ(g.serialize(gpu().layout()), c.serialize(cpu().layout()));
}

TEST(CudaSelf, BatchEqualsAlone) {
  std::vector<std::vector<int32_t>> seqs = {random_prompt(37, 1), random_prompt(5, 2, false), random_prompt(61, 3)};
  std::vector<SequenceState> st;
  std::vector<std::vector<float>> logits(seqs.size());
  std::vector<ForwardItem> items;
  for (size_t i = 0; i < seqs.size(); ++i) st.push_back(gpu().new_sequence());
  for (size_t i = 0; i < seqs.size(); ++i)
    items.push_back({.state = &st[i], .tokens = seqs[i], .want = Logits::kLast, .logits = &logits[i]});
  gpu().forward(items);
  for (size_t i = 0; i < seqs.size(); ++i) {
    SequenceState alone = gpu().new_sequence();
    EXPECT_EQ(diff(run(gpu(), alone, seqs[i], Logits::kLast), logits[i]).max_abs, 0.0);
  }
}

TEST(CudaBatch, DecodeAtDifferentLengthsEqualsCpuAlone) {
  // Four sequences at different lengths decode together for 24 steps (one row each: the
  // graph-captured decode step), crossing window and compression boundaries; each must equal the
  // CPU reference running that sequence alone, bit for bit.
  std::vector<std::vector<int32_t>> prompts = {random_prompt(37, 1), random_prompt(5, 2, false), random_prompt(61, 3),
                                               random_prompt(130, 4)};
  const size_t B = prompts.size();
  std::vector<SequenceState> sg, sc;
  std::vector<std::vector<float>> lg(B), lc(B);
  for (size_t b = 0; b < B; ++b) {
    sg.push_back(gpu().new_sequence());
    sc.push_back(cpu().new_sequence());
    lc[b] = run(cpu(), sc[b], prompts[b], Logits::kLast);
  }
  std::vector<ForwardItem> items;
  for (size_t b = 0; b < B; ++b) items.push_back({.state = &sg[b], .tokens = prompts[b], .want = Logits::kLast, .logits = &lg[b]});
  gpu().forward(items);  // a mixed prefill of four sequences in shared steps
  for (size_t b = 0; b < B; ++b) EXPECT_EQ(diff(lg[b], lc[b]).max_abs, 0.0) << "prefill of sequence " << b;
  std::vector<int32_t> next(B);
  for (int step = 0; step < 24; ++step) {
    items.clear();
    for (size_t b = 0; b < B; ++b) {
      next[b] = argmax(lc[b]);
      items.push_back({.state = &sg[b], .tokens = {&next[b], 1}, .want = Logits::kLast, .logits = &lg[b]});
    }
    gpu().forward(items);
    for (size_t b = 0; b < B; ++b) {
      lc[b] = run(cpu(), sc[b], {next[b]}, Logits::kLast);
      EXPECT_EQ(diff(lg[b], lc[b]).max_abs, 0.0) << "step " << step << " sequence " << b;
    }
  }
}

TEST(CudaSampling, BackendTokensAreTheHostsOnTheSameLogits) {
  // Ten sequences (greedy, top-k + top-p, plain temperature; more than the backend's max_batch of 8,
  // so the sampling jobs run in two launches) prefill and then decode together (the graph-captured
  // step) three times over: run A asks for logits and tokens, run B for tokens only (only the ids
  // cross to the host), run C is the CPU backend sampling its own logits. Every token of A must be
  // core/sampling.h's on A's logits, and B and C must give the same tokens as A.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (uint32_t i = 0; i < 10; ++i) {
    prompts.push_back(random_prompt(9 + 5 * i, 61 + i, i % 2 == 0));
    const uint64_t seed = 5 + i;
    params.push_back(i % 3 == 0   ? SamplingParams{}
                     : i % 3 == 1 ? SamplingParams{.temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = seed}
                                  : SamplingParams{.temperature = 1.2f, .seed = seed});
  }
  const size_t B = prompts.size();
  std::vector<SequenceState> a, b, c;
  for (size_t i = 0; i < B; ++i) {
    a.push_back(gpu().new_sequence());
    b.push_back(gpu().new_sequence());
    c.push_back(cpu().new_sequence());
  }
  std::vector<std::vector<float>> la(B);
  std::vector<int32_t> ta(B, -1), tb(B, -1), tc(B, -1), fed(B);
  int drawn = 0;
  for (int step = 0; step < 12; ++step) {
    std::vector<ForwardItem> ia, ib, ic;
    for (size_t i = 0; i < B; ++i) {
      const std::span<const int32_t> toks =
          step == 0 ? std::span<const int32_t>(prompts[i]) : std::span<const int32_t>(&fed[i], 1);
      const uint64_t draw = uint64_t(step);
      ia.push_back({.state = &a[i], .tokens = toks, .want = Logits::kLast, .logits = &la[i], .sampling = params[i],
                    .draw = draw, .token = &ta[i]});
      ib.push_back({.state = &b[i], .tokens = toks, .want = Logits::kLast, .sampling = params[i], .draw = draw,
                    .token = &tb[i]});
      ic.push_back({.state = &c[i], .tokens = toks, .want = Logits::kLast, .sampling = params[i], .draw = draw,
                    .token = &tc[i]});
    }
    gpu().forward(ia);
    gpu().forward(ib);
    cpu().forward(ic);
    for (size_t i = 0; i < B; ++i) {
      ASSERT_EQ(la[i].size(), size_t(gpu().config().text.vocab_size));
      const int32_t host = sample_token(la[i], params[i], uint64_t(step));
      EXPECT_EQ(ta[i], host) << "step " << step << " sequence " << i << ": device token vs host on the same logits";
      EXPECT_EQ(tb[i], ta[i]) << "step " << step << " sequence " << i << ": without logits";
      EXPECT_EQ(tc[i], ta[i]) << "step " << step << " sequence " << i << ": CPU backend";
      drawn += ta[i] != argmax(la[i]);
      fed[i] = ta[i];  // every run continues with A's token, so one difference does not cascade
    }
  }
  std::printf("backend sampling: %d of %zu tokens drawn away from the argmax\n", drawn, 12 * B);
  EXPECT_GT(drawn, 10);
}

TEST(CudaBatch, LongPrefillInterleavedWithDecode) {
  // One sequence prefills 300 tokens (several steps of max_chunk) in the same forward as two others
  // decode; all must equal the CPU alone.
  std::vector<int32_t> longp = random_prompt(300, 21), a = random_prompt(20, 22), b2 = random_prompt(33, 23);
  SequenceState g0 = gpu().new_sequence(), g1 = gpu().new_sequence(), g2 = gpu().new_sequence();
  run(gpu(), g1, a, Logits::kNone);
  run(gpu(), g2, b2, Logits::kNone);
  int32_t t1 = 17, t2 = 99;
  std::vector<float> l0, l1, l2;
  std::vector<ForwardItem> items = {{.state = &g1, .tokens = {&t1, 1}, .want = Logits::kLast, .logits = &l1},
                                    {.state = &g0, .tokens = longp, .want = Logits::kLast, .logits = &l0},
                                    {.state = &g2, .tokens = {&t2, 1}, .want = Logits::kLast, .logits = &l2}};
  gpu().forward(items);
  SequenceState c0 = cpu().new_sequence(), c1 = cpu().new_sequence(), c2 = cpu().new_sequence();
  EXPECT_EQ(diff(l0, run(cpu(), c0, longp, Logits::kLast)).max_abs, 0.0);
  run(cpu(), c1, a, Logits::kNone);
  run(cpu(), c2, b2, Logits::kNone);
  EXPECT_EQ(diff(l1, run(cpu(), c1, {t1}, Logits::kLast)).max_abs, 0.0);
  EXPECT_EQ(diff(l2, run(cpu(), c2, {t2}, Logits::kLast)).max_abs, 0.0);
}

// The CPU reference's side of CudaVsCpuRealDims: ~90 s of the suite's ~130 on the GPU machine's 16
// cores. Computed here, or read back from $DSUF_TEST_CPU_CACHE/realdims.bin when that variable names
// a folder and the file was written by this very test binary (its size and modification time are the
// file's key; anything else — no file, another build, a short read — computes afresh and rewrites
// it), so that scripts/kernel-check.sh verify's runs of one binary under several kernel settings pay
// for it once. The CPU side never depends on the GPU's results: the decode steps feed the CPU's tokens.
struct RealDimsCpu {
  std::vector<std::vector<float>> traces;  // per layer, the prompt's residual streams
  std::vector<float> prefill;              // the prompt's last logits
  std::vector<std::vector<float>> decode;  // each decode step's logits
  std::vector<int32_t> tokens;             // each step's token: the argmax before it
  std::string state;                       // the packed KV state at the end
};
constexpr int kRealDimsSteps = 16;

std::string binary_key() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const auto size = fs::file_size(exe, ec);
  if (ec) return {};
  const auto mtime = fs::last_write_time(exe, ec).time_since_epoch().count();
  return exe.string() + ":" + std::to_string(size) + ":" + std::to_string(mtime);
}
template <typename T>
void put(std::string& out, const std::vector<T>& v) {
  const uint64_t n = v.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(reinterpret_cast<const char*>(v.data()), n * sizeof(T));
}
template <typename T>
bool get(const std::string& in, size_t& at, std::vector<T>& v) {
  uint64_t n = 0;
  if (in.size() - at < sizeof n) return false;
  std::memcpy(&n, in.data() + at, sizeof n);
  at += sizeof n;
  if ((in.size() - at) / sizeof(T) < n) return false;
  v.resize(n);
  std::memcpy(v.data(), in.data() + at, n * sizeof(T));
  at += n * sizeof(T);
  return true;
}
std::string encode(const std::string& key, const RealDimsCpu& r) {
  std::string out;
  put(out, std::vector<char>(key.begin(), key.end()));
  put(out, std::vector<uint64_t>{r.traces.size()});
  for (const auto& t : r.traces) put(out, t);
  put(out, r.prefill);
  put(out, std::vector<uint64_t>{r.decode.size()});
  for (const auto& d : r.decode) put(out, d);
  put(out, r.tokens);
  put(out, std::vector<char>(r.state.begin(), r.state.end()));
  return out;
}
bool decode(const std::string& in, const std::string& key, RealDimsCpu& r) {
  size_t at = 0;
  std::vector<char> k, st;
  std::vector<uint64_t> n;
  if (!get(in, at, k) || std::string(k.begin(), k.end()) != key || !get(in, at, n) || n.size() != 1) return false;
  r.traces.resize(n[0]);
  for (auto& t : r.traces)
    if (!get(in, at, t)) return false;
  if (!get(in, at, r.prefill) || !get(in, at, n) || n.size() != 1) return false;
  r.decode.resize(n[0]);
  for (auto& d : r.decode)
    if (!get(in, at, d)) return false;
  if (!get(in, at, r.tokens) || !get(in, at, st) || at != in.size()) return false;
  r.state.assign(st.begin(), st.end());
  return true;
}

RealDimsCpu real_dims_cpu(const LoadedModel& m, const std::vector<int32_t>& prompt) {
  namespace fs = std::filesystem;
  const char* dir = std::getenv("DSUF_TEST_CPU_CACHE");
  const std::string key = binary_key();
  const fs::path file = dir && *dir && !key.empty() ? fs::path(dir) / "realdims.bin" : fs::path();
  RealDimsCpu r;
  if (!file.empty() && fs::exists(file)) {
    std::ifstream f(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (decode(bytes, key, r)) {
      std::printf("real dims: the CPU side read from %s\n", file.c_str());
      return r;
    }
    r = {};
  }
  CpuBackend cpu_b(m, compressed_ids(), CpuNumerics{}, 0);
  SequenceState sc = cpu_b.new_sequence();
  r.prefill = run(cpu_b, sc, prompt, Logits::kLast, &r.traces);
  std::vector<float> lc = r.prefill;
  for (int step = 0; step < kRealDimsSteps; ++step) {
    r.tokens.push_back(argmax(lc));
    lc = run(cpu_b, sc, {r.tokens.back()}, Logits::kLast);
    r.decode.push_back(lc);
  }
  r.state = sc.serialize(cpu_b.layout());
  if (!file.empty()) {  // written whole, then renamed: a concurrent run reads all of it or none
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    const fs::path tmp = file.string() + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      const std::string bytes = encode(key, r);
      f.write(bytes.data(), std::streamsize(bytes.size()));
    }
    fs::rename(tmp, file, ec);
  }
  return r;
}

TEST(CudaVsCpuRealDims, PrefillChunksAndDecodeBitIdentical) {
  const LoadedModel& m = real_dims_model();
  // 150 prompt tokens cross the 128-token window; ratio-2 entries (75) exceed index_topk (64); the
  // ratio-1 entries exceed the candidate blocks (4 × 8). The GPU takes the prompt in chunks of 64.
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> id(3, int32_t(m.config.text.vocab_size) - 1);
  std::vector<int32_t> prompt(150);
  for (auto& t : prompt) t = id(rng);
  prompt[40] = prompt[41] = m.config.image_token_id;
  const RealDimsCpu ref = real_dims_cpu(m, prompt);
  CudaBackend gpu_b(m, compressed_ids(), CudaOptions{.max_context = 512, .max_chunk = 64, .numerics = {}});
  SequenceState sg = gpu_b.new_sequence();
  std::vector<std::vector<float>> tg;
  std::vector<float> lg = run(gpu_b, sg, prompt, Logits::kLast, &tg);
  // The GPU traced each 64-token chunk separately: join the chunks layer by layer.
  const size_t L = ref.traces.size();
  ASSERT_GT(L, 0u);
  ASSERT_EQ(tg.size() % L, 0u);
  std::vector<std::vector<float>> joined(L);
  for (size_t i = 0; i < tg.size(); ++i) joined[i % L].insert(joined[i % L].end(), tg[i].begin(), tg[i].end());
  tg = std::move(joined);
  ASSERT_EQ(tg[0].size(), ref.traces[0].size());
  size_t layers_equal = 0;
  for (size_t l = 0; l < L; ++l) {
    Diff d = diff(tg[l], ref.traces[l]);
    std::printf("real dims, layer %zu: max |diff| %.3g (ref rms %.3g)\n", l, d.max_abs, d.ref_rms);
    layers_equal += d.max_abs == 0;
  }
  EXPECT_EQ(layers_equal, L);
  EXPECT_EQ(diff(lg, ref.prefill).max_abs, 0.0);
  ASSERT_EQ(ref.decode.size(), size_t(kRealDimsSteps));
  std::vector<int32_t> toks_g;
  for (int step = 0; step < kRealDimsSteps; ++step) {
    toks_g.push_back(argmax(lg));
    lg = run(gpu_b, sg, {ref.tokens[step]}, Logits::kLast);
    EXPECT_EQ(diff(lg, ref.decode[step]).max_abs, 0.0) << "decode step " << step;
  }
  EXPECT_EQ(toks_g, ref.tokens);
  gpu_b.download(sg);
  EXPECT_EQ(sg.serialize(gpu_b.layout()), ref.state);
}

TEST(CudaLongContext, SyntheticStateDecodeEqualsCpu) {
  // Long rows, which the prompts above (a few hundred tokens) never reach: the tiny model at
  // 131072 positions (tiny-long) continues two sequences of synthetic packed KV state
  // (CudaBackend::synthetic_sequence) downloaded to the host, on the GPU and on the CPU reference
  // from the same bytes. A holds 120001 tokens (odd: the ratio-2 compressor has one token
  // buffered); B holds 130814, so that its four decode rows have 130815..130818 ratio-1 entries
  // (every row length mod 4 of the top-k's float4 loads, across the 128-entry tile boundary at
  // 130816) and 65407..65409 ratio-2 entries (across 65408). Four decode steps run both sequences
  // in one graph-captured step (2 rows); then a 24-token chunk of each in one step (48 rows),
  // where the indexer-score grid (about 4096 blocks over the rows) is smaller than a row's tiles
  // of 128 entries, so each block loops over several tiles. Logits (every row of the chunks) and
  // the packed state must be bit-identical. The CPU side's forwards take ~3.5 s in all (measured
  // on 2 cores from a host-made state of the same shape: 0.09-0.13 s per decode row, 1.3 s per
  // 24-token chunk with every row's logits), plus ~2 s to write the checkpoint the first time.
  const LoadedModel& m = testing::tiny_long_model();
  const ModelConfig& cfg = m.config;
  ASSERT_GE(cfg.text.max_position_embeddings, 131072);
  CpuBackend cpu_b(m, compressed_ids(), CpuNumerics{}, 0);
  CudaBackend gpu_b(m, compressed_ids(),
                    CudaOptions{.max_context = 131072, .max_chunk = 64, .numerics = {}, .max_batch = 2, .devices = {}});
  const KvLayout& L = gpu_b.layout();
  ASSERT_EQ(L.fingerprint, cpu_b.layout().fingerprint);
  const std::vector<int64_t> start = {120001, 130814};
  const size_t B = start.size();
  std::vector<SequenceState> sg, sc;
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (size_t b = 0; b < B; ++b) {
    SequenceState s = gpu_b.synthetic_sequence(start[b], 31 + b);
    gpu_b.download(s);
    // Every stored value must decode to a finite number (the FP4 codes always do; the scales and
    // the window's E4M3 codes are checked), so the reference runs on a state it could hold.
    size_t bad = 0;
    for (const auto& w : s.window)
      for (size_t i = 0; i < w.size(); ++i) {
        const size_t j = i % L.window_entry_bytes;
        bad += !std::isfinite(j < size_t(L.head_dim) ? e4m3_to_float(w[i]) : e8m0_to_float(w[i]));
      }
    for (size_t k = 0; k < L.kv_sources.size(); ++k) {
      ASSERT_EQ(s.entries(L, int(k)), start[b] / L.source_ratio[k]);
      for (size_t i = 0; i < s.ckv[k].size(); ++i)
        bad += i % L.ckv_entry_bytes >= size_t(L.head_dim / 2) && !std::isfinite(e4m3_to_float(s.ckv[k][i]));
      for (size_t i = 0; i < s.ikey[k].size(); ++i)
        bad += i % L.ikey_entry_bytes >= size_t(L.index_head_dim / 2) && !std::isfinite(e8m0_to_float(s.ikey[k][i]));
      // The compressor's buffered a‖g (synthetic_sequence leaves zeros): random finite values.
      for (float& v : s.pending[k]) v = uni(rng);
    }
    ASSERT_EQ(bad, 0u) << "synthetic state of sequence " << b << " holds non-finite values";
    const std::string bytes = s.serialize(L);
    sg.push_back(SequenceState::deserialize(L, bytes));  // uploaded again from the host pools
    sc.push_back(SequenceState::deserialize(cpu_b.layout(), bytes));
  }
  // The rows each index source scored: (pos + 1) / ratio compressed entries per query row.
  auto report_rows = [&](const char* what, size_t b, int64_t first, int64_t last) {
    for (const LayerPlan& lp : cfg.layers) {
      if (!lp.runs_indexer) continue;
      std::printf("  %s, sequence %zu: index source layer %d (KV source %d, ratio %d) scored rows of %lld..%lld entries%s\n",
                  what, b, lp.layer, lp.kv_source, lp.ratio, static_cast<long long>((first + 1) / lp.ratio),
                  static_cast<long long>((last + 1) / lp.ratio),
                  lp.candidate_constrained ? " (inside the candidate blocks; the rest -inf)" : "");
    }
  };

  std::vector<std::vector<float>> lg(B), lc(B);
  std::vector<int32_t> next = {4321, 98765};  // fresh ids, then the reference's greedy tokens
  double worst = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<ForwardItem> items;
    for (size_t b = 0; b < B; ++b)
      items.push_back({.state = &sg[b], .tokens = {&next[b], 1}, .want = Logits::kLast, .logits = &lg[b]});
    gpu_b.forward(items);
    for (size_t b = 0; b < B; ++b) {
      if (step == 0) report_rows("decode", b, sc[b].pos, sc[b].pos + 3);
      lc[b] = run(cpu_b, sc[b], {next[b]}, Logits::kLast);
      const Diff d = diff(lg[b], lc[b]);
      std::printf("long context decode step %d, sequence %zu (position %lld): max |diff| %.4g (ref rms %.3g)\n", step, b,
                  static_cast<long long>(sc[b].pos - 1), d.max_abs, d.ref_rms);
      EXPECT_EQ(d.max_abs, 0.0) << "decode step " << step << " sequence " << b;
      EXPECT_EQ(argmax(lg[b]), argmax(lc[b])) << "decode step " << step << " sequence " << b;
      worst = std::max(worst, d.max_abs);
      next[b] = argmax(lc[b]);
    }
  }
  std::printf("long context: 4 decode steps x %zu sequences, worst max |diff| %.4g (last step graph %.3f ms)\n", B,
              worst, gpu_b.last_graph_ms());

  std::vector<std::vector<int32_t>> chunk = {random_prompt(24, 71, false), random_prompt(24, 72, false)};
  std::vector<ForwardItem> items;
  for (size_t b = 0; b < B; ++b)
    items.push_back({.state = &sg[b], .tokens = chunk[b], .want = Logits::kAll, .logits = &lg[b]});
  gpu_b.forward(items);  // 48 rows in one step (max_chunk 64)
  for (size_t b = 0; b < B; ++b) {
    report_rows("chunk", b, sc[b].pos, sc[b].pos + int64_t(chunk[b].size()) - 1);
    lc[b] = run(cpu_b, sc[b], chunk[b], Logits::kAll);
    const Diff d = diff(lg[b], lc[b]);
    std::printf("long context %zu-token chunk, sequence %zu: max |diff| %.4g over every row's logits\n",
                chunk[b].size(), b, d.max_abs);
    EXPECT_EQ(d.max_abs, 0.0) << "chunk of sequence " << b;
    gpu_b.download(sg[b]);
    // Compared as a bool: the states are ~25 MB, too long for gtest to print.
    EXPECT_TRUE(sg[b].serialize(L) == sc[b].serialize(cpu_b.layout())) << "packed state of sequence " << b;
  }
}

TEST(CudaMemoryPlan, RefusesWithNumbers) {
  const LoadedModel& m = real_dims_model();
  CudaMemoryPlan p = plan_cuda_memory(m, CudaOptions{.max_context = 1 << 20, .max_chunk = 512, .numerics = {}, .max_batch = 64});
  std::printf("plan at 1M context x 64: %s\n", p.describe().c_str());
  EXPECT_GT(p.weights, size_t(1) << 30);
  try {
    CudaBackend b(m, compressed_ids(), CudaOptions{.max_context = int64_t(1) << 24, .max_chunk = 512, .numerics = {}, .max_batch = 4096});
    ADD_FAILURE() << "a plan far beyond the GPU was accepted";
  } catch (const Error& e) {
    std::printf("refusal: %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("GiB"), std::string::npos);
  }
}

}  // namespace
}  // namespace dsuf
