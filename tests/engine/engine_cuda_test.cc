// The engine over the CUDA backend (GPU machine only, label "gpu"): continuous batching with
// prefill chunks interleaved with decodes must give, token for token, what the CPU reference gives
// each request alone (the engine's tokens are sampled on the GPU, the reference's on the host from
// the CPU's logits, greedy and sampled); finished and cancelled sequences must give their device
// pools back.
#include <chrono>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/factory.h"
#include "engine/engine.h"
#include "tiny_fixture.h"

namespace dsuf {
namespace {

using testing::compressed_ids;
using testing::random_prompt;
using testing::tiny_model;

constexpr int kBatch = 4;
constexpr int64_t kContext = 512;
constexpr std::chrono::milliseconds kWait{60000};  // a hang fails the test instead of stalling

// DSUF_TEST_GPUS=0,1 runs the same checks tensor parallel (scripts/tp-check.sh).
std::vector<int> test_gpus() {
  const char* g = std::getenv("DSUF_TEST_GPUS");
  return g ? parse_gpu_list(g) : std::vector<int>{0};
}

Backend& cuda() {
  static std::unique_ptr<Backend> b = make_backend(tiny_model(), compressed_ids(),
                                                   BackendOptions{.cpu = false,
                                                                  .gpus = test_gpus(),
                                                                  .max_batch = kBatch,
                                                                  .max_context = kContext,
                                                                  .numerics = {},
                                                                  .cpu_threads = 0});
  return *b;
}

std::vector<int32_t> cpu_alone(const std::vector<int32_t>& prompt, int n, SamplingParams sp) {
  static CpuBackend cpu(tiny_model(), compressed_ids(), CpuNumerics{}, 0);
  SequenceState st = cpu.new_sequence();
  std::vector<float> logits;
  Sampler sampler(sp);
  std::vector<int32_t> out;
  ForwardItem item{.state = &st, .tokens = prompt, .logits = &logits};
  cpu.forward({&item, 1});
  for (int i = 0; i < n; ++i) {
    if (i > 0) {
      ForwardItem d{.state = &st, .tokens = {&out.back(), 1}, .logits = &logits};
      cpu.forward({&d, 1});
    }
    out.push_back(sampler.sample(logits));
  }
  return out;
}

Request request(std::vector<int32_t> prompt, int n, SamplingParams sp = {}) {
  return Request{.prompt = std::move(prompt),
                 .sampling = sp,
                 .max_tokens = n,
                 .ignore_eos = true,
                 .stop_token_ids = {}};
}

TEST(EngineOnCuda, BatchedStepsEqualTheCpuReferenceAlone) {
  Engine engine(
      cuda(),
      {.max_batch = kBatch, .max_context = kContext, .max_step_tokens = 24, .prefill_chunk = 9});
  // The warm-up runs on the scheduler thread (with several GPUs it includes NCCL's first
  // collectives): wait for it to end, ready or with its error, before asserting.
  for (int i = 0; i < 1200 && !engine.ready() && engine.stats().warm_up_error.empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(engine.ready()) << "warm-up error: '" << engine.stats().warm_up_error << "'";
  struct Case {
    std::vector<int32_t> prompt;
    int n;
    SamplingParams sp;
    EventQueue q;
  };
  // More requests than the batch holds, so sequences also start while others finish.
  std::vector<Case> cases(7);
  for (int i = 0; i < 7; ++i) {
    cases[i].prompt = random_prompt(5 + 23 * i, 300 + i);
    cases[i].n = 3 + (i * 5) % 11;
    if (i % 2) cases[i].sp = {.temperature = 0.8f, .top_p = 0.9f, .top_k = 40, .seed = 77u + i};
  }
  for (auto& c : cases) ASSERT_TRUE(engine.submit(request(c.prompt, c.n, c.sp), c.q.sink()));
  for (size_t i = 0; i < cases.size(); ++i) {
    TokenEvent fin;
    const auto got = cases[i].q.collect(&fin, kWait);
    ASSERT_EQ(fin.finish, FinishReason::kLength) << fin.message;
    EXPECT_EQ(got, cpu_alone(cases[i].prompt, cases[i].n, cases[i].sp)) << "request " << i;
  }
  EXPECT_EQ(engine.stats().state_reserved_bytes, 0u);
}

TEST(EngineOnCuda, CancelledAndFinishedSequencesGiveTheirPoolsBack) {
  // Three rounds of a full batch: the backend's plan holds only kBatch sequences, so this fails if
  // the engine kept finished or cancelled states alive.
  Engine engine(cuda(), {.max_batch = kBatch, .max_context = kContext});
  for (int round = 0; round < 3; ++round) {
    std::vector<EventQueue> qs(kBatch);
    std::vector<uint64_t> ids;
    for (int i = 0; i < kBatch; ++i) {
      Admission a =
          engine.submit(request(random_prompt(12, 900 + 10 * round + i, false), 400), qs[i].sink());
      ASSERT_TRUE(a) << a.message;
      ids.push_back(a.id);
    }
    for (int i = 0; i < kBatch; ++i) {
      TokenEvent ev;
      ASSERT_TRUE(qs[i].next(ev, kWait));
      if (i % 2) engine.cancel(ids[i]);
    }
    for (int i = 0; i < kBatch; ++i) {
      if (i % 2 == 0) engine.cancel(ids[i]);  // the rest too, a little later
      TokenEvent fin;
      qs[i].collect(&fin, kWait);
      EXPECT_EQ(fin.finish, FinishReason::kCancelled) << fin.message;
    }
  }
  EventQueue q;
  ASSERT_TRUE(engine.submit(request({5, 6, 7}, 4), q.sink()));
  TokenEvent fin;
  EXPECT_EQ(q.collect(&fin, kWait), cpu_alone({5, 6, 7}, 4, {}));
}

}  // namespace
}  // namespace dsuf
