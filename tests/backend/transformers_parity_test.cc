// Parity of the CPU reference with an implementation nobody here wrote: transformers' deepseek_v41
// (pinned commit; see tests/fixtures/transformers_v41/README.md and docs/transformers-v41.md), run on
// the tiny checkpoint (`dsuf make-tiny --seed 1`) in FP32. The reference runs in its
// "transformers" numerics (FP32 activations, no FP8 activation quantization, clamped shared expert):
//   fixture.json          transformers as written (cache fake-quant on)  — our kv_quant on
//   fixture_noquant.json  its cache fake-quant replaced by the identity  — our kv_quant off
// Checks: the logits of every stored row within a stated bound, the argmax at every stored row, and
// the 64 greedy decode tokens (teacher-forced with the fixture's tokens) identical.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "tiny_fixture.h"

namespace dsuf {
namespace {

using nlohmann::json;
using Logits = ForwardItem::Logits;

struct Fixture {
  json meta;
  std::vector<float> logits;  // rows × vocab
  size_t vocab = 0;
};

Fixture load(const std::string& name) {
  const std::string dir = testing::source_dir() + "/tests/fixtures/transformers_v41/";
  Fixture f;
  std::ifstream(dir + name) >> f.meta;
  const json& lf = f.meta["logits_file"];
  f.vocab = lf["vocab"].get<size_t>();
  f.logits.resize(lf["rows"].get<size_t>() * f.vocab);
  std::ifstream in(dir + lf["name"].get<std::string>(), std::ios::binary);
  in.read(reinterpret_cast<char*>(f.logits.data()), f.logits.size() * 4);
  EXPECT_TRUE(in.good()) << "cannot read " << lf["name"];
  return f;
}

struct Result {
  double max_abs = 0;       // over the rows stored in full
  double max_abs_first4 = 0;  // over the first four stored rows (positions 0–109)
  int argmax_checked = 0, argmax_equal = 0;
  int greedy_equal = 0, greedy_steps = 0;
};

Result compare(const Fixture& f, bool kv_quant) {
  CpuNumerics num = transformers_numerics();
  num.kv_quant = kv_quant;
  CpuBackend b(testing::tiny_model(), testing::compressed_ids(), num, 2);
  const json& m = f.meta;
  std::vector<int32_t> prompt = m["prompt"]["ids"].get<std::vector<int32_t>>();
  // Stored rows by position.
  std::map<int64_t, size_t> stored;
  const json& order = m["logits_file"]["row_order"];
  for (size_t r = 0; r < order.size(); ++r) stored[order[r]["pos"].get<int64_t>()] = r;
  Result res;
  auto check_row = [&](int64_t pos, const std::vector<float>& logits, int32_t want_argmax) {
    ++res.argmax_checked;
    res.argmax_equal += argmax(logits) == want_argmax;
    auto it = stored.find(pos);
    if (it == stored.end()) return;
    const float* ref = f.logits.data() + it->second * f.vocab;
    double row_max = 0;
    for (size_t v = 0; v < f.vocab; ++v) row_max = std::max(row_max, double(std::fabs(logits[v] - ref[v])));
    res.max_abs = std::max(res.max_abs, row_max);
    if (it->second < 4) res.max_abs_first4 = std::max(res.max_abs_first4, row_max);
    if (std::getenv("DSUF_PARITY_VERBOSE")) std::printf("  pos %lld: max |diff| %.3g\n", (long long)pos, row_max);
  };
  // Prefill in chunks that end on the stored prefill rows (chunking is exact in the reference).
  SequenceState st = b.new_sequence();
  std::vector<float> logits;
  size_t done = 0;
  for (const json& row : m["prefill"]) {
    const int64_t pos = row["pos"].get<int64_t>();
    if (!stored.count(pos)) continue;
    std::vector<int32_t> chunk(prompt.begin() + done, prompt.begin() + pos + 1);
    ForwardItem item{.state = &st, .tokens = chunk, .want = Logits::kLast, .logits = &logits};
    b.forward({&item, 1});
    done = pos + 1;
    check_row(pos, logits, row["argmax"].get<int32_t>());
  }
  EXPECT_EQ(done, prompt.size());
  // Decode: feed the fixture's tokens, compare every step.
  for (const json& step : m["decode"]) {
    int32_t tok = step["input_token"].get<int32_t>();
    ForwardItem item{.state = &st, .tokens = {&tok, 1}, .want = Logits::kLast, .logits = &logits};
    b.forward({&item, 1});
    ++res.greedy_steps;
    const bool same = argmax(logits) == step["argmax"].get<int32_t>();
    res.greedy_equal += same;
    if (!same)
      std::printf("  decode step %d: argmax %d vs transformers %d (its top-1/top-2 gap %.3g)\n", res.greedy_steps - 1,
                  argmax(logits), step["argmax"].get<int32_t>(), step["gap"].get<double>());
    check_row(step["pos"].get<int64_t>(), logits, step["argmax"].get<int32_t>());
  }
  std::printf("%s: max |logit diff| over %zu stored rows %.3g (the first four %.3g; max |logit| %.3g); argmax "
              "equal %d/%d; greedy %d/%d\n",
              kv_quant ? "cache fake-quant on " : "cache fake-quant off", stored.size(), res.max_abs,
              res.max_abs_first4, m["max_abs_logit"].get<double>(), res.argmax_equal, res.argmax_checked,
              res.greedy_equal, res.greedy_steps);
  return res;
}

TEST(TransformersParity, TightMatchWithoutCacheQuantization) {
  Fixture f = load("fixture_noquant.json");
  Result r = compare(f, /*kv_quant=*/false);
  // Both sides are FP32 with identical weights; only summation order and libm differ (≈1e-6
  // relative per op), amplified through 8 layers: well under the smallest top-1/top-2 gap.
  EXPECT_LT(r.max_abs, 2e-3);
  EXPECT_EQ(r.argmax_equal, r.argmax_checked);
  EXPECT_EQ(r.greedy_equal, 64);
}

TEST(TransformersParity, WithCacheQuantization) {
  Fixture f = load("fixture.json");
  Result r = compare(f, /*kv_quant=*/true);
  // The quantizers agree exactly: the stored rows up to position 109 match as tightly as without
  // them. Later, an FP32 ULP difference (summation order, libm) that lands on a rounding boundary of
  // an FP8/FP4 fake-quant flips one code, and that whole quantization step spreads (transformers'
  // own recompute of this prefill differs from its first run by 5e-3 for the same reason,
  // fixture.json "recompute_check"). Measured: max 0.41 at one decode row, 62 of 64 greedy argmaxes
  // equal (steps 33 and 39 differ; transformers' top-1/top-2 gaps there are 0.027 and 0.38, inside
  // the spread). The first stored rows stay within 1e-4 with the first summation orders; with the
  // GPU-friendly orders adopted for decode speed (sequential FP4 block sums, 1024-wide mHC sums;
  // docs/numerics.md) an FP8 boundary flip lands earlier: 2.9e-4 (printed as "the first four"),
  // below transformers' own recompute difference (5e-3). The tight test above keeps 1.3e-5.
  EXPECT_LT(r.max_abs_first4, 1e-2);
  EXPECT_LT(r.max_abs, 0.5);
  EXPECT_GE(r.greedy_equal, 60);
}

}  // namespace
}  // namespace dsuf
