// The text commands of tools/dsuf_text.cc behind a minimal dispatcher, so the oracle tests run the
// real command code without needing every other part the full `dsuf` tool links.
#include <cstdio>
#include <cstring>
#include <exception>

#include "commands.h"

int main(int argc, char** argv) {
  using namespace dsuf::tools;
  const struct {
    const char* name;
    Command fn;
  } cmds[] = {{"tokenize", cmd_tokenize},
              {"detokenize", cmd_detokenize},
              {"render", cmd_render},
              {"parse", cmd_parse}};
  if (argc >= 2) {
    for (const auto& c : cmds) {
      if (std::strcmp(argv[1], c.name) == 0) {
        try {
          return c.fn(argc - 2, argv + 2);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "dsuf_text_cli %s: error: %s\n", c.name, e.what());
          return 1;
        }
      }
    }
  }
  std::fprintf(stderr, "usage: dsuf_text_cli tokenize|detokenize|render|parse [ARGS]\n");
  return 2;
}
