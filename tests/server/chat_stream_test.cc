// ChatStream: engine token events -> OpenAI chunks and responses, with the real V4.1 tokenizer.
// A random-weight model never writes a tool call, so the DSML path is driven here with the ids of
// real model output.
#include <gtest/gtest.h>

#include "server/chat_service.h"

namespace dsuf::server {
namespace {

const text::Tokenizer& tok() {
  static text::Tokenizer t(std::string(DSUF_SOURCE_DIR) + "/assets/tokenizer/tokenizer.json");
  return t;
}

PreparedChat prepared(bool stream, bool thinking, std::vector<std::string> stop = {}) {
  PreparedChat p;
  p.call.stream = stream;
  p.call.include_usage = true;
  p.call.stop = std::move(stop);
  p.prompt = {0, 128803, 19923, 128804, thinking ? 128821 : 128822};
  p.thinking_prompt = thinking;
  return p;
}

TokenEvent event(std::vector<int32_t> ids, bool final = false,
                 FinishReason r = FinishReason::kNone) {
  TokenEvent e;
  e.tokens = std::move(ids);
  e.is_final = final;
  e.finish = r;
  return e;
}

// Feeds `text` one token per event (as the engine does), then EOS as the final event.
std::string feed(ChatStream& cs, const std::string& text, int64_t* n = nullptr) {
  std::string out = cs.open();
  auto ids = tok().encode(text, /*match_added_tokens=*/true);
  for (int32_t id : ids) out += cs.on_event(event({id}));
  TokenEvent fin = event({1}, true, FinishReason::kStop);
  fin.ends_with_stop_token = true;
  out += cs.on_event(fin);
  if (n)
    *n = static_cast<int64_t>(ids.size());  // the block closed: the EOS event comes after done()
  return out;
}

const std::string kToolOutput =
    "Need the tool.</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ "
    "parameter "
    "name=\"location\" string=\"true\">Beijing</｜DSML｜ parameter>\n<｜DSML｜ parameter "
    "name=\"days\" "
    "string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";

TEST(ChatStream, ToolCallBecomesToolCallsInTheResponse) {
  ChatStream cs(tok(), prepared(false, true), {.id = "chatcmpl-abc", .created = 1, .model = "m"});
  int64_t n = 0;
  EXPECT_EQ(feed(cs, kToolOutput, &n), cs.open());  // non-streaming: nothing but the role chunk
  ASSERT_TRUE(cs.done());
  EXPECT_EQ(cs.finish_reason(), "tool_calls");
  const Json r = Json::parse(cs.response_body());
  const Json& msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "Need the tool.");
  EXPECT_EQ(msg["content"], "");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"location": "Beijing", "days": 2})"));
  EXPECT_EQ(msg["tool_calls"][0]["id"].get<std::string>().rfind("call_abc_", 0), 0u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(r["usage"]["completion_tokens"], n);
}

TEST(ChatStream, StreamedToolCallDeltasCarryTheIndexAndConcatenate) {
  ChatStream cs(tok(), prepared(true, true), {.id = "chatcmpl-abc", .created = 1, .model = "m"});
  const std::string out = feed(cs, kToolOutput);
  std::string args, name;
  std::string finish;
  bool done = false, usage = false;
  size_t pos = 0;
  while ((pos = out.find("data: ", pos)) != std::string::npos) {
    const size_t end = out.find("\n\n", pos);
    const std::string d = out.substr(pos + 6, end - pos - 6);
    pos = end;
    if (d == "[DONE]") {
      done = true;
      continue;
    }
    const Json c = Json::parse(d);
    if (c["choices"].empty()) {
      usage = c["usage"]["completion_tokens"].get<int>() > 0;
      continue;
    }
    const Json& ch = c["choices"][0];
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    if (ch["delta"].contains("tool_calls")) {
      const Json& tc = ch["delta"]["tool_calls"][0];
      EXPECT_EQ(tc["index"], 0);
      if (tc["function"].contains("name")) name = tc["function"]["name"];
      args += tc["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(Json::parse(args), Json::parse(R"({"location": "Beijing", "days": 2})"));
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
}

TEST(ChatStream, ToolChoiceRequiredStartsInsideTheCallBlock) {
  PreparedChat p = prepared(false, false);
  p.opens_tool_calls = true;  // the prompt ended "<｜DSML｜ calls>\n"
  ChatStream cs(tok(), p, {.id = "chatcmpl-r", .created = 1, .model = "m"});
  feed(cs,
       "<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"x\" string=\"false\">[1, "
       "2]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  EXPECT_EQ(cs.finish_reason(), "tool_calls");
  const Json msg = Json::parse(cs.response_body())["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(Json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"x": [1, 2]})"));
}

TEST(ChatStream, StopStringEndsContentAndAsksToCancel) {
  ChatStream cs(tok(), prepared(false, false, {"STOP"}),
                {.id = "chatcmpl-x", .created = 1, .model = "m"});
  cs.open();
  for (int32_t id : tok().encode("Hello world, STOP here and more", false)) {
    cs.on_event(event({id}));
    if (cs.done()) break;
  }
  ASSERT_TRUE(cs.done());
  EXPECT_TRUE(cs.wants_cancel());
  EXPECT_EQ(cs.finish_reason(), "stop");
  EXPECT_EQ(Json::parse(cs.response_body())["choices"][0]["message"]["content"], "Hello world, ");
  // The engine's final event for the cancelled request is ignored.
  EXPECT_EQ(cs.on_event(event({}, true, FinishReason::kCancelled)), "");
}

TEST(ChatStream, EngineErrorInAStreamIsAnErrorEventThenDone) {
  ChatStream cs(tok(), prepared(true, false), {.id = "chatcmpl-x", .created = 1, .model = "m"});
  cs.open();
  cs.on_event(event({19923}));
  TokenEvent fin = event({}, true, FinishReason::kError);
  fin.error = ErrorCode::kUnavailable;
  fin.message = "the server is shutting down";
  const std::string out = cs.on_event(fin);
  EXPECT_NE(out.find(R"(data: {"error":{"message":"the server is shutting down")"),
            std::string::npos)
      << out;
  EXPECT_TRUE(out.ends_with("data: [DONE]\n\n"));
  EXPECT_TRUE(cs.failed());
  EXPECT_EQ(cs.error().status, 503);
}

TEST(ChatStream, LengthCutAndUtf8SplitAcrossTokens) {
  ChatStream cs(tok(), prepared(false, false), {.id = "chatcmpl-x", .created = 1, .model = "m"});
  cs.open();
  const auto ids = tok().encode("海浪🦀", false);
  for (size_t i = 0; i + 1 < ids.size(); ++i) cs.on_event(event({ids[i]}));
  cs.on_event(event({ids.back()}, true, FinishReason::kLength));
  EXPECT_EQ(cs.finish_reason(), "length");
  const Json r = Json::parse(cs.response_body());
  EXPECT_EQ(r["choices"][0]["message"]["content"], "海浪🦀");
  EXPECT_EQ(r["usage"]["completion_tokens"], static_cast<int64_t>(ids.size()));
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);
}

}  // namespace
}  // namespace dsuf::server
