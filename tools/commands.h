// Subcommands of the `dsuf` multi-tool. Each part's commands live in their own file
// (dsuf_model.cc, dsuf_text.cc, ...) and are listed in dsuf.cc's table.
#pragma once

namespace dsuf::tools {

// Every command gets the arguments after its name and returns the process exit code.
using Command = int (*)(int argc, char** argv);

int cmd_make_tiny(int argc, char** argv);    // dsuf_model.cc
int cmd_inspect(int argc, char** argv);      // dsuf_model.cc
#ifdef DSUF_HAVE_TEXT
int cmd_tokenize(int argc, char** argv);     // dsuf_text.cc
int cmd_detokenize(int argc, char** argv);   // dsuf_text.cc
int cmd_render(int argc, char** argv);       // dsuf_text.cc
int cmd_parse(int argc, char** argv);        // dsuf_text.cc
#endif

}  // namespace dsuf::tools
