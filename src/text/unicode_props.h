// Small Unicode property checks that must match Rust/Oniguruma exactly and that PCRE2/ICU spell
// differently (PCRE2's \s under UCP leaves out U+0085).
#pragma once

namespace dsuf::text {

// Unicode White_Space (Rust char::is_whitespace, Oniguruma \s for UTF-8).
constexpr bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The same set as the body of a PCRE2 character class.
inline constexpr const char* kWhiteSpaceClassBody =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

}  // namespace dsuf::text
