// Host RAM store of finished turns' states, bounded in bytes with LRU eviction. An entry is
// immutable and shared: a transfer that is sending one keeps it alive (pinned) even if the store
// evicts it meanwhile, so eviction never truncates a transfer.
//
// Lookup: the session id (when given) nominates its latest entry; the prompt's hash chain
// nominates entries filed under each of its block keys. A nominee is used only if its stored
// token ids are a proper prefix of the prompt (at least one token must be left to prefill, as the
// first logits come from a real step). The longest verified nominee wins.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/hash_chain.h"

namespace dsuf::cluster {

struct StoredConversation {
  std::vector<int32_t> tokens;  // what the state has consumed
  std::string blob;             // SequenceState::serialize
  std::string checksum;         // XXH3-128 over tokens bytes ‖ blob
  std::string chain_hex;        // key of the last full block ("" when shorter than one block)

  size_t bytes() const { return tokens.size() * sizeof(int32_t) + blob.size() + 256; }
  std::string_view token_bytes() const {
    return {reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(int32_t)};
  }
  static std::shared_ptr<StoredConversation> make(std::vector<int32_t> tokens, std::string blob);
  bool is_prefix_of(std::span<const int32_t> prompt) const;
};

using ConversationPtr = std::shared_ptr<const StoredConversation>;

class ConversationStore {
 public:
  explicit ConversationStore(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  // False when the entry alone exceeds the capacity (nothing is evicted for it then).
  bool insert(const std::string& session, ConversationPtr c);
  // `keys`: chain_keys(prompt), when the caller already has them.
  ConversationPtr find(const std::string& session, std::span<const int32_t> prompt,
                       const std::vector<ChainKey>* keys = nullptr);

  // Whether an entry filed under this chain key is still here (ownership renewal asks).
  bool holds_chain(const std::string& key_hex) const {
    std::lock_guard lk(mu_);
    return by_chain_.count(key_hex) > 0;
  }

  struct Stats {
    size_t bytes = 0, entries = 0, capacity = 0;
    uint64_t evictions = 0;
  };
  Stats stats() const;

 private:
  struct Node {
    ConversationPtr c;
    std::list<uint64_t>::iterator lru;
  };
  void touch(uint64_t id);
  void erase(uint64_t id);

  size_t capacity_;
  mutable std::mutex mu_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Node> nodes_;
  std::list<uint64_t> lru_;  // front: most recent
  std::unordered_map<std::string, std::vector<uint64_t>> by_chain_;
  std::unordered_map<std::string, uint64_t> by_session_;
  size_t bytes_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace dsuf::cluster
