#include "core/error.h"

namespace dsuf::detail {

void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  std::string s = concat("check failed at ", file, ":", line, ": ", expr);
  if (!msg.empty()) s += concat(": ", msg);
  throw Error(s);
}

}  // namespace dsuf::detail
