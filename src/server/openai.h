// The OpenAI Chat Completions surface (spec ecosystem.md §2): request bodies in, checked and
// turned into what the engine and the chat encoder need; chunks, responses and errors out in the
// shapes the openai client and dsh parse. No HTTP here, so it compiles fast and tests without
// Beast.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "text/chat_encoder.h"

namespace dsuf::server {

using Json = nlohmann::ordered_json;

// An error a client gets: HTTP status + OpenAI error object.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code = {};   // empty: null
  std::string param = {};  // empty: null
  std::string message = {};
  int retry_after_s = 0;  // > 0: sent as Retry-After (429, 503)
};

ApiError bad_request(std::string message, std::string param = {}, std::string code = {});
std::string error_body(const ApiError& e);

struct ChatCall {
  std::string model;
  bool stream = false;
  bool include_usage = false;
  text::ChatRequest chat;
  SamplingParams sampling;
  bool seed_given = false;
  std::optional<int64_t> max_tokens;
  std::vector<std::string> stop;
  bool ignore_eos = false;  // vLLM extension, for benchmarks that want a fixed length
};

struct ModelInfo {
  std::string id;  // served name; requests may name any model and get their name echoed
  int64_t created = 0;
  int64_t max_context = 0;
};

// Checks every field we act on; throws ApiError naming the field. Unknown fields are ignored,
// except ones whose meaning we cannot honour (n > 1, logprobs, logit_bias), which are refused
// rather than silently dropped.
ChatCall parse_chat_call(std::string_view body, const ModelInfo& model);

// The streaming chunk: {id, object, created, model, system_fingerprint, choices: [...]}.
struct ChunkHeader {
  std::string id;
  int64_t created = 0;
  std::string model;
};
std::string sse(const Json& payload);  // "data: <json>\n\n"
Json chunk(const ChunkHeader& h, const Json& delta, const char* finish_reason,
           bool with_usage_null);
Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t reasoning_tokens,
                int64_t cached_tokens);

std::string models_body(const ModelInfo& m);
std::string model_body(const ModelInfo& m);

// Serializes with invalid UTF-8 replaced, never throwing on text that came from the model.
std::string dump(const Json& j);

}  // namespace dsuf::server
