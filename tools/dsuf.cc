// dsuf: the project's multi-tool (checkpoint utilities, text utilities).
#include <cstdio>
#include <cstring>
#include <exception>

#include "commands.h"

namespace {

struct Entry {
  const char* name;
  dsuf::tools::Command fn;
  const char* help;
};

const Entry kCommands[] = {
    {"make-tiny", dsuf::tools::cmd_make_tiny, "write the tiny random V4.1 checkpoint (--out DIR [--seed N])"},
    {"inspect", dsuf::tools::cmd_inspect, "load a checkpoint, check every tensor, print a summary (--ckpt DIR)"},
#ifdef DSUF_HAVE_TEXT
    {"tokenize", dsuf::tools::cmd_tokenize, "JSON lines {text} -> {ids} (--tokenizer FILE [--special])"},
    {"detokenize", dsuf::tools::cmd_detokenize, "JSON lines {ids} -> {text} (--tokenizer FILE)"},
    {"render", dsuf::tools::cmd_render, "chat JSON lines -> {prompt, ids} (--tokenizer FILE)"},
    {"parse", dsuf::tools::cmd_parse, "generated {ids} lines -> response deltas (--tokenizer FILE)"},
#endif
};

void usage() {
  std::fprintf(stderr, "usage: dsuf COMMAND [ARGS]\n\ncommands:\n");
  for (const auto& e : kCommands) std::fprintf(stderr, "  %-12s %s\n", e.name, e.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& e : kCommands) {
    if (std::strcmp(argv[1], e.name) == 0) {
      try {
        return e.fn(argc - 2, argv + 2);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "dsuf %s: error: %s\n", e.name, ex.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "dsuf: unknown command '%s'\n", argv[1]);
  usage();
  return 2;
}
