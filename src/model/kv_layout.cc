#include "model/kv_layout.h"

#include <cstring>

#include "core/error.h"

namespace dsuf {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'U', 'F', 'K', 'V', '4', '1'};

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

class Writer {
 public:
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void u64(uint64_t v) { raw(&v, 8); }
  void blob(const void* p, size_t n) {
    u64(n);
    raw(p, n);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  void raw(void* p, size_t n, const char* what) {
    if (n > s_.size() - off_) fail("sequence state: truncated while reading ", what, " (", s_.size(), " bytes)");
    std::memcpy(p, s_.data() + off_, n);
    off_ += n;
  }
  uint64_t u64(const char* what) {
    uint64_t v;
    raw(&v, 8, what);
    return v;
  }
  template <typename T>
  std::vector<T> blob(const char* what, size_t max_bytes) {
    uint64_t n = u64(what);
    if (n > max_bytes || n % sizeof(T)) fail("sequence state: ", what, " has an impossible size ", n);
    std::vector<T> v(n / sizeof(T));
    raw(v.data(), n, what);
    return v;
  }
  bool done() const { return off_ == s_.size(); }

 private:
  const std::string& s_;
  size_t off_ = 0;
};

}  // namespace

KvLayout KvLayout::from_config(const ModelConfig& cfg) {
  const TextConfig& t = cfg.text;
  KvLayout k;
  k.num_layers = t.num_hidden_layers;
  k.window = t.sliding_window;
  k.head_dim = t.head_dim;
  k.index_head_dim = t.index_head_dim;
  k.history = t.engram_layer_ids.empty() ? 0 : t.engram_max_ngram_size - 1;
  k.window_entry_bytes = t.head_dim + t.head_dim / 32;
  k.ckv_entry_bytes = t.head_dim / 2 + t.head_dim / 16;
  k.ikey_entry_bytes = t.index_head_dim / 2 + t.index_head_dim / 32;
  k.source_slot.assign(k.num_layers, -1);
  for (const LayerPlan& lp : cfg.layers) {
    if (lp.owns_compressor) {
      k.kv_sources.push_back(lp.layer);
      k.source_ratio.push_back(lp.ratio);
    }
  }
  for (const LayerPlan& lp : cfg.layers) {
    for (size_t s = 0; s < k.kv_sources.size(); ++s)
      if (k.kv_sources[s] == lp.kv_source) k.source_slot[lp.layer] = static_cast<int>(s);
  }
  uint64_t h = mix(0, kVersion);
  for (uint64_t v : {uint64_t(k.num_layers), uint64_t(k.window), uint64_t(k.head_dim), uint64_t(k.index_head_dim),
                     uint64_t(k.history)})
    h = mix(h, v);
  for (size_t s = 0; s < k.kv_sources.size(); ++s) h = mix(mix(h, k.kv_sources[s]), k.source_ratio[s]);
  k.fingerprint = h;
  return k;
}

size_t KvLayout::bytes_for(int64_t tokens) const {
  size_t b = static_cast<size_t>(num_layers) * window * window_entry_bytes;
  for (size_t s = 0; s < kv_sources.size(); ++s) {
    size_t entries = static_cast<size_t>(tokens / source_ratio[s]);
    b += entries * (ckv_entry_bytes + ikey_entry_bytes);
    b += static_cast<size_t>(source_ratio[s] - 1) * 2 * head_dim * sizeof(float);
  }
  return b;
}

SequenceState SequenceState::empty(const KvLayout& layout) {
  SequenceState s;
  s.window.assign(layout.num_layers, std::vector<uint8_t>(layout.window * layout.window_entry_bytes, 0));
  s.ckv.resize(layout.kv_sources.size());
  s.ikey.resize(layout.kv_sources.size());
  s.pending.resize(layout.kv_sources.size());
  s.engram_history.assign(layout.history, -1);
  return s;
}

std::string SequenceState::serialize(const KvLayout& layout) const {
  if (unquantized) fail("sequence state: a parity-mode (unquantized) state cannot be serialized");
  Writer w;
  w.raw(kMagic, 8);
  w.u64(KvLayout::kVersion);
  w.u64(layout.fingerprint);
  w.u64(static_cast<uint64_t>(pos));
  for (const auto& v : window) w.blob(v.data(), v.size());
  for (size_t s = 0; s < ckv.size(); ++s) {
    w.blob(ckv[s].data(), ckv[s].size());
    w.blob(ikey[s].data(), ikey[s].size());
    w.blob(pending[s].data(), pending[s].size() * sizeof(float));
  }
  w.blob(engram_history.data(), engram_history.size() * sizeof(int32_t));
  return w.take();
}

SequenceState SequenceState::deserialize(const KvLayout& layout, const std::string& bytes) {
  Reader r(bytes);
  char magic[8];
  r.raw(magic, 8, "magic");
  if (std::memcmp(magic, kMagic, 8) != 0) fail("sequence state: bad magic (not a DSUF V4.1 KV state)");
  uint64_t version = r.u64("version");
  if (version != KvLayout::kVersion)
    fail("sequence state: layout version ", version, ", this build reads version ", KvLayout::kVersion);
  uint64_t fp = r.u64("fingerprint");
  if (fp != layout.fingerprint) fail("sequence state: made for another model layout (fingerprint mismatch)");
  SequenceState s = empty(layout);
  s.pos = static_cast<int64_t>(r.u64("position"));
  if (s.pos < 0) fail("sequence state: negative position");
  for (auto& v : s.window) {
    v = r.blob<uint8_t>("window ring", layout.window * layout.window_entry_bytes);
    if (v.size() != layout.window * layout.window_entry_bytes) fail("sequence state: window ring has the wrong size");
  }
  for (size_t k = 0; k < layout.kv_sources.size(); ++k) {
    const int ratio = layout.source_ratio[k];
    const size_t n_entries = static_cast<size_t>(s.pos / ratio);
    s.ckv[k] = r.blob<uint8_t>("compressed KV", n_entries * layout.ckv_entry_bytes);
    s.ikey[k] = r.blob<uint8_t>("indexer keys", n_entries * layout.ikey_entry_bytes);
    s.pending[k] = r.blob<float>("compressor state", static_cast<size_t>(ratio) * 2 * layout.head_dim * 4);
    if (s.ckv[k].size() != n_entries * layout.ckv_entry_bytes || s.ikey[k].size() != n_entries * layout.ikey_entry_bytes ||
        s.pending[k].size() != static_cast<size_t>(s.pos % ratio) * 2 * layout.head_dim)
      fail("sequence state: KV source layer ", layout.kv_sources[k], " holds sizes inconsistent with position ", s.pos);
  }
  s.engram_history = r.blob<int32_t>("engram history", layout.history * 4);
  if (static_cast<int>(s.engram_history.size()) != layout.history) fail("sequence state: engram history has the wrong size");
  if (!r.done()) fail("sequence state: trailing bytes after the last pool");
  return s;
}

}  // namespace dsuf
