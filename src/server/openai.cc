#include "server/openai.h"

#include <cmath>

#include "core/error.h"

namespace dsuf::server {
namespace {

const char* type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void wrong_type(const std::string& field, const char* expected, const Json& v) {
  throw bad_request(field + " must be " + expected + ", got " + type_name(v), field);
}

double number(const Json& body, const char* field, double lo, double hi) {
  const Json& v = body[field];
  if (!v.is_number()) wrong_type(field, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_request(detail::concat(field, " must be in [", lo, ", ", hi, "], got ", v.dump()),
                      field);
  return x;
}

int64_t integer(const Json& body, const char* field, int64_t lo, int64_t hi) {
  const Json& v = body[field];
  if (!v.is_number_integer() &&
      !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
    wrong_type(field, "an integer", v);
  if (v.is_number_float() && std::fabs(v.get<double>()) > 9e18)
    throw bad_request(std::string(field) + " is out of range", field);
  const int64_t x = v.is_number_unsigned()
                        ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX))
                        : v.get<int64_t>();
  if (x < lo || x > hi)
    throw bad_request(detail::concat(field, " must be in [", lo, ", ", hi, "], got ", v.dump()),
                      field);
  return x;
}

bool boolean(const Json& body, const char* field) {
  const Json& v = body[field];
  if (!v.is_boolean()) wrong_type(field, "a boolean", v);
  return v.get<bool>();
}

bool present(const Json& body, const char* field) {
  return body.contains(field) && !body[field].is_null();
}

}  // namespace

ApiError bad_request(std::string message, std::string param, std::string code) {
  return ApiError{.status = 400,
                  .type = "invalid_request_error",
                  .code = std::move(code),
                  .param = std::move(param),
                  .message = std::move(message)};
}

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string error_body(const ApiError& e) {
  Json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? Json() : Json(e.param)},
              {"code", e.code.empty() ? Json() : Json(e.code)}};
  return dump(Json{{"error", err}});
}

ChatCall parse_chat_call(std::string_view text, const ModelInfo& model) {
  Json body;
  try {
    body = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw bad_request(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!body.is_object())
    throw bad_request(std::string("the request body must be a JSON object, got ") +
                      type_name(body));

  ChatCall c;
  c.model = model.id;
  if (present(body, "model")) {
    if (!body["model"].is_string()) wrong_type("model", "a string", body["model"]);
    // Any name is served and echoed back (as llama.cpp does): one model per server, and scripts
    // written for another deployment's model name keep working unchanged.
    c.model = body["model"].get<std::string>();
    if (c.model.empty()) c.model = model.id;
  }
  if (!body.contains("messages")) throw bad_request("messages is required", "messages");
  if (!body["messages"].is_array()) wrong_type("messages", "an array", body["messages"]);
  if (body["messages"].empty()) throw bad_request("messages must not be empty", "messages");
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    const Json& m = body["messages"][i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(where, "an object", m);
    if (!m.contains("role")) throw bad_request(where + ".role is required", where + ".role");
    if (!m["role"].is_string()) wrong_type(where + ".role", "a string", m["role"]);
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
        role != "tool")
      throw bad_request(
          where + ".role must be system, developer, user, assistant or tool, got '" + role + "'",
          where + ".role");
    if (m.contains("content") && !m["content"].is_null() && !m["content"].is_string() &&
        !m["content"].is_array())
      wrong_type(where + ".content", "a string or an array of content parts", m["content"]);
    if (role != "assistant" && (!m.contains("content") || m["content"].is_null()))
      throw bad_request(where + ".content is required for role " + role, where + ".content");
  }
  if (present(body, "stream")) c.stream = boolean(body, "stream");
  if (present(body, "stream_options")) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) wrong_type("stream_options", "an object", so);
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean())
        wrong_type("stream_options.include_usage", "a boolean", so["include_usage"]);
      c.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (present(body, "n") && integer(body, "n", 1, 1000000) != 1)
    throw bad_request("n must be 1: this server returns one choice per request", "n");
  if (present(body, "logprobs") && boolean(body, "logprobs"))
    throw bad_request("logprobs are not supported by this server", "logprobs");
  if (present(body, "top_logprobs"))
    throw bad_request("top_logprobs is not supported by this server", "top_logprobs");
  if (present(body, "logit_bias")) {
    if (!body["logit_bias"].is_object()) wrong_type("logit_bias", "an object", body["logit_bias"]);
    if (!body["logit_bias"].empty())
      throw bad_request("logit_bias is not supported by this server", "logit_bias");
  }
  for (const char* f : {"max_tokens", "max_completion_tokens"})
    if (present(body, f)) c.max_tokens = integer(body, f, 1, INT64_MAX);
  if (present(body, "temperature"))
    c.sampling.temperature = static_cast<float>(number(body, "temperature", 0, 2));
  if (present(body, "top_p")) {
    c.sampling.top_p = static_cast<float>(number(body, "top_p", 0, 1));
    if (c.sampling.top_p <= 0) throw bad_request("top_p must be greater than 0", "top_p");
  }
  if (present(body, "top_k")) {
    const int64_t k = integer(body, "top_k", -1, 1 << 30);
    c.sampling.top_k = k < 0 ? 0 : static_cast<int>(k);  // vLLM: -1 disables
  }
  if (present(body, "seed")) {
    c.sampling.seed = static_cast<uint64_t>(integer(body, "seed", INT64_MIN, INT64_MAX));
    c.seed_given = true;
  }
  // Accepted for compatibility and not applied (as DeepSeek does in thinking mode).
  for (const char* f : {"presence_penalty", "frequency_penalty"})
    if (present(body, f)) number(body, f, -2, 2);
  if (present(body, "stop")) {
    const Json& s = body["stop"];
    if (s.is_string()) {
      c.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 16) throw bad_request("stop holds at most 16 strings", "stop");
      for (const Json& x : s) {
        if (!x.is_string())
          throw bad_request("stop must be a string or an array of strings", "stop");
        c.stop.push_back(x.get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", s);
    }
    for (const auto& x : c.stop)
      if (x.empty()) throw bad_request("stop strings must not be empty", "stop");
  }
  if (present(body, "ignore_eos")) c.ignore_eos = boolean(body, "ignore_eos");
  if (present(body, "response_format")) {
    const Json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      throw bad_request("response_format must be an object with a string type", "response_format");
    const std::string t = rf["type"].get<std::string>();
    if (t != "text" && t != "json_object" && t != "json_schema")
      throw bad_request(
          "response_format.type must be text, json_object or json_schema, got '" + t + "'",
          "response_format");
  }
  if (present(body, "tools")) {
    const Json& tools = body["tools"];
    if (!tools.is_array()) wrong_type("tools", "an array", tools);
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& t = tools[i];
      const std::string w = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
        throw bad_request(w + " must be {\"type\": \"function\", \"function\": {...}}", w);
      if (!t["function"].contains("name") || !t["function"]["name"].is_string())
        throw bad_request(w + ".function.name must be a string", w + ".function.name");
    }
  }
  if (present(body, "tool_choice")) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      const std::string v = tc.get<std::string>();
      if (v != "none" && v != "auto" && v != "required")
        throw bad_request(
            "tool_choice must be none, auto, required or {\"type\": \"function\", ...}",
            "tool_choice");
    } else if (!tc.is_object()) {
      wrong_type("tool_choice", "a string or an object", tc);
    }
  }
  if (present(body, "thinking")) {
    const Json& t = body["thinking"];
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string() ||
        (t["type"] != "enabled" && t["type"] != "disabled"))
      throw bad_request("thinking must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}",
                        "thinking");
  }
  // DeepSeek's effort names beyond the encoder's low/high/max (spec ecosystem.md §2.3).
  if (present(body, "reasoning_effort") && body["reasoning_effort"].is_string()) {
    const std::string e = body["reasoning_effort"].get<std::string>();
    if (e == "minimal")
      body["reasoning_effort"] = "low";
    else if (e == "medium" || e == "xhigh")
      body["reasoning_effort"] = "high";
    else if (e == "ultra")
      body["reasoning_effort"] = "max";
  }
  // deepseek-chat / deepseek-reasoner pick the mode when the request does not.
  if (!present(body, "thinking") && c.model == "deepseek-chat")
    body["thinking"] = {{"type", "disabled"}};
  // The encoder reads thinking, reasoning_effort, tools, tool_choice, response_format, messages.
  try {
    c.chat = text::chat_request_from_json(body);
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
  return c;
}

std::string sse(const Json& payload) {
  return "data: " + dump(payload) + "\n\n";
}

Json chunk(const ChunkHeader& h, const Json& delta, const char* finish_reason,
           bool with_usage_null) {
  Json choice = {{"index", 0},
                 {"delta", delta},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason ? Json(finish_reason) : Json()}};
  Json c = {
      {"id", h.id},       {"object", "chat.completion.chunk"}, {"created", h.created},
      {"model", h.model}, {"system_fingerprint", "dsuf"},      {"choices", Json::array({choice})}};
  if (with_usage_null) c["usage"] = nullptr;
  return c;
}

Json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t reasoning_tokens,
                int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"prompt_cache_hit_tokens", cached_tokens},
          {"prompt_cache_miss_tokens", prompt_tokens - cached_tokens}};
}

std::string model_body(const ModelInfo& m) {
  return dump(Json{{"id", m.id},
                   {"object", "model"},
                   {"created", m.created},
                   {"owned_by", "deepseek-ultrafast"},
                   {"max_model_len", m.max_context}});
}

std::string models_body(const ModelInfo& m) {
  Json data = Json::array();
  data.push_back(Json::parse(model_body(m)));
  return dump(Json{{"object", "list"}, {"data", data}});
}

}  // namespace dsuf::server
