// dsuf text commands: tokenize, detokenize, render, parse. Each reads JSON lines on stdin and
// writes one JSON line per input line on stdout; a bad line gets {"error": "line N: ..."} and the
// rest of the input is still processed (the exit code is then 1).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "text/chat_encoder.h"
#include "text/response_parser.h"
#include "text/tokenizer.h"

namespace dsuf::tools {
namespace {

using json = nlohmann::ordered_json;

struct Flags {
  std::string tokenizer = std::string(DSUF_SOURCE_DIR) + "/assets/tokenizer/tokenizer.json";
  bool special = false;
  std::vector<std::string> rest;
};

// Parses --tokenizer FILE and the boolean flags named in `bools`; anything else is an error.
Flags parse_flags(int argc, char** argv, const char* usage,
                  std::initializer_list<const char*> bools = {}) {
  Flags f;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) {
      f.tokenizer = argv[++i];
    } else if (a == "--special" && std::find_if(bools.begin(), bools.end(), [](const char* b) {
                                     return std::strcmp(b, "--special") == 0;
                                   }) != bools.end()) {
      f.special = true;
    } else if (a == "-h" || a == "--help") {
      std::fprintf(stderr, "%s\n", usage);
      std::exit(0);
    } else {
      fail("unknown argument '", a, "'\nusage: ", usage);
    }
  }
  return f;
}

// Runs fn on every non-empty stdin line; fn returns the output object or throws.
template <typename Fn>
int for_each_line(Fn&& fn) {
  std::ios::sync_with_stdio(false);
  std::string line;
  int errors = 0;
  for (size_t n = 1; std::getline(std::cin, line); ++n) {
    if (line.empty()) continue;
    json out;
    try {
      json in;
      try {
        in = json::parse(line);
      } catch (const json::exception& e) {
        fail("not valid JSON: ", e.what());
      }
      if (!in.is_object()) fail("expected a JSON object");
      out = fn(in);
    } catch (const std::exception& e) {
      out = json{{"error", "line " + std::to_string(n) + ": " + e.what()}};
      ++errors;
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  }
  std::cout.flush();
  return errors ? 1 : 0;
}

std::vector<int32_t> read_ids(const json& in, const text::Tokenizer& tok) {
  if (!in.contains("ids") || !in["ids"].is_array()) fail("missing \"ids\" array");
  std::vector<int32_t> ids;
  for (const auto& v : in["ids"]) {
    if (!v.is_number_integer()) fail("\"ids\" must hold integers, got ", v.dump());
    const auto x = v.get<int64_t>();
    if (x < 0 || x >= tok.vocab_size() || !tok.has_id(static_cast<int32_t>(x))) {
      fail("id ", x, " is not in the vocabulary (0..", tok.vocab_size() - 1, ")");
    }
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  const Flags f = parse_flags(
      argc, argv, "dsuf tokenize [--tokenizer FILE] [--special] < {\"text\": ...} lines",
      {"--special"});
  const text::Tokenizer tok(f.tokenizer);
  return for_each_line([&](const json& in) {
    if (!in.contains("text") || !in["text"].is_string()) fail("missing \"text\" string");
    return json{{"ids", tok.encode(in["text"].get<std::string>(), f.special)}};
  });
}

int cmd_detokenize(int argc, char** argv) {
  const Flags f = parse_flags(argc, argv,
                              "dsuf detokenize [--tokenizer FILE] < {\"ids\": [...], "
                              "\"skip_special\": false} lines");
  const text::Tokenizer tok(f.tokenizer);
  return for_each_line([&](const json& in) {
    const bool skip = in.value("skip_special", false);
    return json{{"text", tok.decode(read_ids(in, tok), skip)}};
  });
}

int cmd_render(int argc, char** argv) {
  const Flags f =
      parse_flags(argc, argv,
                  "dsuf render [--tokenizer FILE] < {\"messages\": [...], "
                  "\"thinking_mode\": \"thinking\"|\"chat\", \"reasoning_effort\": ..., "
                  "\"tools\": [...]} lines");
  const text::Tokenizer tok(f.tokenizer);
  const text::ChatEncoder enc(tok);
  return for_each_line([&](const json& in) {
    const auto p = enc.render(text::chat_request_from_json(in));
    return json{{"prompt", p.text}, {"ids", p.ids}};
  });
}

// Each line is one generated stream: {"ids": [...], "thinking_mode": "thinking"|"chat",
// "stop": [...], "continuation": false, "finish": "length"|"eos"}. Ids are fed one at a time; the
// EOS id ends the stream, otherwise it ends as `finish` says (default: cut by max_tokens).
int cmd_parse(int argc, char** argv) {
  const Flags f = parse_flags(argc, argv,
                              "dsuf parse [--tokenizer FILE] < {\"ids\": [...], \"thinking_mode\": "
                              "..., \"stop\": [...]} lines");
  const text::Tokenizer tok(f.tokenizer);
  return for_each_line([&](const json& in) {
    text::ParserOptions opt;
    const std::string mode = in.value("thinking_mode", "thinking");
    if (mode != "thinking" && mode != "chat") fail("thinking_mode must be thinking or chat");
    opt.thinking = mode == "thinking";
    opt.continuation = in.value("continuation", false);
    opt.parse_tool_calls = in.value("parse_tool_calls", true);
    opt.start_in_tool_calls = in.value("start_in_tool_calls", false);
    if (in.contains("stop")) {
      const auto& st = in["stop"];
      if (st.is_string()) {
        opt.stop.push_back(st.get<std::string>());
      } else if (st.is_array()) {
        for (const auto& s : st) {
          if (!s.is_string()) fail("\"stop\" must hold strings");
          opt.stop.push_back(s.get<std::string>());
        }
      } else if (!st.is_null()) {
        fail("\"stop\" must be a string or a list of strings");
      }
    }
    const std::string end = in.value("finish", "length");
    if (end != "length" && end != "eos") fail("\"finish\" must be \"length\" or \"eos\"");
    const std::vector<int32_t> ids = read_ids(in, tok);
    text::ResponseParser parser(tok, std::move(opt));
    json deltas = json::array();
    auto take = [&](const std::vector<text::ParseEvent>& events) {
      for (const auto& e : events) deltas.push_back(text::openai_delta(e));
    };
    // "chunks": sizes of id groups whose text is pushed at once (the rest goes one id at a time);
    // the result must not depend on them.
    std::vector<size_t> chunks;
    if (in.contains("chunks")) {
      if (!in["chunks"].is_array()) fail("\"chunks\" must be a list of sizes");
      for (const auto& c : in["chunks"]) {
        if (!c.is_number_unsigned() || c.get<size_t>() == 0) fail("chunk sizes must be >= 1");
        chunks.push_back(c.get<size_t>());
      }
    }
    text::StreamDecoder decoder(tok);
    const auto eos = tok.token_to_id("<｜end▁of▁sentence｜>");
    size_t pos = 0;
    for (size_t c = 0; pos < ids.size() && !parser.finished(); ++c) {
      const size_t n = c < chunks.size() ? chunks[c] : 1;
      std::string text;
      bool saw_eos = false;
      for (size_t k = 0; k < n && pos < ids.size(); ++k, ++pos) {
        if (ids[pos] == eos) {
          saw_eos = true;
          ++pos;
          break;
        }
        text += decoder.push(ids[pos]);
      }
      take(parser.push_text(text));
      if (saw_eos) take(parser.finish(false));
    }
    if (!parser.finished()) take(parser.finish(end == "length"));
    return json{{"deltas", std::move(deltas)},
                {"finish_reason", text::finish_reason_name(parser.finish_reason())}};
  });
}

}  // namespace dsuf::tools
