#include "text/utf8.h"

#include "core/error.h"

namespace dsuf::text {

int utf8_classify(const unsigned char* p, size_t n) {
  const unsigned char b = p[0];
  if (b < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // surrogates are not scalar values
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n) return 0;
    const unsigned char c = p[k];
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return -k;
  }
  return len;
}

size_t utf8_valid_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs dominate real text: skip 8 bytes at a time when none has the high bit.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    const int k = utf8_classify(p + i, n - i);
    if (k <= 0) return i;
    i += static_cast<size_t>(k);
  }
  return n;
}

void utf8_require_valid(std::string_view s, std::string_view what) {
  const size_t at = utf8_valid_prefix(s);
  if (at != s.size()) {
    fail(what, ": invalid UTF-8 at byte ", at, " (byte 0x", std::hex,
         static_cast<int>(static_cast<unsigned char>(s[at])), ")");
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n) {
    const int k = utf8_classify(p + i, n - i);
    if (k > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(k));
      i += static_cast<size_t>(k);
    } else if (k == 0) {  // truncated at the end: one replacement for the whole tail
      out.append(kReplacementChar);
      break;
    } else {
      out.append(kReplacementChar);
      i += static_cast<size_t>(-k);
    }
  }
  return out;
}

char32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char b = p[i];
  if (b < 0x80) {
    ++i;
    return b;
  }
  if (b < 0xE0) {
    char32_t c = ((b & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
    i += 2;
    return c;
  }
  if (b < 0xF0) {
    char32_t c = ((b & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
    i += 3;
    return c;
  }
  char32_t c = ((b & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) |
               (p[i + 3] & 0x3Fu);
  i += 4;
  return c;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace dsuf::text
