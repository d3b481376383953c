// The conversation cache's contract on the CUDA backend (GPU machine only, label "gpu"): a state
// the engine hands out (downloaded from the device), serialized and loaded again, resumes a turn
// with the output a full prefill gives; and the packed form is backend-neutral, so a state made
// on the CPU resumes on the GPU and the other way round. No Redis or transfer here: this is what
// serve --gpus needs before it turns the cache on.
#include "backend/cpu/cpu_backend.h"
#include "backend/factory.h"
#include "engine/engine.h"
#include "tiny_fixture.h"

namespace dsuf {
namespace {

using testing::compressed_ids;
using testing::random_prompt;
using testing::tiny_model;

constexpr std::chrono::milliseconds kWait{60000};

Backend& cuda() {
  static std::unique_ptr<Backend> b = make_backend(tiny_model(), compressed_ids(),
                                                   BackendOptions{.cpu = false,
                                                                  .gpus = {0},
                                                                  .max_batch = 2,
                                                                  .max_context = 512,
                                                                  .numerics = {},
                                                                  .cpu_threads = 0});
  return *b;
}

Backend& cpu() {
  static CpuBackend b(tiny_model(), compressed_ids(), CpuNumerics{}, 0);
  return b;
}

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

}  // namespace
}  // namespace dsuf
