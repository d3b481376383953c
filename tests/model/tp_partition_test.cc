// The tensor-parallel split (model/tp_partition.h) on the CPU: for every world size the slices of
// every sliced tensor cover its rows exactly once, in rank order, on 32-row blocks where FP8 scales
// need it; every expert and shared expert has exactly one owner; impossible splits are refused.
#include "model/tp_partition.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "core/error.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/tiny.h"

namespace dsuf {
namespace {

ModelConfig config_of(const std::string& variant) {
  return parse_model_config(variant == "real" ? real_v41_config_json() : variant_config_json(variant), variant);
}

// For every tensor: the union of the ranks' slices is every row once, contiguous in rank order.
void check_cover(const ModelConfig& cfg, int world, ExpertSplit split = ExpertSplit::kExpert) {
  std::vector<TpPartition> parts;
  for (int r = 0; r < world; ++r) parts.push_back(TpPartition::make(cfg.text, world, r, split));
  auto routed = [](const std::string& name) {
    return name.rfind("layers.", 0) == 0 && name.find(".ffn.experts.") != std::string::npos;
  };
  size_t sliced = 0;
  for (const TensorSpec& ts : expected_tensors(cfg)) {
    int64_t next = 0, holders = 0;
    bool any_sliced = false;
    for (int r = 0; r < world; ++r) {
      const TensorSlice s = tensor_slice(parts[r], ts.name, ts.shape);
      if (!s.present) continue;
      ++holders;
      if (!s.sliced) continue;
      any_sliced = true;
      ASSERT_EQ(s.rows.begin, next) << ts.name << " rank " << r << " of " << world;
      ASSERT_GT(s.rows.size(), 0) << ts.name << " rank " << r << " of " << world;
      next = s.rows.end;
    }
    if (any_sliced) {
      ++sliced;
      EXPECT_EQ(holders, world) << ts.name;
      EXPECT_EQ(next, ts.shape[0]) << ts.name << " over " << world;
    } else {
      const bool owned_once = ts.name.find("experts.") != std::string::npos && ts.name.rfind("layers.", 0) == 0;
      EXPECT_EQ(holders, owned_once ? 1 : world) << ts.name << " over " << world;
      EXPECT_FALSE(split == ExpertSplit::kWidth && routed(ts.name)) << ts.name << ": a routed expert not split";
    }
  }
  // wq_b, wo_a, wo_b (weight + scale) per layer, and the head; split by width, also every routed
  // expert's w1, w2, w3 (weight + scale).
  const size_t experts = split == ExpertSplit::kWidth ? size_t(6) * cfg.text.n_routed_experts : 0;
  EXPECT_EQ(sliced, (6 + experts) * size_t(cfg.text.num_hidden_layers) + 1);
  for (int r = 0; r < world; ++r) {
    const TpPartition& p = parts[r];
    // Heads follow their groups; the gathered wo_a columns tile [0, G·o_lora_rank).
    const int64_t hpg = cfg.text.num_attention_heads / cfg.text.o_groups;
    EXPECT_EQ(p.my_heads().begin, p.my_groups().begin * hpg);
    EXPECT_EQ(p.my_heads().end, p.my_groups().end * hpg);
    EXPECT_EQ(p.my_hidden().begin % 32, 0);
    const auto cols = p.group_cols();
    EXPECT_EQ(cols.front().begin, 0);
    EXPECT_EQ(cols.back().end, int64_t(cfg.text.o_groups) * cfg.text.o_lora_rank);
  }
}

TEST(TpPartition, SplitRowsEvenUnevenAndAligned) {
  EXPECT_EQ(split_rows(64, 2, 1, "x"), (std::vector<RowRange>{{0, 32}, {32, 64}}));
  EXPECT_EQ(split_rows(8, 3, 1, "x"), (std::vector<RowRange>{{0, 3}, {3, 6}, {6, 8}}));
  // 2304 rows = 72 blocks of 32 over 5: 15, 15, 14, 14, 14 blocks.
  const auto r = split_rows(2304, 5, 32, "x");
  EXPECT_EQ(r[0], (RowRange{0, 480}));
  EXPECT_EQ(r[2], (RowRange{960, 1408}));
  EXPECT_EQ(r[4], (RowRange{1856, 2304}));
  // A ragged last block stays with the last rank.
  EXPECT_EQ(split_rows(100, 2, 32, "x"), (std::vector<RowRange>{{0, 64}, {64, 100}}));
  EXPECT_THROW(split_rows(2, 3, 1, "x"), Error);
}

TEST(TpPartition, EveryTensorCoveredOnceTiny) {
  const ModelConfig cfg = config_of("tiny");
  for (int world : {1, 2}) check_cover(cfg, world);
}

TEST(TpPartition, EveryTensorCoveredOnceRealDims) {
  const ModelConfig cfg = config_of("real-dims");
  for (int world = 1; world <= 8; ++world) check_cover(cfg, world);
}

TEST(TpPartition, EveryTensorCoveredOnceReleasedConfig) {
  const ModelConfig cfg = config_of("real");
  for (int world : {1, 2, 3, 4, 8}) check_cover(cfg, world);
}

TEST(TpPartition, ExpertsSplitByWidthCoverEveryRowOnce) {
  for (const char* variant : {"tiny", "real-dims"}) {
    const ModelConfig cfg = config_of(variant);
    for (int world : {1, 2}) check_cover(cfg, world, ExpertSplit::kWidth);
  }
  const ModelConfig real = config_of("real");
  for (int world : {2, 3, 4, 8}) {
    check_cover(real, world, ExpertSplit::kWidth);
    for (int r = 0; r < world; ++r) {  // every rank holds every expert, its share of the width
      const TpPartition p = TpPartition::make(real.text, world, r, ExpertSplit::kWidth);
      for (int e = 0; e < real.text.n_routed_experts; e += 37) EXPECT_TRUE(p.owns_expert(e));
      EXPECT_LE(p.my_ffn().size(), (real.text.moe_intermediate_size + world - 1) / world);
    }
  }
}

TEST(TpPartition, ExpertSplitFromTheEnvironment) {
  ::unsetenv("DSUF_TP_EXPERTS");
  EXPECT_EQ(expert_split_from_env(), ExpertSplit::kExpert);
  ::setenv("DSUF_TP_EXPERTS", "width", 1);
  EXPECT_EQ(expert_split_from_env(), ExpertSplit::kWidth);
  ::setenv("DSUF_TP_EXPERTS", "rows", 1);
  EXPECT_THROW(expert_split_from_env(), Error);
  ::unsetenv("DSUF_TP_EXPERTS");
}

TEST(TpPartition, SixtyFourHeadsOverThreeRanksFollowGroups) {
  const ModelConfig cfg = config_of("real-dims");  // 64 heads in 8 groups
  std::vector<int64_t> heads;
  for (int r = 0; r < 3; ++r) heads.push_back(TpPartition::make(cfg.text, 3, r).my_heads().size());
  EXPECT_EQ(heads, (std::vector<int64_t>{24, 24, 16}));
}

TEST(TpPartition, RefusesMoreRanksThanGroups) {
  const ModelConfig tiny = config_of("tiny");  // 2 output groups
  try {
    TpPartition::make(tiny.text, 4, 0);
    ADD_FAILURE() << "4 ranks over 2 groups accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("o_groups"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TpPartition::make(tiny.text, 2, 2), Error);
}

TEST(TpPartition, ExpertsAndSharedExpertsHaveOneOwner) {
  const ModelConfig cfg = config_of("real");
  for (int world : {2, 3, 8}) {
    std::map<int, int> per_rank;
    for (int e = 0; e < cfg.text.n_routed_experts; ++e) {
      int owners = 0;
      for (int r = 0; r < world; ++r) owners += TpPartition::make(cfg.text, world, r).owns_expert(e);
      EXPECT_EQ(owners, 1);
      ++per_rank[TpPartition::make(cfg.text, world, 0).expert_owner(e)];
    }
    // Round robin: the ranks' expert counts differ by at most one.
    int lo = 1 << 30, hi = 0;
    for (auto [r, n] : per_rank) lo = std::min(lo, n), hi = std::max(hi, n);
    EXPECT_LE(hi - lo, 1);
  }
}

}  // namespace
}  // namespace dsuf
