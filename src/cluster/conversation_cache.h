// The conversation cache a replica runs: the host store, ownership in Redis, and the transfer
// server and client, behind the engine's PromptCache seam.
//
// lookup: local store → (Redis says another replica holds a longer prefix) pull it → else the
// best local state or nothing (recompute). Every failure on the remote path is counted by reason
// and ends in a local answer; a record that proved stale (owner unreachable, other incarnation)
// is cleared by compare-and-set on its epoch.
// store: serialization, insertion and the Redis claim run on a worker thread, so the scheduler
// only pays for moving the state into a queue.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "cluster/conversation_store.h"
#include "cluster/redis_owner.h"
#include "cluster/transfer.h"
#include "engine/prompt_cache.h"

namespace dsuf::cluster {

struct CacheOptions {
  size_t capacity_bytes = size_t{4} << 30;  // --host-cache-gb
  std::string model_id;
  std::string redis_url;  // empty: local only
  std::string replica_id;
  std::string transfer_host = "127.0.0.1";  // bind address of the transfer server
  uint16_t transfer_port = 0;
  std::string advertise_host;  // what peers dial (default: transfer_host)
  int max_outbound = 4;
  int fetch_timeout_ms = 5000;
  int lease_ms = 30000;
  bool ucx = true;        // offer and use UCX RMA GET when built and it starts (else TCP)
  std::string fault;      // DSUF_TRANSFER_FAULT (tests)
  size_t max_queue = 64;  // states waiting to be serialized; beyond it new ones are dropped
};

class ConversationCache final : public PromptCache {
 public:
  ConversationCache(const KvLayout& layout, CacheOptions options);
  ~ConversationCache() override;

  CachedPrefix lookup(const std::string& session, std::span<const int32_t> prompt) override;
  void store(const std::string& session, std::vector<int32_t> tokens, SequenceState state) override;
  std::string metrics_text() const override;

  // Waits until every queued state is stored (tests, shutdown).
  void flush();
  void release_ownership();
  uint16_t transfer_port() const { return server_->port(); }
  bool ucx() const { return ucx_ != nullptr && server_->ucx(); }
  const ConversationStore& local() const { return store_; }
  RedisOwnership* redis() { return redis_.get(); }

 private:
  void worker();
  void count_failure(const std::string& reason);

  const KvLayout& layout_;
  CacheOptions opt_;
  TransferIdentity id_;
  ConversationStore store_;
  std::unique_ptr<TransferServer> server_;
  std::unique_ptr<UcxImporter> ucx_;
  std::unique_ptr<RedisOwnership> redis_;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  struct Job {
    std::string session;
    std::vector<int32_t> tokens;
    SequenceState state;
  };
  std::deque<Job> queue_;  // guarded by mu_
  bool busy_ = false, stop_ = false;
  // Counters, guarded by mu_.
  std::map<std::string, uint64_t> hits_, cached_tokens_, failures_;
  std::map<std::pair<std::string, std::string>, uint64_t> paths_;  // (path, reason)
  uint64_t transfers_ = 0, transfer_bytes_ = 0, dropped_ = 0, stored_ = 0;
  double transfer_seconds_ = 0;
  std::thread thread_;
};

}  // namespace dsuf::cluster
