// Engram n-gram hashing (model-spec §3b.4): per Engram layer, the hash multipliers (drawn with
// numpy's default_rng, reproduced here bit for bit), the prime table sizes and offsets, and the
// row ids of one token's 2..max_ngram-grams. The CPU reference and the CUDA backend both take their
// tables from EngramHasher, so the layout exists once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace dsuf {

// numpy's SeedSequence(seed).generate_state(n_words, np.uint32) for a non-negative integer seed
// (entropy only: no spawn key, pool size 4).
std::vector<uint32_t> numpy_seed_sequence_state(uint64_t seed, size_t n_words);

// numpy.random.PCG64 seeded as numpy.random.default_rng(seed) seeds it: 128-bit LCG, XSL-RR output,
// state and increment from SeedSequence(seed).generate_state(4, np.uint64). The 32-bit draws keep
// numpy's buffer (low half of a 64-bit output first, high half on the next call), which is part of
// the generator's state exactly as in numpy.
class NumpyPcg64 {
 public:
  explicit NumpyPcg64(uint64_t seed);

  uint64_t next_uint64();  // == bit_generator.random_raw()
  uint32_t next_uint32();

  // Generator.integers(low, high, size=n, dtype=np.int64) with endpoint=False (and the
  // default use_masked=False): numpy's Lemire rejection, 32-bit buffered path when
  // high - low - 1 <= 0xFFFFFFFF, 64-bit path otherwise. Throws dsuf::Error when low >= high.
  std::vector<int64_t> integers_int64(int64_t low, int64_t high, size_t n);

 private:
  uint64_t state_hi_ = 0, state_lo_ = 0;
  uint64_t inc_hi_ = 0, inc_lo_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// numpy.random.default_rng(seed).integers(low, high, size=n, dtype=np.int64).
std::vector<int64_t> numpy_integers_int64(uint64_t seed, int64_t low, int64_t high, size_t n);

// The official Engram multipliers of one layer: default_rng(10007 * layer_id).integers(0,
// half_bound, size=max_ngram_size, dtype=np.int64) * 2 + 1 with half_bound =
// max(1, (2^63 - 1) // compressed_vocab_size // 2). Every product c * m with 0 <= c <
// compressed_vocab_size then fits in int64 without wrapping.
std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram_size,
                                        int64_t compressed_vocab_size);

// numpy int64 semantics for the hash: products and xor wrap modulo 2^64; `%` is floor-mod (the
// result has the divisor's sign). ids[0] = c_p, ids[i] = c_{p-i}, already padded; writes the
// (i+1)-gram hash to hashes[i-1] for i = 1..multipliers.size()-1.
void engram_ngram_hashes(const std::vector<int64_t>& multipliers, const int64_t* ids,
                         int64_t* hashes);
inline int64_t floor_mod(int64_t a, int64_t m) {
  int64_t r = a % m;
  return (r != 0 && ((r < 0) != (m < 0))) ? r + m : r;
}

class EngramHasher {
 public:
  // Reads engram_layer_ids, engram_num_embeddings, engram_max_ngram_size, engram_vocab_size,
  // engram_n_heads, engram_compressed_vocab_size. pad_cid = compressed id of engram_pad_token_id.
  // Throws dsuf::Error naming the field when the config is inconsistent, in particular when a
  // layer's prime table does not add up to engram_num_embeddings[slot].
  EngramHasher(const TextConfig& cfg, int32_t pad_cid);

  int num_slots() const { return static_cast<int>(layers_.size()); }
  int rows_per_token() const { return (max_ngram_ - 1) * n_heads_; }
  int max_ngram() const { return max_ngram_; }
  int n_heads() const { return n_heads_; }
  int32_t pad_cid() const { return pad_cid_; }

  // ctx[0] = c_p, ctx[i] = c_{p-i} for i < max_ngram(); a negative entry means the shift crosses
  // the sequence start or a DEAD token, and it and all later entries become pad_cid. Entries must
  // be < engram_compressed_vocab_size. Writes rows_per_token() row ids of the slot's table,
  // n-gram-size-major then head (2-gram h0..hK, 3-gram h0..hK, ...).
  void row_ids(int slot, const int32_t* ctx, int64_t* rows) const;

  const std::vector<int64_t>& multipliers(int slot) const;  // [max_ngram]
  const std::vector<int64_t>& primes(int slot) const;       // [rows_per_token], output order
  const std::vector<int64_t>& offsets(int slot) const;      // [rows_per_token], output order
  int64_t table_rows(int slot) const;                       // sum of the slot's primes

 private:
  struct Layer {
    std::vector<int64_t> multipliers, primes, offsets;
    int64_t rows = 0;
  };
  const Layer& layer(int slot) const;

  int max_ngram_ = 0;
  int n_heads_ = 0;
  int64_t compressed_vocab_ = 0;
  int32_t pad_cid_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace dsuf
