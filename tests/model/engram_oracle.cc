// engram_oracle: answers a JSON request on stdin with what src/model/engram.{h,cc} computes, for
// engram_numpy_oracle.py to compare against numpy. Request keys (all optional):
//   seed_state:  [{seed, n}]                       -> SeedSequence(seed).generate_state(n, uint32)
//   raw:         [{seed, n}]                       -> n x PCG64 next_uint64
//   integers:    [{seed, calls: [[low, high, n]]}] -> successive integers() calls on one generator
//   multipliers: [{layer, max_ngram, vocab}]       -> engram_multipliers
//   hashes:      [{multipliers, ids: [[...]], mods: [...]}] -> hashes and floor_mod(hash, mod)
//   hasher:      [{config: {...}, pad_cid, contexts: [[...]]}] -> tables and row ids, or error
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/engram.h"

using nlohmann::json;

namespace {

json hasher_case(const json& c) {
  dsuf::TextConfig cfg;
  const json& k = c.at("config");
  cfg.engram_layer_ids = k.at("layer_ids").get<std::vector<int>>();
  cfg.engram_num_embeddings = k.at("num_embeddings").get<std::vector<int64_t>>();
  cfg.engram_max_ngram_size = k.at("max_ngram").get<int>();
  cfg.engram_vocab_size = k.at("vocab").get<int64_t>();
  cfg.engram_n_heads = k.at("n_heads").get<int>();
  cfg.engram_compressed_vocab_size = k.at("compressed_vocab").get<int>();
  json out;
  try {
    dsuf::EngramHasher h(cfg, c.at("pad_cid").get<int32_t>());
    out["multipliers"] = json::array();
    out["primes"] = json::array();
    out["offsets"] = json::array();
    out["rows"] = json::array();
    for (int s = 0; s < h.num_slots(); ++s) {
      out["multipliers"].push_back(h.multipliers(s));
      out["primes"].push_back(h.primes(s));
      out["offsets"].push_back(h.offsets(s));
      json rows = json::array();
      std::vector<int64_t> r(static_cast<size_t>(h.rows_per_token()));
      for (const json& ctx : c.at("contexts")) {
        const std::vector<int32_t> v = ctx.get<std::vector<int32_t>>();
        h.row_ids(s, v.data(), r.data());
        rows.push_back(r);
      }
      out["rows"].push_back(std::move(rows));
    }
  } catch (const dsuf::Error& e) {
    out = json{{"error", e.what()}};
  }
  return out;
}

}  // namespace

int main() {
  const json req = json::parse(std::cin);
  json out = json::object();
  for (const json& c : req.value("seed_state", json::array())) {
    out["seed_state"].push_back(
        dsuf::numpy_seed_sequence_state(c.at("seed").get<uint64_t>(), c.at("n").get<size_t>()));
  }
  for (const json& c : req.value("raw", json::array())) {
    dsuf::NumpyPcg64 g(c.at("seed").get<uint64_t>());
    std::vector<uint64_t> v;
    for (size_t i = 0, n = c.at("n").get<size_t>(); i < n; ++i) v.push_back(g.next_uint64());
    out["raw"].push_back(v);
  }
  for (const json& c : req.value("integers", json::array())) {
    dsuf::NumpyPcg64 g(c.at("seed").get<uint64_t>());
    json calls = json::array();
    for (const json& call : c.at("calls")) {
      calls.push_back(g.integers_int64(call.at(0).get<int64_t>(), call.at(1).get<int64_t>(),
                                       call.at(2).get<size_t>()));
    }
    out["integers"].push_back(std::move(calls));
  }
  for (const json& c : req.value("multipliers", json::array())) {
    out["multipliers"].push_back(dsuf::engram_multipliers(
        c.at("layer").get<int>(), c.at("max_ngram").get<int>(), c.at("vocab").get<int64_t>()));
  }
  for (const json& c : req.value("hashes", json::array())) {
    const std::vector<int64_t> m = c.at("multipliers").get<std::vector<int64_t>>();
    const std::vector<int64_t> mods = c.at("mods").get<std::vector<int64_t>>();
    json hs = json::array(), ms = json::array();
    for (const json& ids : c.at("ids")) {
      const std::vector<int64_t> v = ids.get<std::vector<int64_t>>();
      std::vector<int64_t> h(m.size() - 1);
      dsuf::engram_ngram_hashes(m, v.data(), h.data());
      std::vector<int64_t> r;
      for (int64_t x : h) {
        for (int64_t p : mods) r.push_back(dsuf::floor_mod(x, p));
      }
      hs.push_back(h);
      ms.push_back(r);
    }
    out["hashes"].push_back(json{{"hashes", hs}, {"mods", ms}});
  }
  for (const json& c : req.value("hasher", json::array())) out["hasher"].push_back(hasher_case(c));
  std::cout << out.dump() << "\n";
  return 0;
}
