// Engram hash tables and row ids (model-spec §3b.4). The exhaustive comparison with numpy runs in
// engram_numpy_oracle.py; literal values here were printed by numpy 2.4 (noted at each use).
#include "model/engram.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/config.h"

namespace dsuf {
namespace {

TextConfig engram_config(std::vector<int> layers, std::vector<int64_t> rows, int64_t vocab,
                         int heads) {
  TextConfig c;
  c.engram_layer_ids = std::move(layers);
  c.engram_num_embeddings = std::move(rows);
  c.engram_max_ngram_size = 4;
  c.engram_vocab_size = vocab;
  c.engram_n_heads = heads;
  c.engram_pad_token_id = 2;
  c.engram_compressed_vocab_size = 99092;
  return c;
}

TextConfig real_config() {
  return engram_config({1, 14}, {384006168, 384016682}, 16000000, 8);
}
TextConfig tiny_config() {
  return engram_config({1}, {6126}, 1000, 2);
}

TEST(NumpyPcg64, MatchesNumpyLiterals) {
  // numpy: np.random.SeedSequence(0).generate_state(4, np.uint32)
  EXPECT_EQ(numpy_seed_sequence_state(0, 4),
            (std::vector<uint32_t>{2968811710u, 3677149159u, 745650761u, 2884920346u}));
  // numpy: np.random.default_rng(0).bit_generator.random_raw(3)
  NumpyPcg64 g(0);
  EXPECT_EQ(g.next_uint64(), 11749869230777074271ull);
  EXPECT_EQ(g.next_uint64(), 4976686463289251617ull);
  EXPECT_EQ(g.next_uint64(), 755828109848996024ull);
  // numpy: g = default_rng(12345); g.integers(0, 1000, 5, dtype=np.int64), then
  // g.integers(0, 2**40, 3, dtype=np.int64) on the same generator (32-bit path, then 64-bit).
  NumpyPcg64 h(12345);
  EXPECT_EQ(h.integers_int64(0, 1000, 5), (std::vector<int64_t>{699, 227, 788, 316, 204}));
  EXPECT_EQ(h.integers_int64(0, int64_t{1} << 40, 3),
            (std::vector<int64_t>{743549873828, 430029498621, 365932783574}));
  EXPECT_THROW(h.integers_int64(3, 3, 1), Error);
}

TEST(EngramHasher, RealConfigPrimeTables) {
  const EngramHasher h(real_config(), 2);
  ASSERT_EQ(h.num_slots(), 2);
  EXPECT_EQ(h.rows_per_token(), 24);
  EXPECT_EQ(h.table_rows(0), 384006168);  // model-spec §1.2 engram_num_embeddings
  EXPECT_EQ(h.table_rows(1), 384016682);
  EXPECT_EQ(h.primes(0).front(), 16000057);  // model-spec §3b.4
  EXPECT_EQ(h.primes(1).back(), 16000889);
  std::set<int64_t> all;
  for (int s = 0; s < 2; ++s) {
    const auto& p = h.primes(s);
    const auto& o = h.offsets(s);
    ASSERT_EQ(p.size(), 24u);
    ASSERT_EQ(o.size(), 24u);
    int64_t sum = 0;
    for (size_t k = 0; k < p.size(); ++k) {
      EXPECT_EQ(o[k], sum);
      sum += p[k];
      if (k % 8 != 0) {
        EXPECT_GT(p[k], p[k - 1]) << "within one n-gram size primes increase";
      }
      all.insert(p[k]);
    }
  }
  EXPECT_EQ(all.size(), 48u) << "a prime is never reused, across sizes and layers";
}

TEST(EngramHasher, TinyConfigPrimeTables) {
  const EngramHasher h(tiny_config(), 2);
  EXPECT_EQ(h.primes(0), (std::vector<int64_t>{1009, 1013, 1019, 1021, 1031, 1033}));  // §6.2
  EXPECT_EQ(h.offsets(0), (std::vector<int64_t>{0, 1009, 2022, 3041, 4062, 5093}));
  EXPECT_EQ(h.table_rows(0), 6126);
  EXPECT_EQ(h.rows_per_token(), 6);
}

TEST(EngramHasher, TinyConfigJsonWiring) {
  // The §6.2 config as parsed from JSON carries every field the hasher reads.
  const ModelConfig m = parse_model_config(tiny_config_json(), "tiny config");
  const EngramHasher h(m.text, 2);
  EXPECT_EQ(h.table_rows(0), 6126);
  EXPECT_EQ(h.rows_per_token(), 6);
}

TEST(EngramHasher, MultipliersMatchNumpy) {
  const EngramHasher h(real_config(), 2);
  // numpy: default_rng(10007 * L).integers(0, (2**63 - 1) // 99092 // 2, size=4,
  //        dtype=np.int64) * 2 + 1, for L = 1 and 14.
  EXPECT_EQ(h.multipliers(0),
            (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
  EXPECT_EQ(h.multipliers(1),
            (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
}

TEST(EngramHasher, RejectsWrongTableSizeNamingTheField) {
  TextConfig c = tiny_config();
  c.engram_num_embeddings = {6127};
  try {
    EngramHasher h(c, 2);
    FAIL() << "accepted a wrong table size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("engram_num_embeddings[0]"), std::string::npos)
        << e.what();
  }
  c.engram_num_embeddings = {6126, 6126};
  EXPECT_THROW(EngramHasher(c, 2), Error);
  EXPECT_THROW(EngramHasher(tiny_config(), 99092), Error) << "pad id out of range";
  EXPECT_THROW(EngramHasher(tiny_config(), -1), Error) << "pad id out of range";
}

TEST(EngramHasher, NegativeEntryPadsItAndEveryLaterShift) {
  const EngramHasher h(real_config(), 7);
  const int n = h.rows_per_token();
  std::vector<int64_t> a(n), b(n);
  const int32_t dead_at_1[4] = {500, -1, 42, 42};
  const int32_t padded[4] = {500, 7, 7, 7};
  h.row_ids(0, dead_at_1, a.data());
  h.row_ids(0, padded, b.data());
  EXPECT_EQ(a, b);
  const int32_t dead_at_2[4] = {500, 600, -1, 42};
  const int32_t padded2[4] = {500, 600, 7, 7};
  h.row_ids(1, dead_at_2, a.data());
  h.row_ids(1, padded2, b.data());
  EXPECT_EQ(a, b);
  // Every row id falls inside its own head's slice of the table.
  const int32_t ctx[4] = {99091, 0, 12345, 99091};
  h.row_ids(1, ctx, a.data());
  for (int k = 0; k < n; ++k) {
    EXPECT_GE(a[k], h.offsets(1)[k]);
    EXPECT_LT(a[k], h.offsets(1)[k] + h.primes(1)[k]);
  }
}

TEST(EngramHash, FloorModFollowsPython) {
  // Python: -7 % 3 == 2, 7 % -3 == -2, -7 % -3 == -1, -9 % 3 == 0.
  EXPECT_EQ(floor_mod(-7, 3), 2);
  EXPECT_EQ(floor_mod(7, -3), -2);
  EXPECT_EQ(floor_mod(-7, -3), -1);
  EXPECT_EQ(floor_mod(-9, 3), 0);
  EXPECT_EQ(floor_mod(7, 3), 1);
}

}  // namespace
}  // namespace dsuf
