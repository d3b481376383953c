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

int cmd_parse(int argc, char** argv) {
  parse_flags(argc, argv, "dsuf parse [--tokenizer FILE]");
  fail("parse is not implemented yet");
}

}  // namespace dsuf::tools
