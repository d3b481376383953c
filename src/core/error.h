// Errors. At a boundary (file, network, request) failures become a dsuf::Error whose message names
// the input and what was expected. Inside the engine, invariants are checked with DSUF_CHECK.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dsuf {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace detail

// Throws dsuf::Error with all arguments streamed together.
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

}  // namespace dsuf

// Invariant check: on failure throws dsuf::Error naming the file, line and expression, followed by
// the streamed message arguments (optional).
#define DSUF_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::dsuf::detail::check_failed(__FILE__, __LINE__, #cond,                            \
                                   ::dsuf::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
