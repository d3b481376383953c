// The conversation cache on the CUDA backend with the real host store and transfer (GPU machine,
// label "gpu"). Turn 1 runs on the GPU and its states land in replica A's host store; turn 2
// resumes on the GPU from A's store (local tier) and from the state replica B pulls from A over
// TCP (remote), and both answer what a full prefill answers. No Redis: B dials A's transfer port
// directly, as it would after a Redis lookup.
//
// It needs src/cluster (hiredis, xxHash, OpenSSL), which the GPU machine cannot build, so it is
// built on a dev machine that has nvcc (build/bin/cluster_cuda_tests) and run on the GPU machine
// with the shared libraries it links: scripts/gpu-check.sh --prepare copies them into .gpu-libs/.
#include <gtest/gtest.h>

#include <chrono>

#include "backend/cpu/cpu_backend.h"
#include "backend/factory.h"
#include "cluster/conversation_cache.h"
#include "engine/engine.h"
#include "cuda_fixture.h"

namespace dsuf::cluster {
namespace {

using testing::compressed_ids;
using testing::random_prompt;
using testing::tiny_model;

constexpr std::chrono::milliseconds kWait{60000};

Backend& cuda() { return testing::tiny_cuda_backend(); }
Backend& cpu() { return testing::tiny_cpu_backend(); }

std::vector<int32_t> generate(Backend& be, std::vector<int32_t> prompt, int n, PromptCache* store_in = nullptr,
                              CachedPrefix from = {}) {
  Engine engine(be, {.max_batch = 2, .max_context = 512, .max_step_tokens = 32, .prefill_chunk = 16});
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.ignore_eos = true;
  r.initial_state = from.state;
  r.cached_tokens = from.tokens;
  if (store_in) {
    r.snapshot_prompt = true;
    r.on_state = [store_in](std::vector<int32_t> tokens, SequenceState st) {
      store_in->store("conv", std::move(tokens), std::move(st));
    };
  }
  EventQueue q;
  Admission a = engine.submit(std::move(r), q.sink());
  EXPECT_TRUE(a) << a.message;
  return q.collect(nullptr, kWait);
}

CacheOptions options(const std::string& replica) {
  CacheOptions o;
  o.capacity_bytes = 256 << 20;
  o.model_id = "tiny";
  o.replica_id = replica;
  o.ucx = false;  // TCP: the GPU machine may lack UCX's transport modules
  return o;
}

TEST(CacheOnCuda, Turn2FromTheHostStoreAndFromAPeerEqualsAFullPrefill) {
  ConversationCache a(cuda().layout(), options("A"));
  const auto turn1 = random_prompt(70, 61, false);
  const auto out1 = generate(cuda(), turn1, 5, &a);
  a.flush();
  ASSERT_GE(a.local().stats().entries, 1u);

  auto turn2 = turn1;
  turn2.insert(turn2.end(), out1.begin(), out1.end());
  for (int32_t t : random_prompt(30, 62, false)) turn2.push_back(t);
  const auto want = generate(cuda(), turn2, 8);
  EXPECT_EQ(generate(cpu(), turn2, 8), want) << "the CUDA backend and the CPU reference disagree";

  // Local tier: A's own store.
  CachedPrefix local = a.lookup("conv", turn2);
  ASSERT_TRUE(local.state);
  EXPECT_EQ(local.tier, "local");
  EXPECT_EQ(local.tokens, 70 + 4);  // the last generated token was never fed
  EXPECT_EQ(generate(cuda(), turn2, 8, nullptr, local), want);
  // The same entry again: resuming never changed it.
  EXPECT_EQ(generate(cuda(), turn2, 8, nullptr, a.lookup("conv", turn2)), want);

  // Remote: B pulls the state from A over TCP, as it would after Redis named A.
  const TransferIdentity b_id{.model_id = "tiny",
                              .layout_version = KvLayout::kVersion,
                              .fingerprint = cuda().layout().fingerprint,
                              .incarnation = 2};
  FetchResult f =
      fetch_conversation("127.0.0.1:" + std::to_string(a.transfer_port()), b_id, 0, turn2, 5000, 1ull << 30);
  ASSERT_TRUE(f.conv) << f.reason << ": " << f.detail;
  EXPECT_EQ(f.path, "tcp");
  EXPECT_EQ(f.conv->tokens.size(), 74u);
  CachedPrefix remote{.state = std::make_shared<SequenceState>(SequenceState::deserialize(cuda().layout(), f.conv->blob)),
                      .tokens = int64_t(f.conv->tokens.size()),
                      .tier = "remote"};
  EXPECT_EQ(generate(cuda(), turn2, 8, nullptr, remote), want);
  // A GPU replica's state on a CPU replica, too: the packed form does not depend on the backend.
  EXPECT_EQ(generate(cpu(), turn2, 8, nullptr, remote), want);
}

// The other direction: a CPU replica owns the conversation, a GPU replica pulls and resumes it.
TEST(CacheOnCuda, AStatePulledFromACpuPeerResumesOnTheGpu) {
  ConversationCache a(cpu().layout(), options("A"));
  const auto turn1 = random_prompt(60, 71, false);
  const auto out1 = generate(cpu(), turn1, 3, &a);
  a.flush();
  auto turn2 = turn1;
  turn2.insert(turn2.end(), out1.begin(), out1.end());
  for (int32_t t : random_prompt(20, 72, false)) turn2.push_back(t);

  const TransferIdentity b_id{.model_id = "tiny",
                              .layout_version = KvLayout::kVersion,
                              .fingerprint = cuda().layout().fingerprint,
                              .incarnation = 3};
  FetchResult f =
      fetch_conversation("127.0.0.1:" + std::to_string(a.transfer_port()), b_id, 0, turn2, 5000, 1ull << 30);
  ASSERT_TRUE(f.conv) << f.reason << ": " << f.detail;
  CachedPrefix remote{.state = std::make_shared<SequenceState>(SequenceState::deserialize(cuda().layout(), f.conv->blob)),
                      .tokens = int64_t(f.conv->tokens.size()),
                      .tier = "remote"};
  EXPECT_EQ(generate(cuda(), turn2, 8, nullptr, remote), generate(cpu(), turn2, 8));
}

}  // namespace
}  // namespace dsuf::cluster
