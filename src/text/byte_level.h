// GPT-2's reversible byte <-> printable-character map used by ByteLevel pre-tokenizers/decoders.
#pragma once

#include <array>
#include <cstdint>

namespace dsuf::text {

// Code point standing for each byte: printable Latin-1 bytes map to themselves, the other 68 to
// U+0100 upwards in byte order.
inline std::array<char32_t, 256> byte_to_codepoint_table() {
  std::array<char32_t, 256> t{};
  auto keep = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) t[b] = keep(b) ? static_cast<char32_t>(b) : next++;
  return t;
}

}  // namespace dsuf::text
