// The engine: requests in, token events out. One scheduler thread owns the backend and runs
// continuous batching: every step feeds one token to each decoding sequence and spends what is left
// of the step's token budget on prefill chunks, so long prompts never stall running streams.
//
// Admission is arithmetic, decided before a request runs: a request reserves the packed state bytes
// of its worst case (KvLayout::bytes_for(min(prompt + max_tokens, max_context))) against a budget
// fixed at construction, so a running sequence can never run out of memory and nothing is
// preempted. A request that could never fit is refused at submit with a message saying why; when
// the waiting queue is full, submit refuses with kOverloaded instead of queueing without bound.
//
// Errors travel as data (TokenEvent), never as exceptions across threads. Detokenization, stop
// strings and tool-call parsing are the caller's business, off the scheduler thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"

namespace dsuf {

struct EngineOptions {
  int max_batch = 64;             // sequences admitted (prefilling or decoding) at once
  int64_t max_context = 4096;     // prompt + generated tokens per sequence
  int max_step_tokens = 128;      // tokens fed to the backend per step (decodes count one each)
  int prefill_chunk = 64;         // longest prefill slice of one sequence in one step
  size_t max_waiting = 1024;      // queued requests beyond which submit answers kOverloaded
  size_t state_budget_bytes = 0;  // 0: max_batch × KvLayout::bytes_for(max_context)
  bool warm_up = true;            // run one token through the backend before ready()
};

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 256;  // clamped to what the context leaves; the finish is then kLength
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;  // in addition to EOS

  // Conversation cache (src/cluster). A state that has consumed prompt[0, cached_tokens): the
  // sequence starts from a copy of it and prefills only the rest. cached_tokens < prompt.size(),
  // so at least one token is fed and the first logits come from a real step.
  std::shared_ptr<const SequenceState> initial_state{};
  int64_t cached_tokens = 0;
  // Called on the scheduler thread with the tokens a state has consumed and the state itself:
  // once when the prompt is consumed (a copy; only with snapshot_prompt) and once when the
  // sequence ends with stop or length (the final state, moved). It must return quickly.
  std::function<void(std::vector<int32_t> tokens, SequenceState state)> on_state{};
  bool snapshot_prompt = false;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
enum class ErrorCode {
  kOk,
  kInvalidRequest,
  kContextExceeded,
  kOverloaded,
  kUnavailable,
  kInternal
};

const char* to_string(FinishReason r);
const char* to_string(ErrorCode c);

struct TokenEvent {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;  // generated since the previous event
  bool is_final = false;
  FinishReason finish = FinishReason::kNone;
  bool ends_with_stop_token = false;  // tokens.back() is EOS or a stop id, not content
  ErrorCode error = ErrorCode::kOk;   // set with FinishReason::kError
  std::string message;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;  // so far, this event included
};

// Called on the scheduler thread, once per step with new tokens and exactly once with is_final.
// It must return quickly (hand the event to another thread); it may call Engine::cancel.
using EventSink = std::function<void(TokenEvent&&)>;

struct Admission {
  uint64_t id = 0;  // 0 when refused
  ErrorCode error = ErrorCode::kOk;
  std::string message;
  explicit operator bool() const { return error == ErrorCode::kOk; }
};

struct EngineStats {
  bool ready = false;
  std::string warm_up_error;
  int running = 0;  // admitted: prefilling or decoding
  int waiting = 0;
  size_t state_reserved_bytes = 0;
  size_t state_budget_bytes = 0;
  uint64_t prompt_tokens_total = 0;      // prompt tokens fed to the backend
  uint64_t generation_tokens_total = 0;  // tokens sampled
  uint64_t steps = 0;
  double forward_seconds = 0;  // wall time inside Backend::forward (the rest is engine overhead)
  double forward_cpu_seconds = 0;  // CPU time of the scheduler thread inside it
  uint64_t requests_finished = 0;
};

class Engine {
 public:
  // The backend must outlive the engine; the scheduler thread starts here.
  Engine(Backend& backend, EngineOptions options = {});
  ~Engine();  // finishes every request with kError "engine shut down", joins the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues. A refusal comes back at once (the sink is then never called).
  Admission submit(Request request, EventSink sink);
  // Finishes the request with kCancelled and frees its reservation within one step; unknown or
  // already finished ids are ignored.
  void cancel(uint64_t id);
  // New submits get kUnavailable; what is queued or running continues.
  void stop_accepting();
  // Finishes everything queued or running with kError and `message`.
  void abort_all(const std::string& message);

  EngineStats stats() const;
  bool ready() const { return ready_.load(); }
  const EngineOptions& options() const { return opt_; }
  const ModelConfig& config() const { return backend_.config(); }
  // Bytes one request of `tokens` total tokens reserves.
  size_t bytes_for(int64_t tokens) const { return backend_.layout().bytes_for(tokens); }

 private:
  struct Sequence;
  void loop();
  void step(std::vector<Sequence*>& batch);
  void finish(Sequence& s, FinishReason r, ErrorCode e, std::string message);

  Backend& backend_;
  EngineOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;   // guarded by mu_
  std::vector<uint64_t> cancels_;                   // guarded by mu_
  std::string abort_message_;                       // guarded by mu_; non-empty: abort all
  bool accepting_ = true;                           // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  std::vector<std::unique_ptr<Sequence>> running_;  // scheduler thread only
  size_t reserved_ = 0;                             // guarded by mu_
  uint64_t next_id_ = 1;                            // guarded by mu_
  EngineStats counters_;                            // guarded by mu_ (the counter fields)
  int running_count_ = 0;                           // guarded by mu_
  std::atomic<bool> ready_{false};
  std::vector<int32_t> tokens_;  // the backend's sampled token per batch slot, reused across steps
  std::thread thread_;
};

// A blocking collector for one request's events (tests, tools, benchmarks).
class EventQueue {
 public:
  EventSink sink();
  // Waits for the next event; false on timeout.
  bool next(TokenEvent& out, std::chrono::milliseconds timeout = std::chrono::minutes(10));
  // Waits for the final event; returns every generated token, `final` gets the last event.
  std::vector<int32_t> collect(TokenEvent* final = nullptr,
                               std::chrono::milliseconds timeout = std::chrono::minutes(10));

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<TokenEvent> events;
  };
  std::shared_ptr<State> st_ = std::make_shared<State>();
};

}  // namespace dsuf
