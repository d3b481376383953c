#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "text/byte_level.h"
#include "text/unicode_props.h"
#include "text/utf8.h"

namespace dsuf::text {
namespace {

using json = nlohmann::json;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Oniguruma (what HF runs) reads \s and \S as Unicode White_Space; PCRE2 with UCP reads them as
// "Z categories plus \t-\r", which leaves out U+0085. Rewrite both into explicit classes so the
// pattern from the file means the same thing under PCRE2.
std::string translate_pattern(std::string_view pat, std::string_view origin) {
  std::string out;
  out.reserve(pat.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pat.size(); ++i) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char e = pat[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceClassBody)
                        : "[" + std::string(kWhiteSpaceClassBody) + "]";
      } else if (e == 'S') {
        if (in_class) {
          fail(origin,
               ": pre-tokenizer regex uses \\S inside a character class, which is not "
               "supported: ",
               pat);
        }
        out += "[^" + std::string(kWhiteSpaceClassBody) + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (after an optional '^') right at the start of a class is a literal.
      if (i + 1 < pat.size() && pat[i + 1] == '^') out += pat[++i];
      if (i + 1 < pat.size() && pat[i + 1] == ']') out += pat[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string source;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  Regex(Regex&& o) noexcept : code(o.code), jit(o.jit), source(std::move(o.source)) {
    o.code = nullptr;
  }
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

// Open-addressing map (left id, right id) -> (merge rank, merged id). The BPE inner loop does
// one lookup per adjacent pair, so it is kept flat and branch-light.
class PairTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  // Returns false if the pair is already present (the earlier, lower rank wins, as in HF).
  bool insert(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
    const uint64_t k = key(a, b);
    for (size_t i = hash(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = Entry{k, rank, merged};
        return true;
      }
      if (slots_[i].key == k) return false;
    }
  }
  // Pairs of small ids (the byte tokens and the first merges) also go into a dense table: a
  // long piece starts as bytes, so its first lookups are all byte pairs, and the dense table
  // stays in cache where the hash table does not.
  void build_dense(int32_t limit) {
    dense_limit_ = limit;
    dense_.assign(static_cast<size_t>(limit) * limit, nullptr);
    for (const Entry& e : slots_) {
      if (e.key == kEmpty) continue;
      const auto a = static_cast<int32_t>(e.key >> 32),
                 b = static_cast<int32_t>(e.key & 0xFFFFFFFF);
      if (a < limit && b < limit) dense_[static_cast<size_t>(a) * limit + b] = &e;
    }
  }
  const Entry* find(int32_t a, int32_t b) const {
    if (a < dense_limit_ && b < dense_limit_ && a >= 0 && b >= 0) {
      return dense_[static_cast<size_t>(a) * dense_limit_ + b];
    }
    const uint64_t k = key(a, b);
    for (size_t i = hash(k);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == k) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t hash(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ULL >> 20) & mask_; }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
  std::vector<const Entry*> dense_;
  int32_t dense_limit_ = 0;
};

// Byte trie over added-token contents for leftmost-longest matching (HF uses an Aho-Corasick
// automaton with LeftmostLongest; scanning start positions left to right and taking the longest
// match at the first position that has one is the same thing).
class AddedTrie {
 public:
  AddedTrie() { nodes_.emplace_back(); }
  void add(std::string_view s, int32_t id) {
    uint32_t n = 0;
    for (unsigned char c : s) {
      auto& ch = nodes_[n].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), c,
                                 [](const auto& p, unsigned char v) { return p.first < v; });
      if (it != ch.end() && it->first == c) {
        n = it->second;
      } else {
        const auto next = static_cast<uint32_t>(nodes_.size());
        ch.insert(it, {c, next});
        nodes_.emplace_back();
        n = next;
      }
    }
    if (nodes_[n].id < 0) nodes_[n].id = id;
    first_byte_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // Longest match starting at s[pos]: sets len and id; returns false when none.
  bool match_at(std::string_view s, size_t pos, size_t& len, int32_t& id) const {
    if (!first_byte_[static_cast<unsigned char>(s[pos])]) return false;
    uint32_t n = 0;
    bool found = false;
    for (size_t i = pos; i < s.size(); ++i) {
      const auto& ch = nodes_[n].children;
      const unsigned char c = static_cast<unsigned char>(s[i]);
      auto it = std::lower_bound(ch.begin(), ch.end(), c,
                                 [](const auto& p, unsigned char v) { return p.first < v; });
      if (it == ch.end() || it->first != c) break;
      n = it->second;
      if (nodes_[n].id >= 0) {
        found = true;
        len = i + 1 - pos;
        id = nodes_[n].id;
      }
    }
    return found;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, uint32_t>> children;
    int32_t id = -1;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
  bool empty_ = true;
};

// Direct-mapped word cache: piece bytes -> ids, stored inline so a lookup is one hash and one
// memcmp and an insert never allocates. A colliding piece simply replaces the old one.
class WordCache {
 public:
  static constexpr size_t kMaxBytes = 48;  // longer pieces (CJK runs) rarely repeat
  static constexpr size_t kMaxIds = 15;
  static constexpr size_t kSlots = 1 << 14;

  WordCache() : tags_(kSlots, 0), slots_(kSlots) {}
  // Appends the cached ids for `piece` to out; false on a miss.
  bool lookup(std::string_view piece, size_t hash, std::vector<int32_t>& out) const {
    // Most misses are settled by the small tag array without touching the large slot array.
    if (tags_[hash & (kSlots - 1)] != tag(hash)) return false;
    const Slot& s = slots_[hash & (kSlots - 1)];
    if (s.len != piece.size() || s.n_ids == 0 || std::memcmp(s.bytes, piece.data(), s.len) != 0) {
      return false;
    }
    out.insert(out.end(), s.ids, s.ids + s.n_ids);
    return true;
  }
  void insert(std::string_view piece, size_t hash, const int32_t* ids, size_t n) {
    if (piece.size() > kMaxBytes || n == 0 || n > kMaxIds) return;
    tags_[hash & (kSlots - 1)] = tag(hash);
    Slot& s = slots_[hash & (kSlots - 1)];
    s.len = static_cast<uint8_t>(piece.size());
    s.n_ids = static_cast<uint8_t>(n);
    std::memcpy(s.bytes, piece.data(), piece.size());
    std::memcpy(s.ids, ids, n * sizeof(int32_t));
  }

 private:
  struct Slot {
    uint8_t len = 0, n_ids = 0;
    char bytes[kMaxBytes];
    int32_t ids[kMaxIds];
  };
  static uint16_t tag(size_t hash) { return static_cast<uint16_t>((hash >> 48) | 1); }
  std::vector<uint16_t> tags_;  // 0: empty
  std::vector<Slot> slots_;
};

struct MergeCandidate {
  uint32_t rank;
  int32_t left, right, left_id, right_id, merged;
};

// Per-thread working state: PCRE2 match data and JIT stack are not shareable between threads,
// and the word cache is only useful if it survives between calls.
struct EncodeState {
  std::vector<pcre2_match_data*> match_data;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  WordCache cache;
  // Scratch for BPE.
  std::vector<int32_t> sym, prev, next;
  std::vector<uint32_t> ranks;
  std::vector<MergeCandidate> heap;
  EncodeState() = default;
  EncodeState(const EncodeState&) = delete;
  EncodeState& operator=(const EncodeState&) = delete;
  ~EncodeState() {
    for (auto* md : match_data) pcre2_match_data_free(md);
    if (mctx) pcre2_match_context_free(mctx);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
  }
};

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  std::vector<Regex> splits;
  // Model vocab: byte-level spelling <-> id.
  StringMap<int32_t> vocab;
  std::vector<std::string> id_spelling;  // HF's token string per id ("" if none)
  std::vector<std::string> id_bytes;     // raw bytes per id, as the ByteLevel decoder yields
  std::vector<uint8_t> id_known;
  std::vector<uint8_t> id_special;
  std::array<int32_t, 256> byte_id{};
  PairTable pairs;
  bool ignore_merges = false;
  StringMap<int32_t> bytes_to_vocab_id;  // only with ignore_merges
  std::vector<AddedToken> added;
  StringMap<int32_t> added_by_content;
  AddedTrie trie_raw;         // added tokens with normalized=false: matched first
  AddedTrie trie_normalized;  // then the rest, on what remains

  std::mutex pool_mu;
  std::vector<std::unique_ptr<EncodeState>> pool;

  ~Impl() = default;

  std::unique_ptr<EncodeState> acquire() {
    {
      std::lock_guard lk(pool_mu);
      if (!pool.empty()) {
        auto s = std::move(pool.back());
        pool.pop_back();
        return s;
      }
    }
    auto s = std::make_unique<EncodeState>();
    for (const auto& r : splits) {
      s->match_data.push_back(pcre2_match_data_create_from_pattern(r.code, nullptr));
      DSUF_CHECK(s->match_data.back() != nullptr, "out of memory for PCRE2 match data");
    }
    s->mctx = pcre2_match_context_create(nullptr);
    // Runs of tens of thousands of spaces make `\s+(?!\S)` backtrack deeply; give JIT room.
    s->jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    DSUF_CHECK(s->mctx && s->jit_stack, "out of memory for PCRE2 JIT stack");
    pcre2_jit_stack_assign(s->mctx, nullptr, s->jit_stack);
    return s;
  }
  void release(std::unique_ptr<EncodeState> s) {
    std::lock_guard lk(pool_mu);
    pool.push_back(std::move(s));
  }

  void bpe(EncodeState& st, std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_long(EncodeState& st, std::string_view piece, std::vector<int32_t>& out) const;
  void split_level(EncodeState& st, size_t level, std::string_view piece,
                   std::vector<int32_t>& out) const;
  void encode_plain(EncodeState& st, std::string_view text, std::vector<int32_t>& out) const;
  void encode_added(EncodeState& st, std::string_view text, const AddedTrie& trie,
                    const AddedTrie* next, std::vector<int32_t>& out) const;
};

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open tokenizer file ", path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

[[noreturn]] void unsupported(std::string_view origin, std::string_view what) {
  fail(origin, ": unsupported tokenizer.json: ", what,
       " (only byte-level BPE of the DeepSeek family is implemented)");
}

void check_normalizer(const json& n, std::string_view origin) {
  if (n.is_null()) return;
  if (n.value("type", "") == "Sequence" && n.contains("normalizers") &&
      n["normalizers"].is_array() && n["normalizers"].empty()) {
    return;
  }
  unsupported(origin, "a normalizer (" + n.dump() + ")");
}

Regex compile_split(const json& pt, std::string_view origin) {
  if (pt.value("behavior", "") != "Isolated" || pt.value("invert", false)) {
    unsupported(origin, "Split pre-tokenizer with behavior other than Isolated: " + pt.dump());
  }
  const json& pat = pt.at("pattern");
  Regex r;
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  std::string source;
  if (pat.contains("Regex")) {
    source = translate_pattern(pat["Regex"].get<std::string>(), origin);
  } else if (pat.contains("String")) {
    source = pat["String"].get<std::string>();
    options |= PCRE2_LITERAL;
  } else {
    fail(origin, ": Split pattern has neither Regex nor String: ", pat.dump());
  }
  int err = 0;
  PCRE2_SIZE erroff = 0;
  r.code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), options, &err,
                         &erroff, nullptr);
  if (!r.code) {
    fail(origin, ": cannot compile pre-tokenizer regex at offset ", erroff, ": ",
         pcre2_message(err), " (pattern ", source, ")");
  }
  r.jit = pcre2_jit_compile(r.code, PCRE2_JIT_COMPLETE) == 0;
  r.source = std::move(source);
  return r;
}

void load_pre_tokenizer(const json& pt, std::string_view origin, std::vector<Regex>& splits) {
  if (pt.is_null()) unsupported(origin, "no pre_tokenizer");
  std::vector<json> list;
  if (pt.value("type", "") == "Sequence") {
    for (const auto& p : pt.at("pretokenizers")) list.push_back(p);
  } else {
    list.push_back(pt);
  }
  bool byte_level = false;
  for (const auto& p : list) {
    const std::string type = p.value("type", "");
    if (type == "Split") {
      if (byte_level) unsupported(origin, "a Split after the ByteLevel pre-tokenizer");
      splits.push_back(compile_split(p, origin));
    } else if (type == "ByteLevel") {
      if (p.value("add_prefix_space", false)) unsupported(origin, "ByteLevel add_prefix_space");
      if (p.value("use_regex", true)) unsupported(origin, "ByteLevel use_regex (GPT-2 regex)");
      byte_level = true;
    } else {
      unsupported(origin, "pre-tokenizer type '" + type + "'");
    }
  }
  if (!byte_level) unsupported(origin, "no ByteLevel pre-tokenizer");
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer::Tokenizer(const std::filesystem::path& path)
    : Tokenizer(from_json(read_file(path), path.string())) {}

Tokenizer Tokenizer::from_json(std::string_view json_text, std::string_view origin) {
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.origin = origin;
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(origin, ": not valid JSON: ", e.what());
  }
  try {
    check_normalizer(j.value("normalizer", json()), origin);
    load_pre_tokenizer(j.value("pre_tokenizer", json()), origin, t.splits);
    const json& dec = j.value("decoder", json());
    if (dec.is_null() || dec.value("type", "") != "ByteLevel") {
      unsupported(origin, "decoder other than ByteLevel");
    }
    const json& m = j.at("model");
    if (m.value("type", "BPE") != "BPE")
      unsupported(origin, "model type " + m.dump(0).substr(0, 40));
    if (m.value("byte_fallback", false)) unsupported(origin, "BPE byte_fallback");
    if (!m.value("continuing_subword_prefix", json()).is_null() ||
        !m.value("end_of_word_suffix", json()).is_null()) {
      unsupported(origin, "BPE continuing_subword_prefix/end_of_word_suffix");
    }
    if (!m.value("dropout", json()).is_null()) unsupported(origin, "BPE dropout");
    t.ignore_merges = m.value("ignore_merges", false);

    // Byte-level alphabet: code point -> byte.
    const auto b2c = byte_to_codepoint_table();
    std::unordered_map<char32_t, unsigned char> c2b;
    for (int b = 0; b < 256; ++b) c2b[b2c[b]] = static_cast<unsigned char>(b);
    // The ByteLevel decoder maps a token char by char when every char is in the alphabet and
    // otherwise keeps the token's own UTF-8 (this is how added tokens come out verbatim).
    auto token_to_bytes = [&](const std::string& s) {
      std::string out;
      size_t i = 0;
      while (i < s.size()) {
        auto it = c2b.find(utf8_next(s, i));
        if (it == c2b.end()) return s;
        out.push_back(static_cast<char>(it->second));
      }
      return out;
    };

    int32_t max_id = -1;
    const json& vocab = m.at("vocab");
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int32_t id = it.value().get<int32_t>();
      if (id < 0) fail(origin, ": negative id ", id, " for vocab entry ", it.key());
      max_id = std::max(max_id, id);
    }
    const json& added_json = j.value("added_tokens", json::array());
    for (const auto& a : added_json) max_id = std::max(max_id, a.at("id").get<int32_t>());
    if (max_id < 0) fail(origin, ": empty vocabulary");
    const size_t n = static_cast<size_t>(max_id) + 1;
    t.id_spelling.assign(n, {});
    t.id_bytes.assign(n, {});
    t.id_known.assign(n, 0);
    t.id_special.assign(n, 0);
    t.vocab.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int32_t id = it.value().get<int32_t>();
      if (!t.vocab.emplace(it.key(), id).second) fail(origin, ": duplicate vocab entry ", it.key());
      if (t.id_known[id]) fail(origin, ": id ", id, " is used by two vocab entries");
      t.id_spelling[id] = it.key();
      t.id_bytes[id] = token_to_bytes(it.key());
      t.id_known[id] = 1;
    }
    for (int b = 0; b < 256; ++b) {
      std::string s;
      utf8_append(s, b2c[b]);
      auto it = t.vocab.find(s);
      t.byte_id[b] = it == t.vocab.end() ? -1 : it->second;
    }
    if (t.ignore_merges) {
      for (const auto& [s, id] : t.vocab) t.bytes_to_vocab_id.emplace(t.id_bytes[id], id);
    }

    const json& merges = m.at("merges");
    t.pairs.reserve(merges.size());
    uint32_t rank = 0;
    for (const auto& mg : merges) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) fail(origin, ": merge ", rank, " has no space: ", s);
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        fail(origin, ": merge ", rank, " is neither \"a b\" nor [a, b]");
      }
      auto ia = t.vocab.find(a), ib = t.vocab.find(b), im = t.vocab.find(a + b);
      if (ia == t.vocab.end() || ib == t.vocab.end() || im == t.vocab.end()) {
        fail(origin, ": merge ", rank, " (", a, " ", b, ") refers to a token not in the vocab");
      }
      t.pairs.insert(ia->second, ib->second, rank, im->second);
      ++rank;
    }
    // Dense over the byte tokens when they sit at low ids (ids 3..258 in this family).
    int32_t max_byte_id = 0;
    for (int32_t id : t.byte_id) max_byte_id = std::max(max_byte_id, id);
    if (max_byte_id < 1024) t.pairs.build_dense(max_byte_id + 1);

    for (const auto& a : added_json) {
      AddedToken tok{a.at("id").get<int32_t>(), a.at("content").get<std::string>(),
                     a.value("special", false), a.value("normalized", !a.value("special", false))};
      if (a.value("single_word", false) || a.value("lstrip", false) || a.value("rstrip", false)) {
        unsupported(origin, "added token with single_word/lstrip/rstrip: " + tok.content);
      }
      if (tok.content.empty()) fail(origin, ": added token ", tok.id, " has empty content");
      utf8_require_valid(tok.content, std::string(origin) + ": added token content");
      t.id_spelling[tok.id] = tok.content;
      t.id_bytes[tok.id] = token_to_bytes(tok.content);
      t.id_known[tok.id] = 1;
      t.id_special[tok.id] = tok.special;
      t.added_by_content.emplace(tok.content, tok.id);
      (tok.normalized ? t.trie_normalized : t.trie_raw).add(tok.content, tok.id);
      t.added.push_back(std::move(tok));
    }
  } catch (const json::exception& e) {
    fail(origin, ": malformed tokenizer.json: ", e.what());
  }
  return Tokenizer(std::move(impl));
}

// BPE of one pre-token: start from byte tokens, repeatedly merge the adjacent pair of lowest
// rank (leftmost on ties). Short pieces keep a rank per adjacent pair and rescan it (quadratic
// but tiny: faster than the heap up to ~32 bytes); longer ones go to the heap version.
void Tokenizer::Impl::bpe(EncodeState& st, std::string_view piece,
                          std::vector<int32_t>& out) const {
  if (ignore_merges) {
    auto it = bytes_to_vocab_id.find(piece);
    if (it != bytes_to_vocab_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > 32) {
    bpe_long(st, piece, out);
    return;
  }
  auto& sym = st.sym;
  auto& ranks = st.ranks;
  sym.clear();
  for (unsigned char c : piece) {
    if (byte_id[c] >= 0) sym.push_back(byte_id[c]);  // HF drops bytes with no token (no unk)
  }
  if (sym.size() <= 1) {
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  auto rank_of = [&](int32_t a, int32_t b) {
    const auto* e = pairs.find(a, b);
    return e ? e->rank : kNoRank;
  };
  ranks.resize(sym.size() - 1);
  for (size_t i = 0; i + 1 < sym.size(); ++i) ranks[i] = rank_of(sym[i], sym[i + 1]);
  while (sym.size() > 1) {
    size_t best = 0;
    uint32_t best_rank = ranks[0];
    for (size_t i = 1; i < ranks.size(); ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == kNoRank) break;
    sym[best] = pairs.find(sym[best], sym[best + 1])->merged;
    sym.erase(sym.begin() + static_cast<ptrdiff_t>(best) + 1);
    ranks.erase(ranks.begin() + static_cast<ptrdiff_t>(best));
    if (best > 0) ranks[best - 1] = rank_of(sym[best - 1], sym[best]);
    if (best < ranks.size()) ranks[best] = rank_of(sym[best], sym[best + 1]);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

// O(n log n) BPE for long pieces (whole CJK paragraphs, long runs): symbols in a linked list,
// candidate merges in a min-heap keyed by (rank, position); stale entries are skipped on pop.
void Tokenizer::Impl::bpe_long(EncodeState& st, std::string_view piece,
                               std::vector<int32_t>& out) const {
  auto& id = st.sym;
  id.clear();
  for (unsigned char c : piece) {
    if (byte_id[c] >= 0) id.push_back(byte_id[c]);
  }
  const size_t n = id.size();
  if (n <= 1) {
    out.insert(out.end(), id.begin(), id.end());
    return;
  }
  auto& prev = st.prev;
  auto& next = st.next;
  prev.resize(n);
  next.resize(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  auto& heap = st.heap;
  heap.clear();
  // Min-heap on (rank, left position): the lowest rank first, leftmost among equals.
  auto later = [](const MergeCandidate& a, const MergeCandidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  auto push = [&](int32_t l) {
    const int32_t r = next[l];
    if (r < 0) return;
    if (const auto* e = pairs.find(id[l], id[r])) {
      heap.push_back(MergeCandidate{e->rank, l, r, id[l], id[r], e->merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const MergeCandidate c = heap.back();
    heap.pop_back();
    if (id[c.left] != c.left_id || next[c.left] != c.right || id[c.right] != c.right_id) continue;
    id[c.left] = c.merged;
    id[c.right] = -1;  // dead
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    if (prev[c.left] >= 0) push(prev[c.left]);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

// Runs the Split regexes one after another: regex k sees each piece regex k-1 produced (matched
// pieces and the gaps between matches alike), exactly as HF's Sequence of Isolated splits does.
// Matching runs on the piece alone, so anchors and lookarounds stop at piece boundaries.
void Tokenizer::Impl::split_level(EncodeState& st, size_t level, std::string_view piece,
                                  std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (level == splits.size()) {
    if (piece.size() <= WordCache::kMaxBytes) {
      const size_t h = std::hash<std::string_view>{}(piece);
      if (st.cache.lookup(piece, h, out)) return;
      const size_t start = out.size();
      bpe(st, piece, out);
      st.cache.insert(piece, h, out.data() + start, out.size() - start);
    } else {
      bpe(st, piece, out);
    }
    return;
  }
  const Regex& re = splits[level];
  pcre2_match_data* md = st.match_data[level];
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  const size_t len = piece.size();
  size_t gap_start = 0, search = 0;
  while (search <= len) {
    const int rc =
        re.jit ? pcre2_jit_match(re.code, subject, len, search, 0, md, st.mctx)
               : pcre2_match(re.code, subject, len, search, PCRE2_NO_UTF_CHECK, md, st.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      fail(origin, ": pre-tokenizer regex ", level, " failed on a piece of ", len,
           " bytes: ", pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (e == s) {  // empty match: produces no piece; step over one character
      if (s >= len) break;
      size_t i = s;
      utf8_next(piece, i);
      search = i;
      continue;
    }
    if (s > gap_start) split_level(st, level + 1, piece.substr(gap_start, s - gap_start), out);
    split_level(st, level + 1, piece.substr(s, e - s), out);
    gap_start = search = e;
  }
  if (gap_start < len) split_level(st, level + 1, piece.substr(gap_start), out);
}

void Tokenizer::Impl::encode_plain(EncodeState& st, std::string_view text,
                                   std::vector<int32_t>& out) const {
  split_level(st, 0, text, out);
}

void Tokenizer::Impl::encode_added(EncodeState& st, std::string_view text, const AddedTrie& trie,
                                   const AddedTrie* next, std::vector<int32_t>& out) const {
  auto rest = [&](std::string_view seg) {
    if (seg.empty()) return;
    if (next && !next->empty()) {
      encode_added(st, seg, *next, nullptr, out);
    } else {
      encode_plain(st, seg, out);
    }
  };
  if (trie.empty()) {
    rest(text);
    return;
  }
  size_t seg_start = 0;
  for (size_t i = 0; i < text.size();) {
    size_t len = 0;
    int32_t id = -1;
    if (trie.match_at(text, i, len, id)) {
      rest(text.substr(seg_start, i - seg_start));
      out.push_back(id);
      i += len;
      seg_start = i;
    } else {
      ++i;
    }
  }
  rest(text.substr(seg_start));
}

void Tokenizer::encode_into(std::string_view text, bool match_added_tokens,
                            std::vector<int32_t>& out) const {
  utf8_require_valid(text, "text to tokenize");
  auto st = impl_->acquire();
  struct Releaser {
    Impl* impl;
    std::unique_ptr<EncodeState>& s;
    ~Releaser() { impl->release(std::move(s)); }
  } releaser{impl_.get(), st};
  if (match_added_tokens) {
    impl_->encode_added(*st, text, impl_->trie_raw, &impl_->trie_normalized, out);
  } else {
    impl_->encode_plain(*st, text, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool match_added_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  encode_into(text, match_added_tokens, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (!has_id(id)) continue;
    if (skip_special && impl_->id_special[id]) continue;
    bytes += impl_->id_bytes[id];
  }
  return utf8_lossy(bytes);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  return has_id(id) ? std::string_view(impl_->id_bytes[id]) : std::string_view();
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->id_known.size());
}

bool Tokenizer::has_id(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_known.size() && impl_->id_known[id];
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (!has_id(id)) return std::nullopt;
  return impl_->id_spelling[id];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) {
    return it->second;
  }
  if (auto it = impl_->vocab.find(token); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return has_id(id) && impl_->id_special[id];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    const int k = utf8_classify(p + i, n - i);
    if (k == 0) break;  // incomplete character: hold it
    if (k > 0) {
      out.append(pending_, i, static_cast<size_t>(k));
      i += static_cast<size_t>(k);
    } else {
      out += kReplacementChar;
      i += static_cast<size_t>(-k);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsuf::text
