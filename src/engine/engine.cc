#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "core/error.h"

namespace dsuf {
namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

const char* to_string(ErrorCode c) {
  switch (c) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kInvalidRequest:
      return "invalid_request";
    case ErrorCode::kContextExceeded:
      return "context_length_exceeded";
    case ErrorCode::kOverloaded:
      return "overloaded";
    case ErrorCode::kUnavailable:
      return "unavailable";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "?";
}

struct Engine::Sequence {
  uint64_t id = 0;
  Request req;
  EventSink sink;
  SequenceState state;
  int64_t limit = 0;      // prompt + generated tokens at which the sequence ends with kLength
  size_t reserved = 0;    // bytes_for(limit)
  int64_t prefilled = 0;  // prompt tokens consumed
  int64_t generated = 0;
  int32_t last = 0;  // the sampled token the next decode step feeds
  std::vector<int32_t> out;  // generated tokens, kept only for Request::on_state
  bool admitted = false;
  bool started = false;  // state allocated (on the scheduler thread, after admission)
  bool done = false;

  Sequence(Request r, EventSink k, SequenceState st)
      : req(std::move(r)), sink(std::move(k)), state(std::move(st)) {}
  bool decoding() const { return prefilled == static_cast<int64_t>(req.prompt.size()); }
};

Engine::Engine(Backend& backend, EngineOptions options) : backend_(backend), opt_(options) {
  if (opt_.max_batch < 1) fail("engine: max_batch must be >= 1 (got ", opt_.max_batch, ")");
  if (opt_.max_context < 2) fail("engine: max_context must be >= 2 (got ", opt_.max_context, ")");
  if (opt_.max_step_tokens < 1 || opt_.prefill_chunk < 1)
    fail("engine: max_step_tokens and prefill_chunk must be >= 1");
  if (opt_.state_budget_bytes == 0)
    opt_.state_budget_bytes = static_cast<size_t>(opt_.max_batch) * bytes_for(opt_.max_context);
  counters_.state_budget_bytes = opt_.state_budget_bytes;
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    accepting_ = false;
  }
  cv_.notify_all();
  thread_.join();
}

Admission Engine::submit(Request req, EventSink sink) {
  auto refuse = [](ErrorCode e, std::string msg) { return Admission{0, e, std::move(msg)}; };
  const int64_t vocab = config().text.vocab_size;
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  if (n == 0) return refuse(ErrorCode::kInvalidRequest, "the prompt is empty");
  for (int64_t i = 0; i < n; ++i) {
    if (req.prompt[i] < 0 || req.prompt[i] >= vocab)
      return refuse(ErrorCode::kInvalidRequest,
                    detail::concat("prompt token ", req.prompt[i], " at index ", i,
                                   " is outside the vocabulary [0, ", vocab, ")"));
  }
  const SamplingParams& sp = req.sampling;
  if (!std::isfinite(sp.temperature) || sp.temperature < 0)
    return refuse(ErrorCode::kInvalidRequest, "temperature must be a finite number >= 0");
  if (!(sp.top_p > 0 && sp.top_p <= 1))
    return refuse(ErrorCode::kInvalidRequest, "top_p must be in (0, 1]");
  if (sp.top_k < 0) return refuse(ErrorCode::kInvalidRequest, "top_k must be >= 0");
  if (req.max_tokens < 1) return refuse(ErrorCode::kInvalidRequest, "max_tokens must be >= 1");
  if (req.cached_tokens < 0 || req.cached_tokens >= n ||
      (req.cached_tokens > 0 && (!req.initial_state || req.initial_state->pos != req.cached_tokens)))
    return refuse(ErrorCode::kInvalidRequest,
                  detail::concat("cached_tokens ", req.cached_tokens,
                                 " needs a state at that position and fewer than the prompt's ", n,
                                 " tokens"));
  if (n >= opt_.max_context)
    return refuse(ErrorCode::kContextExceeded,
                  detail::concat("the prompt has ", n, " tokens but this server's context holds ",
                                 opt_.max_context, " tokens (prompt + generated), so at most ",
                                 opt_.max_context - 1, " prompt tokens fit"));
  const int64_t limit =
      req.max_tokens >= opt_.max_context - n ? opt_.max_context : n + req.max_tokens;
  const size_t need = bytes_for(limit);
  if (need > opt_.state_budget_bytes)
    return refuse(ErrorCode::kContextExceeded,
                  detail::concat("the request needs ", need, " bytes of sequence state for ", limit,
                                 " tokens, more than the whole budget of ", opt_.state_budget_bytes,
                                 " bytes"));

  auto seq = std::make_unique<Sequence>(std::move(req), std::move(sink), SequenceState{});
  seq->limit = limit;
  seq->reserved = need;
  {
    std::lock_guard lk(mu_);
    if (!accepting_) return refuse(ErrorCode::kUnavailable, "the server is shutting down");
    if (waiting_.size() >= opt_.max_waiting)
      return refuse(ErrorCode::kOverloaded,
                    detail::concat(waiting_.size(), " requests are already waiting (limit ",
                                   opt_.max_waiting, "); retry later"));
    seq->id = next_id_++;
    waiting_.push_back(std::move(seq));
    Admission ok{waiting_.back()->id, ErrorCode::kOk, {}};
    cv_.notify_one();
    return ok;
  }
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard lk(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_one();
}

void Engine::stop_accepting() {
  std::lock_guard lk(mu_);
  accepting_ = false;
}

void Engine::abort_all(const std::string& message) {
  {
    std::lock_guard lk(mu_);
    abort_message_ = message.empty() ? "aborted" : message;
  }
  cv_.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard lk(mu_);
  EngineStats s = counters_;
  s.ready = ready_.load();
  s.running = running_count_;
  s.waiting = static_cast<int>(waiting_.size());
  s.state_reserved_bytes = reserved_;
  return s;
}

void Engine::finish(Sequence& s, FinishReason r, ErrorCode e, std::string message) {
  if (s.done) return;
  s.done = true;
  if (s.admitted) {
    std::lock_guard lk(mu_);
    reserved_ -= s.reserved;
    --running_count_;
    ++counters_.requests_finished;
  }
  s.state = SequenceState{};  // the memory goes back now, not when the slot is compacted
  TokenEvent ev;
  ev.request_id = s.id;
  ev.is_final = true;
  ev.finish = r;
  ev.error = e;
  ev.message = std::move(message);
  ev.prompt_tokens = static_cast<int64_t>(s.req.prompt.size());
  ev.generated_tokens = s.generated;
  s.sink(std::move(ev));
}

void Engine::loop() {
  if (opt_.warm_up) {
    try {
      SequenceState st = backend_.new_sequence();
      const int32_t tok = config().bos_token_id;
      int32_t next = -1;
      ForwardItem item{
          .state = &st, .tokens = {&tok, 1}, .want = ForwardItem::Logits::kLast, .token = &next};
      backend_.forward({&item, 1});
      DSUF_CHECK(next >= 0 && next < config().text.vocab_size, "warm-up sampled token ", next);
    } catch (const std::exception& e) {
      std::lock_guard lk(mu_);
      counters_.warm_up_error = e.what();
    }
  }
  {
    std::lock_guard lk(mu_);
    ready_ = counters_.warm_up_error.empty();
  }

  std::vector<Sequence*> batch;
  for (;;) {
    std::vector<std::unique_ptr<Sequence>> dropped;  // refused while waiting: cancelled or aborted
    std::vector<uint64_t> cancels;
    std::string abort;
    bool stop = false;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] {
        return stop_ || !waiting_.empty() || !running_.empty() || !cancels_.empty() ||
               !abort_message_.empty();
      });
      stop = stop_;
      cancels.swap(cancels_);
      abort.swap(abort_message_);
      if (stop) abort = "the engine shut down";
      if (!abort.empty()) {
        for (auto& s : waiting_) dropped.push_back(std::move(s));
        waiting_.clear();
      } else if (!cancels.empty()) {
        std::erase_if(waiting_, [&](std::unique_ptr<Sequence>& s) {
          if (std::find(cancels.begin(), cancels.end(), s->id) == cancels.end()) return false;
          dropped.push_back(std::move(s));
          return true;
        });
      }
      // FIFO admission: the head waits until its reservation fits, so a big request is not
      // overtaken forever by small ones.
      while (!waiting_.empty() && static_cast<int>(running_.size()) < opt_.max_batch &&
             reserved_ + waiting_.front()->reserved <= opt_.state_budget_bytes) {
        auto& s = waiting_.front();
        reserved_ += s->reserved;
        s->admitted = true;
        running_.push_back(std::move(s));
        waiting_.pop_front();
      }
      running_count_ = static_cast<int>(running_.size());
    }
    for (auto& s : dropped) {
      if (abort.empty())
        finish(*s, FinishReason::kCancelled, ErrorCode::kOk, "cancelled");
      else
        finish(*s, FinishReason::kError, ErrorCode::kUnavailable, abort);
    }
    for (auto& s : running_) {
      if (s->started || s->done) continue;
      if (s->req.cached_tokens > 0) {
        s->state = *s->req.initial_state;
        // A cached state is host-only; should it still carry a device handle, the handle is not
        // this sequence's: the backend uploads the host pools into pools of its own.
        s->state.device.reset();
        s->prefilled = s->req.cached_tokens;
        s->req.initial_state.reset();
      } else {
        s->state = backend_.new_sequence();
      }
      s->started = true;
    }
    for (auto& s : running_) {
      if (!abort.empty())
        finish(*s, FinishReason::kError, ErrorCode::kUnavailable, abort);
      else if (std::find(cancels.begin(), cancels.end(), s->id) != cancels.end())
        finish(*s, FinishReason::kCancelled, ErrorCode::kOk, "cancelled");
    }
    std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
    if (stop) return;
    if (!running_.empty()) step(batch);
    std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
    std::lock_guard lk(mu_);
    running_count_ = static_cast<int>(running_.size());
  }
}

void Engine::step(std::vector<Sequence*>& batch) {
  std::vector<ForwardItem> items;
  batch.clear();
  int decodes = 0;
  for (auto& s : running_) {
    if (!s->decoding()) continue;
    batch.push_back(s.get());
    items.push_back(
        {.state = &s->state, .tokens = {&s->last, 1}, .want = ForwardItem::Logits::kLast});
    ++decodes;
  }
  // Prefill gets what decodes leave of the step budget, and at least one chunk, so new requests
  // keep moving however many streams are decoding.
  int budget = std::max(opt_.max_step_tokens - decodes, opt_.prefill_chunk);
  for (auto& s : running_) {
    if (s->decoding() || budget <= 0) continue;
    const int64_t left = static_cast<int64_t>(s->req.prompt.size()) - s->prefilled;
    const int n = static_cast<int>(std::min<int64_t>({left, opt_.prefill_chunk, budget}));
    budget -= n;
    batch.push_back(s.get());
    items.push_back({.state = &s->state,
                     .tokens = {s->req.prompt.data() + s->prefilled, static_cast<size_t>(n)},
                     .want = n == left ? ForwardItem::Logits::kLast : ForwardItem::Logits::kNone});
  }
  // Every row that ends a prompt or decodes comes back as a token sampled by the backend (the
  // request's draw number is its count of tokens so far); no logits cross to the host.
  if (tokens_.size() < items.size()) tokens_.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].want == ForwardItem::Logits::kNone) continue;
    items[i].sampling = batch[i]->req.sampling;
    items[i].draw = static_cast<uint64_t>(batch[i]->generated);
    items[i].token = &tokens_[i];
  }

  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  try {
    backend_.forward(items);
  } catch (const std::exception& e) {
    // A backend failure ends the step's requests, not the server.
    for (Sequence* s : batch)
      finish(*s, FinishReason::kError, ErrorCode::kInternal, std::string("backend: ") + e.what());
    return;
  }

  const double forward_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double forward_cpu_s = thread_cpu_seconds() - cpu0;
  uint64_t prompt_tokens = 0, generated = 0;
  std::vector<std::pair<Sequence*, TokenEvent>> events;
  const int32_t eos = config().eos_token_id;
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = *batch[i];
    if (!s.decoding()) {
      s.prefilled += static_cast<int64_t>(items[i].tokens.size());
      prompt_tokens += items[i].tokens.size();
      if (!s.decoding()) continue;  // more prompt to go: no logits this step
      if (s.req.on_state && s.req.snapshot_prompt) {
        backend_.download(s.state);
        SequenceState copy = s.state;
        copy.device.reset();  // the copy is host-only; the live sequence keeps the device pools
        s.req.on_state(s.req.prompt, std::move(copy));
      }
    }
    const int32_t tok = tokens_[i];
    s.last = tok;
    if (s.req.on_state) s.out.push_back(tok);
    ++s.generated;
    ++generated;
    const bool is_stop = (!s.req.ignore_eos && tok == eos) ||
                         std::find(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), tok) !=
                             s.req.stop_token_ids.end();
    const int64_t total = static_cast<int64_t>(s.req.prompt.size()) + s.generated;
    TokenEvent ev;
    ev.request_id = s.id;
    ev.tokens.push_back(tok);
    ev.prompt_tokens = static_cast<int64_t>(s.req.prompt.size());
    ev.generated_tokens = s.generated;
    if (is_stop || total >= s.limit) {
      ev.is_final = true;
      ev.finish = is_stop ? FinishReason::kStop : FinishReason::kLength;
      ev.ends_with_stop_token = is_stop;
      s.done = true;
      if (s.req.on_state) {
        // The last sampled token was never fed: the state has consumed everything before it.
        std::vector<int32_t> seen = s.req.prompt;
        seen.insert(seen.end(), s.out.begin(), s.out.end() - 1);
        backend_.download(s.state);
        s.state.device.reset();
        s.req.on_state(std::move(seen), std::move(s.state));
      }
      s.state = SequenceState{};
    }
    events.emplace_back(&s, std::move(ev));
  }
  // The books are updated before anyone hears of the step, so a client that reads /metrics right
  // after its last token sees its request finished and its tokens counted.
  {
    std::lock_guard lk(mu_);
    for (auto& [s, ev] : events) {
      if (!ev.is_final) continue;
      reserved_ -= s->reserved;
      --running_count_;
      ++counters_.requests_finished;
    }
    counters_.prompt_tokens_total += prompt_tokens;
    counters_.generation_tokens_total += generated;
    ++counters_.steps;
    counters_.forward_seconds += forward_s;
    counters_.forward_cpu_seconds += forward_cpu_s;
  }
  for (auto& [s, ev] : events) s->sink(std::move(ev));
}

EventSink EventQueue::sink() {
  return [st = st_](TokenEvent&& ev) {
    {
      std::lock_guard lk(st->mu);
      st->events.push_back(std::move(ev));
    }
    st->cv.notify_all();
  };
}

bool EventQueue::next(TokenEvent& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(st_->mu);
  if (!st_->cv.wait_for(lk, timeout, [&] { return !st_->events.empty(); })) return false;
  out = std::move(st_->events.front());
  st_->events.pop_front();
  return true;
}

std::vector<int32_t> EventQueue::collect(TokenEvent* final, std::chrono::milliseconds timeout) {
  std::vector<int32_t> out;
  TokenEvent ev;
  for (;;) {
    if (!next(ev, timeout)) fail("EventQueue: no event within ", timeout.count(), " ms");
    out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.is_final) break;
  }
  if (final) *final = std::move(ev);
  return out;
}

}  // namespace dsuf
