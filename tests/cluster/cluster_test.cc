// The conversation cache's parts: hash-chain lookup verified against token ids, LRU bound, the
// TCP pull between two in-process peers with every refusal and injected fault ending in a clear
// reason and no state, Redis ownership against a real redis-server (killed and restarted), and
// the engine resuming from a cached state with output identical to a full prefill.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "cluster/conversation_cache.h"
#include "engine/engine.h"
#include "tiny_fixture.h"

namespace dsuf::cluster {
namespace {

using dsuf::testing::compressed_ids;
using dsuf::testing::random_prompt;
using dsuf::testing::tiny_model;

CpuBackend& backend() {
  static CpuBackend b(tiny_model(), compressed_ids(), CpuNumerics{}, 2);
  return b;
}

std::vector<int32_t> seq(int n, int from = 100) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

ConversationPtr entry(std::vector<int32_t> tokens, size_t blob_bytes = 100) {
  return StoredConversation::make(std::move(tokens), std::string(blob_bytes, 'x'));
}

TEST(HashChain, PrefixesShareKeysAndAnEditChangesEveryLaterKey) {
  auto a = seq(50), b = seq(50);
  b[20] = 7;
  const auto ka = chain_keys(a), kb = chain_keys(b);
  ASSERT_EQ(ka.size(), 3u);  // 16-token blocks, the partial one is not keyed
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);
  EXPECT_NE(ka[2], kb[2]);
  EXPECT_EQ(chain_keys(std::span(a).first(32)), std::vector(ka.begin(), ka.begin() + 2));
}

TEST(Store, LongestVerifiedProperPrefixWins) {
  ConversationStore s(1 << 20);
  ASSERT_TRUE(s.insert("", entry(seq(20))));
  ASSERT_TRUE(s.insert("", entry(seq(37))));
  ASSERT_TRUE(s.insert("", entry(seq(60))));
  auto p = seq(50);
  auto hit = s.find("", p);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->tokens.size(), 37u);  // 60 is longer than the prompt
  // A client that rewrote history at token 30 reuses only what still agrees.
  p[30] = 5;
  hit = s.find("", p);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->tokens.size(), 20u);
  // Equal to the prompt is not usable: one token must be left to prefill.
  EXPECT_FALSE(s.find("", seq(20)));
}

TEST(Store, TheSessionNominatesButTheTokensDecide) {
  ConversationStore s(1 << 20);
  ASSERT_TRUE(
      s.insert("sess-1", entry(seq(10))));  // shorter than a block: only the session finds it
  EXPECT_EQ(s.find("sess-1", seq(30))->tokens.size(), 10u);
  EXPECT_FALSE(s.find("", seq(30)));
  auto other = seq(30, 5000);
  EXPECT_FALSE(s.find("sess-1", other))
      << "a session id must not hand out a state for other tokens";
}

TEST(Store, LruEvictsTheLeastRecentlyUsedWithinTheBound) {
  const size_t one = entry(seq(20))->bytes();
  ConversationStore s(3 * one + 10);
  ASSERT_TRUE(s.insert("", entry(seq(20, 1000))));
  ASSERT_TRUE(s.insert("", entry(seq(20, 2000))));
  ASSERT_TRUE(s.insert("", entry(seq(20, 3000))));
  ASSERT_TRUE(s.find("", seq(25, 1000)));  // 1000 is now the most recent
  ASSERT_TRUE(s.insert("", entry(seq(20, 4000))));
  EXPECT_TRUE(s.find("", seq(25, 1000)));
  EXPECT_FALSE(s.find("", seq(25, 2000)));
  EXPECT_EQ(s.stats().entries, 3u);
  EXPECT_EQ(s.stats().evictions, 1u);
  EXPECT_LE(s.stats().bytes, s.stats().capacity);
  EXPECT_FALSE(s.insert("", entry(seq(20), 10 * one))) << "larger than the whole store";
}

TEST(Store, AnEntryBeingSentSurvivesItsEviction) {
  ConversationStore s(entry(seq(20))->bytes() + 10);
  ASSERT_TRUE(s.insert("", entry(seq(20, 1000))));
  ConversationPtr pinned = s.find("", seq(25, 1000));
  ASSERT_TRUE(s.insert("", entry(seq(20, 2000))));  // evicts the pinned one from the index
  EXPECT_FALSE(s.find("", seq(25, 1000)));
  EXPECT_EQ(pinned->tokens, seq(20, 1000));  // still whole for the transfer that holds it
}

// --- transfer --------------------------------------------------------------------------------

TransferIdentity ident(uint64_t inc = 7) {
  return {.model_id = "m", .layout_version = 1, .fingerprint = 42, .incarnation = inc};
}

struct Peer {
  ConversationStore store;
  TransferServer server;
  explicit Peer(TransferServerOptions o = {}, size_t capacity = 64 << 20)
      : store(capacity),
        server(ident(), o, [this](std::span<const int32_t> p) { return store.find("", p); }) {}
  std::string addr() const { return "127.0.0.1:" + std::to_string(server.port()); }
};

FetchResult pull(const Peer& p, std::span<const int32_t> prompt, TransferIdentity me = ident(),
                 uint64_t expect_inc = 7, int timeout_ms = 3000) {
  return fetch_conversation(p.addr(), me, expect_inc, prompt, timeout_ms, 1ull << 32);
}

// The owner counts a send as served after its last write (TCP) or the puller's acknowledgement (UCX),
// on its own thread: the puller can return first. The count once it reaches `want`, or after 5 s.
auto served_count(const Peer& p, uint64_t want) {
  for (int i = 0; i < 500 && p.server.counters().served < want; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return p.server.counters().served;
}

TEST(Transfer, PullsTheLongestPrefixWhole) {
  Peer owner;
  owner.store.insert("", StoredConversation::make(seq(40), std::string(3 << 20, 'k')));
  auto r = pull(owner, seq(50));
  ASSERT_TRUE(r.conv) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.conv->tokens, seq(40));
  EXPECT_EQ(r.conv->blob.size(), 3u << 20);
  EXPECT_EQ(r.bytes, 40 * 4 + (3u << 20));
  EXPECT_EQ(served_count(owner, 1), 1u);
}

TEST(Transfer, RefusalsAndFaultsNameTheirReasonAndReturnNothing) {
  Peer owner;
  owner.store.insert("", entry(seq(40)));
  EXPECT_EQ(pull(owner, seq(50, 9000)).reason, "not_found");
  auto skew = ident();
  skew.fingerprint = 43;
  EXPECT_EQ(pull(owner, seq(50), skew).reason, "version_skew");
  skew = ident();
  skew.model_id = "other-model";
  EXPECT_EQ(pull(owner, seq(50), skew).reason, "version_skew");
  EXPECT_EQ(pull(owner, seq(50), ident(), 8).reason, "incarnation");  // the owner restarted
  std::string dead;
  {
    Peer gone;
    dead = gone.addr();
  }
  auto r = fetch_conversation(dead, ident(), 0, seq(50), 1000, 1 << 20);
  EXPECT_EQ(r.reason, "connect");
  EXPECT_FALSE(r.conv);
}

TEST(Transfer, CorruptedBytesFailTheChecksum) {
  Peer owner({.fault = "corrupt"});
  owner.store.insert("", entry(seq(40), 1 << 16));
  auto r = pull(owner, seq(50));
  EXPECT_EQ(r.reason, "checksum");
  EXPECT_FALSE(r.conv);
}

TEST(Transfer, PeerDeathMidTransferIsAFailureNotAPartialState) {
  Peer owner({.fault = "close"});
  owner.store.insert("", entry(seq(40), 1 << 20));
  auto r = pull(owner, seq(50));
  EXPECT_EQ(r.reason, "closed");
  EXPECT_FALSE(r.conv);
}

TEST(Transfer, AStalledPeerTimesOut) {
  Peer owner({.fault = "stall"});
  owner.store.insert("", entry(seq(40), 1 << 20));
  const auto t0 = std::chrono::steady_clock::now();
  auto r = pull(owner, seq(50), ident(), 7, 500);
  EXPECT_EQ(r.reason, "timeout");
  EXPECT_FALSE(r.conv);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(Transfer, AHotOwnerRefusesBeyondItsCap) {
  Peer owner({.max_concurrent = 1, .fault = "hold"});  // each send holds its slot for 2 s
  owner.store.insert("", entry(seq(40)));
  FetchResult first;
  std::thread t([&] { first = pull(owner, seq(50)); });
  while (owner.server.active() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto second = pull(owner, seq(50));
  t.join();
  EXPECT_TRUE(first.conv) << first.reason;
  EXPECT_EQ(second.reason, "busy");
  EXPECT_EQ(owner.server.counters().refused_busy, 1u);
}

TEST(Transfer, AnEvictionDuringTheSendDoesNotTruncateIt) {
  const auto big = StoredConversation::make(seq(40), std::string(1 << 20, 'e'));
  // Room for one entry; the owner picks the entry, then waits 2 s before sending.
  Peer owner({.fault = "hold"}, big->bytes() + 100);
  ConversationStore& store = owner.store;
  ASSERT_TRUE(store.insert("", big));
  FetchResult r;
  std::thread t([&] { r = pull(owner, seq(50)); });
  while (owner.server.active() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // past find(): the entry is pinned
  ASSERT_TRUE(store.insert("", StoredConversation::make(seq(40, 7000), std::string(1 << 20, 'f'))));
  EXPECT_EQ(store.stats().evictions, 1u);
  EXPECT_FALSE(store.find("", seq(50)));
  t.join();
  ASSERT_TRUE(r.conv) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.conv->tokens, seq(40));
  EXPECT_EQ(r.conv->blob, big->blob);
}

#ifdef DSUF_HAVE_UCX
// The UCX path runs with UCX_TLS=tcp,self on lo (set by CTest): the same code that does RDMA GET
// on an InfiniBand/RoCE NIC. Compiled only where UCX is (libucx-dev).
TEST(TransferUcx, AGetMovesTheStateAndSaysSo) {
  Peer owner({.ucx = true, .fault = ""});
  ASSERT_TRUE(owner.server.ucx()) << "UCX did not start";
  owner.store.insert("", StoredConversation::make(seq(40), std::string(3 << 20, 'u')));
  UcxImporter me;
  auto r = fetch_conversation(owner.addr(), ident(), 7, seq(50), 5000, 1ull << 32, &me);
  ASSERT_TRUE(r.conv) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.path, "ucx");
  EXPECT_EQ(r.path_reason, "rdma_get");
  EXPECT_EQ(r.conv->blob, std::string(3 << 20, 'u'));
  // A puller without UCX gets the same bytes over TCP from the same owner.
  auto t = pull(owner, seq(50));
  ASSERT_TRUE(t.conv);
  EXPECT_EQ(t.path, "tcp");
  EXPECT_EQ(t.path_reason, "puller_tcp_only");
  EXPECT_EQ(served_count(owner, 2), 2u);
}

TEST(TransferUcx, ABadDescriptorFallsBackToTcpExactlyOnce) {
  Peer owner({.ucx = true, .fault = "ucx_bad"});
  owner.store.insert("", entry(seq(40), 1 << 16));
  UcxImporter me;
  auto r = fetch_conversation(owner.addr(), ident(), 7, seq(50), 5000, 1ull << 32, &me);
  ASSERT_TRUE(r.conv) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.path, "tcp");
  EXPECT_EQ(r.path_reason, "ucx_failed");
}

TEST(TransferUcx, CorruptedBytesFailTheChecksumOnThisPathToo) {
  Peer owner({.ucx = true, .fault = "corrupt"});
  owner.store.insert("", entry(seq(40), 1 << 16));
  UcxImporter me;
  auto r = fetch_conversation(owner.addr(), ident(), 7, seq(50), 5000, 1ull << 32, &me);
  EXPECT_EQ(r.reason, "checksum");
  EXPECT_FALSE(r.conv);
}

// The puller half of the next test, in a child process (this binary run again with
// DSUF_TEST_UCX_OWNER set): it starts a GET of a large state and dies in the middle of it.
// It runs before main(), so it is no test of its own.
const bool kPullerChild = [] {
  const char* addr = std::getenv("DSUF_TEST_UCX_OWNER");
  if (!addr) return false;
  UcxImporter me;
  std::thread killer([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    _exit(0);
  });
  auto r = fetch_conversation(addr, ident(), 7, seq(50), 20000, 1ull << 32, &me);
  std::fprintf(stderr, "child: the pull ended before the kill: '%s' %s\n", r.reason.c_str(),
               r.detail.c_str());
  _exit(3);
}();

TEST(TransferUcx, APullerThatDiesMidGetLeavesTheOwnerServing) {
  Peer owner({.io_timeout_ms = 3000, .ucx = true, .fault = ""}, size_t{1} << 30);
  ASSERT_TRUE(
      owner.store.insert("", StoredConversation::make(seq(40), std::string(512u << 20, 'd'))));
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("DSUF_TEST_UCX_OWNER", owner.addr().c_str(), 1);
    execl("/proc/self/exe", "cluster_tests", nullptr);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "3: the pull ended before the puller died (see its stderr)";
  // The owner noticed (no acknowledgement), released the mapping, and still serves.
  for (int i = 0; i < 100 && owner.server.counters().failed == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(owner.server.counters().failed, 1u);
  UcxImporter me;
  auto r = fetch_conversation(owner.addr(), ident(), 7, seq(50), 20000, 1ull << 32, &me);
  ASSERT_TRUE(r.conv) << r.reason << ": " << r.detail;
  EXPECT_EQ(r.path, "ucx");
}
#endif

// --- Redis -----------------------------------------------------------------------------------

uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool can_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

class RedisServer {
 public:
  explicit RedisServer(uint16_t port = 0) : port_(port ? port : free_port()) { start(); }
  ~RedisServer() { kill(); }
  void start() {
    pid_ = fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      const std::string p = std::to_string(port_);
      execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--save",
             "", "--appendonly", "no", "--loglevel", "warning", nullptr);
      _exit(127);
    }
    for (int i = 0; i < 500 && !can_connect(port_); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(can_connect(port_)) << "redis-server did not start (is it installed?)";
  }
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  uint16_t port() const { return port_; }

 private:
  uint16_t port_;
  pid_t pid_ = -1;
};

RedisOptions ropts(const std::string& url, const std::string& id, uint64_t inc,
                   int lease_ms = 30000) {
  return {.url = url,
          .replica_id = id,
          .addr = id + ":1",
          .incarnation = inc,
          .lease_ms = lease_ms,
          .timeout_ms = 300,
          .backoff_ms = 100};
}

TEST(Redis, ClaimLookupRaceAndStaleClear) {
  RedisServer redis;
  RedisOwnership a(ropts(redis.url(), "A", 1), nullptr), b(ropts(redis.url(), "B", 2), nullptr);
  EXPECT_FALSE(b.lookup("", {"k1"}, 100));
  ASSERT_TRUE(a.claim("s1", "k1", 40));
  auto rec = b.lookup("", {"k0", "k1"}, 100);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->owner, "A");
  EXPECT_EQ(rec->incarnation, 1u);
  EXPECT_EQ(rec->tokens, 40);
  EXPECT_EQ(rec->addr, "A:1");
  EXPECT_FALSE(a.lookup("", {"k1"}, 100)) << "a replica never fetches from itself";
  EXPECT_FALSE(b.lookup("", {"k1"}, 40)) << "a state as long as the prompt is not usable";
  // The session record nominates k1 only for a prompt whose chain contains k1.
  EXPECT_TRUE(b.lookup("s1", {"k1"}, 100));
  EXPECT_FALSE(b.lookup("s1", {"other"}, 100));
  // Racing for the same state: the second claim loses and is counted.
  EXPECT_FALSE(b.claim("", "k1", 40));
  EXPECT_EQ(b.counters().cas_conflicts, 1u);
  // A longer state supersedes.
  EXPECT_TRUE(b.claim("", "k1", 41));
  rec = a.lookup("", {"k1"}, 100);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->owner, "B");
  // Clearing with an old epoch does nothing; with the current one it removes the record.
  EXPECT_FALSE(a.clear_stale("k1", rec->epoch - 1));
  EXPECT_TRUE(a.clear_stale("k1", rec->epoch));
  EXPECT_FALSE(a.lookup("", {"k1"}, 100));
}

TEST(Redis, DownMeansNothingFastAndARestartGetsRecordsRepublished) {
  RedisServer redis;
  RedisOwnership a(ropts(redis.url(), "A", 1, 300), [](const std::string&) { return true; });
  RedisOwnership b(ropts(redis.url(), "B", 2, 300), nullptr);
  ASSERT_TRUE(a.claim("", "k1", 40));
  redis.kill();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(b.lookup("", {"k1"}, 100));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2))
      << "a down Redis must not slow every request";
  EXPECT_FALSE(b.up());
  EXPECT_GT(b.counters().errors, 0u);
  redis.start();  // empty: the record is gone until A re-publishes it
  std::optional<OwnerRecord> rec;
  for (int i = 0; i < 100 && !rec; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rec = b.lookup("", {"k1"}, 100);
  }
  ASSERT_TRUE(rec) << "A did not re-publish its record after Redis came back";
  EXPECT_EQ(rec->owner, "A");
  EXPECT_GT(a.counters().reclaims, 0u);
}

TEST(Redis, LeasesLapseWhenTheOwnerStopsRenewing) {
  RedisServer redis;
  RedisOwnership b(ropts(redis.url(), "B", 2), nullptr);
  {
    RedisOwnership a(ropts(redis.url(), "A", 1, 1000), [](const std::string&) { return false; });
    ASSERT_TRUE(a.claim("", "k1", 40));  // the store no longer holds it: never renewed
    ASSERT_TRUE(b.lookup("", {"k1"}, 100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  EXPECT_FALSE(b.lookup("", {"k1"}, 100));
}

// --- the cache over real states, and the engine resuming from one ------------------------------

std::vector<int32_t> generate(Engine& e, Request r) {
  EventQueue q;
  Admission a = e.submit(std::move(r), q.sink());
  EXPECT_TRUE(a) << a.message;
  return q.collect();
}

Request greedy(std::vector<int32_t> prompt, int n) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.ignore_eos = true;
  return r;
}

TEST(Cache, ATurnResumedFromAPulledStateEqualsAFullPrefill) {
  RedisServer redis;
  CacheOptions o;
  o.capacity_bytes = 256 << 20;
  o.model_id = "tiny";
  o.redis_url = redis.url();
  o.replica_id = "A";
  ConversationCache a(backend().layout(), o);
  o.replica_id = "B";
  ConversationCache b(backend().layout(), o);
  Engine engine(backend(), {.max_batch = 2, .max_context = 512, .prefill_chunk = 16});

  const auto turn1 = random_prompt(70, 3, false);
  Request r1 = greedy(turn1, 5);
  r1.on_state = [&](std::vector<int32_t> t, SequenceState s) {
    a.store("s", std::move(t), std::move(s));
  };
  const auto out1 = generate(engine, std::move(r1));
  a.flush();
  ASSERT_EQ(a.local().stats().entries, 1u);

  auto turn2 = turn1;
  turn2.insert(turn2.end(), out1.begin(), out1.end());
  for (int32_t t : random_prompt(30, 4, false)) turn2.push_back(t);

  CachedPrefix hit = b.lookup("", turn2);  // no session: the hash chain finds it
  ASSERT_TRUE(hit.state) << b.metrics_text();
  EXPECT_EQ(hit.tier, "remote");
  EXPECT_EQ(hit.tokens, 70 + 4);  // the last generated token was never fed
  Request r2 = greedy(turn2, 8);
  r2.initial_state = hit.state;
  r2.cached_tokens = hit.tokens;
  const auto cached_out = generate(engine, std::move(r2));
  EXPECT_EQ(cached_out, generate(engine, greedy(turn2, 8)));
  EXPECT_EQ(engine.stats().prompt_tokens_total, 70u + (turn2.size() - 74) + turn2.size());

  // B now holds it too: the next lookup is local.
  EXPECT_EQ(b.lookup("", turn2).tier, "local");
  EXPECT_NE(b.metrics_text().find("dsuf:kv_transfer_total 1"), std::string::npos);
}

TEST(Cache, AGracefulExitReleasesAndADeadOwnersRecordIsCleared) {
  RedisServer redis;
  CacheOptions o;
  o.capacity_bytes = 64 << 20;
  o.model_id = "tiny";
  o.redis_url = redis.url();
  o.replica_id = "B";
  ConversationCache b(backend().layout(), o);
  const auto prompt = random_prompt(60, 5, false);
  {
    o.replica_id = "A";
    ConversationCache a(backend().layout(), o);
    SequenceState st = backend().new_sequence();
    std::vector<float> logits;
    ForwardItem it{.state = &st, .tokens = std::span(prompt).first(40), .logits = &logits};
    backend().forward({&it, 1});
    a.store("", std::vector<int32_t>(prompt.begin(), prompt.begin() + 40), std::move(st));
    a.flush();
    EXPECT_EQ(b.lookup("", prompt).tier, "remote");
  }  // A shut down cleanly: it released its records, so nobody chases it
  CacheOptions o3 = o;
  o3.replica_id = "C";
  ConversationCache c(backend().layout(), o3);
  EXPECT_EQ(c.lookup("", prompt).tier, "recompute");
  EXPECT_NE(c.metrics_text().find("dsuf:kv_transfer_failures_total{reason=\"connect\"} 0"),
            std::string::npos);

  // An owner that died without a word: its record names an address nobody answers at.
  RedisOwnership ghost(ropts(redis.url(), "G", 9), nullptr);
  ASSERT_TRUE(ghost.claim("", to_hex(chain_keys(prompt)[1]), 32));
  CachedPrefix miss = c.lookup("", prompt);
  EXPECT_EQ(miss.tier, "recompute");
  EXPECT_FALSE(miss.state);
  const std::string m = c.metrics_text();
  EXPECT_NE(m.find("dsuf:kv_transfer_failures_total{reason=\"connect\"} 1"), std::string::npos)
      << m;
  EXPECT_NE(m.find("dsuf:conv_ownership_stale_cleared_total 1"), std::string::npos) << m;
  c.lookup("", prompt);  // the record is gone: no second attempt
  EXPECT_NE(c.metrics_text().find("dsuf:kv_transfer_failures_total{reason=\"connect\"} 1"),
            std::string::npos);
}

TEST(Engine, RefusesACachedCountWithoutAMatchingState) {
  Engine engine(backend(), {.max_batch = 1, .max_context = 64, .warm_up = false});
  Request r = greedy(random_prompt(10, 1, false), 2);
  r.cached_tokens = 4;
  EventQueue q;
  Admission a = engine.submit(r, q.sink());
  EXPECT_EQ(a.error, ErrorCode::kInvalidRequest);
  r.cached_tokens = 10;  // the whole prompt: nothing left to produce the first logits
  r.initial_state = std::make_shared<SequenceState>();
  EXPECT_EQ(engine.submit(r, q.sink()).error, ErrorCode::kInvalidRequest);
}

}  // namespace
}  // namespace dsuf::cluster
