#include "core/parse.h"

#include <cerrno>
#include <cstdlib>

#include "core/error.h"

namespace dsuf {

std::vector<int64_t> parse_int_list(const std::string& s, const std::string& what, int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
      fail(what, ": '", tok, "' is not an integer in [", lo, ", ", hi, "]");
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

int env_choice(const char* name, std::initializer_list<const char*> values) {
  const char* v = std::getenv(name);
  const std::string m = v ? v : *values.begin();
  std::string list;
  int i = 0;
  for (const char* c : values) {
    if (m == c) return i;
    list += (i++ ? ", " : "") + std::string(c);
  }
  fail(name, "=", m, ": expected ", list);
}

bool env_picks(const char* name, const std::string& dflt, const std::string& alt) {
  return env_choice(name, {dflt.c_str(), alt.c_str()}) == 1;
}

}  // namespace dsuf
