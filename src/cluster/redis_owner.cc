#include "cluster/redis_owner.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace dsuf::cluster {
namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// KEYS[1] record, KEYS[2] session record or "" ; ARGV: owner addr inc tokens lease_ms channel key
// Returns {1, epoch} on a win, {0, epoch} when another replica holds an equal or longer state.
const char* kClaim = R"(
local cur = redis.call('HMGET', KEYS[1], 'owner', 'inc', 'tokens', 'epoch')
local epoch = tonumber(cur[4] or '0')
if cur[1] and not (cur[1] == ARGV[1] and cur[2] == ARGV[3]) and tonumber(cur[3]) >= tonumber(ARGV[4]) then
  return {0, epoch}
end
epoch = epoch + 1
local f = {'owner', ARGV[1], 'addr', ARGV[2], 'inc', ARGV[3], 'tokens', ARGV[4], 'epoch', epoch, 'key', ARGV[7]}
redis.call('HSET', KEYS[1], unpack(f))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if KEYS[2] ~= '' then
  local s = redis.call('HMGET', KEYS[2], 'owner', 'tokens')
  if not s[1] or s[1] == ARGV[1] or tonumber(s[2]) <= tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[2], unpack(f))
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
end
redis.call('PUBLISH', ARGV[6], ARGV[7] .. ' ' .. ARGV[1] .. ' ' .. epoch)
return {1, epoch}
)";

// KEYS[1] record, KEYS[2] session or ""; ARGV: owner inc lease_ms
const char* kRenew = R"(
local cur = redis.call('HMGET', KEYS[1], 'owner', 'inc')
if not cur[1] then return 2 end
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if KEYS[2] ~= '' then
  local s = redis.call('HMGET', KEYS[2], 'owner', 'inc')
  if s[1] == ARGV[1] and s[2] == ARGV[2] then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
end
return 1
)";

// KEYS[1] record; ARGV: epoch channel key
const char* kClear = R"(
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' - ' .. ARGV[1])
return 1
)";

// KEYS[1] session record or a placeholder, KEYS[2..] chain records longest first;
// ARGV[1] prompt tokens, ARGV[2] this replica. The first usable record of each kind.
const char* kLookup = R"(
local n = tonumber(ARGV[1])
local function ok(r)
  if #r == 0 then return false end
  local h = {}
  for i = 1, #r, 2 do h[r[i]] = r[i + 1] end
  return tonumber(h['tokens']) < n and h['owner'] ~= ARGV[2]
end
local s = redis.call('HGETALL', KEYS[1])
if not ok(s) then s = {} end
for i = 2, #KEYS do
  local r = redis.call('HGETALL', KEYS[i])
  if ok(r) then return {s, r} end
end
return {s, {}}
)";

OwnerRecord parse_record(const redisReply* r) {
  OwnerRecord o;
  for (size_t i = 0; i + 1 < r->elements; i += 2) {
    const std::string k(r->element[i]->str, r->element[i]->len);
    const std::string v(r->element[i + 1]->str, r->element[i + 1]->len);
    if (k == "owner")
      o.owner = v;
    else if (k == "addr")
      o.addr = v;
    else if (k == "inc")
      o.incarnation = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "epoch")
      o.epoch = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "tokens")
      o.tokens = std::strtoll(v.c_str(), nullptr, 10);
    else if (k == "key")
      o.key = v;
  }
  return o;
}

std::string conv_key(const std::string& hex) {
  return "dsuf:conv:" + hex;
}
std::string sess_key(const std::string& s) {
  return s.empty() ? std::string() : "dsuf:sess:" + s;
}

}  // namespace

RedisOwnership::RedisOwnership(RedisOptions options,
                               std::function<bool(const std::string&)> still_held)
    : opt_(std::move(options)), still_held_(std::move(still_held)) {
  std::string u = opt_.url;
  if (u.starts_with("redis://")) u = u.substr(8);
  if (auto at = u.rfind('@'); at != std::string::npos) u = u.substr(at + 1);
  if (auto sl = u.find('/'); sl != std::string::npos) u = u.substr(0, sl);
  const auto colon = u.rfind(':');
  host_ = colon == std::string::npos ? u : u.substr(0, colon);
  if (colon != std::string::npos) {
    char* end = nullptr;
    const long p = std::strtol(u.c_str() + colon + 1, &end, 10);
    if (*end || p <= 0 || p > 65535)
      fail("DSUF_REDIS_URL '", opt_.url, "': expected redis://host:port");
    port_ = static_cast<int>(p);
  }
  if (host_.empty()) fail("DSUF_REDIS_URL '", opt_.url, "': no host");
  thread_ = std::thread([this] { renew_loop(); });
}

RedisOwnership::~RedisOwnership() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (ctx_) redisFree(ctx_);
}

bool RedisOwnership::connect_locked() {
  if (ctx_) return true;
  const int64_t t = now_ms();
  if (t < next_connect_ms_) return false;
  next_connect_ms_ = t + opt_.backoff_ms;
  timeval tv{opt_.timeout_ms / 1000, (opt_.timeout_ms % 1000) * 1000};
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, tv);
  if (!c || c->err) {
    if (c) redisFree(c);
    ++c_.errors;
    up_ = false;
    lost_ = true;
    return false;
  }
  redisSetTimeout(c, tv);
  ctx_ = c;
  up_ = true;
  return true;
}

void RedisOwnership::drop_locked(const char* why) {
  if (ctx_) {
    std::fprintf(stderr, "cluster: redis %s:%d: %s (serving local-only until it is back)\n",
                 host_.c_str(), port_, why);
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  ++c_.errors;
  up_ = false;
  lost_ = true;
}

struct RedisOwnership::Reply {
  redisReply* r = nullptr;
  ~Reply() {
    if (r) freeReplyObject(r);
  }
};

namespace {

// EVAL with binary-safe arguments.
redisReply* eval(redisContext* c, const char* script, const std::vector<std::string>& keys,
                 const std::vector<std::string>& args) {
  std::vector<std::string> all = {"EVAL", script, std::to_string(keys.size())};
  all.insert(all.end(), keys.begin(), keys.end());
  all.insert(all.end(), args.begin(), args.end());
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto& s : all) argv.push_back(s.data()), lens.push_back(s.size());
  return static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
}

}  // namespace

std::optional<OwnerRecord> RedisOwnership::lookup(const std::string& session,
                                                  const std::vector<std::string>& keys,
                                                  int64_t prompt_tokens) {
  std::lock_guard lk(mu_);
  if (!connect_locked()) return std::nullopt;
  std::vector<std::string> k = {session.empty() ? "dsuf:sess:-" : sess_key(session)};
  for (const auto& h : keys) k.push_back(conv_key(h));
  Reply rep{eval(ctx_, kLookup, k, {std::to_string(prompt_tokens), opt_.replica_id})};
  if (!rep.r || rep.r->type != REDIS_REPLY_ARRAY || rep.r->elements != 2) {
    drop_locked(rep.r && rep.r->type == REDIS_REPLY_ERROR ? rep.r->str
                : ctx_ && ctx_->err                       ? ctx_->errstr
                                                          : "bad reply to lookup");
    return std::nullopt;
  }
  OwnerRecord s = parse_record(rep.r->element[0]);
  OwnerRecord c = parse_record(rep.r->element[1]);
  // The session's record counts only if its chain key is one of ours (the caller verifies the
  // tokens on the transfer anyway); the longer of the two wins.
  const bool s_ok = !s.owner.empty() && !s.key.empty() &&
                    std::find(keys.begin(), keys.end(), s.key) != keys.end();
  if (s_ok && (c.owner.empty() || s.tokens > c.tokens)) return s;
  if (!c.owner.empty()) return c;
  return std::nullopt;
}

bool RedisOwnership::claim_locked(const std::string& session, const std::string& key_hex,
                                  int64_t tokens) {
  if (!connect_locked()) return false;
  Reply rep{eval(ctx_, kClaim, {conv_key(key_hex), sess_key(session)},
                 {opt_.replica_id, opt_.addr, std::to_string(opt_.incarnation),
                  std::to_string(tokens), std::to_string(opt_.lease_ms), opt_.channel, key_hex})};
  if (!rep.r || rep.r->type != REDIS_REPLY_ARRAY || rep.r->elements != 2) {
    drop_locked(rep.r && rep.r->type == REDIS_REPLY_ERROR ? rep.r->str : "bad reply to claim");
    return false;
  }
  if (rep.r->element[0]->integer != 1) {
    ++c_.cas_conflicts;
    return false;
  }
  ++c_.claims;
  return true;
}

bool RedisOwnership::claim(const std::string& session, const std::string& key_hex, int64_t tokens) {
  std::lock_guard lk(mu_);
  // Remembered even when Redis is down, so the renewal thread publishes it once Redis is back.
  owned_[key_hex] = {session, tokens};
  const bool won = claim_locked(session, key_hex, tokens);
  if (!won && ctx_) owned_.erase(key_hex);  // lost the race: the winner's record stands
  return won;
}

bool RedisOwnership::clear_stale(const std::string& key_hex, uint64_t epoch) {
  std::lock_guard lk(mu_);
  if (!connect_locked()) return false;
  Reply rep{
      eval(ctx_, kClear, {conv_key(key_hex)}, {std::to_string(epoch), opt_.channel, key_hex})};
  if (!rep.r || rep.r->type != REDIS_REPLY_INTEGER) {
    drop_locked("bad reply to clear");
    return false;
  }
  if (rep.r->integer == 1) ++c_.stale_cleared;
  return rep.r->integer == 1;
}

void RedisOwnership::release_all() {
  std::lock_guard lk(mu_);
  if (!connect_locked()) return;
  for (const auto& [key, v] : owned_) {
    Reply rep{eval(ctx_,
                   "if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] and redis.call('HGET', "
                   "KEYS[1], 'inc') == ARGV[2] then return redis.call('DEL', KEYS[1]) end return 0",
                   {conv_key(key)}, {opt_.replica_id, std::to_string(opt_.incarnation)})};
    if (!rep.r) {
      drop_locked("release failed");
      return;
    }
  }
  owned_.clear();
}

RedisOwnership::Counters RedisOwnership::counters() const {
  std::lock_guard lk(mu_);
  return c_;
}

void RedisOwnership::renew_loop() {
  std::unique_lock lk(mu_);
  const auto period = std::chrono::milliseconds(std::max(50, opt_.lease_ms / 3));
  while (!stop_) {
    // While down, wake often enough to notice Redis coming back soon after the backoff.
    cv_.wait_for(lk, lost_ ? std::chrono::milliseconds(opt_.backoff_ms) : period,
                 [&] { return stop_; });
    if (stop_) break;
    if (!connect_locked()) continue;
    const bool republish = lost_;
    lost_ = false;
    for (auto it = owned_.begin(); it != owned_.end() && ctx_;) {
      const auto& [key, v] = *it;
      lk.unlock();
      const bool held = still_held_ ? still_held_(key) : true;
      lk.lock();
      if (!ctx_) break;
      if (!held) {
        it = owned_.erase(it);
        continue;
      }
      if (republish) {
        // Redis restarted (empty) or was unreachable long enough for the lease to lapse.
        if (claim_locked(v.first, key, v.second))
          ++c_.reclaims;
        else if (!ctx_)
          break;
        else {
          it = owned_.erase(it);
          continue;
        }
      } else {
        Reply rep{eval(
            ctx_, kRenew, {conv_key(key), sess_key(v.first)},
            {opt_.replica_id, std::to_string(opt_.incarnation), std::to_string(opt_.lease_ms)})};
        if (!rep.r || rep.r->type != REDIS_REPLY_INTEGER) {
          drop_locked("lease renewal failed");
          break;
        }
        if (rep.r->integer == 0) {
          it = owned_.erase(it);  // another replica took it over
          continue;
        }
        if (rep.r->integer == 2) {
          // The record vanished (Redis restarted empty, or the lease lapsed): publish it again.
          if (claim_locked(v.first, key, v.second)) ++c_.reclaims;
        } else {
          ++c_.renewals;
        }
      }
      ++it;
    }
  }
}

}  // namespace dsuf::cluster
