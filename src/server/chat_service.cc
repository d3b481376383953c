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
  p.opens_tool_calls = r.opens_tool_calls;
  const auto& msgs = p.call.chat.messages;
  p.continuation = !msgs.empty() && msgs.back().prefix;
  const int64_t n = static_cast<int64_t>(p.prompt.size());
  const int64_t ctx = engine_.options().max_context;
  if (n >= ctx)
    throw bad_request(
        detail::concat("this model's maximum context length is ", ctx,
                       " tokens; the messages take ", n,
                       " tokens, leaving no room for a reply; shorten the conversation"),
        "messages", "context_length_exceeded");
  return p;
}

std::string session_id(std::string_view harness_header, std::string_view generic_header) {
  std::string_view v = !harness_header.empty() ? harness_header : generic_header;
  if (v.size() > 256) return {};
  return std::string(v);
}

void ChatService::attach_cache(PreparedChat& p) const {
  if (!cache_) return;
  CachedPrefix hit = cache_->lookup(p.session, p.prompt);
  p.cache_tier = hit.tier;
  if (!hit.state) return;
  p.cached_state = std::move(hit.state);
  p.cached_tokens = hit.tokens;
}

ApiError api_error(const Admission& a) {
  switch (a.error) {
    case ErrorCode::kInvalidRequest:
      return bad_request(a.message);
    case ErrorCode::kContextExceeded:
      return bad_request(a.message, "messages", "context_length_exceeded");
    case ErrorCode::kOverloaded:
      return {.status = 429,
              .type = "rate_limit_error",
              .code = "overloaded",
              .message = "server overloaded: " + a.message,
              .retry_after_s = 1};
    case ErrorCode::kUnavailable:
      return {.status = 503,
              .type = "server_error",
              .code = "unavailable",
              .message = a.message,
              .retry_after_s = 5};
    default:
      return {.status = 500, .type = "server_error", .message = a.message};
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
  if (cache_) {
    r.initial_state = p.cached_state;
    r.cached_tokens = p.cached_state ? p.cached_tokens : 0;
    // The state at the end of the prompt is kept as well as the final one: a client's next turn
    // re-renders the reply, and only the prompt part is sure to come back token for token.
    r.snapshot_prompt = true;
    r.on_state = [cache = cache_, session = p.session](std::vector<int32_t> tokens,
                                                       SequenceState state) {
      cache->store(session, std::move(tokens), std::move(state));
    };
  }
  Admission a = engine_.submit(std::move(r), std::move(sink));
  if (!a) throw api_error(a);
  return a.id;
}

namespace {

text::ParserOptions parser_options(const PreparedChat& p, const std::string& completion_id) {
  text::ParserOptions o;
  o.thinking = p.thinking_prompt;
  o.continuation = p.continuation;
  o.start_in_tool_calls = p.opens_tool_calls;
  o.stop = p.call.stop;
  // Call ids derive from the completion id: unique per request, and equal in the streamed and
  // the final form.
  const std::string base = completion_id.substr(completion_id.find('-') + 1);
  o.make_call_id = [base](int index) { return detail::concat("call_", base, "_", index); };
  return o;
}

}  // namespace

ChatStream::ChatStream(const text::Tokenizer& tok, const PreparedChat& p, ChunkHeader header)
    : parser_(tok, parser_options(p, header.id)),
      header_(std::move(header)),
      stream_(p.call.stream),
      include_usage_(p.call.include_usage),
      thinking_(p.thinking_prompt),
      in_reasoning_(p.thinking_prompt),
      prompt_tokens_(static_cast<int64_t>(p.prompt.size())),
      cached_tokens_(p.cached_state ? p.cached_tokens : 0) {}

std::string ChatStream::open() {
  Json delta = {{"role", "assistant"}, {"content", ""}};
  if (thinking_) delta["reasoning_content"] = "";
  return sse(chunk(header_, delta, nullptr, include_usage_));
}

std::string ChatStream::events_to_sse(const std::vector<text::ParseEvent>& events) {
  std::string out;
  for (const auto& e : events)
    out += sse(chunk(header_, text::openai_delta(e), nullptr, include_usage_));
  return out;
}

void ChatStream::accumulate(const std::vector<text::ParseEvent>& events) {
  using K = text::ParseEvent::Kind;
  for (const auto& e : events) {
    if (e.kind != K::kReasoning) in_reasoning_ = false;
    if (stream_) continue;
    switch (e.kind) {
      case K::kReasoning:
        reasoning_ += e.text;
        break;
      case K::kContent:
        content_ += e.text;
        break;
      case K::kToolCallBegin:
        if (static_cast<int>(calls_.size()) <= e.index) calls_.resize(e.index + 1);
        calls_[e.index].id = e.id;
        calls_[e.index].name = e.name;
        break;
      case K::kToolCallArguments:
        if (static_cast<int>(calls_.size()) <= e.index) calls_.resize(e.index + 1);
        calls_[e.index].args += e.text;
        break;
    }
  }
}

std::string ChatStream::finish(const std::string& reason) {
  done_ = true;
  finish_reason_ = reason;
  if (!stream_) return {};
  std::string out = sse(chunk(header_, Json::object(), finish_reason_.c_str(), include_usage_));
  if (include_usage_) {
    Json u = {{"id", header_.id},
              {"object", "chat.completion.chunk"},
              {"created", header_.created},
              {"model", header_.model},
              {"system_fingerprint", "dsuf"},
              {"choices", Json::array()},
              {"usage",
               usage_json(prompt_tokens_, completion_tokens_, reasoning_tokens_, cached_tokens_)}};
    out += sse(u);
  }
  out += "data: [DONE]\n\n";
  return out;
}

std::string ChatStream::on_event(const TokenEvent& ev) {
  if (done_) return {};
  std::vector<text::ParseEvent> events;
  const size_t shown = ev.tokens.size() - (ev.ends_with_stop_token ? 1 : 0);
  for (size_t i = 0; i < ev.tokens.size() && !parser_.done(); ++i) {
    ++completion_tokens_;
    if (i >= shown) break;  // the stop token is counted, never shown
    if (in_reasoning_) ++reasoning_tokens_;
    auto more = parser_.push(ev.tokens[i]);
    accumulate(more);
    events.insert(events.end(), std::make_move_iterator(more.begin()),
                  std::make_move_iterator(more.end()));
  }
  // A stop string matched or the tool-call block closed: the rest of the generation is not
  // wanted, and the engine does not know that.
  const bool cut = parser_.done() && !ev.is_final;
  if (!ev.is_final && !cut) return stream_ ? events_to_sse(events) : std::string();
  if (!cut && ev.finish == FinishReason::kError) {
    done_ = true;
    finish_reason_ = "error";
    error_ = ev.error == ErrorCode::kUnavailable ? ApiError{.status = 503,
                                                            .type = "server_error",
                                                            .code = "unavailable",
                                                            .message = ev.message,
                                                            .retry_after_s = 5}
                                                 : ApiError{.status = 500,
                                                            .type = "server_error",
                                                            .code = "internal_error",
                                                            .message = ev.message};
    if (!stream_) return {};
    // After the 200 header the error travels in the stream; [DONE] still ends it (dsh and the
    // openai client both need a terminal event).
    return events_to_sse(events) + "data: " + error_body(error_) + "\n\ndata: [DONE]\n\n";
  }
  wants_cancel_ = cut;
  auto tail = parser_.finish(!cut && ev.finish == FinishReason::kLength);
  accumulate(tail);
  events.insert(events.end(), std::make_move_iterator(tail.begin()),
                std::make_move_iterator(tail.end()));
  std::string out = stream_ ? events_to_sse(events) : std::string();
  if (!cut && ev.finish == FinishReason::kCancelled) return out + finish("abort");
  return out + finish(text::finish_reason_name(parser_.finish_reason()));
}

std::string ChatStream::response_body() const {
  Json msg = {{"role", "assistant"}, {"content", content_}};
  if (thinking_) msg["reasoning_content"] = reasoning_;
  if (!calls_.empty()) {
    Json tc = Json::array();
    for (size_t i = 0; i < calls_.size(); ++i)
      tc.push_back({{"id", calls_[i].id},
                    {"type", "function"},
                    {"function", {{"name", calls_[i].name}, {"arguments", calls_[i].args}}}});
    msg["tool_calls"] = tc;
  }
  Json body = {
      {"id", header_.id},
      {"object", "chat.completion"},
      {"created", header_.created},
      {"model", header_.model},
      {"system_fingerprint", "dsuf"},
      {"choices", Json::array({{{"index", 0},
                                {"message", msg},
                                {"logprobs", nullptr},
                                {"finish_reason", finish_reason_}}})},
      {"usage", usage_json(prompt_tokens_, completion_tokens_, reasoning_tokens_, cached_tokens_)}};
  return dump(body);
}

}  // namespace dsuf::server
