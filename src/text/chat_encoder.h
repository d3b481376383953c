// DeepSeek-V4.1 prompt rendering (the official encoding/encoding.py rules, spec
// tokenizer-recipe.md §2): conversation -> prompt text and token ids. Control tokens go in by id;
// everything a client wrote (content, reasoning, tool schemas, tool-call arguments) is plain BPE,
// so a client cannot inject control tokens by spelling them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace dsuf::text {

using OrderedJson = nlohmann::ordered_json;

enum class ThinkingMode { kChat, kThinking };

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // the JSON text the client sent (OpenAI `function.arguments`)
};

struct ContentPart {
  enum class Kind { kText, kImage, kToolResult, kUnsupported };
  Kind kind = Kind::kText;
  std::string text;          // text; tool result body; the type name for kUnsupported
  std::string tool_call_id;  // kToolResult only
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool | latest_reminder
  std::vector<ContentPart> content;
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;            // role tool
  bool prefix = false;                 // assistant only: continue this message (no EOS)
  OrderedJson tools;                   // OpenAI tool list, when attached to a system message
  OrderedJson response_format_schema;  // JSON schema the reply must follow (system message)
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  ThinkingMode thinking_mode = ThinkingMode::kThinking;
  int reasoning_effort = 75;  // 1..100; "low" 50, "high" 75, "max" 100
  OrderedJson tools;          // top-level OpenAI tools: attached to the first system message
  OrderedJson response_format_schema;
  // "auto"; "none" hides the tools from the prompt; "required" (also what a named-function
  // choice becomes) opens the DSML call block at the end of the prompt in chat mode (in
  // thinking mode it renders like "auto").
  std::string tool_choice = "auto";
  std::string tool_choice_function;   // a named-function choice: only that tool is shown
  std::optional<bool> drop_thinking;  // default: drop old reasoning unless tools are present
};

// Reads one request in the shape of shared/vectors/prompt-vectors.jsonl (messages,
// thinking_mode "thinking"|"chat", reasoning_effort, optional top-level tools) or an OpenAI Chat
// Completions body (thinking: {type: enabled|disabled}, response_format, tool_choice). Throws
// dsuf::Error naming the field on bad input.
ChatRequest chat_request_from_json(const OrderedJson& j);

// Parses "low" | "high" | "max" | integer 1..100.
int parse_reasoning_effort(const OrderedJson& v);

struct RenderedPrompt {
  std::string text;
  std::vector<int32_t> ids;
  size_t image_count = 0;  // number of image placeholders, in prompt order
  // The prompt ends inside an opened DSML call block (tool_choice "required"): start the
  // response parser in its tool-call stage (ParserOptions::start_in_tool_calls).
  bool opens_tool_calls = false;
};

class ChatEncoder {
 public:
  // Looks up every control token the format needs; throws if the tokenizer lacks one.
  explicit ChatEncoder(const Tokenizer& tokenizer);
  RenderedPrompt render(const ChatRequest& request) const;

 private:
  const Tokenizer* tok_;
};

}  // namespace dsuf::text
