#include "text/response_parser.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "test_paths.h"
#include "text/utf8.h"

namespace dsuf::text {
namespace {

const Tokenizer& tok() {
  static const Tokenizer t(testing::tokenizer_json());
  return t;
}

struct Result {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  FinishReason finish = FinishReason::kStop;
  bool operator==(const Result&) const = default;
};

void collect(const std::vector<ParseEvent>& events, Result& r) {
  for (const auto& e : events) {
    switch (e.kind) {
      case ParseEvent::Kind::kReasoning:
        r.reasoning += e.text;
        break;
      case ParseEvent::Kind::kContent:
        r.content += e.text;
        break;
      case ParseEvent::Kind::kToolCallBegin:
        ASSERT_EQ(e.index, static_cast<int>(r.calls.size()));
        r.calls.push_back({e.name, ""});
        break;
      case ParseEvent::Kind::kToolCallArguments:
        ASSERT_EQ(e.index + 1, static_cast<int>(r.calls.size()));
        r.calls.back().second += e.text;
        break;
    }
  }
}

ParserOptions options(bool thinking, std::vector<std::string> stop = {}) {
  ParserOptions o;
  o.thinking = thinking;
  o.stop = std::move(stop);
  o.make_call_id = [](int i) { return "call_" + std::to_string(i); };
  return o;
}

// Feeds `text` in pieces cut at `cuts` (byte offsets, kept on character boundaries).
Result parse_text(const std::string& text, const ParserOptions& o, const std::vector<size_t>& cuts,
                  bool length = false) {
  ResponseParser p(tok(), o);
  Result r;
  size_t prev = 0;
  for (size_t c : cuts) {
    collect(p.push_text(text.substr(prev, c - prev)), r);
    prev = c;
  }
  collect(p.push_text(text.substr(prev)), r);
  collect(p.finish(length), r);
  r.finish = p.finish_reason();
  return r;
}

std::vector<size_t> char_boundaries(const std::string& s) {
  std::vector<size_t> cuts;
  for (size_t i = 0; i < s.size();) {
    utf8_next(s, i);
    if (i < s.size()) cuts.push_back(i);
  }
  return cuts;
}

TEST(ResponseParser, ReasoningContentAndToolCallFromIds) {
  const std::string out =
      "\nNeed the tool.\n\n</think>\n\nSure.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
      "name=\"get_weather\">\n<｜DSML｜ parameter name=\"location\" "
      "string=\"true\">Bei\"jing</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"days\" "
      "string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  std::vector<int32_t> ids = tok().encode(out, true);
  ids.push_back(1);  // EOS
  ResponseParser p(tok(), options(true));
  std::vector<ParseEvent> all;
  for (int32_t id : ids) {
    auto ev = p.push(id);
    all.insert(all.end(), ev.begin(), ev.end());
  }
  EXPECT_TRUE(p.finished());
  Result r;
  collect(all, r);
  EXPECT_EQ(r.reasoning, "Need the tool.");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].first, "get_weather");
  EXPECT_EQ(r.calls[0].second, "{\"location\": \"Bei\\\"jing\", \"days\": 2}");
  EXPECT_EQ(p.finish_reason(), FinishReason::kToolCalls);
  // OpenAI shapes.
  const auto begin = std::find_if(all.begin(), all.end(), [](const ParseEvent& e) {
    return e.kind == ParseEvent::Kind::kToolCallBegin;
  });
  ASSERT_NE(begin, all.end());
  EXPECT_EQ(openai_delta(*begin).dump(),
            R"({"tool_calls":[{"index":0,"id":"call_0","type":"function","function":)"
            R"({"name":"get_weather","arguments":""}}]})");
}

TEST(ResponseParser, SameResultWholeSplitAnywhereAndPerCharacter) {
  // Keys with spaces, an empty key, a key holding ` string= mode `, values with newlines and CJK,
  // objects and numbers, in both the V4.1 and the V4 spelling of the block.
  for (const std::string& calls : {std::string(" calls"), std::string("tool_calls")}) {
    const std::string out =
        "Let me see.</think>On it.\n\n<｜DSML｜" + calls +
        ">\n<｜DSML｜ invoke name=\"f\">\n"
        "<｜DSML｜ parameter name=\"a key\" string=\"true\">line1\n行二</｜DSML｜ parameter>\n"
        "<｜DSML｜ parameter name=\"\" string=\"false\">{\"enabled\":true}</｜DSML｜ parameter>\n"
        "<｜DSML｜ parameter name=\"x string= mode \" string=\"false\">2</｜DSML｜ parameter>\n"
        "</｜DSML｜ invoke>\n</｜DSML｜" +
        calls + ">";
    const Result whole = parse_text(out, options(true), {});
    ASSERT_EQ(whole.calls.size(), 1u);
    EXPECT_EQ(whole.calls[0].second,
              "{\"a key\": \"line1\\n行二\", \"\": {\"enabled\":true}, \"x string= mode \": 2}");
    EXPECT_TRUE(nlohmann::json::accept(whole.calls[0].second));
    EXPECT_EQ(whole.content, "On it.");
    EXPECT_EQ(whole.finish, FinishReason::kToolCalls);
    const auto cuts = char_boundaries(out);
    EXPECT_EQ(parse_text(out, options(true), cuts), whole);
    for (size_t c : cuts) ASSERT_EQ(parse_text(out, options(true), {c}), whole) << c;
  }
}

TEST(ResponseParser, StopStringsApplyToContentOnly) {
  const std::string out = "think STOP here</think>answer STOP after";
  for (const auto& cuts : {std::vector<size_t>{}, char_boundaries(out)}) {
    const Result r = parse_text(out, options(true, {"STOP"}), cuts);
    EXPECT_EQ(r.reasoning, "think STOP here");
    EXPECT_EQ(r.content, "answer ");
    EXPECT_EQ(r.finish, FinishReason::kStop);
  }
  // A partial stop string at the end is content.
  EXPECT_EQ(parse_text("done ST", options(false, {"STOP"}), {5}).content, "done ST");
  ResponseParser p(tok(), options(false, {"STOP"}));
  p.push_text("abc STO");
  EXPECT_FALSE(p.done());
  p.push_text("P more");
  EXPECT_TRUE(p.done());
}

TEST(ResponseParser, LeadingNewlinesAndChatMode) {
  EXPECT_EQ(parse_text("\n\nhello\n", options(false), {}).content, "hello\n");
  EXPECT_EQ(parse_text("\n\nr</think>\n\nc", options(true), {}).reasoning, "\nr");
  ParserOptions cont = options(false);
  cont.continuation = true;
  EXPECT_EQ(parse_text("\n\nkept", cont, {}).content, "\n\nkept");
  // Stray </think> in content is dropped; in chat mode content starts at once.
  EXPECT_EQ(parse_text("a</think>b", options(false), {}).content, "ab");
  // A missing </think> before the tool block is tolerated.
  const Result r = parse_text(
      "plan\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"g\">\n</｜DSML｜ invoke>\n</｜DSML｜ "
      "calls>",
      options(true), {});
  EXPECT_EQ(r.reasoning, "plan");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, "{}");
}

TEST(ResponseParser, MalformedAndTruncatedCalls) {
  const std::string head = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n";
  // A non-string value that is not JSON is sent as a string.
  Result r = parse_text(head +
                            "<｜DSML｜ parameter name=\"v\" string=\"false\">not json</｜DSML｜ "
                            "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
                        options(false), {});
  EXPECT_EQ(r.calls.at(0).second, "{\"v\": \"not json\"}");
  // Cut inside a string value: closed, valid JSON, finish_reason length.
  r = parse_text(head + "<｜DSML｜ parameter name=\"v\" string=\"true\">abc</｜DS", options(false),
                 {}, /*length=*/true);
  EXPECT_EQ(r.calls.at(0).second, "{\"v\": \"abc\"}");
  EXPECT_EQ(r.finish, FinishReason::kLength);
  // Cut inside a parameter header: the parameter is dropped.
  r = parse_text(head + "<｜DSML｜ parameter name=\"v\" stri", options(false), {}, true);
  EXPECT_EQ(r.calls.at(0).second, "{}");
  // Cut inside the name: the call was never announced.
  r = parse_text("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"ge", options(false), {}, true);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, "");
  // A name running into markup is not a call; the next well-formed invoke still is.
  r = parse_text(
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"bad>\n<｜DSML｜ invoke name=\"ok\">\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      options(false), {});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].first, "ok");
  // A parameter without its string= attribute is skipped, not half-emitted.
  r = parse_text(head +
                     "<｜DSML｜ parameter name=\"v\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
                     "</｜DSML｜ calls>",
                 options(false), {});
  EXPECT_EQ(r.calls.at(0).second, "{}");
  // Text after the block is dropped.
  r = parse_text(head + "</｜DSML｜ invoke>\n</｜DSML｜ calls>trailing", options(false), {});
  EXPECT_EQ(r.content, "");
}

TEST(ResponseParser, StartsInsideTheCallBlockWhenThePromptOpenedIt) {
  ParserOptions o = options(false);
  o.start_in_tool_calls = true;
  const Result r = parse_text(
      "<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"false\">1</｜DSML｜ "
      "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      o, {});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, "{\"a\": 1}");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(ResponseParser, EndOfThinkingThenAnswer) {
  // deepseek-recipe's binding test: "</think>" + "Custom answer" gives that content.
  const Result r = parse_text("</think>Custom answer", options(true), {});
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Custom answer");
  EXPECT_EQ(r.finish, FinishReason::kStop);
}

// Fuzz: mutate well-formed outputs (cut, delete or duplicate spans, splice in markers) and feed
// them in random pieces. Whatever comes in, nothing throws, every call's arguments parse as a
// JSON object, no DSML marker reaches reasoning or content, and the result does not depend on
// how the text was split.
TEST(ResponseParser, FuzzMalformedDsml) {
  // DSUF_FUZZ_ITERS / DSUF_FUZZ_SEED widen the search by hand; CI runs the fixed default.
  const char* iters_env = std::getenv("DSUF_FUZZ_ITERS");
  const char* seed_env = std::getenv("DSUF_FUZZ_SEED");
  const int iters = iters_env ? std::atoi(iters_env) : 3000;
  std::mt19937 rng(seed_env ? std::atoi(seed_env) : 12345);
  const std::vector<std::string> markers = {"<｜DSML｜ calls>",
                                            "</｜DSML｜ calls>",
                                            "<｜DSML｜ invoke name=\"",
                                            "</｜DSML｜ invoke>",
                                            "<｜DSML｜ parameter name=\"",
                                            "\" string=\"true\">",
                                            "\" string=\"false\">",
                                            "</｜DSML｜ parameter>",
                                            "</think>",
                                            "\n",
                                            "\"",
                                            "<",
                                            "｜DSML｜",
                                            "{",
                                            "}"};
  const std::string base =
      "reason</think>text\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter "
      "name=\"a\" string=\"true\">x\"y\\z</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"b\" "
      "string=\"false\">[1, {\"c\": 2}]</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke "
      "name=\"g\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  auto at_boundary = [](const std::string& s, size_t i) {
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    return i;
  };
  for (int iter = 0; iter < iters; ++iter) {
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t a = at_boundary(s, rng() % (s.size() + 1));
      const size_t b = at_boundary(s, std::min(s.size(), a + rng() % 40));
      switch (rng() % 4) {
        case 0:
          s = s.substr(0, a);
          break;
        case 1:
          s.erase(a, b - a);
          break;
        case 2:
          s.insert(a, s.substr(a, b - a));
          break;
        default:
          s.insert(a, markers[rng() % markers.size()]);
          break;
      }
    }
    const bool thinking = rng() % 2;
    const bool length = rng() % 2;
    const Result whole = parse_text(s, options(thinking), {}, length);
    for (const auto& [name, args] : whole.calls) {
      const auto j = nlohmann::json::parse(args, nullptr, false);
      ASSERT_TRUE(j.is_object()) << "arguments " << args << "\nfrom " << s;
      ASSERT_FALSE(name.empty());
    }
    for (const std::string* t : {&whole.reasoning, &whole.content}) {
      ASSERT_EQ(t->find("<｜DSML｜"), std::string::npos) << *t << "\n FROM " << s;
      ASSERT_EQ(t->find("</｜DSML｜"), std::string::npos) << s;
    }
    std::vector<size_t> cuts;
    for (size_t c : char_boundaries(s)) {
      if (rng() % 5 == 0) cuts.push_back(c);
    }
    ASSERT_EQ(parse_text(s, options(thinking), cuts, length), whole) << s;
  }
}

}  // namespace
}  // namespace dsuf::text
