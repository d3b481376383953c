// Self-consistency of the CPU reference on the tiny checkpoint: chunked prefill, decode, batches and
// state serialization must reproduce one-shot prefill exactly (the reference's arithmetic for a
// token does not depend on how the sequence was cut), and the logits must not be degenerate.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "tiny_fixture.h"

namespace dsuf {
namespace {

using testing::compressed_ids;
using testing::random_prompt;
using testing::tiny_model;
using Logits = ForwardItem::Logits;

CpuBackend& backend() {
  static CpuBackend b(tiny_model(), compressed_ids(), CpuNumerics{}, 2);
  return b;
}

std::vector<float> prefill_chunked(SequenceState& st, const std::vector<int32_t>& tokens,
                                   const std::vector<int>& sizes) {
  return testing::prefill_chunked(backend(), st, tokens, sizes);
}

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  std::string state;
};
const Reference& one_shot() {
  static Reference r = [] {
    Reference r;
    r.tokens = random_prompt(160, 42);
    SequenceState st = backend().new_sequence();
    r.logits = prefill_chunked(st, r.tokens, {static_cast<int>(r.tokens.size())});
    r.state = st.serialize(backend().layout());
    return r;
  }();
  return r;
}

void expect_same_logits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  EXPECT_EQ(diff, 0u) << "logits differ at " << diff << " of " << a.size() << " entries";
}

class ChunkedPrefill : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(ChunkedPrefill, EqualsOneShot) {
  const Reference& ref = one_shot();
  SequenceState st = backend().new_sequence();
  std::vector<float> logits = prefill_chunked(st, ref.tokens, GetParam());
  expect_same_logits(logits, ref.logits);
  EXPECT_EQ(st.serialize(backend().layout()), ref.state) << "sequence state differs";
}

INSTANTIATE_TEST_SUITE_P(Sizes, ChunkedPrefill,
                         ::testing::Values(std::vector<int>{1}, std::vector<int>{3}, std::vector<int>{7},
                                           std::vector<int>{64}, std::vector<int>{5, 1, 16, 2, 33, 9, 17}));

TEST(Decode, AfterPrefillEqualsLongerPrefill) {
  const Reference& ref = one_shot();
  const size_t n0 = 100;
  std::vector<int32_t> head(ref.tokens.begin(), ref.tokens.begin() + n0);
  SequenceState st = backend().new_sequence();
  prefill_chunked(st, head, {static_cast<int>(n0)});
  std::vector<float> logits;
  for (size_t i = n0; i < ref.tokens.size(); ++i) {
    ForwardItem item{.state = &st, .tokens = {&ref.tokens[i], 1}, .want = Logits::kLast, .logits = &logits};
    backend().forward({&item, 1});
  }
  expect_same_logits(logits, ref.logits);
  EXPECT_EQ(st.serialize(backend().layout()), ref.state);
}

TEST(Decode, AllPositionLogitsMatchLastPositionLogits) {
  // kAll returns one row per token; its rows must equal the kLast logits of prefixes.
  std::vector<int32_t> toks = random_prompt(24, 9, false);
  SequenceState st = backend().new_sequence();
  std::vector<float> all;
  ForwardItem item{.state = &st, .tokens = toks, .want = Logits::kAll, .logits = &all};
  backend().forward({&item, 1});
  const size_t V = tiny_model().config.text.vocab_size;
  ASSERT_EQ(all.size(), toks.size() * V);
  for (size_t n : {1u, 13u, 24u}) {
    SequenceState s2 = backend().new_sequence();
    std::vector<int32_t> prefix(toks.begin(), toks.begin() + n);
    std::vector<float> last = prefill_chunked(s2, prefix, {static_cast<int>(n)});
    std::vector<float> row(all.begin() + (n - 1) * V, all.begin() + n * V);
    expect_same_logits(row, last);
  }
}

TEST(Batch, EqualsSequencesRunAlone) {
  std::vector<std::vector<int32_t>> seqs = {random_prompt(37, 1), random_prompt(5, 2, false), random_prompt(61, 3)};
  std::vector<SequenceState> states;
  std::vector<std::vector<float>> logits(seqs.size());
  std::vector<ForwardItem> items;
  for (size_t i = 0; i < seqs.size(); ++i) states.push_back(backend().new_sequence());
  for (size_t i = 0; i < seqs.size(); ++i)
    items.push_back({.state = &states[i], .tokens = seqs[i], .want = Logits::kLast, .logits = &logits[i]});
  backend().forward(items);
  for (size_t i = 0; i < seqs.size(); ++i) {
    SequenceState alone = backend().new_sequence();
    expect_same_logits(prefill_chunked(alone, seqs[i], {static_cast<int>(seqs[i].size())}), logits[i]);
    EXPECT_EQ(alone.serialize(backend().layout()), states[i].serialize(backend().layout()));
  }
}

TEST(State, SerializeDeserializeContinuesIdentically) {
  const Reference& ref = one_shot();
  const KvLayout& L = backend().layout();
  SequenceState a = SequenceState::deserialize(L, ref.state);
  EXPECT_EQ(a.pos, static_cast<int64_t>(ref.tokens.size()));
  SequenceState b = SequenceState::deserialize(L, a.serialize(L));
  std::vector<int32_t> more = random_prompt(12, 77, false);
  std::vector<float> la, lb;
  for (int32_t t : more) {
    ForwardItem ia{.state = &a, .tokens = {&t, 1}, .want = Logits::kLast, .logits = &la};
    ForwardItem ib{.state = &b, .tokens = {&t, 1}, .want = Logits::kLast, .logits = &lb};
    backend().forward({&ia, 1});
    backend().forward({&ib, 1});
    expect_same_logits(la, lb);
  }
}

TEST(State, DeserializeRejectsDamage) {
  const std::string& good = one_shot().state;
  const KvLayout& L = backend().layout();
  auto expect_error = [&](const std::string& bytes, const std::string& needle) {
    try {
      SequenceState::deserialize(L, bytes);
      ADD_FAILURE() << "accepted damaged state (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(good.substr(0, good.size() / 2), "truncated");
  expect_error(good + "x", "trailing");
  std::string bad = good;
  bad[0] = 'X';
  expect_error(bad, "magic");
  bad = good;
  bad[8] = 9;  // version
  expect_error(bad, "version");
  bad = good;
  bad[16] ^= 1;  // fingerprint
  expect_error(bad, "layout");
  bad = good;
  bad[24] ^= 1;  // position: pool sizes no longer agree
  expect_error(bad, "sequence state");
}

TEST(State, StoresThePackedLayout) {
  const Reference& ref = one_shot();
  SequenceState st = SequenceState::deserialize(backend().layout(), ref.state);
  const KvLayout& L = backend().layout();
  const int64_t n = static_cast<int64_t>(ref.tokens.size());
  ASSERT_EQ(L.kv_sources, (std::vector<int>{2, 4}));
  EXPECT_EQ(st.entries(L, 0), n / 2);  // ratio 2
  EXPECT_EQ(st.entries(L, 1), n);      // ratio 1
  EXPECT_EQ(st.ckv[0].size(), size_t(n / 2) * (128 / 2 + 128 / 16));
  EXPECT_EQ(st.ikey[1].size(), size_t(n) * (128 / 2 + 128 / 32));
  EXPECT_EQ(st.pending[0].size(), 0u);  // 160 is even: no half-filled ratio-2 group
  EXPECT_EQ(L.bytes_for(n), [&] {
    size_t b = 0;
    for (auto& w : st.window) b += w.size();
    for (size_t s = 0; s < st.ckv.size(); ++s) b += st.ckv[s].size() + st.ikey[s].size();
    return b + size_t(1) * 2 * 128 * 4;  // bytes_for counts the worst-case pending token
  }());
}

TEST(Logits, AreNotDegenerate) {
  const Reference& ref = one_shot();
  const std::vector<float>& l = ref.logits;
  double mean = std::accumulate(l.begin(), l.end(), 0.0) / l.size(), var = 0;
  for (float x : l) {
    ASSERT_TRUE(std::isfinite(x));
    var += (x - mean) * (x - mean);
  }
  const double sd = std::sqrt(var / l.size());
  EXPECT_GT(sd, 0.5);
  EXPECT_LT(sd, 20.0);
  // The distribution is neither one-hot nor flat.
  const float mx = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (float x : l) z += std::exp(x - mx);
  EXPECT_LT(1.0 / z, 0.95);
  EXPECT_GT(1.0 / z, 50.0 / l.size());
}

TEST(Generate, GreedyIsDeterministicAndVaried) {
  std::vector<int32_t> prompt = random_prompt(200, 5);
  auto generate = [&] {
    SequenceState st = backend().new_sequence();
    std::vector<float> logits = prefill_chunked(st, prompt, {200});
    std::vector<int32_t> out;
    for (int step = 0; step < 64; ++step) {
      int32_t t = argmax(logits);
      out.push_back(t);
      ForwardItem item{.state = &st, .tokens = {&t, 1}, .want = Logits::kLast, .logits = &logits};
      backend().forward({&item, 1});
    }
    return out;
  };
  std::vector<int32_t> a = generate(), b = generate();
  EXPECT_EQ(a, b);
  std::vector<int32_t> distinct = a;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_GT(distinct.size(), 8u) << "greedy decode collapsed onto few tokens";
}

TEST(Numerics, QuantizationChangesLogitsButLittle) {
  // The parity switches change the numbers (so they are wired) but not the model.
  CpuBackend plain(tiny_model(), compressed_ids(), transformers_numerics(), 2);
  const Reference& ref = one_shot();
  SequenceState st = plain.new_sequence();
  std::vector<float> logits;
  ForwardItem item{.state = &st, .tokens = ref.tokens, .want = Logits::kLast, .logits = &logits};
  plain.forward({&item, 1});
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(logits[i] - ref.logits[i])));
    max_abs = std::max(max_abs, double(std::fabs(ref.logits[i])));
  }
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LT(max_diff, 0.5 * max_abs);
}

TEST(Sampling, TheBackendsTokenIsTheSharedSamplersOnItsLogits) {
  // With logits and a token, the token is sample_token() on those logits; with the token alone the
  // same token comes back (the engine's path); a token without logits rows is refused.
  const SamplingParams p{.temperature = 0.9f, .top_p = 0.95f, .top_k = 0, .seed = 17};
  const std::vector<int32_t> prompt = random_prompt(19, 71);
  SequenceState a = backend().new_sequence(), b = backend().new_sequence();
  std::vector<float> la;
  int32_t ta = -1, tb = -1, fed = 0;
  for (int step = 0; step < 4; ++step) {
    const std::span<const int32_t> toks =
        step == 0 ? std::span<const int32_t>(prompt) : std::span<const int32_t>(&fed, 1);
    ForwardItem ia{.state = &a, .tokens = toks, .want = Logits::kLast, .logits = &la, .sampling = p,
                   .draw = uint64_t(step), .token = &ta};
    ForwardItem ib{.state = &b, .tokens = toks, .want = Logits::kLast, .sampling = p, .draw = uint64_t(step),
                   .token = &tb};
    backend().forward({&ia, 1});
    backend().forward({&ib, 1});
    EXPECT_EQ(ta, sample_token(la, p, uint64_t(step))) << "step " << step;
    EXPECT_EQ(tb, ta) << "step " << step;
    fed = ta;
  }
  SequenceState c = backend().new_sequence();
  int32_t tc = -1;
  ForwardItem none{.state = &c, .tokens = prompt, .want = Logits::kNone, .token = &tc};
  EXPECT_THROW(backend().forward({&none, 1}), Error);
}

TEST(Errors, TokenOutsideVocabulary) {
  SequenceState st = backend().new_sequence();
  std::vector<int32_t> bad = {5, 200000};
  ForwardItem item{.state = &st, .tokens = bad, .want = Logits::kNone};
  EXPECT_THROW(backend().forward({&item, 1}), Error);
}

}  // namespace
}  // namespace dsuf
