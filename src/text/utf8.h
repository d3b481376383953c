// UTF-8 helpers shared by the tokenizer, the streaming decoder and the response parser.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsuf::text {

// Classifies the UTF-8 sequence starting at p[0] (n > 0 bytes available):
//   > 0  a complete, valid sequence of that many bytes;
//   == 0 a valid prefix of a sequence that needs more bytes than n;
//   < 0  invalid: -k is the length of the maximal subpart to replace with one U+FFFD (k >= 1),
//        following Unicode's "substitution of maximal subparts" (what Rust's from_utf8_lossy and
//        therefore HF's ByteLevel decoder do).
int utf8_classify(const unsigned char* p, size_t n);

// Offset of the first invalid or incomplete byte, or s.size() when all of s is valid UTF-8.
size_t utf8_valid_prefix(std::string_view s);

// Throws dsuf::Error naming `what` and the byte offset when s is not valid UTF-8.
void utf8_require_valid(std::string_view s, std::string_view what);

// Lossy conversion: every maximal invalid subpart (including a truncated tail) becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Decodes one code point from valid UTF-8 at s[i]; advances i.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t cp);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

}  // namespace dsuf::text
