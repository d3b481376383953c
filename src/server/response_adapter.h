// TEMPORARY ADAPTER (issue 4): a minimal streaming parser for V4.1 output, written because the
// text part's streaming response parser (issue 3, src/text) has not landed yet. Replace it with
// that parser once it does; the server only uses the interface below.
//
// Text in (complete UTF-8, as text::StreamDecoder emits it), deltas out: reasoning, content, and
// OpenAI tool calls built from the DSML block (tokenizer-recipe.md §3.1/§3.2). Markers that may
// still be completing are held back, so a marker split across tokens is never leaked as text.
// Stop strings apply to content only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsuf::server {

struct Delta {
  enum class Kind { kReasoning, kContent, kToolBegin, kToolArgs };
  Kind kind;
  std::string text;     // kToolBegin: the function name
  int tool_index = -1;  // kToolBegin / kToolArgs
};

class ResponseParser {
 public:
  enum class Stage { kReasoning, kContent, kToolCalls, kToolName, kToolArgs, kParamName, kParamType,
                     kParamValue, kFinished };
  // `thinking`: the prompt ended with <think>, so output starts as reasoning. `tool_calls_open`:
  // the prompt already opened the DSML block (tool_choice "required"). `strip_leading`: drop the
  // newlines the model puts at the start of content (off when continuing a prefix).
  ResponseParser(bool thinking, std::vector<std::string> stop, bool tool_calls_open = false,
                 bool strip_leading = true);

  void push(std::string_view text, std::vector<Delta>& out);
  // End of output: releases what was held back.
  void finish(std::vector<Delta>& out);

  Stage stage() const { return stage_; }
  bool stopped() const { return stopped_; }  // a stop string matched; generation should end
  int tool_calls() const { return tools_; }

 private:
  void run(bool final, std::vector<Delta>& out);
  void emit(Delta::Kind kind, std::string_view text, std::vector<Delta>& out);
  void unmatched(std::string_view text, std::vector<Delta>& out);

  Stage stage_;
  std::vector<std::string> stop_;
  std::string buf_;
  bool leading_ = true;
  bool strip_leading_ = true;
  bool stopped_ = false;
  bool string_value_ = false;
  int params_ = 0;
  int tools_ = 0;
  std::string name_;
};

}  // namespace dsuf::server
