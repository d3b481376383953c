#include "text/response_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "text/py_json.h"

namespace dsuf::text {
namespace {

constexpr std::string_view kDsmlOpen = "<｜DSML｜";
constexpr std::string_view kDsmlClose = "</｜DSML｜";
constexpr std::string_view kThinkEnd = "</think>";

std::string random_call_id(int index) {
  static constexpr char kAlnum[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_" + std::to_string(index) + "_";
  for (int i = 0; i < 24; ++i) id.push_back(kAlnum[rng() % (sizeof kAlnum - 1)]);
  return id;
}

}  // namespace

nlohmann::ordered_json openai_delta(const ParseEvent& e) {
  using J = nlohmann::ordered_json;
  switch (e.kind) {
    case ParseEvent::Kind::kReasoning:
      return J{{"reasoning_content", e.text}};
    case ParseEvent::Kind::kContent:
      return J{{"content", e.text}};
    case ParseEvent::Kind::kToolCallBegin:
      return J{{"tool_calls", J::array({J{{"index", e.index},
                                          {"id", e.id},
                                          {"type", "function"},
                                          {"function", J{{"name", e.name}, {"arguments", ""}}}}})}};
    case ParseEvent::Kind::kToolCallArguments:
      return J{{"tool_calls",
                J::array({J{{"index", e.index}, {"function", J{{"arguments", e.text}}}}})}};
  }
  return J::object();
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kToolCalls:
      return "tool_calls";
  }
  return "stop";
}

ResponseParser::ResponseParser(const Tokenizer& tokenizer, ParserOptions options)
    : tok_(&tokenizer), opt_(std::move(options)), decoder_(tokenizer) {
  if (auto id = tokenizer.token_to_id("<｜end▁of▁sentence｜>")) eos_id_ = *id;
  if (!opt_.make_call_id) opt_.make_call_id = random_call_id;
  for (const auto& s : opt_.stop) {
    if (s.empty()) fail("stop strings must not be empty");
  }
  if (opt_.start_in_tool_calls) {
    enter(Stage::kToolCalls);
  } else {
    enter(opt_.thinking ? Stage::kReasoning : Stage::kContent);
    leading_ = !opt_.continuation;
  }
}

void ResponseParser::enter(Stage s) {
  stage_ = s;
  branches_.clear();
  auto add = [&](std::string_view lit, bool nl, Action a) {
    branches_.push_back(Branch{std::string(lit), nl, a});
  };
  switch (s) {
    case Stage::kReasoning:
      // A missing </think> before the tool calls is tolerated.
      if (opt_.parse_tool_calls) add(kDsmlOpen, true, Action::kToToolCalls);
      add(kThinkEnd, true, Action::kToContent);
      add(kDsmlClose, false, Action::kSkipTag);  // a stray closing tag is markup, never text
      break;
    case Stage::kContent:
      for (const auto& stop : opt_.stop) add(stop, false, Action::kStop);
      if (opt_.parse_tool_calls) add(kDsmlOpen, true, Action::kToToolCalls);
      add(kThinkEnd, false, Action::kSkip);  // a stray </think> is never content
      add(kDsmlClose, false, Action::kSkipTag);
      break;
    case Stage::kSkipTag:
      add(">", false, Action::kTagEnd);
      add("\n", false, Action::kTagEnd);
      break;
    case Stage::kToolCalls:
      add("invoke name=\"", false, Action::kInvoke);
      add("</｜DSML｜ calls>", false, Action::kEndBlock);
      add("</｜DSML｜tool_calls>", false, Action::kEndBlock);  // the V4 spelling
      break;
    // A name cannot span lines or markup: such an invoke is malformed and skipped, and the
    // character that ended it goes back to be read as markup (it may open the next invoke).
    case Stage::kToolName:
      add("\"", false, Action::kNameDone);
      add("\n", false, Action::kNameAbort);
      add("<", false, Action::kNameAbort);
      add(">", false, Action::kNameAbort);
      break;
    case Stage::kArguments:
      add("parameter name=\"", false, Action::kParamStart);
      add(kDsmlClose, false, Action::kArgumentsEnd);
      break;
    // A parameter whose header breaks off before its value is dropped.
    case Stage::kParamName:
      add("\"", false, Action::kKeyDone);
      add(kDsmlClose, false, Action::kParamAbort);
      break;
    case Stage::kParamType:
      add("true\">", false, Action::kTypeString);
      add("false\">", false, Action::kTypeRaw);
      add(kDsmlClose, false, Action::kParamAbort);
      break;
    case Stage::kParamValue:
      add(kDsmlClose, false, Action::kValueEnd);
      break;
    case Stage::kFinished:
      break;
  }
}

std::vector<ParseEvent> ResponseParser::push(int32_t id) {
  if (ended_) return {};
  if (id == eos_id_) return finish(false);
  return push_text(decoder_.push(id));
}

std::vector<ParseEvent> ResponseParser::push_text(std::string_view text) {
  std::vector<ParseEvent> out;
  if (ended_ || stage_ == Stage::kFinished) return out;
  buf_ += text;
  process(out, /*at_end=*/false);
  return out;
}

std::vector<ParseEvent> ResponseParser::finish(bool length) {
  std::vector<ParseEvent> out;
  if (ended_) return out;
  ended_ = true;
  length_ = length;
  // A character cut by the end of generation is dropped, like ids that never decoded.
  process(out, /*at_end=*/true);
  if (stage_ != Stage::kFinished) close_call(out);
  return out;
}

// A cut by max_tokens reports length even inside a tool call (the call is incomplete, however
// well it was closed); a closed call block reports tool_calls even if the cut came right after.
FinishReason ResponseParser::finish_reason() const {
  if (stopped_by_string_) return FinishReason::kStop;
  if (block_closed_) return FinishReason::kToolCalls;
  if (length_) return FinishReason::kLength;
  return calls_ > 0 ? FinishReason::kToolCalls : FinishReason::kStop;
}

// Longest tail of buf_ that could still grow into a match of some branch.
size_t ResponseParser::hold_length(std::string_view buf) const {
  size_t hold = 0;
  for (const auto& b : branches_) {
    const size_t max_j = std::min(b.literal.size() - 1, buf.size());
    for (size_t j = max_j + 1; j-- > 0;) {
      if (buf.compare(buf.size() - j, j, std::string_view(b.literal).substr(0, j)) != 0) continue;
      size_t h = j;
      if (b.newlines_before) {
        while (h < buf.size() && buf[buf.size() - h - 1] == '\n') ++h;
      }
      // Before a possible stray tag, whatever could start a marker once the tag is gone.
      if ((b.action == Action::kSkipTag || b.action == Action::kSkip) && j > 0) {
        h += hold_length(buf.substr(0, buf.size() - j));
      }
      hold = std::max(hold, h);
      if (!b.newlines_before) break;  // shorter prefixes cannot hold more
    }
  }
  return hold;
}

void ResponseParser::process(std::vector<ParseEvent>& out, bool at_end) {
  while (stage_ != Stage::kFinished) {
    if (leading_) {
      // Reasoning drops one leading newline; content drops all of them.
      if (buf_.empty()) return;
      if (buf_[0] == '\n') {
        buf_.erase(0, 1);
        if (stage_ == Stage::kReasoning) leading_ = false;
        continue;
      }
      leading_ = false;
    }
    // The branch whose match ends first wins; ties go to the earlier branch.
    size_t best_end = std::string::npos, best_start = 0;
    const Branch* best = nullptr;
    for (const auto& b : branches_) {
      const size_t at = buf_.find(b.literal);
      if (at == std::string::npos) continue;
      const size_t end = at + b.literal.size();
      if (end < best_end) {
        best_end = end;
        best_start = at;
        if (b.newlines_before) {
          while (best_start > 0 && buf_[best_start - 1] == '\n') --best_start;
        }
        best = &b;
      }
    }
    if (!best) {
      const size_t keep = hold_length(buf_);
      if (buf_.size() > keep) {
        unmatched(std::string_view(buf_).substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
      }
      if (at_end) {
        // What was held for a marker that never came is text in reasoning and content, and
        // a broken-off marker inside a tool call, which is dropped.
        if (stage_ == Stage::kReasoning || stage_ == Stage::kContent) unmatched(buf_, out);
        buf_.clear();
      }
      return;
    }
    const Action action = best->action;
    const std::string literal = best->literal;
    size_t keep = 0;
    if (action == Action::kSkipTag || action == Action::kSkip) {
      // Text before a stray tag that could start a marker is read again once the tag is
      // skipped, as if the tag had not been there.
      keep = hold_length(std::string_view(buf_).substr(0, best_start));
      tag_prefix_ = buf_.substr(best_start - keep, keep);
    }
    if (best_start > keep) unmatched(std::string_view(buf_).substr(0, best_start - keep), out);
    buf_.erase(0, best_end);
    if (action == Action::kNameAbort) buf_.insert(0, literal);
    apply(action, out);
  }
  buf_.clear();  // anything after the end of the response is dropped
}

void ResponseParser::emit(std::vector<ParseEvent>& out, ParseEvent::Kind kind,
                          std::string_view text) {
  if (text.empty()) return;
  const int index = kind == ParseEvent::Kind::kToolCallArguments ? calls_ - 1 : -1;
  if (!out.empty() && out.back().kind == kind && out.back().index == index) {
    out.back().text += text;
  } else {
    out.push_back(ParseEvent{kind, std::string(text), index, {}, {}});
  }
}

void ResponseParser::unmatched(std::string_view text, std::vector<ParseEvent>& out) {
  switch (stage_) {
    case Stage::kReasoning:
      emit(out, ParseEvent::Kind::kReasoning, text);
      break;
    case Stage::kContent:
      emit(out, ParseEvent::Kind::kContent, text);
      break;
    case Stage::kToolName:
      name_ += text;
      break;
    case Stage::kParamName:
      key_ += text;
      break;
    case Stage::kParamValue:
      if (value_is_string_) {
        std::string esc;
        python_json_escape(text, esc);
        emit(out, ParseEvent::Kind::kToolCallArguments, esc);
      } else {
        raw_value_ += text;
      }
      break;
    default:
      break;  // markup between the parts we read
  }
}

void ResponseParser::apply(Action a, std::vector<ParseEvent>& out) {
  switch (a) {
    case Action::kToToolCalls:
      enter(Stage::kToolCalls);
      break;
    case Action::kToContent:
      enter(Stage::kContent);
      leading_ = true;
      break;
    case Action::kStop:
      stopped_by_string_ = true;
      enter(Stage::kFinished);
      break;
    case Action::kSkip:
      buf_.insert(0, tag_prefix_);
      tag_prefix_.clear();
      break;
    case Action::kSkipTag:
      return_stage_ = stage_;
      enter(Stage::kSkipTag);
      break;
    case Action::kTagEnd:
      enter(return_stage_);
      buf_.insert(0, tag_prefix_);
      tag_prefix_.clear();
      break;
    case Action::kNameAbort:
      name_.clear();
      enter(Stage::kToolCalls);
      break;
    case Action::kInvoke:
      name_.clear();
      enter(Stage::kToolName);
      break;
    case Action::kEndBlock:
      block_closed_ = true;
      enter(Stage::kFinished);
      break;
    case Action::kNameDone: {
      if (name_.empty()) {
        enter(Stage::kToolCalls);
        break;
      }
      const int index = calls_++;
      out.push_back(
          ParseEvent{ParseEvent::Kind::kToolCallBegin, {}, index, opt_.make_call_id(index), name_});
      first_param_ = true;
      enter(Stage::kArguments);
      break;
    }
    case Action::kParamStart:
      key_.clear();
      enter(Stage::kParamName);
      break;
    case Action::kArgumentsEnd:
      emit(out, ParseEvent::Kind::kToolCallArguments, first_param_ ? "{}" : "}");
      enter(Stage::kToolCalls);
      break;
    case Action::kKeyDone:
      enter(Stage::kParamType);
      break;
    case Action::kParamAbort:
      enter(Stage::kArguments);
      break;
    case Action::kTypeString:
    case Action::kTypeRaw: {
      value_is_string_ = a == Action::kTypeString;
      std::string head = first_param_ ? "{\"" : ", \"";
      python_json_escape(key_, head);
      head += value_is_string_ ? "\": \"" : "\": ";
      emit(out, ParseEvent::Kind::kToolCallArguments, head);
      first_param_ = false;
      raw_value_.clear();
      enter(Stage::kParamValue);
      break;
    }
    case Action::kValueEnd:
      if (value_is_string_) {
        emit(out, ParseEvent::Kind::kToolCallArguments, "\"");
      } else {
        // Only valid JSON goes out raw, so the arguments always parse.
        if (nlohmann::json::accept(raw_value_)) {
          emit(out, ParseEvent::Kind::kToolCallArguments, raw_value_);
        } else {
          std::string quoted = "\"";
          python_json_escape(raw_value_, quoted);
          quoted += "\"";
          emit(out, ParseEvent::Kind::kToolCallArguments, quoted);
        }
      }
      enter(Stage::kArguments);
      break;
  }
}

// Closes whatever tool call the output was cut in, so every emitted arguments string is
// complete JSON.
void ResponseParser::close_call(std::vector<ParseEvent>& out) {
  switch (stage_) {
    case Stage::kParamValue:
      buf_.clear();
      apply(Action::kValueEnd, out);
      [[fallthrough]];
    case Stage::kArguments:
    case Stage::kParamName:
    case Stage::kParamType:
      emit(out, ParseEvent::Kind::kToolCallArguments, first_param_ ? "{}" : "}");
      break;
    default:
      break;  // in kToolName the call was never announced: nothing to close
  }
  enter(Stage::kFinished);
}

}  // namespace dsuf::text
