// Conversation ownership in Redis (hiredis, one synchronous connection behind a mutex, short
// timeouts). A record per chain key, `dsuf:conv:<hex>`, and per session, `dsuf:sess:<id>`:
//   owner (replica id), addr (transfer host:port), inc (owner incarnation), epoch, tokens, key
// with a lease (PEXPIRE) that the owner renews. Records change only inside Lua scripts that
// compare before they set, so two replicas racing for one conversation cannot both win; the
// epoch is the fencing token. Every change is PUBLISHed on a channel as a hint; readers re-read
// the record on every miss, so a lost message costs nothing.
//
// Redis down: every call answers "nothing" at once (after one failed connect per backoff
// period), the caller recomputes; a background thread reconnects and re-claims what this replica
// still holds. Nothing here is on the readiness path.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

struct redisContext;

namespace dsuf::cluster {

struct RedisOptions {
  std::string url;         // redis://host:port (DSUF_REDIS_URL)
  std::string replica_id;  // this replica's name (pod name)
  std::string addr;        // where peers pull from (host:port)
  uint64_t incarnation = 0;
  int lease_ms = 30000;
  int timeout_ms = 300;   // connect and per-command
  int backoff_ms = 1000;  // between reconnect attempts
  std::string channel = "dsuf:conv";
};

struct OwnerRecord {
  std::string key;  // chain key hex of the owner's state
  std::string owner, addr;
  uint64_t incarnation = 0, epoch = 0;
  int64_t tokens = 0;
};

class RedisOwnership {
 public:
  // `still_held(key_hex)`: whether this replica still has the state (the renewal thread drops
  // ownership of evicted ones).
  RedisOwnership(RedisOptions options, std::function<bool(const std::string&)> still_held);
  ~RedisOwnership();
  RedisOwnership(const RedisOwnership&) = delete;
  RedisOwnership& operator=(const RedisOwnership&) = delete;

  // The best record usable for a prompt of `prompt_tokens` tokens: the session's, then the chain
  // keys (longest first); only records with fewer tokens than the prompt and owned by another
  // replica. nullopt when none, or Redis is down.
  std::optional<OwnerRecord> lookup(const std::string& session,
                                    const std::vector<std::string>& keys_longest_first,
                                    int64_t prompt_tokens);
  // Claims `key_hex` (and the session) for this replica: wins when the record is absent, already
  // ours, or names a shorter state. False on a lost race (counted) or Redis down.
  bool claim(const std::string& session, const std::string& key_hex, int64_t tokens);
  // Deletes a record that proved stale (dead owner, wrong incarnation), only if its epoch is still
  // `epoch`: a newer owner's record is never cleared.
  bool clear_stale(const std::string& key_hex, uint64_t epoch);
  void release_all();  // graceful shutdown: drop what this replica owns

  bool up() const { return up_.load(); }
  struct Counters {
    uint64_t errors = 0, cas_conflicts = 0, claims = 0, renewals = 0, stale_cleared = 0,
             reclaims = 0;
  };
  Counters counters() const;

 private:
  struct Reply;
  // Runs one command on a connected context; nullopt (and the connection dropped) on error.
  bool connect_locked();
  void drop_locked(const char* why);
  void renew_loop();
  bool claim_locked(const std::string& session, const std::string& key_hex, int64_t tokens);

  RedisOptions opt_;
  std::string host_;
  int port_ = 6379;
  std::function<bool(const std::string&)> still_held_;
  mutable std::mutex mu_;
  redisContext* ctx_ = nullptr;  // guarded by mu_
  int64_t next_connect_ms_ = 0;  // guarded by mu_
  bool lost_ = false;            // guarded by mu_: was down since the last successful claim pass
  std::map<std::string, std::pair<std::string, int64_t>> owned_;  // key -> (session, tokens)
  Counters c_;
  std::atomic<bool> up_{false};
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dsuf::cluster
