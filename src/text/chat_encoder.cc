#include "text/chat_encoder.h"

#include <algorithm>
#include <string_view>

#include "core/error.h"
#include "text/py_json.h"
#include "text/utf8.h"

namespace dsuf::text {
namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kSystem = "<｜System｜>";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";
constexpr std::string_view kImage = "<｜deepseek_image｜>";

constexpr std::string_view kEffortPrefix = "Reasoning Effort: ";
constexpr std::string_view kEffortSuffix =
    " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
constexpr std::string_view kResponseFormatIntro =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// The V4.1 tools block around the schemas (one JSON object per line in between).
constexpr std::string_view kToolsHead =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    "invoke tools by writing a \"<｜DSML｜ calls>\" block like the following:\n\n<｜DSML｜ calls>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME\">\n<｜DSML｜ parameter name=\"$PARAMETER_NAME\" "
    "string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n...\n</｜DSML｜ invoke>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜ invoke>\n</｜DSML｜ calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output "
    "your complete reasoning inside <think>...</think> BEFORE any tool calls or final response."
    "\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";

// Accumulates the prompt as text plus ids. Client text is buffered and BPE-encoded as one run up
// to the next control token, so ids equal encoding the whole prompt with added-token matching
// whenever the client text holds no control-token spellings (and stay plain text when it does).
class Builder {
 public:
  explicit Builder(const Tokenizer& tok) : tok_(tok) {}
  void text(std::string_view s) {
    out_.text += s;
    pending_ += s;
  }
  void control(std::string_view spelling) {
    flush();
    const auto id = tok_.token_to_id(spelling);
    DSUF_CHECK(id.has_value(), "control token missing: ", spelling);
    out_.text += spelling;
    out_.ids.push_back(*id);
  }
  // Template text written by the format itself: its control-token spellings are control tokens.
  void template_text(std::string_view s) {
    static constexpr std::string_view kInTemplate[] = {kDsml, kThinkEnd, kThinkStart};
    size_t pos = 0;
    while (pos < s.size()) {
      size_t best = std::string_view::npos;
      std::string_view which;
      for (auto tok : kInTemplate) {
        const size_t at = s.find(tok, pos);
        if (at < best) {
          best = at;
          which = tok;
        }
      }
      if (best == std::string_view::npos) break;
      text(s.substr(pos, best - pos));
      control(which);
      pos = best + which.size();
    }
    text(s.substr(pos));
  }
  RenderedPrompt finish() {
    flush();
    return std::move(out_);
  }
  size_t images = 0;

 private:
  void flush() {
    if (!pending_.empty()) tok_.encode_into(pending_, /*match_added_tokens=*/false, out_.ids);
    pending_.clear();
  }
  const Tokenizer& tok_;
  RenderedPrompt out_;
  std::string pending_;
};

bool has_tools(const OrderedJson& t) {
  return t.is_array() && !t.empty();
}

std::string content_text(const std::vector<ContentPart>& parts) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) s += "\n\n";
    s += parts[i].text;
  }
  return s;
}

// OpenAI tool messages have no turn of their own: they become tool_result blocks of a user turn,
// and consecutive user/tool messages form one turn. Results are put in the order of the calls
// of the assistant message before them.
std::vector<ChatMessage> merge_user_turns(const std::vector<ChatMessage>& in) {
  std::vector<ChatMessage> out;
  const ChatMessage* last_assistant = nullptr;
  for (const auto& m : in) {
    if (m.role == "assistant") last_assistant = &m;
    if (m.role != "user" && m.role != "tool") {
      out.push_back(m);
      continue;
    }
    ChatMessage part = m;
    if (m.role == "tool") {
      part.role = "user";
      part.content = {
          ContentPart{ContentPart::Kind::kToolResult, content_text(m.content), m.tool_call_id}};
    }
    if (!out.empty() && out.back().role == "user") {
      auto& c = out.back().content;
      c.insert(c.end(), part.content.begin(), part.content.end());
    } else {
      out.push_back(std::move(part));
    }
    if (last_assistant && !last_assistant->tool_calls.empty()) {
      auto& c = out.back().content;
      std::vector<size_t> slots;
      std::vector<ContentPart> results;
      for (size_t i = 0; i < c.size(); ++i) {
        if (c[i].kind == ContentPart::Kind::kToolResult) {
          slots.push_back(i);
          results.push_back(c[i]);
        }
      }
      auto order = [&](const ContentPart& p) {
        const auto& calls = last_assistant->tool_calls;
        for (size_t k = 0; k < calls.size(); ++k) {
          if (calls[k].id == p.tool_call_id) return k;
        }
        return calls.size();
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const auto& a, const auto& b) { return order(a) < order(b); });
      for (size_t k = 0; k < slots.size(); ++k) c[slots[k]] = std::move(results[k]);
    }
  }
  return out;
}

// History tool-call arguments arrive as JSON text. An object becomes one parameter per key; a
// string holding JSON text (double-encoded, which V4.1 tolerates) is decoded once more; anything
// else is kept whole as {"arguments": raw}.
OrderedJson call_arguments(const std::string& raw) {
  OrderedJson v = OrderedJson::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (v.is_string()) v = OrderedJson::parse(v.get<std::string>(), nullptr, false);
  if (v.is_object()) return v;
  return OrderedJson{{"arguments", raw}};
}

void render_tool_calls(Builder& b, const std::vector<ToolCall>& calls) {
  if (calls.empty()) return;
  b.text("\n\n<");
  b.control(kDsml);
  b.text(" calls>\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) b.text("\n");
    b.text("<");
    b.control(kDsml);
    b.text(" invoke name=\"" + calls[i].name + "\">\n");
    const OrderedJson args = call_arguments(calls[i].arguments);
    bool first = true;
    for (auto it = args.begin(); it != args.end(); ++it) {
      if (!first) b.text("\n");
      first = false;
      const bool is_str = it.value().is_string();
      b.text("<");
      b.control(kDsml);
      b.text(" parameter name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") +
             "\">" + (is_str ? it.value().get<std::string>() : python_json_dumps(it.value())) +
             "</");
      b.control(kDsml);
      b.text(" parameter>");
    }
    b.text("\n</");
    b.control(kDsml);
    b.text(" invoke>");
  }
  b.text("\n</");
  b.control(kDsml);
  b.text(" calls>");
}

void render_parts(Builder& b, const std::vector<ContentPart>& parts) {
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) b.text("\n\n");
    const auto& p = parts[i];
    switch (p.kind) {
      case ContentPart::Kind::kText:
        b.text(p.text);
        break;
      case ContentPart::Kind::kImage:
        b.control(kImage);
        ++b.images;
        break;
      case ContentPart::Kind::kToolResult:
        b.text("<tool_result>" + p.text + "</tool_result>");
        break;
      case ContentPart::Kind::kUnsupported:
        b.text("[Unsupported " + p.text + "]");
        break;
    }
  }
}

// The fixed text around the schemas is the format's own (its ｜DSML｜ and think spellings are
// control tokens); the schemas are client text.
void render_tools_block(Builder& b, const OrderedJson& tools) {
  b.template_text(kToolsHead);
  std::string schemas;
  bool first = true;
  for (const auto& t : tools) {
    if (!first) schemas += "\n";
    first = false;
    python_json_dumps(t.contains("function") ? t["function"] : t, schemas);
  }
  b.text(schemas);
  b.template_text(kToolsTail);
}

bool user_like(const ChatMessage& m, size_t index) {
  return m.role == "user" || (m.role == "system" && index > 0);
}

}  // namespace

ChatEncoder::ChatEncoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {
  for (auto s : {kBos, kEos, kSystem, kUser, kAssistant, kLatestReminder, kThinkStart, kThinkEnd,
                 kDsml, kImage}) {
    if (!tokenizer.token_to_id(s)) fail("tokenizer has no control token ", s);
  }
}

RenderedPrompt ChatEncoder::render(const ChatRequest& req) const {
  if (req.tool_choice != "auto" && req.tool_choice != "none" && req.tool_choice != "required") {
    fail("tool_choice must be auto, none or required, got \"", req.tool_choice, "\"");
  }
  if (req.reasoning_effort < 1 || req.reasoning_effort > 100) {
    fail("reasoning_effort must be within 1..100, got ", req.reasoning_effort);
  }
  std::vector<ChatMessage> msgs = req.messages;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const auto& r = msgs[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "latest_reminder") {
      fail("messages[", i, "]: unknown role '", r, "'");
    }
    if (msgs[i].prefix && (r != "assistant" || i + 1 != msgs.size())) {
      fail("messages[", i, "]: only the last message, an assistant one, may be a prefix");
    }
  }
  // Tools and a response schema belong to the first system message; one is made if needed.
  const bool show_tools = req.tool_choice != "none";
  if ((show_tools && has_tools(req.tools)) || !req.response_format_schema.is_null()) {
    // Only a system message that opens the conversation can carry them (a later one is a
    // mid-conversation instruction), so one is inserted when the first message is not.
    auto it = msgs.begin();
    if (msgs.empty() || msgs.front().role != "system") {
      ChatMessage system;
      system.role = "system";
      it = msgs.insert(msgs.begin(), std::move(system));
    }
    if (show_tools && has_tools(req.tools)) it->tools = req.tools;
    if (!req.response_format_schema.is_null()) {
      it->response_format_schema = req.response_format_schema;
    }
  }
  if (!show_tools) {
    for (auto& m : msgs) m.tools = nullptr;
  }
  if (!req.tool_choice_function.empty()) {
    bool found = false;
    for (auto& m : msgs) {
      if (!has_tools(m.tools)) continue;
      OrderedJson kept = OrderedJson::array();
      for (const auto& t : m.tools) {
        const auto& fn = t.contains("function") ? t["function"] : t;
        if (fn.is_object() && fn.value("name", "") == req.tool_choice_function) kept.push_back(t);
      }
      found |= !kept.empty();
      m.tools = std::move(kept);
    }
    if (!found) fail("tool_choice names function '", req.tool_choice_function, "', not in tools");
  }
  bool any_tools = false;
  for (const auto& m : msgs) any_tools |= has_tools(m.tools);
  msgs = merge_user_turns(msgs);

  const bool thinking = req.thinking_mode == ThinkingMode::kThinking;
  const bool drop = req.drop_thinking.value_or(true) && !any_tools;
  ptrdiff_t last_user = -1;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (user_like(msgs[i], i)) last_user = static_cast<ptrdiff_t>(i);
  }
  // Reasoning is shown for turns after the last user message, or for all when not dropping.
  auto keeps_reasoning = [&](size_t i) {
    return thinking && (!drop || static_cast<ptrdiff_t>(i) > last_user);
  };

  Builder b(*tok_);
  b.control(kBos);
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (i == 0 && (m.role == "system" || thinking)) {
      b.control(kSystem);
      if (thinking) {
        b.text(std::string(kEffortPrefix) + std::to_string(req.reasoning_effort) +
               std::string(kEffortSuffix));
      }
    }
    if (m.role == "system") {
      if (i > 0) b.control(kSystem);
      b.text(content_text(m.content));
      if (has_tools(m.tools)) {
        b.text("\n\n");
        render_tools_block(b, m.tools);
      }
      if (!m.response_format_schema.is_null()) {
        b.text(std::string(kResponseFormatIntro) + python_json_dumps(m.response_format_schema));
      }
    } else if (m.role == "user") {
      b.control(kUser);
      render_parts(b, m.content);
    } else if (m.role == "latest_reminder") {
      b.control(kLatestReminder);
      b.text(content_text(m.content));
    } else if (m.role == "assistant") {
      // An assistant with no user turn before it (a greeting after the system prompt, or the
      // first message) still needs the turn header the user turn would have written.
      if (i == 0 || !user_like(msgs[i - 1], i - 1)) {
        b.control(kAssistant);
        b.control(keeps_reasoning(i) ? kThinkStart : kThinkEnd);
      }
      const std::string content = content_text(m.content);
      if (keeps_reasoning(i)) {
        b.text(m.reasoning_content.value_or(""));
        // A prefix that has only reasoning so far continues the reasoning: no </think> yet.
        if (!(m.prefix && content.empty() && m.tool_calls.empty())) b.control(kThinkEnd);
      }
      b.text(content);
      render_tool_calls(b, m.tool_calls);
      if (!m.prefix) b.control(kEos);
    }
    // The generation header follows a user turn that ends the prompt or precedes an answer.
    if (user_like(m, i)) {
      const bool last = i + 1 == msgs.size();
      if (last || msgs[i + 1].role == "assistant" || msgs[i + 1].role == "latest_reminder") {
        b.control(kAssistant);
        b.control(keeps_reasoning(i) || (thinking && static_cast<ptrdiff_t>(i) == last_user)
                      ? kThinkStart
                      : kThinkEnd);
      }
    }
  }
  // Forcing a call: the prompt itself opens the block and the model continues with an invoke.
  // Only after a chat-mode generation header: in thinking mode the reasoning comes first (the
  // recipe refuses the combination; we fall back to "auto" rather than fail the request).
  const bool force_call = req.tool_choice == "required" && any_tools && !thinking &&
                          !msgs.empty() && user_like(msgs.back(), msgs.size() - 1);
  if (force_call) {
    b.text("\n\n<");
    b.control(kDsml);
    b.text(" calls>\n");
  }
  const size_t images = b.images;
  RenderedPrompt out = b.finish();
  out.image_count = images;
  out.opens_tool_calls = force_call;
  return out;
}

int parse_reasoning_effort(const OrderedJson& v) {
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (s == "low") return 50;
    if (s == "high") return 75;
    if (s == "max") return 100;
    fail("reasoning_effort must be \"low\", \"high\", \"max\" or an integer 1..100, got \"", s,
         "\"");
  }
  if (v.is_number_integer()) {
    const auto n = v.get<int64_t>();
    if (n >= 1 && n <= 100) return static_cast<int>(n);
    fail("reasoning_effort must be within 1..100, got ", n);
  }
  fail("reasoning_effort must be \"low\", \"high\", \"max\" or an integer 1..100, got ", v.dump());
}

namespace {

std::string str_field(const OrderedJson& o, const char* key, const std::string& where) {
  if (!o.contains(key) || o[key].is_null()) return {};
  if (!o[key].is_string()) fail(where, ".", key, " must be a string");
  return o[key].get<std::string>();
}

std::vector<ContentPart> parse_content(const OrderedJson& c, const std::string& where) {
  std::vector<ContentPart> parts;
  if (c.is_null()) return parts;
  if (c.is_string()) {
    parts.push_back({ContentPart::Kind::kText, c.get<std::string>(), {}});
    return parts;
  }
  if (!c.is_array()) fail(where, ".content must be a string, null or a list of parts");
  for (size_t i = 0; i < c.size(); ++i) {
    const auto& p = c[i];
    const std::string w = where + ".content[" + std::to_string(i) + "]";
    if (p.is_string()) {
      parts.push_back({ContentPart::Kind::kText, p.get<std::string>(), {}});
      continue;
    }
    if (!p.is_object()) fail(w, " must be an object");
    const std::string type = str_field(p, "type", w);
    if (type == "text" || type == "input_text" || type == "output_text") {
      parts.push_back({ContentPart::Kind::kText, str_field(p, "text", w), {}});
    } else if (type == "image_url" || type == "image" || type == "input_image") {
      parts.push_back({ContentPart::Kind::kImage, {}, {}});
    } else if (type.empty()) {
      fail(w, " has no type");
    } else {
      parts.push_back({ContentPart::Kind::kUnsupported, type, {}});
    }
  }
  return parts;
}

}  // namespace

ChatRequest chat_request_from_json(const OrderedJson& j) {
  if (!j.is_object()) fail("request must be a JSON object");
  ChatRequest r;
  if (j.contains("thinking_mode")) {
    const std::string mode = str_field(j, "thinking_mode", "request");
    if (mode == "thinking") {
      r.thinking_mode = ThinkingMode::kThinking;
    } else if (mode == "chat") {
      r.thinking_mode = ThinkingMode::kChat;
    } else {
      fail("thinking_mode must be \"thinking\" or \"chat\", got \"", mode, "\"");
    }
  } else if (j.contains("thinking")) {
    const auto& t = j["thinking"];
    const std::string type = t.is_object() ? str_field(t, "type", "thinking") : "";
    if (type != "enabled" && type != "disabled") {
      fail("thinking must be {\"type\": \"enabled\" | \"disabled\"}");
    }
    r.thinking_mode = type == "enabled" ? ThinkingMode::kThinking : ThinkingMode::kChat;
  }
  if (j.contains("reasoning_effort") && !j["reasoning_effort"].is_null()) {
    r.reasoning_effort = parse_reasoning_effort(j["reasoning_effort"]);
  }
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) fail("tools must be a list");
    r.tools = j["tools"];
  }
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const auto& tc = j["tool_choice"];
    if (tc.is_object()) {
      // A named function: the model must call that one (the recipe renders only that tool).
      r.tool_choice = "required";
      const auto& fn = tc.contains("function") ? tc["function"] : tc;
      if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) {
        fail(
            "tool_choice object must name a function: {\"type\": \"function\", \"function\": "
            "{\"name\": ...}}");
      }
      r.tool_choice_function = fn["name"].get<std::string>();
    } else if (tc.is_string() && (tc == "auto" || tc == "none" || tc == "required")) {
      r.tool_choice = tc.get<std::string>();
    } else {
      fail("tool_choice must be \"auto\", \"none\", \"required\" or a function object");
    }
  }
  if (j.contains("drop_thinking") && j["drop_thinking"].is_boolean()) {
    r.drop_thinking = j["drop_thinking"].get<bool>();
  }
  if (j.contains("response_format") && j["response_format"].is_object()) {
    const auto& rf = j["response_format"];
    if (rf.value("type", "") == "json_schema" && rf.contains("json_schema") &&
        rf["json_schema"].contains("schema")) {
      r.response_format_schema = rf["json_schema"]["schema"];
    }
  }
  if (!j.contains("messages") || !j["messages"].is_array()) fail("missing \"messages\" list");
  const auto& ms = j["messages"];
  for (size_t i = 0; i < ms.size(); ++i) {
    const auto& m = ms[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) fail(where, " must be an object");
    ChatMessage msg;
    msg.role = str_field(m, "role", where);
    // V4.1 has no developer role; OpenAI clients send it where they mean system instructions.
    if (msg.role == "developer") msg.role = "system";
    if (msg.role.empty()) fail(where, " has no role");
    msg.content = parse_content(m.value("content", OrderedJson()), where);
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
      msg.reasoning_content = str_field(m, "reasoning_content", where);
    }
    msg.tool_call_id = str_field(m, "tool_call_id", where);
    msg.prefix = m.value("prefix", false);
    if (m.contains("tools") && !m["tools"].is_null()) {
      if (!m["tools"].is_array()) fail(where, ".tools must be a list");
      msg.tools = m["tools"];
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) fail(where, ".tool_calls must be a list");
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        const auto& tc = m["tool_calls"][k];
        const std::string w = where + ".tool_calls[" + std::to_string(k) + "]";
        if (!tc.is_object()) fail(w, " must be an object");
        const auto& fn = tc.contains("function") ? tc["function"] : tc;
        if (!fn.is_object()) fail(w, ".function must be an object");
        ToolCall call{str_field(tc, "id", w), str_field(fn, "name", w + ".function"), {}};
        if (call.name.empty()) fail(w, ".function.name is missing");
        if (fn.contains("arguments")) {
          const auto& a = fn["arguments"];
          call.arguments = a.is_string() ? a.get<std::string>() : a.dump();
        } else {
          call.arguments = "{}";
        }
        msg.tool_calls.push_back(std::move(call));
      }
    }
    r.messages.push_back(std::move(msg));
  }
  return r;
}

}  // namespace dsuf::text
