// Tokenizer throughput: encodes every {"text": ...} line of a JSON-lines file, single-threaded,
// and prints MB/s of thread CPU time for the first pass (empty word cache) and the best pass.
// bench/tokenizer_vs_hf.py runs it next to HF `tokenizers` on the same texts and prints the ratio.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace {
// CPU time of this thread: the machine is shared, and wall time would count other programs.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: tokenizer_bench TOKENIZER_JSON TEXTS_JSONL [PASSES] [--special]\n");
    return 2;
  }
  const int passes = argc > 3 ? std::atoi(argv[3]) : 5;
  const bool special = argc > 4 && std::string(argv[4]) == "--special";
  try {
    const dsuf::text::Tokenizer tok(argv[1]);
    std::ifstream f(argv[2]);
    if (!f) {
      std::fprintf(stderr, "cannot open %s\n", argv[2]);
      return 1;
    }
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (std::string line; std::getline(f, line);) {
      if (line.empty()) continue;
      texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      bytes += texts.back().size();
    }
    double best = 1e30, first = 0;
    size_t tokens = 0;
    std::vector<int32_t> ids;
    for (int p = 0; p < passes; ++p) {
      tokens = 0;
      const double t0 = thread_seconds();
      for (const auto& t : texts) {
        ids.clear();
        tok.encode_into(t, special, ids);
        tokens += ids.size();
      }
      const double dt = thread_seconds() - t0;
      if (p == 0) first = dt;  // the word cache starts empty: every piece is new
      best = std::min(best, dt);
    }
    std::printf(
        "{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, \"mb_per_s\": %.2f, "
        "\"cold_mb_per_s\": %.2f}\n",
        bytes, tokens, best, bytes / best / 1e6, bytes / first / 1e6);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
