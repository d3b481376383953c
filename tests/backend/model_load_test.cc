// Config and checkpoint loading: every bad config names its field; every damaged checkpoint names
// the tensor and file.
#include <filesystem>
#include <functional>
#include <cstdio>
#include <set>
#include <unistd.h>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/inventory.h"
#include "model/safetensors.h"
#include "model/tiny.h"
#include "model/weights.h"
#include "tiny_fixture.h"

namespace dsuf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_config_error(const std::function<void(json&)>& edit, const std::string& needle) {
  json j = tiny_config_json();
  edit(j);
  std::string msg = error_of([&] { parse_model_config(j, "test.json"); });
  EXPECT_NE(msg.find(needle), std::string::npos) << "got: '" << msg << "' wanted: " << needle;
}

TEST(Config, TinyPlanHasEveryRole) {
  ModelConfig c = parse_model_config(tiny_config_json());
  ASSERT_EQ(c.layers.size(), 8u);
  EXPECT_EQ(c.layers[0].ratio, 0);
  EXPECT_EQ(c.layers[1].engram_slot, 0);
  EXPECT_TRUE(c.layers[2].owns_compressor && c.layers[2].runs_indexer && c.layers[2].ratio == 2);
  EXPECT_EQ(c.layers[3].kv_source, 2);
  EXPECT_EQ(c.layers[3].index_source, 2);
  EXPECT_TRUE(c.layers[4].candidate_source && c.layers[4].ratio == 1 && c.layers[4].owns_compressor);
  EXPECT_EQ(c.layers[5].index_source, 4);
  EXPECT_TRUE(c.layers[6].runs_indexer && c.layers[6].candidate_constrained && !c.layers[6].owns_compressor);
  EXPECT_EQ(c.layers[6].kv_source, 4);
  EXPECT_EQ(c.layers[7].index_source, 6);
  EXPECT_EQ(c.layers[5].dspark_target_slot, 0);
  ASSERT_EQ(c.dspark.size(), 1u);
  EXPECT_TRUE(c.dspark[0].first && c.dspark[0].last);
}

// tiny-long changes the position limit and nothing else, so its weights and its output on a
// short prompt are the tiny model's.
TEST(Config, TinyLongDiffersFromTinyOnlyInItsContext) {
  json tiny = variant_config_json("tiny"), long_ = variant_config_json("tiny-long");
  EXPECT_EQ(long_["text_config"]["max_position_embeddings"], 131072);
  long_["text_config"]["max_position_embeddings"] = tiny["text_config"]["max_position_embeddings"];
  EXPECT_EQ(long_, tiny);
  EXPECT_EQ(parse_model_config(variant_config_json("tiny-long")).text.max_position_embeddings, 131072);
  EXPECT_NE(error_of([] { variant_config_json("tiny-short"); }).find("tiny-long"), std::string::npos);
}

TEST(Config, RealV41PlanMatchesSpecTable) {
  json j = real_v41_config_json();
  ModelConfig c = parse_model_config(j);
  for (int l = 2; l < 40; ++l) {
    const LayerPlan& p = c.layers[l];
    int want_kv = l < 8 ? 2 : l < 14 ? 8 : l < 20 ? 14 : 20;
    int want_idx = l < 20 ? want_kv : 20 + 4 * ((l - 20) / 4);
    EXPECT_EQ(p.kv_source, want_kv) << l;
    EXPECT_EQ(p.index_source, want_idx) << l;
    EXPECT_EQ(p.ratio, l < 20 ? 2 : 1) << l;
    EXPECT_EQ(p.candidate_constrained, l > 20 && l % 4 == 0) << l;
  }
  EXPECT_EQ(c.dspark.size(), 3u);
  EXPECT_TRUE(c.dspark[0].first && !c.dspark[0].last && c.dspark[2].last);
}

TEST(Inventory, RealV41BytesMatchTheCheckpointAudit) {
  // model-spec §2.3: the real 48-shard checkpoint holds 510 286 023 000 tensor bytes, of which the
  // routed experts (incl. DSpark) 295 997 276 160 and the Engram tables 202 758 032 400.
  ModelConfig c = parse_model_config(real_v41_config_json());
  double total = 0, experts = 0, engram = 0;
  size_t count = 0;
  for (const TensorSpec& t : expected_tensors(c)) {
    double n = double(dtype_size(t.dtype));
    for (int64_t d : t.shape) n *= double(d);
    total += n;
    ++count;
    if (t.name.find(".ffn.experts.") != std::string::npos) experts += n;
    if (t.name.find(".engram.embed.") != std::string::npos) engram += n;
  }
  std::printf("real V4.1 inventory: %zu tensors, %.0f bytes (experts %.0f, Engram tables %.0f)\n", count, total,
              experts, engram);
  EXPECT_EQ(experts, 295997276160.0);
  EXPECT_EQ(engram, 202758032400.0);
  EXPECT_EQ(total, 510286023000.0);
}

TEST(Config, RefusesWithTheFieldName) {
  expect_config_error([](json& j) { j["model_type"] = "deepseek_v4"; }, "model_type");
  expect_config_error([](json& j) { j["text_config"]["model_type"] = "llama"; }, "text_config.model_type");
  expect_config_error([](json& j) { j["text_config"].erase("hidden_size"); }, "text_config.hidden_size: missing");
  expect_config_error([](json& j) { j["text_config"]["hidden_size"] = "256"; }, "text_config.hidden_size: expected an integer");
  expect_config_error([](json& j) { j["text_config"]["compress_ratios"] = {0, 0, 2}; }, "text_config.compress_ratios");
  expect_config_error([](json& j) { j["text_config"]["compress_ratios"][3] = 4; }, "compress_ratios");
  expect_config_error([](json& j) { j["text_config"]["kv_source_layer_ids"] = {1, 4}; }, "kv_source_layer_ids");
  expect_config_error([](json& j) { j["text_config"]["kv_source_layer_ids"] = {4}; }, "kv_source_layer_ids");
  expect_config_error([](json& j) { j["text_config"]["index_source_layer_ids"] = {2, 4, 9}; }, "index_source_layer_ids");
  expect_config_error([](json& j) { j["text_config"]["candidate_source_layer_id"] = 3; }, "candidate_source_layer_id");
  expect_config_error([](json& j) { j["text_config"]["o_groups"] = 3; }, "text_config.o_groups");
  expect_config_error([](json& j) { j["text_config"]["hidden_size"] = 250; }, "text_config.hidden_size");
  expect_config_error([](json& j) { j["text_config"]["scoring_func"] = "softmax"; }, "scoring_func");
  expect_config_error([](json& j) { j["quantization_config"]["weight_block_size"] = {128, 128}; }, "weight_block_size");
  expect_config_error([](json& j) { j["quantization_config"]["scale_fmt"] = "fp32"; }, "scale_fmt");
  expect_config_error([](json& j) { j["vision_config"]["model_type"] = "clip"; }, "vision_config.model_type");
  expect_config_error([](json& j) { j["image_token_id"] = 200000; }, "image_token_id");
  expect_config_error([](json& j) { j["text_config"]["vocab_size"] = 1000; }, "outside the vocabulary");
  expect_config_error([](json& j) { j["text_config"]["engram_num_embeddings"] = {1, 2}; }, "engram_num_embeddings");
  expect_config_error([](json& j) { j["text_config"]["compress_ratios"] = {0, 0, 2, 2, 1, 0, 1, 1, 0}; }, "compress_ratios");
}

TEST(Config, UnreadableFile) {
  EXPECT_NE(error_of([] { load_model_config("/nonexistent/config.json"); }).find("cannot open"), std::string::npos);
  fs::path p = fs::temp_directory_path() / "dsuf_bad_config.json";
  std::ofstream(p) << "{not json";
  EXPECT_NE(error_of([&] { load_model_config(p.string()); }).find("not valid JSON"), std::string::npos);
}

// A copy of the tiny checkpoint with one tensor replaced (or dropped) in its shard.
class DamagedCheckpoint : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("dsuf_damaged_" + std::to_string(::getpid()));
  void SetUp() override {
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(testing::tiny_dir()))
      fs::copy_file(e.path(), dir / e.path().filename());
  }
  void TearDown() override { fs::remove_all(dir); }
  // Rewrites the shard holding `name` with `edit` applied to its tensor list.
  void rewrite(const std::string& name, const std::function<void(std::vector<TensorData>&)>& edit) {
    auto ck = Checkpoint::open(dir.string());
    const std::string file = ck->get(name).file;
    auto sf = SafetensorsFile::open(file);
    std::vector<TensorData> ts;
    for (const auto& [n, info] : sf->tensors())
      ts.push_back({n, info.dtype, info.shape, std::vector<uint8_t>(info.data, info.data + info.nbytes)});
    edit(ts);
    sf.reset();
    ck.reset();
    SafetensorsWriter w;
    for (auto& t : ts) w.add(std::move(t));
    w.write(file);
  }
  std::string load_error() {
    return error_of([&] { load_model(dir.string()); });
  }
};

TEST_F(DamagedCheckpoint, WrongDtypeNamesTensorAndFile) {
  rewrite("layers.3.attn.wq_a.weight", [](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == "layers.3.attn.wq_a.weight") t.dtype = DType::U8;
  });
  std::string msg = load_error();
  EXPECT_NE(msg.find("layers.3.attn.wq_a.weight is U8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected F8_E4M3"), std::string::npos) << msg;
  EXPECT_NE(msg.find(".safetensors"), std::string::npos) << msg;
}

TEST_F(DamagedCheckpoint, WrongShapeNamesTensor) {
  rewrite("layers.2.ffn.experts.5.w2.scale", [](std::vector<TensorData>& ts) {
    for (auto& t : ts)
      if (t.name == "layers.2.ffn.experts.5.w2.scale") t.shape = {t.shape[1], t.shape[0]};
  });
  std::string msg = load_error();
  EXPECT_NE(msg.find("layers.2.ffn.experts.5.w2.scale is F8_E8M0 [8, 256], expected F8_E8M0 [256, 8]"),
            std::string::npos)
      << msg;
}

TEST_F(DamagedCheckpoint, MissingTensorIsRefusedByIndexOrInventory) {
  // Removing a tensor from its shard while the index still names it: the checkpoint layer refuses.
  rewrite("layers.4.attn.indexer.wk.weight", [](std::vector<TensorData>& ts) {
    std::erase_if(ts, [](const TensorData& t) { return t.name == "layers.4.attn.indexer.wk.weight"; });
  });
  std::string msg = load_error();
  EXPECT_NE(msg.find("layers.4.attn.indexer.wk.weight"), std::string::npos) << msg;
}

TEST_F(DamagedCheckpoint, MissingTensorEverywhereIsNamedByTheInventory) {
  const std::string victim = "layers.1.engram.embed.scale";
  rewrite(victim, [&](std::vector<TensorData>& ts) {
    std::erase_if(ts, [&](const TensorData& t) { return t.name == victim; });
  });
  json idx;
  std::ifstream(dir / "model.safetensors.index.json") >> idx;
  idx["weight_map"].erase(victim);
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  std::string msg = load_error();
  EXPECT_NE(msg.find("missing tensor " + victim + " (expected F8_E8M0 [6126, 2])"), std::string::npos) << msg;
}

TEST_F(DamagedCheckpoint, MissingShardTruncatedFileBadHeader) {
  fs::path shard = dir / "model-00002-of-00004.safetensors";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  std::string msg = load_error();
  EXPECT_NE(msg.find("model-00002-of-00004.safetensors"), std::string::npos) << msg;
  fs::remove(shard);
  msg = load_error();
  EXPECT_NE(msg.find("model-00002-of-00004.safetensors"), std::string::npos) << msg;
  std::ofstream(shard, std::ios::binary) << std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13);
  msg = load_error();
  EXPECT_NE(msg.find("model-00002-of-00004.safetensors"), std::string::npos) << msg;
}

TEST(Checkpoint, TinyLoadsCleanlyWithQuantizedFormats) {
  const LoadedModel& m = testing::tiny_model();
  EXPECT_TRUE(m.unknown_tensors.empty());
  // FP8 weights carry real E8M0 scales (not all equal), FP4 experts use all 16 codes.
  const Fp8Linear& wq = m.weights.layers[0].attn.wq_b;
  std::set<uint8_t> scales(wq.scale, wq.scale + (wq.out / 32) * (wq.in / 32));
  EXPECT_GT(scales.size(), 1u);
  const Fp4Linear& w1 = m.weights.layers[3].ffn.experts[7].w1;
  std::set<int> codes;
  for (int64_t i = 0; i < w1.out * w1.in / 2; ++i) codes.insert(w1.w[i] & 0xf), codes.insert(w1.w[i] >> 4);
  EXPECT_EQ(codes.size(), 16u);
}

}  // namespace
}  // namespace dsuf
