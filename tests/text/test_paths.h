// Paths of the project's tokenizer assets and the shared golden vectors, for tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsuf::text::testing {

inline std::filesystem::path source_dir() {
  return DSUF_SOURCE_DIR;
}
inline std::filesystem::path tokenizer_json() {
  return source_dir() / "assets/tokenizer/tokenizer.json";
}
// The golden vectors: the project's copy of shared/vectors in tests/vectors (CI clones the project
// alone); DSUF_SHARED_DIR points at another folder holding vectors/.
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("DSUF_SHARED_DIR")) return env;
  return source_dir() / "tests";
}
inline std::vector<nlohmann::ordered_json> read_jsonl(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::vector<nlohmann::ordered_json> out;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty()) out.push_back(nlohmann::ordered_json::parse(line));
  }
  return out;
}

}  // namespace dsuf::text::testing
