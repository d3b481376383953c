#include "cluster/conversation_cache.h"

#include <unistd.h>

#include <cstdio>
#include <initializer_list>
#include <random>

#include "core/error.h"

namespace dsuf::cluster {
namespace {

uint64_t random_incarnation() {
  std::random_device rd;
  uint64_t x = 0;
  while (x == 0) x = (uint64_t(rd()) << 32) ^ rd();
  return x;
}

}  // namespace

ConversationCache::ConversationCache(const KvLayout& layout, CacheOptions options)
    : layout_(layout), opt_(std::move(options)), store_(opt_.capacity_bytes) {
  id_ = {.model_id = opt_.model_id,
         .layout_version = KvLayout::kVersion,
         .fingerprint = layout_.fingerprint,
         .incarnation = random_incarnation()};
  if (opt_.replica_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    opt_.replica_id = std::string(host) + "-" + std::to_string(getpid());
  }
  server_ = std::make_unique<TransferServer>(
      id_,
      TransferServerOptions{.host = opt_.transfer_host,
                            .port = opt_.transfer_port,
                            .max_concurrent = opt_.max_outbound,
                            .io_timeout_ms = opt_.fetch_timeout_ms,
                            .ucx = opt_.ucx,
                            .fault = opt_.fault},
      [this](std::span<const int32_t> prompt) { return store_.find("", prompt); });
  if (opt_.ucx) {
    try {
      ucx_ = std::make_unique<UcxImporter>();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cluster: UCX unavailable for pulls (%s); pulling over TCP\n", e.what());
    }
  }
  if (!opt_.redis_url.empty()) {
    const std::string host = opt_.advertise_host.empty() ? opt_.transfer_host : opt_.advertise_host;
    redis_ = std::make_unique<RedisOwnership>(
        RedisOptions{.url = opt_.redis_url,
                     .replica_id = opt_.replica_id,
                     .addr = host + ":" + std::to_string(server_->port()),
                     .incarnation = id_.incarnation,
                     .lease_ms = opt_.lease_ms},
        [this](const std::string& key_hex) { return store_.holds_chain(key_hex); });
  }
  thread_ = std::thread([this] { worker(); });
}

ConversationCache::~ConversationCache() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Graceful shutdown: the states die with this process, so peers should not be sent here.
  if (redis_) redis_->release_all();
  redis_.reset();
  server_.reset();
}

void ConversationCache::count_failure(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++failures_[reason];
}

CachedPrefix ConversationCache::lookup(const std::string& session,
                                       std::span<const int32_t> prompt) {
  CachedPrefix out;
  try {
    const auto keys = chain_keys(prompt);
    ConversationPtr local = store_.find(session, prompt, &keys);
    const int64_t local_len = local ? static_cast<int64_t>(local->tokens.size()) : 0;
    ConversationPtr use = local;
    std::string tier = local ? "local" : "recompute";
    if (redis_) {
      std::vector<std::string> hex;
      for (size_t b = keys.size(); b > 0; --b) {
        // Only keys that could beat the local state are worth asking about.
        if (static_cast<int64_t>(b) * kBlockTokens + kBlockTokens <= local_len) break;
        hex.push_back(to_hex(keys[b - 1]));
      }
      std::optional<OwnerRecord> rec;
      if (!hex.empty() || !session.empty())
        rec = redis_->lookup(session, hex, static_cast<int64_t>(prompt.size()));
      if (rec && rec->tokens > local_len) {
        FetchResult f = fetch_conversation(rec->addr, id_, rec->incarnation, prompt,
                                           opt_.fetch_timeout_ms, uint64_t{1} << 40, ucx_.get());
        if (f.conv) {
          {
            std::lock_guard lk(mu_);
            ++transfers_;
            transfer_bytes_ += f.bytes;
            transfer_seconds_ += f.seconds;
            ++paths_[{f.path, f.path_reason}];
          }
          if (static_cast<int64_t>(f.conv->tokens.size()) > local_len) {
            use = f.conv;
            tier = "remote";
            store_.insert(session, f.conv);
          }
        } else {
          count_failure(f.reason);
          std::fprintf(stderr, "cluster: fetch from %s (%s) failed: %s: %s; recomputing\n",
                       rec->addr.c_str(), rec->owner.c_str(), f.reason.c_str(), f.detail.c_str());
          // Only what proves the record wrong clears it; a busy or slow owner is still the owner.
          if (f.reason == "connect" || f.reason == "incarnation")
            redis_->clear_stale(rec->key, rec->epoch);
        }
      }
    }
    if (use) {
      try {
        auto st = std::make_shared<SequenceState>(SequenceState::deserialize(layout_, use->blob));
        if (st->pos != static_cast<int64_t>(use->tokens.size()))
          fail("the state holds ", st->pos, " tokens, its token list ", use->tokens.size());
        out.state = std::move(st);
        out.tokens = static_cast<int64_t>(use->tokens.size());
        out.tier = tier;
      } catch (const std::exception& e) {
        count_failure("bad_state");
        std::fprintf(stderr, "cluster: a stored state does not load (%s); recomputing\n", e.what());
        out = {};
      }
    }
  } catch (const std::exception& e) {
    count_failure("internal");
    std::fprintf(stderr, "cluster: lookup failed: %s; recomputing\n", e.what());
    out = {};
  }
  std::lock_guard lk(mu_);
  ++hits_[out.tier];
  cached_tokens_[out.tier] += static_cast<uint64_t>(out.tokens);
  return out;
}

void ConversationCache::store(const std::string& session, std::vector<int32_t> tokens,
                              SequenceState state) {
  {
    std::lock_guard lk(mu_);
    if (stop_) return;
    if (queue_.size() >= opt_.max_queue) {
      ++dropped_;
      return;
    }
    queue_.push_back({session, std::move(tokens), std::move(state)});
  }
  cv_.notify_one();
}

void ConversationCache::flush() {
  std::unique_lock lk(mu_);
  idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

void ConversationCache::release_ownership() {
  if (redis_) redis_->release_all();
}

void ConversationCache::worker() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    try {
      std::string blob = job.state.serialize(layout_);
      job.state = SequenceState{};
      auto c = StoredConversation::make(std::move(job.tokens), std::move(blob));
      if (store_.insert(job.session, c) && redis_ && !c->chain_hex.empty())
        redis_->claim(job.session, c->chain_hex, static_cast<int64_t>(c->tokens.size()));
      lk.lock();
      ++stored_;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cluster: storing a state failed: %s\n", e.what());
      lk.lock();
      ++failures_["store"];
    }
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

std::string ConversationCache::metrics_text() const {
  std::string o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto line = [&](const std::string& name, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " %.17g\n", v);
    o += name + buf;
  };
  const auto st = store_.stats();
  const auto sc = server_->counters();
  RedisOwnership::Counters rc;
  if (redis_) rc = redis_->counters();
  std::lock_guard lk(mu_);
  // One sample per label value, 0 for values not seen yet (so every series exists from the start).
  auto labeled = [&](const std::string& name, const char* key, std::initializer_list<const char*> values,
                     const auto& counts) {
    for (const char* v : values) {
      auto it = counts.find(v);
      line(name + "{" + key + "=\"" + v + "\"}", it == counts.end() ? 0.0 : static_cast<double>(it->second));
    }
  };
  head("dsuf:conv_cache_lookups_total", "counter",
       "Conversation-cache lookups by the tier that answered (local, remote, recompute).");
  labeled("dsuf:conv_cache_lookups_total", "tier", {"local", "remote", "recompute"}, hits_);
  head("dsuf:conv_cache_cached_tokens_total", "counter", "Prompt tokens reused, by tier.");
  labeled("dsuf:conv_cache_cached_tokens_total", "tier", {"local", "remote"}, cached_tokens_);
  head("dsuf:conv_store_bytes", "gauge", "Bytes held by the host conversation store.");
  line("dsuf:conv_store_bytes", static_cast<double>(st.bytes));
  head("dsuf:conv_store_capacity_bytes", "gauge", "The store's bound (--host-cache-gb).");
  line("dsuf:conv_store_capacity_bytes", static_cast<double>(st.capacity));
  head("dsuf:conv_store_entries", "gauge", "Conversations held.");
  line("dsuf:conv_store_entries", static_cast<double>(st.entries));
  head("dsuf:conv_store_evictions_total", "counter", "Entries evicted (LRU).");
  line("dsuf:conv_store_evictions_total", static_cast<double>(st.evictions));
  head("dsuf:conv_store_dropped_total", "counter", "States not stored: the queue was full.");
  line("dsuf:conv_store_dropped_total", static_cast<double>(dropped_));
  head("dsuf:kv_transfer_total", "counter", "States pulled from peers.");
  line("dsuf:kv_transfer_total", static_cast<double>(transfers_));
  head("dsuf:kv_transfer_bytes_total", "counter", "Bytes pulled from peers.");
  line("dsuf:kv_transfer_bytes_total", static_cast<double>(transfer_bytes_));
  head("dsuf:kv_transfer_seconds_total", "counter", "Time spent in successful pulls.");
  line("dsuf:kv_transfer_seconds_total", transfer_seconds_);
  head("dsuf:kv_transfer_path_total", "counter",
       "Successful pulls by the path the bytes took (ucx|tcp) and why (rdma_get, ucx_failed, "
       "owner_tcp_only, puller_tcp_only).");
  line("dsuf:kv_transfer_path_total{path=\"ucx\",reason=\"rdma_get\"}",
       static_cast<double>(paths_.count({"ucx", "rdma_get"}) ? paths_.at({"ucx", "rdma_get"}) : 0));
  for (const auto& [k, n] : paths_)
    if (k.first != "ucx")
      line("dsuf:kv_transfer_path_total{path=\"" + k.first + "\",reason=\"" + k.second + "\"}",
           static_cast<double>(n));
  head("dsuf:kv_transfer_failures_total", "counter",
       "Failed pulls (then recomputed) and unusable states, by reason.");
  labeled("dsuf:kv_transfer_failures_total", "reason",
          {"connect", "timeout", "closed", "busy", "not_found", "version_skew", "incarnation", "checksum",
           "mismatch", "protocol", "bad_state", "store", "internal"},
          failures_);
  head("dsuf:kv_transfer_served_total", "counter", "States sent to peers.");
  line("dsuf:kv_transfer_served_total", static_cast<double>(sc.served));
  head("dsuf:kv_transfer_served_bytes_total", "counter", "Bytes sent to peers.");
  line("dsuf:kv_transfer_served_bytes_total", static_cast<double>(sc.bytes));
  head("dsuf:kv_transfer_refused_total", "counter", "Pulls refused by this owner, by reason.");
  line("dsuf:kv_transfer_refused_total{reason=\"busy\"}", static_cast<double>(sc.refused_busy));
  line("dsuf:kv_transfer_refused_total{reason=\"other\"}", static_cast<double>(sc.refused_other));
  head("dsuf:conv_ownership_cas_conflicts_total", "counter", "Claims lost to another replica.");
  line("dsuf:conv_ownership_cas_conflicts_total", static_cast<double>(rc.cas_conflicts));
  head("dsuf:conv_ownership_claims_total", "counter", "Claims won (including re-claims).");
  line("dsuf:conv_ownership_claims_total", static_cast<double>(rc.claims));
  head("dsuf:conv_ownership_stale_cleared_total", "counter", "Stale records cleared.");
  line("dsuf:conv_ownership_stale_cleared_total", static_cast<double>(rc.stale_cleared));
  head("dsuf:redis_errors_total", "counter", "Redis connects or commands that failed.");
  line("dsuf:redis_errors_total", static_cast<double>(rc.errors));
  head("dsuf:redis_up", "gauge",
       "1 while the Redis connection works (0 also when not configured).");
  line("dsuf:redis_up", redis_ && redis_->up() ? 1.0 : 0.0);
  return o;
}

}  // namespace dsuf::cluster
