#include "text/engram_ids.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <unordered_map>

#include "core/error.h"
#include "text/unicode_props.h"
#include "text/utf8.h"

namespace dsuf::text {
namespace {

const icu::Normalizer2& normalizer(bool nfkc) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n =
      nfkc ? icu::Normalizer2::getNFKCInstance(err) : icu::Normalizer2::getNFDInstance(err);
  if (U_FAILURE(err) || !n) fail("ICU normalizer unavailable: ", u_errorName(err));
  return *n;
}

bool is_mark(UChar32 c) {
  const int8_t t = u_charType(c);
  return t == U_NON_SPACING_MARK || t == U_COMBINING_SPACING_MARK || t == U_ENCLOSING_MARK;
}

}  // namespace

std::string engram_normalize(std::string_view text) {
  static const icu::Normalizer2& nfkc = normalizer(true);
  static const icu::Normalizer2& nfd = normalizer(false);
  UErrorCode err = U_ZERO_ERROR;
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  s = nfkc.normalize(s, err);
  s = nfd.normalize(s, err);
  if (U_FAILURE(err)) fail("ICU normalization failed: ", u_errorName(err));

  // Marks out, then lowercase one code point at a time: Rust's char::to_lowercase has no
  // context (no final-sigma rule), which a whole-string ICU toLower would apply.
  std::string lowered;
  for (int32_t i = 0; i < s.length();) {
    const UChar32 c = s.char32At(i);
    i += U16_LENGTH(c);
    if (is_mark(c)) continue;
    icu::UnicodeString one(c);
    one.toLower(icu::Locale::getRoot());
    one.toUTF8String(lowered);
  }

  // Collapse [ \t\r\n]+ to a single space.
  std::string collapsed;
  collapsed.reserve(lowered.size());
  bool in_run = false;
  for (const char c : lowered) {
    const bool ws = c == ' ' || c == '\t' || c == '\r' || c == '\n';
    if (!ws)
      collapsed.push_back(c);
    else if (!in_run)
      collapsed.push_back(' ');
    in_run = ws;
  }
  // A token that is only whitespace keeps one space instead of being stripped to nothing; the
  // reference does this with a U+E000 sentinel that it turns back into a space after Strip.
  constexpr std::string_view kSentinel = "\xEE\x80\x80";  // U+E000
  if (collapsed == " ") collapsed = kSentinel;

  // Strip Unicode White_Space at both ends.
  size_t b = 0, e = collapsed.size();
  while (b < e) {
    size_t i = b;
    if (!is_white_space(utf8_next(collapsed, i))) break;
    b = i;
  }
  while (e > b) {
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(collapsed[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!is_white_space(utf8_next(collapsed, i))) break;
    e = start;
  }
  std::string stripped = collapsed.substr(b, e - b);

  std::string key;
  key.reserve(stripped.size());
  for (size_t pos = 0;;) {
    const size_t at = stripped.find(kSentinel, pos);
    if (at == std::string::npos) {
      key.append(stripped, pos);
      break;
    }
    key.append(stripped, pos, at - pos);
    key.push_back(' ');
    pos = at + kSentinel.size();
  }
  if (key.empty()) return std::string(text);
  return key;
}

std::vector<int32_t> engram_compressed_ids(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<int32_t> out(static_cast<size_t>(n), -1);
  std::unordered_map<std::string, int32_t> keys;
  keys.reserve(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    if (!tokenizer.has_id(t)) continue;
    const int32_t one[1] = {t};
    const std::string text = tokenizer.decode(one, /*skip_special=*/false);
    // Byte fragments of a character decode to U+FFFD; they are keyed by their raw spelling so
    // that different fragments stay different.
    const std::string key = text.find(kReplacementChar) != std::string::npos
                                ? *tokenizer.id_to_token(t)
                                : engram_normalize(text);
    auto [it, inserted] = keys.emplace(key, static_cast<int32_t>(keys.size()));
    out[static_cast<size_t>(t)] = it->second;
  }
  return out;
}

}  // namespace dsuf::text
