// Parsing of small command-line values, with errors that name the flag.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace dsuf {

// "1,2,3" -> {1, 2, 3}; every entry an integer in [lo, hi]; throws dsuf::Error naming `what` and the
// bad entry.
std::vector<int64_t> parse_int_list(const std::string& s, const std::string& what, int64_t lo, int64_t hi);

// Environment knobs with a fixed set of values (the CUDA kernels' DSUF_* measuring switches): the
// position of `name`'s value in `values`, the first one when it is unset; any other value throws
// dsuf::Error naming the variable and the choices.
int env_choice(const char* name, std::initializer_list<const char*> values);
// Whether `name` picks `alt` over the default `dflt`, its only other value (env_choice of the two).
bool env_picks(const char* name, const std::string& dflt, const std::string& alt);
// A comma-separated subset of `values` in `name` (unset or empty: none) as a mask, bit i for
// values[i]; an entry not in `values` throws dsuf::Error naming the variable, the entry and the
// choices.
uint32_t env_flags(const char* name, std::initializer_list<const char*> values);

}  // namespace dsuf
