// The shared sampler (core/sampling.h): greedy and its ties, the edge cases of temperature, top-k
// and top-p, the radix-select implementation against a sort-based statement of the definition, the
// integer helpers against 128-bit arithmetic, determinism of the counter-based stream, and the
// distribution against the exact probabilities with a chi-square bound.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/sampling.h"
#include "engine/sampler.h"

namespace dsuf {
namespace {

namespace smp = sampling;
using u128 = unsigned __int128;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> logits_peaked() {
  return {0.1f, 2.0f, 1.9f, -3.0f, 1.8f, 0.0f};
}

// The definition stated with a full sort and 128-bit arithmetic, nothing shared with the
// implementation beyond the per-element key and weight and the random stream.
int32_t by_sorting(const std::vector<float>& x, const SamplingParams& p, uint64_t draw) {
  const int64_t n = int64_t(x.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return smp::key(x[a]) > smp::key(x[b]); });
  const uint32_t max_key = smp::key(x[order[0]]);
  if (smp::is_greedy(p, max_key)) return int32_t(order[0]);
  const float m = smp::key_value(max_key);
  std::vector<uint64_t> q(n);
  for (int64_t i = 0; i < n; ++i) q[i] = smp::fixed_weight(smp::weight(x[i], m, p.temperature));
  const int64_t c = p.top_k > 0 && p.top_k < n ? p.top_k : n;
  u128 total = 0;
  for (int64_t j = 0; j < c; ++j) total += q[order[j]];
  int64_t kept = c;
  if (p.top_p < 1.0f) {
    const uint64_t p30 = uint64_t(std::ceil(double(p.top_p) * 1073741824.0));
    const u128 target = (total * p30 + ((u128(1) << 30) - 1)) >> 30;
    u128 acc = 0;
    for (kept = 0; kept < c;) {
      acc += q[order[kept++]];
      if (acc >= target) break;
    }
  }
  std::vector<bool> in(n, false);
  u128 mass = 0;
  for (int64_t j = 0; j < kept; ++j) in[order[j]] = true, mass += q[order[j]];
  const u128 u = (u128(smp::random64(p.seed, draw)) * mass) >> 64;
  u128 acc = 0;
  for (int64_t i = 0; i < n; ++i)
    if (in[i] && (acc += q[i]) > u) return int32_t(i);
  return -1;
}

TEST(Sampler, GreedyIsArgmaxLowestIndexOnTies) {
  EXPECT_EQ(argmax(std::vector<float>{1, 3, 3, 2}), 1);
  Sampler s({.temperature = 0});
  EXPECT_EQ(s.sample(logits_peaked()), 1);
  EXPECT_EQ(argmax(std::vector<float>{-1, -0.0f, 0.0f, -2}), 1);  // −0 ties +0: the lower index
  EXPECT_EQ(argmax(std::vector<float>{-1, 0.0f, -0.0f, -2}), 1);
  EXPECT_EQ(argmax(std::vector<float>{kNaN, -5, kNaN, -4}), 3);  // NaN is never the largest
  EXPECT_EQ(argmax(std::vector<float>{kNaN, kNaN}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, -kInf, -kInf}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, kNaN, -kInf}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, -3e38f, kNaN}), 1);
}

TEST(Sampler, GreedyCasesIgnoreTheSeed) {
  const std::vector<float> x = {0.5f, 4.0f, 4.0f, -1.0f};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    EXPECT_EQ(sample_token(x, {.temperature = 0.0f, .seed = seed}, seed), 1);
    EXPECT_EQ(sample_token(x, {.temperature = 2.0f, .top_k = 1, .seed = seed}, seed), 1);
    EXPECT_EQ(sample_token(x, {.temperature = -1.0f, .seed = seed}, seed), 1);
    EXPECT_EQ(sample_token(x, {.temperature = kNaN, .seed = seed}, seed), 1);
    // A +inf logit makes the row greedy: the first +inf.
    EXPECT_EQ(sample_token(std::vector<float>{1.0f, kInf, 3.0f, kInf},
                           {.temperature = 1.0f, .seed = seed}, seed),
              1);
    // Nothing finite: the first index.
    EXPECT_EQ(sample_token(std::vector<float>{-kInf, kNaN, -kInf},
                           {.temperature = 1.0f, .seed = seed}, seed),
              0);
  }
}

TEST(Sampler, SameSeedAndDrawSameToken) {
  auto draws = [](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .seed = seed});
    std::vector<int32_t> v;
    for (int i = 0; i < 64; ++i) v.push_back(s.sample(logits_peaked()));
    return v;
  };
  EXPECT_EQ(draws(7), draws(7));
  EXPECT_NE(draws(7), draws(8));  // 64 draws over 3 likely tokens: equal only by a 1e-20 fluke
  // Counter-based: draw d of a stream is sample_token(…, d), whatever came before.
  const auto v = draws(7);
  for (int d = 63; d >= 0; --d)
    EXPECT_EQ(sample_token(logits_peaked(), {.temperature = 1.0f, .seed = 7}, uint64_t(d)), v[d]);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  Sampler k1({.temperature = 5.0f, .top_k = 1, .seed = 3});
  Sampler p0({.temperature = 5.0f, .top_p = 1e-6f, .seed = 3});
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(k1.sample(logits_peaked()), 1);
    EXPECT_EQ(p0.sample(logits_peaked()), 1);
  }
}

std::map<int32_t, int> histogram(const std::vector<float>& x, SamplingParams p, int n) {
  std::map<int32_t, int> seen;
  for (int i = 0; i < n; ++i) {
    p.seed = uint64_t(i) * 2654435761u;
    ++seen[sample_token(x, p, uint64_t(i % 3))];
  }
  return seen;
}

TEST(Sampler, TopKKeepsTheFirstKOfTheOrderTiesByIndex) {
  auto seen = histogram(logits_peaked(), {.temperature = 1.0f, .top_k = 2}, 400);
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[2], 100);
  // Ties at the cut: of the three 2s only the two lower indices are candidates.
  seen = histogram({1, 3, 2, 2, 2, 0}, {.temperature = 1.0f, .top_k = 3}, 3000);
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_GT(seen[3], 0);
  EXPECT_EQ(seen.count(4), 0u);
  // top_k ≥ V is off.
  EXPECT_EQ(histogram({1, 1, 1}, {.temperature = 1.0f, .top_k = 3}, 600).size(), 3u);
  EXPECT_EQ(histogram({1, 1, 1}, {.temperature = 1.0f, .top_k = 50}, 600).size(), 3u);
}

TEST(Sampler, TopPKeepsTheShortestPrefixReachingIt) {
  // Probabilities 0.5, 0.3, 0.2 (as logits); the nucleus at top_p: 0.45 → {0}, 0.75 → {0, 1}, 0.85
  // → all.
  const std::vector<float> x = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  auto keys = [&](float top_p) {
    std::set<int32_t> s;
    for (auto [t, c] : histogram(x, {.temperature = 1.0f, .top_p = top_p}, 2000)) s.insert(t);
    return s;
  };
  EXPECT_EQ(keys(0.45f), (std::set<int32_t>{0}));
  EXPECT_EQ(keys(0.75f), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(keys(0.85f), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(keys(1.0f), (std::set<int32_t>{0, 1, 2}));
  // The order is the logits' (index order among ties): with four equal logits, top_p 0.5 keeps the
  // first two.
  std::set<int32_t> s;
  for (auto [t, c] : histogram({2, 2, 2, 2}, {.temperature = 0.7f, .top_p = 0.5f}, 2000))
    s.insert(t);
  EXPECT_EQ(s, (std::set<int32_t>{0, 1}));
}

TEST(Sampler, TemperatureExtremes) {
  // Tiny temperature: only the tied maxima carry weight, each about a third of the draws.
  auto seen = histogram({5, 1, 5, 5, 4.99f}, {.temperature = 1e-4f}, 3000);
  EXPECT_EQ(seen.size(), 3u);
  for (int32_t t : {0, 2, 3}) EXPECT_GT(seen[t], 800) << t;
  // Huge temperature: close to uniform.
  seen = histogram({5, 1, -3, 0}, {.temperature = 1e6f}, 4000);
  EXPECT_EQ(seen.size(), 4u);
  for (auto [t, c] : seen) EXPECT_NEAR(c, 1000, 200) << t;
  // NaN and −inf logits are never drawn.
  seen = histogram({kNaN, 0.0f, -kInf, 0.5f, kNaN}, {.temperature = 1.0f}, 2000);
  EXPECT_EQ(seen.count(0) + seen.count(2) + seen.count(4), 0u);
  EXPECT_EQ(seen.size(), 2u);
}

TEST(Sampler, IntegerHelpersAgainst128BitArithmetic) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t a = rng() >> (rng() % 64), b = rng() >> (rng() % 64);
    ASSERT_EQ(smp::mulhi64(a, b), uint64_t((u128(a) * b) >> 64)) << a << " " << b;
    const uint64_t mass = rng() >> (1 + rng() % 63);
    const uint32_t p30 = uint32_t(1 + rng() % smp::kTopPOne);
    const u128 want = (u128(mass) * p30 + ((u128(1) << 30) - 1)) >> 30;
    ASSERT_EQ(smp::nucleus_target(mass, p30), uint64_t(want)) << mass << " " << p30;
  }
  EXPECT_EQ(smp::top_p_fixed(1.0f), smp::kTopPOne);
  EXPECT_EQ(smp::top_p_fixed(2.0f), smp::kTopPOne);
  EXPECT_EQ(smp::top_p_fixed(kNaN), smp::kTopPOne);
  EXPECT_EQ(smp::top_p_fixed(0.5f), smp::kTopPOne / 2);
  EXPECT_EQ(smp::top_p_fixed(1e-30f), 1u);
  EXPECT_EQ(smp::top_p_fixed(0.0f), 1u);
  for (int i = 0; i < 100000; ++i) {
    const float p = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    const double exact = double(p) * 1073741824.0;
    const uint32_t v = smp::top_p_fixed(p);
    if (exact <= 1.0) {
      ASSERT_EQ(v, 1u) << p;
      continue;
    }
    ASSERT_GE(double(v), exact) << p;  // the ceiling
    ASSERT_LT(double(v) - 1.0, exact) << p;
  }
  // The weight of the largest logit is exactly 2^40, so a non-greedy row always has mass.
  for (float m : {-80.0f, -1.5f, 0.0f, 3.25f, 1e30f})
    for (float t : {1e-6f, 0.7f, 1.0f, 3e5f})
      EXPECT_EQ(smp::fixed_weight(smp::weight(m, m, t)), uint64_t(1) << 40);
  // Keys order floats like <, with −0 = +0 and NaN lowest.
  const std::vector<float> sorted = {-kInf,  -3e38f, -1.0f, -1e-40f, 0.0f,
                                     1e-40f, 1.0f,   3e38f, kInf};
  for (size_t i = 1; i < sorted.size(); ++i)
    EXPECT_LT(smp::key(sorted[i - 1]), smp::key(sorted[i]));
  EXPECT_EQ(smp::key(-0.0f), smp::key(0.0f));
  EXPECT_LT(smp::key(kNaN), smp::key(-kInf));
  for (float f : sorted) EXPECT_EQ(smp::key(smp::key_value(smp::key(f))), smp::key(f));
}

TEST(Sampler, ImplementationEqualsTheSortedDefinition) {
  std::mt19937_64 rng(11);
  const float temps[] = {0.0f, 1e-3f, 0.3f, 0.7f, 1.0f, 1.5f, 4.0f, 1e4f};
  const float top_ps[] = {1.0f, 0.999f, 0.95f, 0.9f, 0.5f, 0.1f, 1e-6f};
  int cases = 0, nongreedy = 0;
  for (int r = 0; r < 3000; ++r) {
    const int64_t n = 1 + int64_t(rng() % (r % 5 == 0 ? 2000 : 60));
    std::vector<float> x(n);
    std::normal_distribution<float> nd(0.0f, r % 3 == 0 ? 0.5f : 4.0f);
    for (auto& v : x) v = nd(rng);
    if (r % 4 == 1)  // many ties
      for (auto& v : x) v = std::round(v * 2) / 2;
    if (r % 7 == 2) x[rng() % n] = kNaN, x[rng() % n] = -kInf;
    if (r % 11 == 3) x[rng() % n] = -0.0f, x[rng() % n] = 0.0f;
    SamplingParams p{
        .temperature = temps[rng() % 8], .top_p = top_ps[rng() % 7], .top_k = 0, .seed = rng()};
    const int k = int(rng() % 6);
    p.top_k = k == 0 ? 0 : k == 1 ? 1 : k == 2 ? int(n) : k == 3 ? int(n) + 3 : int(1 + rng() % n);
    const uint64_t draw = rng() % 1000;
    const int32_t want = by_sorting(x, p, draw);
    ASSERT_GE(want, 0);
    ASSERT_EQ(sample_token(x, p, draw), want)
        << "case " << r << " n " << n << " T " << p.temperature << " top_p " << p.top_p << " top_k "
        << p.top_k;
    ++cases;
    nongreedy += p.temperature > 0 && p.top_k != 1;
  }
  EXPECT_GT(nongreedy, 2000);
  // The real vocabulary size, a few parameter sets.
  std::vector<float> x(129280);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (auto& v : x) v = nd(rng);
  for (SamplingParams p :
       {SamplingParams{.temperature = 1.0f}, SamplingParams{.temperature = 0.6f, .top_p = 0.95f},
        SamplingParams{.temperature = 1.0f, .top_p = 0.9f, .top_k = 50},
        SamplingParams{.temperature = 2.0f, .top_p = 0.5f, .top_k = 5000}}) {
    for (uint64_t d = 0; d < 4; ++d) {
      p.seed = rng();
      ASSERT_EQ(sample_token(x, p, d), by_sorting(x, p, d));
    }
  }
}

// Chi-square of `n` draws against the exact probabilities q_i / M of the definition.
double chi_square(const std::vector<float>& x, const SamplingParams& p,
                  const std::vector<double>& prob, int n, bool vary_seed) {
  std::vector<int> count(x.size(), 0);
  for (int i = 0; i < n; ++i) {
    SamplingParams pi = p;
    if (vary_seed) pi.seed = p.seed + uint64_t(i);
    ++count[sample_token(x, pi, vary_seed ? 0 : uint64_t(i))];
  }
  double chi = 0;
  for (size_t t = 0; t < x.size(); ++t) {
    if (prob[t] == 0) {
      if (count[t] > 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double e = prob[t] * n;
    chi += (count[t] - e) * (count[t] - e) / e;
  }
  return chi;
}

std::vector<double> exact_probabilities(const std::vector<float>& x, float temperature) {
  const float m = *std::max_element(x.begin(), x.end());
  std::vector<double> q(x.size());
  double total = 0;
  for (size_t i = 0; i < x.size(); ++i)
    total += q[i] = double(smp::fixed_weight(smp::weight(x[i], m, temperature)));
  for (auto& v : q) v /= total;
  return q;
}

TEST(Sampler, DrawsFollowTheProbabilities) {
  // Six tokens, five degrees of freedom: P(χ² > 35) ≈ 1.5·10⁻⁶ for a correct sampler.
  const double bound = 35.0;
  const std::vector<float> x = logits_peaked();
  const int n = 60000;
  for (float t : {0.8f, 1.0f, 2.5f}) {
    const auto prob = exact_probabilities(x, t);
    EXPECT_LT(chi_square(x, {.temperature = t, .seed = 99}, prob, n, /*vary_seed=*/false), bound)
        << "T " << t;
    EXPECT_LT(chi_square(x, {.temperature = t, .seed = 1000}, prob, n, /*vary_seed=*/true), bound)
        << "T " << t;
  }
  // The test has power: the T = 1 draws measured against the T = 1.2 probabilities fail it.
  EXPECT_GT(
      chi_square(x, {.temperature = 1.0f, .seed = 99}, exact_probabilities(x, 1.2f), n, false),
      10 * bound);
  // top-k 3 (tokens 1, 2, 4 renormalized): two degrees of freedom, P(χ² > 27) ≈ 1.4·10⁻⁶.
  auto prob = exact_probabilities(x, 1.0f);
  double kept = prob[1] + prob[2] + prob[4];
  for (size_t i = 0; i < prob.size(); ++i)
    prob[i] = (i == 1 || i == 2 || i == 4) ? prob[i] / kept : 0.0;
  EXPECT_LT(chi_square(x, {.temperature = 1.0f, .top_k = 3, .seed = 5}, prob, n, false), 27.0);
}

}  // namespace
}  // namespace dsuf
