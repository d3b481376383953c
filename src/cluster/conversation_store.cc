#include "cluster/conversation_store.h"

#include <algorithm>

namespace dsuf::cluster {

std::shared_ptr<StoredConversation> StoredConversation::make(std::vector<int32_t> tokens,
                                                             std::string blob) {
  auto c = std::make_shared<StoredConversation>();
  c->tokens = std::move(tokens);
  c->blob = std::move(blob);
  const std::string_view parts[] = {c->token_bytes(), c->blob};
  c->checksum = checksum_hex(parts);
  const auto keys = chain_keys(c->tokens);
  if (!keys.empty()) c->chain_hex = to_hex(keys.back());
  return c;
}

bool StoredConversation::is_prefix_of(std::span<const int32_t> prompt) const {
  return !tokens.empty() && tokens.size() < prompt.size() &&
         std::equal(tokens.begin(), tokens.end(), prompt.begin());
}

void ConversationStore::touch(uint64_t id) {
  auto& n = nodes_.at(id);
  lru_.splice(lru_.begin(), lru_, n.lru);
}

void ConversationStore::erase(uint64_t id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  const ConversationPtr& c = it->second.c;
  if (!c->chain_hex.empty()) {
    auto& v = by_chain_[c->chain_hex];
    std::erase(v, id);
    if (v.empty()) by_chain_.erase(c->chain_hex);
  }
  std::erase_if(by_session_, [&](const auto& kv) { return kv.second == id; });
  bytes_ -= c->bytes();
  lru_.erase(it->second.lru);
  nodes_.erase(it);
}

bool ConversationStore::insert(const std::string& session, ConversationPtr c) {
  if (c->bytes() > capacity_) return false;
  std::lock_guard lk(mu_);
  // The same token sequence stored again (a retried turn) replaces the older copy.
  if (!c->chain_hex.empty()) {
    if (auto it = by_chain_.find(c->chain_hex); it != by_chain_.end()) {
      for (uint64_t id : std::vector<uint64_t>(it->second))
        if (nodes_.at(id).c->tokens == c->tokens) erase(id);
    }
  }
  while (bytes_ + c->bytes() > capacity_ && !lru_.empty()) {
    erase(lru_.back());
    ++evictions_;
  }
  const uint64_t id = next_id_++;
  lru_.push_front(id);
  nodes_[id] = Node{c, lru_.begin()};
  bytes_ += c->bytes();
  if (!c->chain_hex.empty()) by_chain_[c->chain_hex].push_back(id);
  if (!session.empty()) by_session_[session] = id;
  return true;
}

ConversationPtr ConversationStore::find(const std::string& session, std::span<const int32_t> prompt,
                                        const std::vector<ChainKey>* keys) {
  std::vector<ChainKey> own;
  if (!keys) {
    own = chain_keys(prompt);
    keys = &own;
  }
  std::lock_guard lk(mu_);
  uint64_t best = 0;
  size_t best_len = 0;
  if (!session.empty()) {
    if (auto it = by_session_.find(session); it != by_session_.end()) {
      const auto& c = nodes_.at(it->second).c;
      if (c->is_prefix_of(prompt)) best = it->second, best_len = c->tokens.size();
    }
  }
  // Longest block first: an entry filed under block b holds [b·B, (b+1)·B) tokens, so the first
  // block with a verified entry has the longest one (unless the session's is longer still).
  for (size_t b = keys->size(); b > 0; --b) {
    if (b * kBlockTokens + kBlockTokens <= best_len) break;
    auto it = by_chain_.find(to_hex((*keys)[b - 1]));
    if (it == by_chain_.end()) continue;
    for (uint64_t id : it->second) {
      const auto& c = nodes_.at(id).c;
      if (c->tokens.size() > best_len && c->is_prefix_of(prompt))
        best = id, best_len = c->tokens.size();
    }
    if (best_len >= b * kBlockTokens) break;
  }
  if (!best) return nullptr;
  touch(best);
  return nodes_.at(best).c;
}

ConversationStore::Stats ConversationStore::stats() const {
  std::lock_guard lk(mu_);
  return {bytes_, nodes_.size(), capacity_, evictions_};
}

}  // namespace dsuf::cluster
