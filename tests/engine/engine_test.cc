// The engine against the CPU reference on the tiny checkpoint: its output must be what running the
// backend by hand gives, whatever else shares the batch; admission must refuse what cannot fit and
// bound what waits; cancel must give the memory back.
#include <chrono>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "tiny_fixture.h"

namespace dsuf {
namespace {

using testing::compressed_ids;
using testing::random_prompt;
using testing::tiny_model;

CpuBackend& backend() {
  static CpuBackend b(tiny_model(), compressed_ids(), CpuNumerics{}, 2);
  return b;
}

// Generation by hand: one-shot prefill, then one token at a time.
std::vector<int32_t> reference(const std::vector<int32_t>& prompt, int n, SamplingParams sp = {}) {
  SequenceState st = backend().new_sequence();
  std::vector<float> logits;
  Sampler sampler(sp);
  std::vector<int32_t> out;
  ForwardItem item{.state = &st, .tokens = prompt, .logits = &logits};
  backend().forward({&item, 1});
  for (int i = 0; i < n; ++i) {
    if (i > 0) {
      ForwardItem d{.state = &st, .tokens = {&out.back(), 1}, .logits = &logits};
      backend().forward({&d, 1});
    }
    out.push_back(sampler.sample(logits));
  }
  return out;
}

Request request(std::vector<int32_t> prompt, int max_tokens, SamplingParams sp = {}) {
  return Request{.prompt = std::move(prompt),
                 .sampling = sp,
                 .max_tokens = max_tokens,
                 .ignore_eos = true,
                 .stop_token_ids = {}};
}

void wait_until(const std::function<bool()>& cond) {
  auto t0 = std::chrono::steady_clock::now();
  while (!cond()) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60))
        << "condition never held";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(Engine, GreedyEqualsTheBackendByHandWithChunkedPrefill) {
  Engine engine(backend(),
                {.max_batch = 4, .max_context = 256, .max_step_tokens = 16, .prefill_chunk = 7});
  const auto prompt = random_prompt(45, 1);
  EventQueue q;
  Admission a = engine.submit(request(prompt, 6), q.sink());
  ASSERT_TRUE(a) << a.message;
  TokenEvent fin;
  EXPECT_EQ(q.collect(&fin), reference(prompt, 6));
  EXPECT_EQ(fin.finish, FinishReason::kLength);
  EXPECT_EQ(fin.prompt_tokens, 45);
  EXPECT_EQ(fin.generated_tokens, 6);
  EXPECT_TRUE(engine.ready());
  EXPECT_EQ(engine.stats().prompt_tokens_total, 45u);
}

TEST(Engine, ABatchOfRequestsEqualsEachAlone) {
  // Small steps force prefill chunks of some requests to share steps with decodes of others.
  Engine engine(backend(),
                {.max_batch = 8, .max_context = 256, .max_step_tokens = 12, .prefill_chunk = 5});
  struct Case {
    std::vector<int32_t> prompt;
    int n;
    SamplingParams sp;
    EventQueue q;
  };
  std::vector<Case> cases(6);
  for (int i = 0; i < 6; ++i) {
    cases[i].prompt = random_prompt(3 + 9 * i, 100 + i, false);
    cases[i].n = 2 + i % 3 * 2;
    if (i % 2) cases[i].sp = {.temperature = 0.9f, .top_p = 0.95f, .top_k = 50, .seed = 1000u + i};
  }
  for (auto& c : cases) ASSERT_TRUE(engine.submit(request(c.prompt, c.n, c.sp), c.q.sink()));
  for (auto& c : cases) {
    TokenEvent fin;
    EXPECT_EQ(c.q.collect(&fin), reference(c.prompt, c.n, c.sp));
    EXPECT_EQ(fin.generated_tokens, c.n);
  }
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.state_reserved_bytes, 0u);
  EXPECT_EQ(st.requests_finished, 6u);
}

TEST(Engine, StopTokenEndsWithStopAndMaxTokensWithLength) {
  Engine engine(backend(), {.max_batch = 2, .max_context = 128});
  const auto prompt = random_prompt(12, 5, false);
  const auto ref = reference(prompt, 5);
  EventQueue q;
  Request r = request(prompt, 50);
  r.stop_token_ids = {ref[2]};
  ASSERT_TRUE(engine.submit(r, q.sink()));
  TokenEvent fin;
  const auto out = q.collect(&fin);
  // The stop id may already appear earlier in the greedy output; the engine stops at its first use.
  const size_t first = std::find(ref.begin(), ref.end(), ref[2]) - ref.begin();
  EXPECT_EQ(out, std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(fin.finish, FinishReason::kStop);
  EXPECT_TRUE(fin.ends_with_stop_token);
}

TEST(Engine, ContextLimitEndsWithLength) {
  Engine engine(backend(), {.max_batch = 1, .max_context = 20});
  EventQueue q;
  ASSERT_TRUE(engine.submit(request(random_prompt(17, 6, false), 100), q.sink()));
  TokenEvent fin;
  EXPECT_EQ(q.collect(&fin).size(), 3u);  // 17 + 3 = the 20-token context
  EXPECT_EQ(fin.finish, FinishReason::kLength);
  // A max_tokens near the integer limit is the context limit, not an overflow.
  EventQueue q2;
  ASSERT_TRUE(engine.submit(request(random_prompt(18, 7, false), 0), q2.sink()).error ==
              ErrorCode::kInvalidRequest);
  Request huge = request(random_prompt(18, 7, false), 1);
  huge.max_tokens = INT64_MAX;
  ASSERT_TRUE(engine.submit(huge, q2.sink()));
  EXPECT_EQ(q2.collect().size(), 2u);
}

TEST(Engine, RefusesWhatCanNeverFitWithAReason) {
  Engine engine(backend(), {.max_batch = 2, .max_context = 64, .warm_up = false});
  EventQueue q;
  Admission a = engine.submit(request(random_prompt(64, 1, false), 1), q.sink());
  EXPECT_EQ(a.error, ErrorCode::kContextExceeded);
  EXPECT_NE(a.message.find("64 tokens"), std::string::npos) << a.message;
  a = engine.submit(request({}, 1), q.sink());
  EXPECT_EQ(a.error, ErrorCode::kInvalidRequest);
  a = engine.submit(request({5, 129280}, 1), q.sink());
  EXPECT_EQ(a.error, ErrorCode::kInvalidRequest);
  EXPECT_NE(a.message.find("129280"), std::string::npos) << a.message;
  a = engine.submit(request({5}, 0), q.sink());
  EXPECT_EQ(a.error, ErrorCode::kInvalidRequest);
  a = engine.submit(request({5}, 1, {.temperature = -1}), q.sink());
  EXPECT_EQ(a.error, ErrorCode::kInvalidRequest);

  // A budget smaller than one full-context sequence: long requests can never fit, short ones can.
  Engine small(backend(), {.max_batch = 2,
                           .max_context = 4096,
                           .state_budget_bytes = backend().layout().bytes_for(1000),
                           .warm_up = false});
  a = small.submit(request({5, 6}, 3000), q.sink());
  EXPECT_EQ(a.error, ErrorCode::kContextExceeded);
  EXPECT_NE(a.message.find("bytes"), std::string::npos) << a.message;
  EventQueue ok;
  ASSERT_TRUE(small.submit(request({5, 6}, 2), ok.sink()));
  EXPECT_EQ(ok.collect().size(), 2u);
}

TEST(Engine, FullQueueAnswersOverloaded) {
  Engine engine(backend(), {.max_batch = 1, .max_context = 512, .max_waiting = 1});
  EventQueue a, b, c;
  ASSERT_TRUE(engine.submit(request(random_prompt(4, 2, false), 200), a.sink()));
  wait_until([&] { return engine.stats().running == 1; });
  ASSERT_TRUE(engine.submit(request(random_prompt(4, 3, false), 1), b.sink()));
  Admission over = engine.submit(request(random_prompt(4, 4, false), 1), c.sink());
  EXPECT_EQ(over.error, ErrorCode::kOverloaded);
  EXPECT_EQ(engine.stats().waiting, 1);
  engine.abort_all("test over");
  TokenEvent fin;
  a.collect(&fin);
  EXPECT_EQ(fin.finish, FinishReason::kError);
  EXPECT_EQ(fin.message, "test over");
  b.collect(&fin);
  EXPECT_EQ(fin.finish, FinishReason::kError);
}

TEST(Engine, CancelFreesTheReservationAtOnce) {
  Engine engine(backend(), {.max_batch = 2, .max_context = 1024});
  EventQueue q, w;
  Admission a = engine.submit(request(random_prompt(8, 9, false), 1000), q.sink());
  ASSERT_TRUE(a);
  TokenEvent ev;
  ASSERT_TRUE(q.next(ev));  // the first token: it is running
  EXPECT_EQ(engine.stats().state_reserved_bytes, engine.bytes_for(1008));
  engine.cancel(a.id);
  TokenEvent fin;
  q.collect(&fin);
  EXPECT_EQ(fin.finish, FinishReason::kCancelled);
  EXPECT_LT(fin.generated_tokens, 100);
  wait_until([&] { return engine.stats().running == 0; });
  EXPECT_EQ(engine.stats().state_reserved_bytes, 0u);
  // Cancelling a finished or unknown id is harmless.
  engine.cancel(a.id);
  engine.cancel(987654);
  ASSERT_TRUE(engine.submit(request({7, 8}, 1), w.sink()));
  EXPECT_EQ(w.collect().size(), 1u);
}

TEST(Engine, MemoryBudgetBoundsConcurrency) {
  // Room for two full-context sequences although eight could be batched.
  Engine engine(backend(), {.max_batch = 8,
                            .max_context = 64,
                            .state_budget_bytes = 2 * backend().layout().bytes_for(64)});
  std::vector<EventQueue> qs(5);
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(engine.submit(request(random_prompt(6, 50 + i, false), 58), qs[i].sink()));
  int most = 0;
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) {
      most = std::max(most, engine.stats().running);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  // Cut each short by cancelling after its first token, so the test stays quick.
  for (auto& q : qs) {
    TokenEvent ev;
    ASSERT_TRUE(q.next(ev));
    engine.cancel(ev.request_id);
    q.collect();
  }
  done = true;
  watch.join();
  EXPECT_EQ(most, 2);
}

TEST(Engine, ShutdownWithRequestsInFlightFinishesThemWithAnError) {
  EventQueue q;
  {
    Engine engine(backend(), {.max_batch = 1, .max_context = 512});
    ASSERT_TRUE(engine.submit(request({5, 6, 7}, 400), q.sink()));
    TokenEvent ev;
    ASSERT_TRUE(q.next(ev));
  }
  TokenEvent fin;
  q.collect(&fin, std::chrono::milliseconds(1000));
  EXPECT_EQ(fin.finish, FinishReason::kError);
  EXPECT_EQ(fin.error, ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace dsuf
