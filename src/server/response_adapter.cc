// TEMPORARY ADAPTER (issue 4): see response_adapter.h.
#include "server/response_adapter.h"

#include <algorithm>

namespace dsuf::server {
namespace {

constexpr std::string_view kDsmlOpen = "<｜DSML｜";
constexpr std::string_view kDsmlClose = "</｜DSML｜";
constexpr std::string_view kThinkEnd = "</think>";

void json_escape(std::string_view s, std::string& out) {
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          static const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
}

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

ResponseParser::ResponseParser(bool thinking, std::vector<std::string> stop, bool tool_calls_open,
                               bool strip_leading)
    : stage_(tool_calls_open ? Stage::kToolCalls : thinking ? Stage::kReasoning : Stage::kContent),
      stop_(std::move(stop)),
      strip_leading_(strip_leading) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

void ResponseParser::emit(Delta::Kind kind, std::string_view text, std::vector<Delta>& out) {
  if (text.empty()) return;
  const int index = kind == Delta::Kind::kToolArgs || kind == Delta::Kind::kToolBegin ? tools_ - 1 : -1;
  if (!out.empty() && out.back().kind == kind && kind != Delta::Kind::kToolBegin &&
      out.back().tool_index == index) {
    out.back().text += text;
  } else {
    out.push_back({kind, std::string(text), index});
  }
}

void ResponseParser::unmatched(std::string_view text, std::vector<Delta>& out) {
  switch (stage_) {
    case Stage::kReasoning:
    case Stage::kContent: {
      if (leading_ && strip_leading_) {
        const size_t first = text.find_first_not_of('\n');
        if (first == std::string_view::npos) return;
        text.remove_prefix(first);
      }
      leading_ = false;
      emit(stage_ == Stage::kReasoning ? Delta::Kind::kReasoning : Delta::Kind::kContent, text, out);
      return;
    }
    case Stage::kToolName: name_ += text; return;
    case Stage::kParamName: {
      std::string esc;
      json_escape(text, esc);
      emit(Delta::Kind::kToolArgs, esc, out);
      return;
    }
    case Stage::kParamValue: {
      if (!string_value_) {
        emit(Delta::Kind::kToolArgs, text, out);
        return;
      }
      std::string esc;
      json_escape(text, esc);
      emit(Delta::Kind::kToolArgs, esc, out);
      return;
    }
    default: return;  // markup between the parts that matter, or text after the end
  }
}

void ResponseParser::push(std::string_view text, std::vector<Delta>& out) {
  buf_ += text;
  run(false, out);
}

void ResponseParser::finish(std::vector<Delta>& out) {
  run(true, out);
  // An unterminated tool call still closes its arguments, so clients get valid JSON.
  if (stage_ == Stage::kParamValue && string_value_) emit(Delta::Kind::kToolArgs, "\"", out);
  if (stage_ == Stage::kParamValue || stage_ == Stage::kParamName || stage_ == Stage::kParamType ||
      stage_ == Stage::kToolArgs)
    emit(Delta::Kind::kToolArgs, params_ ? "}" : "{}", out);
  if (stage_ != Stage::kFinished) stage_ = Stage::kFinished;
}

void ResponseParser::run(bool final, std::vector<Delta>& out) {
  for (;;) {
    if (stage_ == Stage::kFinished) {
      buf_.clear();
      return;
    }
    // The markers that end this stage, in priority order (first complete match wins).
    struct Marker {
      std::string_view text;
      int id;
      bool eat_newlines;  // newlines right before the marker belong to it
    };
    std::vector<Marker> markers;
    switch (stage_) {
      case Stage::kReasoning:
        markers = {{kDsmlOpen, 0, true}, {kThinkEnd, 1, true}};
        break;
      case Stage::kContent:
        for (size_t i = 0; i < stop_.size(); ++i) markers.push_back({stop_[i], 100 + static_cast<int>(i), false});
        markers.push_back({kDsmlOpen, 0, true});
        markers.push_back({kThinkEnd, 2, false});
        break;
      case Stage::kToolCalls:
        markers = {{"invoke name=\"", 3, false}, {"</｜DSML｜ calls>", 4, false},
                   {"</｜DSML｜tool_calls>", 4, false}};
        break;
      case Stage::kToolName: markers = {{"\"", 5, false}}; break;
      case Stage::kToolArgs:
        markers = {{"parameter name=\"", 6, false}, {kDsmlClose, 7, false}};
        break;
      case Stage::kParamName: markers = {{"\"", 8, false}}; break;
      case Stage::kParamType: markers = {{"true\">", 9, false}, {"false\">", 10, false}}; break;
      case Stage::kParamValue: markers = {{kDsmlClose, 11, false}}; break;
      case Stage::kFinished: break;
    }
    size_t best = std::string::npos;
    const Marker* hit = nullptr;
    for (const Marker& m : markers) {
      const size_t at = buf_.find(m.text);
      if (at != std::string::npos && (at < best || (at == best && hit == nullptr))) {
        best = at;
        hit = &m;
      }
    }
    if (!hit) {
      size_t keep = 0;
      if (!final) {
        for (const Marker& m : markers) keep = std::max(keep, partial_suffix(buf_, m.text));
        size_t cut = buf_.size() - keep;
        if (stage_ == Stage::kReasoning || stage_ == Stage::kContent)
          while (cut > 0 && buf_[cut - 1] == '\n') --cut;  // might precede a DSML block
        keep = buf_.size() - cut;
      }
      unmatched(std::string_view(buf_).substr(0, buf_.size() - keep), out);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    std::string_view before = std::string_view(buf_).substr(0, best);
    if (hit->eat_newlines)
      while (!before.empty() && before.back() == '\n') before.remove_suffix(1);
    unmatched(before, out);
    const size_t consumed = best + hit->text.size();
    switch (hit->id) {
      case 0: stage_ = Stage::kToolCalls; break;
      case 1: stage_ = Stage::kContent, leading_ = true; break;
      case 2: break;  // a stray </think> in content is dropped
      case 3: stage_ = Stage::kToolName, name_.clear(); break;
      case 4: stage_ = Stage::kFinished; break;
      case 5:
        ++tools_;
        params_ = 0;
        emit(Delta::Kind::kToolBegin, name_, out);
        if (name_.empty()) out.push_back({Delta::Kind::kToolBegin, "", tools_ - 1});
        stage_ = Stage::kToolArgs;
        break;
      case 6:
        emit(Delta::Kind::kToolArgs, params_++ ? ", \"" : "{\"", out);
        stage_ = Stage::kParamName;
        break;
      case 7:
        emit(Delta::Kind::kToolArgs, params_ ? "}" : "{}", out);
        stage_ = Stage::kToolCalls;
        break;
      case 8:
        emit(Delta::Kind::kToolArgs, "\": ", out);
        stage_ = Stage::kParamType;
        break;
      case 9:
      case 10:
        string_value_ = hit->id == 9;
        if (string_value_) emit(Delta::Kind::kToolArgs, "\"", out);
        stage_ = Stage::kParamValue;
        break;
      case 11:
        if (string_value_) emit(Delta::Kind::kToolArgs, "\"", out);
        stage_ = Stage::kToolArgs;
        break;
      default:  // a stop string
        stopped_ = true;
        stage_ = Stage::kFinished;
        break;
    }
    buf_.erase(0, consumed);
  }
}

}  // namespace dsuf::server
