// Parsing of small command-line values, with errors that name the flag.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsuf {

// "1,2,3" -> {1, 2, 3}; every entry an integer in [lo, hi]; throws dsuf::Error naming `what` and the
// bad entry.
std::vector<int64_t> parse_int_list(const std::string& s, const std::string& what, int64_t lo, int64_t hi);

}  // namespace dsuf
