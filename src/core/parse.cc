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

}  // namespace dsuf
