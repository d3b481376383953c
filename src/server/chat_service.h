// The chat request path without HTTP: a request body becomes a prompt and an engine request, and
// the engine's token events become OpenAI chunks (streaming) or one response (non-streaming).
// Detokenization, stop strings and tool-call parsing run here, on the server's thread, never on
// the scheduler thread. HTTP (http_server.cc) only moves the bytes.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/prompt_cache.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "text/chat_encoder.h"
#include "text/response_parser.h"
#include "text/tokenizer.h"

namespace dsuf::server {

struct PreparedChat {
  ChatCall call;
  std::vector<int32_t> prompt;
  bool thinking_prompt = false;   // the prompt ends with <think>: output starts as reasoning
  bool continuation = false;      // the last message is an assistant prefix being continued
  bool opens_tool_calls = false;  // the prompt opened the DSML call block (tool_choice required)
  // Conversation cache: the client's session id (header), and what attach_cache found.
  std::string session;
  std::shared_ptr<const SequenceState> cached_state;
  int64_t cached_tokens = 0;
  std::string cache_tier;
};

// The session id a client sent (x-deepseek-harness-session-id, else x-session-id); "" when none
// or when it is longer than 256 bytes (a key, not a payload).
std::string session_id(std::string_view harness_header, std::string_view generic_header);

class ChatService {
 public:
  ChatService(Engine& engine, const text::Tokenizer& tokenizer, ModelInfo model);

  // Parses, validates and renders; throws ApiError.
  PreparedChat prepare(std::string_view body) const;
  // The conversation cache, when this replica has one (serve wires it before requests arrive).
  void set_cache(std::shared_ptr<PromptCache> cache) { cache_ = std::move(cache); }
  bool has_cache() const { return cache_ != nullptr; }
  // Looks the prompt up (may pull from a peer: call it off the I/O thread); never throws.
  void attach_cache(PreparedChat& p) const;
  // Submits to the engine; a refusal becomes the ApiError the client gets.
  uint64_t submit(const PreparedChat& p, EventSink sink);
  void cancel(uint64_t id) { engine_.cancel(id); }

  Engine& engine() { return engine_; }
  const text::Tokenizer& tokenizer() const { return tok_; }
  const ModelInfo& model() const { return model_; }

 private:
  Engine& engine_;
  const text::Tokenizer& tok_;
  text::ChatEncoder encoder_;
  ModelInfo model_;
  std::shared_ptr<PromptCache> cache_;
};

ApiError api_error(const Admission& a);

// One request's output, event by event.
class ChatStream {
 public:
  ChatStream(const text::Tokenizer& tok, const PreparedChat& p, ChunkHeader header);

  // The role chunk that opens a stream.
  std::string open();
  // Consumes one engine event; returns the SSE bytes to send (streaming). After done(), further
  // events are ignored.
  std::string on_event(const TokenEvent& ev);
  bool done() const { return done_; }
  // A stop string matched: the engine request must be cancelled (it does not know).
  bool wants_cancel() const { return wants_cancel_; }
  bool failed() const { return !error_.message.empty(); }
  const ApiError& error() const { return error_; }
  const std::string& finish_reason() const { return finish_reason_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  // The non-streaming response, once done() and not failed().
  std::string response_body() const;

 private:
  std::string events_to_sse(const std::vector<text::ParseEvent>& events);
  void accumulate(const std::vector<text::ParseEvent>& events);
  std::string finish(const std::string& reason);

  text::ResponseParser parser_;
  ChunkHeader header_;
  bool stream_, include_usage_, thinking_;
  bool in_reasoning_;  // for counting reasoning tokens: no content or tool call seen yet
  bool done_ = false, wants_cancel_ = false;
  std::string finish_reason_;
  ApiError error_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, reasoning_tokens_ = 0, cached_tokens_ = 0;
  // Non-streaming accumulation.
  std::string reasoning_, content_;
  struct Call {
    std::string id, name, args;
  };
  std::vector<Call> calls_;
};

}  // namespace dsuf::server
