#include "server/chat_service.h"

#include "core/error.h"

namespace dsuf::server {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

ChatService::ChatService(Engine& engine, const text::Tokenizer& tokenizer, ModelInfo model)
    : engine_(engine), tok_(tokenizer), encoder_(tokenizer), model_(std::move(model)) {}

PreparedChat ChatService::prepare(std::string_view body) const {
  PreparedChat p;
  p.call = parse_chat_call(body, model_);
  text::RenderedPrompt r;
  try {
    r = encoder_.render(p.call.chat);
  } catch (const Error& e) {
    throw bad_request(e.what(), "messages");
  }
  if (r.image_count > 0)
    throw bad_request("image content is not supported by this server yet", "messages");
  p.prompt = std::move(r.ids);
  p.thinking_prompt = ends_with(r.text, "<think>");
  p.tool_calls_open = ends_with(r.text, "<｜DSML｜ calls>\n");
  const auto& msgs = p.call.chat.messages;
  p.strip_leading = msgs.empty() || !msgs.back().prefix;
  const int64_t n = static_cast<int64_t>(p.prompt.size());
  const int64_t ctx = engine_.options().max_context;
  if (n >= ctx)
    throw bad_request(detail::concat("this model's maximum context length is ", ctx,
                                     " tokens; the messages take ", n,
                                     " tokens, leaving no room for a reply; shorten the conversation"),
                      "messages", "context_length_exceeded");
  return p;
}

ApiError api_error(const Admission& a) {
  switch (a.error) {
    case ErrorCode::kInvalidRequest: return bad_request(a.message);
    case ErrorCode::kContextExceeded: return bad_request(a.message, "messages", "context_length_exceeded");
    case ErrorCode::kOverloaded:
      return {.status = 429, .type = "rate_limit_error", .code = "overloaded", .message = "server overloaded: " + a.message,
              .retry_after_s = 1};
    case ErrorCode::kUnavailable:
      return {.status = 503, .type = "server_error", .code = "unavailable", .message = a.message, .retry_after_s = 5};
    default: return {.status = 500, .type = "server_error", .message = a.message};
  }
}

uint64_t ChatService::submit(const PreparedChat& p, EventSink sink) {
  Request r;
  r.prompt = p.prompt;
  r.sampling = p.call.sampling;
  const int64_t room = engine_.options().max_context - static_cast<int64_t>(p.prompt.size());
  // max_tokens beyond the context is clamped (finish "length"), not refused: clients such as dsh
  // send 256000 by default.
  r.max_tokens = std::min(p.call.max_tokens.value_or(room), room);
  r.ignore_eos = p.call.ignore_eos;
  Admission a = engine_.submit(std::move(r), std::move(sink));
  if (!a) throw api_error(a);
  return a.id;
}

ChatStream::ChatStream(const text::Tokenizer& tok, const PreparedChat& p, ChunkHeader header)
    : tok_(tok),
      decoder_(tok),
      parser_(p.thinking_prompt, p.call.stop, p.tool_calls_open, p.strip_leading),
      header_(std::move(header)),
      stream_(p.call.stream),
      include_usage_(p.call.include_usage),
      thinking_(p.thinking_prompt),
      prompt_tokens_(static_cast<int64_t>(p.prompt.size())) {}

std::string ChatStream::open() {
  Json delta = {{"role", "assistant"}, {"content", ""}};
  if (thinking_) delta["reasoning_content"] = "";
  return sse(chunk(header_, delta, nullptr, include_usage_));
}

std::string ChatStream::deltas_to_sse(const std::vector<Delta>& deltas) {
  std::string out;
  for (const Delta& d : deltas) {
    Json delta;
    switch (d.kind) {
      case Delta::Kind::kReasoning: delta = {{"reasoning_content", d.text}}; break;
      case Delta::Kind::kContent: delta = {{"content", d.text}}; break;
      case Delta::Kind::kToolBegin:
        delta = {{"tool_calls", Json::array({{{"index", d.tool_index},
                                             {"id", calls_[d.tool_index].id},
                                             {"type", "function"},
                                             {"function", {{"name", d.text}, {"arguments", ""}}}}})}};
        break;
      case Delta::Kind::kToolArgs:
        delta = {{"tool_calls", Json::array({{{"index", d.tool_index}, {"function", {{"arguments", d.text}}}}})}};
        break;
    }
    out += sse(chunk(header_, delta, nullptr, include_usage_));
  }
  return out;
}

void ChatStream::accumulate(const std::vector<Delta>& deltas) {
  for (const Delta& d : deltas) {
    if (d.kind == Delta::Kind::kToolBegin) {
      // The id is made when the call begins, so the streamed and the final form agree.
      calls_.push_back({detail::concat("call_", header_.id.substr(header_.id.find('-') + 1), "_", calls_.size()),
                        d.text, ""});
    }
  }
  if (!stream_) {
    for (const Delta& d : deltas) {
      if (d.kind == Delta::Kind::kReasoning) reasoning_ += d.text;
      if (d.kind == Delta::Kind::kContent) content_ += d.text;
      if (d.kind == Delta::Kind::kToolArgs) calls_[d.tool_index].args += d.text;
    }
  }
}

std::string ChatStream::finish(const std::string& reason) {
  done_ = true;
  finish_reason_ = parser_.tool_calls() > 0 && reason == "stop" ? "tool_calls" : reason;
  if (!stream_) return {};
  std::string out = sse(chunk(header_, Json::object(), finish_reason_.c_str(), include_usage_));
  if (include_usage_) {
    Json u = {{"id", header_.id}, {"object", "chat.completion.chunk"}, {"created", header_.created},
              {"model", header_.model}, {"system_fingerprint", "dsuf"}, {"choices", Json::array()},
              {"usage", usage_json(prompt_tokens_, completion_tokens_, reasoning_tokens_, 0)}};
    out += sse(u);
  }
  out += "data: [DONE]\n\n";
  return out;
}

std::string ChatStream::on_event(const TokenEvent& ev) {
  if (done_) return {};
  std::vector<Delta> deltas;
  const size_t n = ev.tokens.size() - (ev.ends_with_stop_token ? 1 : 0);
  for (size_t i = 0; i < ev.tokens.size(); ++i) {
    ++completion_tokens_;
    if (i >= n) break;  // the stop token is counted, never shown
    const bool reasoning = parser_.stage() == ResponseParser::Stage::kReasoning;
    parser_.push(decoder_.push(ev.tokens[i]), deltas);
    if (reasoning) ++reasoning_tokens_;
    if (parser_.stopped()) break;
  }
  if (parser_.stopped()) {
    wants_cancel_ = !ev.is_final;
    parser_.finish(deltas);
    accumulate(deltas);
    return (stream_ ? deltas_to_sse(deltas) : std::string()) + finish("stop");
  }
  if (!ev.is_final) {
    accumulate(deltas);
    return stream_ ? deltas_to_sse(deltas) : std::string();
  }
  parser_.push(decoder_.finish(), deltas);
  parser_.finish(deltas);
  accumulate(deltas);
  std::string out = stream_ ? deltas_to_sse(deltas) : std::string();
  switch (ev.finish) {
    case FinishReason::kStop: return out + finish("stop");
    case FinishReason::kLength: return out + finish("length");
    case FinishReason::kCancelled: return out + finish("abort");
    default: break;
  }
  done_ = true;
  finish_reason_ = "error";
  error_ = ev.error == ErrorCode::kUnavailable
               ? ApiError{.status = 503, .type = "server_error", .code = "unavailable", .message = ev.message, .retry_after_s = 5}
               : ApiError{.status = 500, .type = "server_error", .code = "internal_error", .message = ev.message};
  if (!stream_) return {};
  // After the 200 header the error travels in the stream; [DONE] still ends it (dsh and the
  // openai client both need a terminal event).
  return out + "data: " + error_body(error_) + "\n\ndata: [DONE]\n\n";
}

std::string ChatStream::response_body() const {
  Json msg = {{"role", "assistant"}, {"content", content_}};
  if (thinking_) msg["reasoning_content"] = reasoning_;
  if (!calls_.empty()) {
    Json tc = Json::array();
    for (size_t i = 0; i < calls_.size(); ++i)
      tc.push_back({{"id", calls_[i].id}, {"type", "function"},
                    {"function", {{"name", calls_[i].name}, {"arguments", calls_[i].args}}}});
    msg["tool_calls"] = tc;
  }
  Json body = {{"id", header_.id},
               {"object", "chat.completion"},
               {"created", header_.created},
               {"model", header_.model},
               {"system_fingerprint", "dsuf"},
               {"choices", Json::array({{{"index", 0}, {"message", msg}, {"logprobs", nullptr},
                                         {"finish_reason", finish_reason_}}})},
               {"usage", usage_json(prompt_tokens_, completion_tokens_, reasoning_tokens_, 0)}};
  return dump(body);
}

}  // namespace dsuf::server
