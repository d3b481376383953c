#include "model/engram.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "core/error.h"

namespace dsuf {

namespace {

using u128 = unsigned __int128;

// numpy/random/bit_generator.pyx (SeedSequence): constants of its hashmix/mix.
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// PCG64's default 128-bit LCG multiplier (pcg64.h, PCG_DEFAULT_MULTIPLIER_128).
constexpr u128 kPcgMult = (u128{2549297995355413924ull} << 64) | 4865540595714422341ull;

uint64_t rotr64(uint64_t v, unsigned r) {
  return (v >> r) | (v << ((64 - r) & 63));
}

bool is_prime(int64_t n) {
  if (n < 2) return false;
  static constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  for (uint64_t p : kBases) {
    if (static_cast<uint64_t>(n) % p == 0) return static_cast<uint64_t>(n) == p;
  }
  // Deterministic Miller-Rabin: these bases decide every n < 2^64.
  const uint64_t un = static_cast<uint64_t>(n);
  uint64_t d = un - 1;
  int s = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++s;
  }
  auto mulmod = [un](uint64_t a, uint64_t b) { return static_cast<uint64_t>(u128{a} * b % un); };
  for (uint64_t a : kBases) {
    uint64_t x = 1, base = a % un, e = d;
    while (e) {
      if (e & 1) x = mulmod(x, base);
      base = mulmod(base, base);
      e >>= 1;
    }
    if (x == 1 || x == un - 1) continue;
    bool composite = true;
    for (int r = 1; r < s && composite; ++r) {
      x = mulmod(x, x);
      if (x == un - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

// The official find_next_prime: the smallest prime > start not already taken.
int64_t next_unused_prime(int64_t start, const std::set<int64_t>& taken) {
  for (int64_t c = start + 1;; ++c) {
    if (is_prime(c) && !taken.count(c)) return c;
  }
}

}  // namespace

std::vector<uint32_t> numpy_seed_sequence_state(uint64_t seed, size_t n_words) {
  // _coerce_to_uint32_array(int): little-endian 32-bit words, [0] for zero.
  std::vector<uint32_t> entropy;
  do {
    entropy.push_back(static_cast<uint32_t>(seed));
    seed >>= 32;
  } while (seed);

  // mix_entropy
  uint32_t pool[kPoolSize];
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i) {
    pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_const);
  }
  for (size_t src = 0; src < kPoolSize; ++src) {
    for (size_t dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
    }
  }
  for (size_t src = kPoolSize; src < entropy.size(); ++src) {
    for (size_t dst = 0; dst < kPoolSize; ++dst) {
      pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
    }
  }

  // generate_state
  std::vector<uint32_t> out(n_words);
  hash_const = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    out[i] = v;
  }
  return out;
}

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  // generate_state(4, np.uint64) is the uint32 state viewed as little-endian uint64 words;
  // pcg64_set_seed takes words 0,1 as the initial state (high, low) and 2,3 as the stream.
  const std::vector<uint32_t> w = numpy_seed_sequence_state(seed, 8);
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = w[2 * i] | (uint64_t{w[2 * i + 1]} << 32);
  const u128 initstate = (u128{v[0]} << 64) | v[1];
  const u128 initseq = (u128{v[2]} << 64) | v[3];
  // pcg_setseq_128_srandom_r
  const u128 inc = (initseq << 1) | 1;
  u128 state = 0;
  state = state * kPcgMult + inc;
  state += initstate;
  state = state * kPcgMult + inc;
  state_hi_ = static_cast<uint64_t>(state >> 64);
  state_lo_ = static_cast<uint64_t>(state);
  inc_hi_ = static_cast<uint64_t>(inc >> 64);
  inc_lo_ = static_cast<uint64_t>(inc);
}

uint64_t NumpyPcg64::next_uint64() {
  u128 state = (u128{state_hi_} << 64) | state_lo_;
  const u128 inc = (u128{inc_hi_} << 64) | inc_lo_;
  state = state * kPcgMult + inc;
  state_hi_ = static_cast<uint64_t>(state >> 64);
  state_lo_ = static_cast<uint64_t>(state);
  return rotr64(state_hi_ ^ state_lo_, static_cast<unsigned>(state_hi_ >> 58));
}

uint32_t NumpyPcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next);
}

std::vector<int64_t> NumpyPcg64::integers_int64(int64_t low, int64_t high, size_t n) {
  if (low >= high) fail("integers: low (", low, ") must be < high (", high, ")");
  // numpy turns [low, high) into the closed range [low, high - 1] = off + [0, rng].
  const uint64_t off = static_cast<uint64_t>(low);
  const uint64_t rng = static_cast<uint64_t>(high - 1) - off;
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t v;
    if (rng == 0) {
      v = 0;  // no draw at all
    } else if (rng < 0xFFFFFFFFull) {
      // buffered_bounded_lemire_uint32
      const uint32_t rng_excl = static_cast<uint32_t>(rng) + 1;
      uint64_t m = uint64_t{next_uint32()} * rng_excl;
      uint32_t leftover = static_cast<uint32_t>(m);
      if (leftover < rng_excl) {
        const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % rng_excl;
        while (leftover < threshold) {
          m = uint64_t{next_uint32()} * rng_excl;
          leftover = static_cast<uint32_t>(m);
        }
      }
      v = m >> 32;
    } else if (rng == 0xFFFFFFFFull) {
      v = next_uint32();
    } else if (rng == std::numeric_limits<uint64_t>::max()) {
      v = next_uint64();  // unreachable with endpoint=False; kept for the closed-range form
    } else {
      // bounded_lemire_uint64
      const uint64_t rng_excl = rng + 1;
      u128 m = u128{next_uint64()} * rng_excl;
      uint64_t leftover = static_cast<uint64_t>(m);
      if (leftover < rng_excl) {
        const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % rng_excl;
        while (leftover < threshold) {
          m = u128{next_uint64()} * rng_excl;
          leftover = static_cast<uint64_t>(m);
        }
      }
      v = static_cast<uint64_t>(m >> 64);
    }
    out[i] = static_cast<int64_t>(off + v);
  }
  return out;
}

std::vector<int64_t> numpy_integers_int64(uint64_t seed, int64_t low, int64_t high, size_t n) {
  NumpyPcg64 gen(seed);
  return gen.integers_int64(low, high, n);
}

std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram_size,
                                        int64_t compressed_vocab_size) {
  if (layer_id < 0) fail("engram_layer_ids: layer id ", layer_id, " is negative");
  if (max_ngram_size < 1) fail("engram_max_ngram_size must be >= 1 (got ", max_ngram_size, ")");
  if (compressed_vocab_size < 1) {
    fail("engram_compressed_vocab_size must be >= 1 (got ", compressed_vocab_size, ")");
  }
  const int64_t m_max = std::numeric_limits<int64_t>::max() / compressed_vocab_size;
  const int64_t half_bound = std::max<int64_t>(1, m_max / 2);
  NumpyPcg64 gen(uint64_t{10007} * static_cast<uint64_t>(layer_id));
  std::vector<int64_t> m = gen.integers_int64(0, half_bound, static_cast<size_t>(max_ngram_size));
  for (int64_t& x : m) x = x * 2 + 1;
  return m;
}

void engram_ngram_hashes(const std::vector<int64_t>& multipliers, const int64_t* ids,
                         int64_t* hashes) {
  // Unsigned arithmetic is numpy's int64 wrap-around without C++ signed-overflow UB.
  uint64_t h = static_cast<uint64_t>(ids[0]) * static_cast<uint64_t>(multipliers[0]);
  for (size_t i = 1; i < multipliers.size(); ++i) {
    h ^= static_cast<uint64_t>(ids[i]) * static_cast<uint64_t>(multipliers[i]);
    hashes[i - 1] = static_cast<int64_t>(h);
  }
}

EngramHasher::EngramHasher(const TextConfig& cfg, int32_t pad_cid)
    : max_ngram_(cfg.engram_max_ngram_size),
      n_heads_(cfg.engram_n_heads),
      compressed_vocab_(cfg.engram_compressed_vocab_size),
      pad_cid_(pad_cid) {
  if (cfg.engram_num_embeddings.size() != cfg.engram_layer_ids.size()) {
    fail("engram_num_embeddings has ", cfg.engram_num_embeddings.size(),
         " entries, expected one per engram_layer_ids entry (", cfg.engram_layer_ids.size(), ")");
  }
  if (max_ngram_ < 2) fail("engram_max_ngram_size must be >= 2 (got ", max_ngram_, ")");
  if (n_heads_ < 1) fail("engram_n_heads must be >= 1 (got ", n_heads_, ")");
  if (cfg.engram_vocab_size < 1) {
    fail("engram_vocab_size must be >= 1 (got ", cfg.engram_vocab_size, ")");
  }
  if (compressed_vocab_ < 1) {
    fail("engram_compressed_vocab_size must be >= 1 (got ", compressed_vocab_, ")");
  }
  if (pad_cid < 0 || pad_cid >= compressed_vocab_) {
    fail("Engram pad id: compressed id ", pad_cid, " of engram_pad_token_id ",
         cfg.engram_pad_token_id,
         " is outside [0, engram_compressed_vocab_size=", compressed_vocab_, ")");
  }

  // Primes are handed out in layer order, then n-gram size, then head, and never reused.
  std::set<int64_t> taken;
  for (size_t slot = 0; slot < cfg.engram_layer_ids.size(); ++slot) {
    Layer l;
    l.multipliers = engram_multipliers(cfg.engram_layer_ids[slot], max_ngram_, compressed_vocab_);
    for (int n = 2; n <= max_ngram_; ++n) {
      int64_t start = cfg.engram_vocab_size - 1;
      for (int head = 0; head < n_heads_; ++head) {
        const int64_t p = next_unused_prime(start, taken);
        taken.insert(p);
        l.offsets.push_back(l.rows);
        l.primes.push_back(p);
        l.rows += p;
        start = p;
      }
    }
    if (l.rows != cfg.engram_num_embeddings[slot]) {
      fail("engram_num_embeddings[", slot, "] = ", cfg.engram_num_embeddings[slot],
           " but Engram layer ", cfg.engram_layer_ids[slot], " has a prime table of ", l.rows,
           " rows (engram_vocab_size ", cfg.engram_vocab_size, ", engram_n_heads ", n_heads_,
           ", engram_max_ngram_size ", max_ngram_, ")");
    }
    layers_.push_back(std::move(l));
  }
}

const EngramHasher::Layer& EngramHasher::layer(int slot) const {
  DSUF_CHECK(slot >= 0 && slot < num_slots(), "Engram slot ", slot, " of ", num_slots());
  return layers_[static_cast<size_t>(slot)];
}

void EngramHasher::row_ids(int slot, const int32_t* ctx, int64_t* rows) const {
  const Layer& l = layer(slot);
  bool dead = false;
  auto id = [&](int i) -> uint64_t {
    dead = dead || ctx[i] < 0;
    const int32_t c = dead ? pad_cid_ : ctx[i];
    DSUF_CHECK(c < compressed_vocab_, "compressed id ", c, " >= ", compressed_vocab_);
    return static_cast<uint64_t>(c);
  };
  // With 0 <= c < compressed_vocab every product is below 2^63 - 1 (see engram_multipliers), so
  // h never wraps and stays non-negative; floor_mod still gives numpy's answer for any h.
  uint64_t h = id(0) * static_cast<uint64_t>(l.multipliers[0]);
  size_t k = 0;
  for (int i = 1; i < max_ngram_; ++i) {
    h ^= id(i) * static_cast<uint64_t>(l.multipliers[static_cast<size_t>(i)]);
    for (int head = 0; head < n_heads_; ++head, ++k) {
      rows[k] = floor_mod(static_cast<int64_t>(h), l.primes[k]) + l.offsets[k];
    }
  }
}

const std::vector<int64_t>& EngramHasher::multipliers(int slot) const {
  return layer(slot).multipliers;
}
const std::vector<int64_t>& EngramHasher::primes(int slot) const {
  return layer(slot).primes;
}
const std::vector<int64_t>& EngramHasher::offsets(int slot) const {
  return layer(slot).offsets;
}
int64_t EngramHasher::table_rows(int slot) const {
  return layer(slot).rows;
}

}  // namespace dsuf
