// Streaming response parser: generated ids -> OpenAI-shaped events (reasoning_content, content,
// tool_calls) for DeepSeek-V4.1's output grammar (spec tokenizer-recipe.md §3):
//   [REASONING</think>]CONTENT[\n\n<｜DSML｜ calls>…</｜DSML｜ calls>]<｜end▁of▁sentence｜>
//
// It works on text, a stage at a time. Each stage has literal markers ("branches"); the branch
// whose match completes first wins, text before it gets the stage's action, and only the bytes
// that could still become a marker are held back between pushes, so chunking never changes the
// result. Behaviour on malformed output (docs/text.md): markup is never emitted as content or
// arguments; a truncated call is closed so its arguments stay valid JSON; a call whose name never
// completed is dropped; non-string parameter values that are not JSON are sent as JSON strings.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace dsuf::text {

struct ParseEvent {
  enum class Kind { kReasoning, kContent, kToolCallBegin, kToolCallArguments };
  Kind kind;
  std::string text;  // reasoning/content text or a fragment of the arguments JSON
  int index = -1;    // tool call index (0, 1, ...) for the tool-call kinds
  std::string id;    // kToolCallBegin: the call id
  std::string name;  // kToolCallBegin: the function name
};

// The event as an OpenAI Chat Completions `delta` object.
nlohmann::ordered_json openai_delta(const ParseEvent& event);

enum class FinishReason { kStop, kLength, kToolCalls };
const char* finish_reason_name(FinishReason r);

struct ParserOptions {
  bool thinking = true;       // the prompt ended with <think>: output starts with reasoning
  bool continuation = false;  // continuing a prefix: keep leading newlines
  bool parse_tool_calls = true;
  bool start_in_tool_calls = false;  // the prompt opened the call block (tool_choice required)
  std::vector<std::string> stop;     // stop strings, matched in content only
  // Makes the id of call `index`; default "call_<index>_<24 random alphanumerics>".
  std::function<std::string(int)> make_call_id;
};

class ResponseParser {
 public:
  ResponseParser(const Tokenizer& tokenizer, ParserOptions options);

  // One generated id. The EOS id ends the stream like finish(false).
  std::vector<ParseEvent> push(int32_t id);
  // Text already decoded (complete UTF-8).
  std::vector<ParseEvent> push_text(std::string_view text);
  // End of generation: `length` when max_tokens cut it. Flushes what is held back and closes an
  // open tool call. Further pushes are ignored.
  std::vector<ParseEvent> finish(bool length);

  // True once a stop string matched or the tool-call block closed: generating more is pointless.
  bool done() const { return stage_ == Stage::kFinished; }
  bool finished() const { return ended_; }
  FinishReason finish_reason() const;
  int tool_call_count() const { return calls_; }

 private:
  enum class Stage {
    kReasoning,
    kContent,
    kToolCalls,
    kToolName,
    kArguments,
    kParamName,
    kParamType,
    kParamValue,
    kSkipTag,  // inside a stray closing DSML tag in reasoning or content
    kFinished
  };
  enum class Action {
    kToToolCalls,
    kToContent,
    kStop,
    kSkip,
    kInvoke,
    kEndBlock,
    kNameDone,
    kParamStart,
    kArgumentsEnd,
    kKeyDone,
    kParamAbort,
    kSkipTag,
    kTagEnd,
    kNameAbort,
    kTypeString,
    kTypeRaw,
    kValueEnd
  };
  struct Branch {
    std::string literal;
    bool newlines_before;  // also swallows a run of '\n' right before the literal
    Action action;
  };

  void enter(Stage s);
  void process(std::vector<ParseEvent>& out, bool at_end);
  void unmatched(std::string_view text, std::vector<ParseEvent>& out);
  void apply(Action a, std::vector<ParseEvent>& out);
  void emit(std::vector<ParseEvent>& out, ParseEvent::Kind kind, std::string_view text);
  void close_call(std::vector<ParseEvent>& out);
  size_t hold_length(std::string_view buf) const;

  const Tokenizer* tok_;
  ParserOptions opt_;
  StreamDecoder decoder_;
  int32_t eos_id_ = -1;
  Stage stage_;
  Stage return_stage_ = Stage::kContent;
  std::vector<Branch> branches_;
  std::string buf_;
  bool leading_ = false;  // strip leading newline(s) at the start of this stage
  bool ended_ = false;
  bool length_ = false;
  bool stopped_by_string_ = false;
  bool block_closed_ = false;
  int calls_ = 0;
  bool first_param_ = true;
  bool value_is_string_ = false;
  std::string name_, key_, raw_value_;
  std::string tag_prefix_;  // possible start of a marker seen right before a skipped tag
};

}  // namespace dsuf::text
