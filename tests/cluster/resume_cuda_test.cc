// The conversation cache's contract on the CUDA backend (GPU machine only, label "gpu"): a state
// the engine hands out (downloaded from the device), serialized as the host store keeps it and
// loaded again, resumes a turn with the output a full prefill gives; the packed form is
// backend-neutral, so a state made on the CPU (a peer's) resumes on the GPU and the other way
// round; and nothing stale survives: a state restored while the device still holds a later copy
// of the same sequence is uploaded again. No Redis or transfer here (cluster_cuda_tests pulls a
// state from a peer over the real transfer).
#include "backend/cpu/cpu_backend.h"
#include "backend/factory.h"
#include "core/error.h"
#include "engine/engine.h"
#include "cuda_fixture.h"

namespace dsuf {
namespace {

using testing::compressed_ids;
using testing::prefill_chunked;
using testing::random_prompt;
using testing::tiny_model;

constexpr std::chrono::milliseconds kWait{60000};

Backend& cuda() { return testing::tiny_cuda_backend(); }
Backend& cpu() { return testing::tiny_cpu_backend(); }

struct Turn {
  std::vector<int32_t> out;
  std::vector<std::pair<std::vector<int32_t>, std::string>> states;  // tokens, serialized
};

Turn run(Backend& be, std::vector<int32_t> prompt, int n,
         std::shared_ptr<const SequenceState> from = nullptr, int64_t cached = 0) {
  Engine engine(be,
                {.max_batch = 2, .max_context = 512, .max_step_tokens = 32, .prefill_chunk = 16});
  Turn t;
  std::mutex mu;
  Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.ignore_eos = true;
  r.initial_state = std::move(from);
  r.cached_tokens = cached;
  r.snapshot_prompt = true;
  r.on_state = [&](std::vector<int32_t> tokens, SequenceState st) {
    EXPECT_EQ(st.device, nullptr);
    std::lock_guard lk(mu);
    t.states.emplace_back(std::move(tokens), st.serialize(be.layout()));
  };
  EventQueue q;
  Admission a = engine.submit(std::move(r), q.sink());
  EXPECT_TRUE(a) << a.message;
  t.out = q.collect(nullptr, kWait);
  return t;
}

std::shared_ptr<const SequenceState> load(Backend& be, const std::string& bytes) {
  return std::make_shared<SequenceState>(SequenceState::deserialize(be.layout(), bytes));
}

TEST(ResumeOnCuda, AHandedOutStateResumesLikeAFullPrefill) {
  const auto p1 = random_prompt(90, 11, false);
  Turn t1 = run(cuda(), p1, 6);
  ASSERT_EQ(t1.states.size(), 2u);  // end of prompt, end of turn
  EXPECT_EQ(t1.states[0].first, p1);
  auto p2 = t1.states[1].first;
  EXPECT_EQ(p2.size(), p1.size() + 5);
  p2.push_back(t1.out.back());
  for (int32_t x : random_prompt(40, 12, false)) p2.push_back(x);

  const Turn full = run(cuda(), p2, 8);
  const Turn from_final =
      run(cuda(), p2, 8, load(cuda(), t1.states[1].second), int64_t(t1.states[1].first.size()));
  const Turn from_prompt =
      run(cuda(), p2, 8, load(cuda(), t1.states[0].second), int64_t(p1.size()));
  EXPECT_EQ(from_final.out, full.out);
  EXPECT_EQ(from_prompt.out, full.out);
  EXPECT_EQ(run(cpu(), p2, 8).out, full.out) << "the CUDA backend and the CPU reference disagree";
}

TEST(ResumeOnCuda, StatesMoveBetweenTheCpuAndTheGpu) {
  const auto p1 = random_prompt(70, 21, false);
  auto p2 = p1;
  for (int32_t x : random_prompt(30, 22, false)) p2.push_back(x);
  const Turn on_cpu = run(cpu(), p1, 1);
  const Turn on_gpu = run(cuda(), p1, 1);
  ASSERT_FALSE(on_cpu.states.empty());
  ASSERT_FALSE(on_gpu.states.empty());
  EXPECT_EQ(on_cpu.states[0].second, on_gpu.states[0].second)
      << "the packed state differs by backend";
  const Turn want = run(cpu(), p2, 8);
  EXPECT_EQ(run(cuda(), p2, 8, load(cuda(), on_cpu.states[0].second), 70).out, want.out);
  EXPECT_EQ(run(cpu(), p2, 8, load(cpu(), on_gpu.states[0].second), 70).out, want.out);
}

// The next logits after `tokens`, fed in one forward.
std::vector<float> feed(Backend& be, SequenceState& st, const std::vector<int32_t>& tokens) {
  return prefill_chunked(be, st, tokens, {int(tokens.size())});
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A copy of a state shares its device handle. Here the device pools move on past the copy; putting
// the copy back must upload its host pools again, not run on the later pools.
TEST(ResumeOnCuda, AStateRestoredWhileTheDeviceMovedOnIsUploadedAgain) {
  Backend& be = cuda();
  const auto p1 = random_prompt(50, 31, false), more = random_prompt(20, 32, false);
  const auto tail = random_prompt(9, 33, false);
  SequenceState want_st = be.new_sequence();
  feed(be, want_st, p1);
  const std::vector<float> want = feed(be, want_st, tail);

  SequenceState s = be.new_sequence();
  feed(be, s, p1);
  be.download(s);
  const SequenceState saved = s;  // host pools current, same device handle
  ASSERT_NE(saved.device, nullptr);
  feed(be, s, more);  // the shared device pools now hold 70 tokens
  s = saved;          // back to 50 tokens: the handle is stale
  EXPECT_EQ(feed(be, s, tail), want);
  // Twice from the same restored copy, and once more the same way through the engine.
  s = saved;
  EXPECT_EQ(feed(be, s, tail), want);
  const auto p2 = cat(p1, tail);
  EXPECT_EQ(run(be, p2, 8, std::make_shared<SequenceState>(saved), int64_t(p1.size())).out, run(be, p2, 8).out);
}

// Two copies of one state at the same position in one batch: each advances pools of its own.
TEST(ResumeOnCuda, TwoCopiesOfOneStateInOneBatchDoNotShareDevicePools) {
  Backend& be = cuda();
  const auto p1 = random_prompt(45, 41, false), ta = random_prompt(7, 42, false), tb = random_prompt(7, 43, false);
  std::vector<float> want_a, want_b;
  {
    SequenceState r = be.new_sequence();
    feed(be, r, p1);
    want_a = feed(be, r, ta);
    SequenceState q = be.new_sequence();
    feed(be, q, p1);
    want_b = feed(be, q, tb);
  }
  SequenceState s = be.new_sequence();
  feed(be, s, p1);
  be.download(s);
  SequenceState a = s, b = s;  // all three share one device handle
  std::vector<float> la, lb;
  ForwardItem items[2] = {{.state = &a, .tokens = ta, .logits = &la}, {.state = &b, .tokens = tb, .logits = &lb}};
  be.forward(items);
  EXPECT_EQ(la, want_a);
  EXPECT_EQ(lb, want_b);
  EXPECT_EQ(feed(be, s, ta), want_a) << "the original, left behind at 45 tokens";
}

// A copy taken off the device without Backend::download has no host pools to upload: once its
// handle is stale, using it is refused with a message, never run on whatever the host holds.
TEST(ResumeOnCuda, ACopyTakenWithoutADownloadIsRefusedOnceStale) {
  Backend& be = cuda();
  SequenceState s = be.new_sequence();
  feed(be, s, random_prompt(40, 51, false));
  SequenceState copy = s;
  feed(be, s, random_prompt(5, 52, false));
  try {
    feed(be, copy, random_prompt(3, 53, false));
    ADD_FAILURE() << "a stale copy without host pools ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Backend::download"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsuf
