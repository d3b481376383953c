#include "core/parse.h"

#include <algorithm>
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

namespace {
// The position of `s` in `values`, or −1; and the values as "a, b, c" for an error.
int index_of(const std::string& s, std::initializer_list<const char*> values) {
  int i = 0;
  for (const char* c : values) {
    if (s == c) return i;
    ++i;
  }
  return -1;
}
std::string joined(std::initializer_list<const char*> values) {
  std::string list;
  for (const char* c : values) list += (list.empty() ? "" : ", ") + std::string(c);
  return list;
}
}  // namespace

int env_choice(const char* name, std::initializer_list<const char*> values) {
  const char* v = std::getenv(name);
  const std::string m = v ? v : *values.begin();
  const int i = index_of(m, values);
  if (i < 0) fail(name, "=", m, ": expected ", joined(values));
  return i;
}

uint32_t env_flags(const char* name, std::initializer_list<const char*> values) {
  const char* v = std::getenv(name);
  const std::string all = v ? v : "";
  uint32_t mask = 0;
  if (all.empty()) return mask;
  for (size_t i = 0, j = 0; j < all.size(); i = j + 1) {  // every entry, the empty ones too
    j = std::min(all.find(',', i), all.size());
    const std::string tok = all.substr(i, j - i);
    const int k = index_of(tok, values);
    if (k < 0) fail(name, "=", all, ": '", tok, "' is not one of ", joined(values));
    mask |= 1u << k;
  }
  return mask;
}

bool env_picks(const char* name, const std::string& dflt, const std::string& alt) {
  return env_choice(name, {dflt.c_str(), alt.c_str()}) == 1;
}

}  // namespace dsuf
