// The sampler: greedy is argmax, a seed fixes the draw, top-k/top-p narrow it as documented.
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "engine/sampler.h"

namespace dsuf {
namespace {

std::vector<float> logits_peaked() {
  return {0.1f, 2.0f, 1.9f, -3.0f, 1.8f, 0.0f};
}

TEST(Sampler, GreedyIsArgmaxLowestIndexOnTies) {
  EXPECT_EQ(argmax(std::vector<float>{1, 3, 3, 2}), 1);
  Sampler s({.temperature = 0});
  EXPECT_EQ(s.sample(logits_peaked()), 1);
}

TEST(Sampler, SameSeedSameDraws) {
  auto draws = [](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .seed = seed});
    std::vector<int32_t> v;
    for (int i = 0; i < 64; ++i) v.push_back(s.sample(logits_peaked()));
    return v;
  };
  EXPECT_EQ(draws(7), draws(7));
  EXPECT_NE(draws(7), draws(8));  // 64 draws over 3 likely tokens: equal only by a 1e-20 fluke
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  Sampler k1({.temperature = 5.0f, .top_k = 1, .seed = 3});
  Sampler p0({.temperature = 5.0f, .top_p = 1e-6f, .seed = 3});
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(k1.sample(logits_peaked()), 1);
    EXPECT_EQ(p0.sample(logits_peaked()), 1);
  }
}

TEST(Sampler, TopKTwoOnlyDrawsTheTwoBest) {
  Sampler s({.temperature = 1.0f, .top_k = 2, .seed = 11});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[s.sample(logits_peaked())];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[2], 100);
}

}  // namespace
}  // namespace dsuf
