#include "text/py_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace dsuf::text {

void python_json_escape(std::string_view s, std::string& out) {
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
}

namespace {

void dump_string(const std::string& s, std::string& out) {
  out.push_back('"');
  python_json_escape(s, out);
  out.push_back('"');
}

}  // namespace

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits, then Python's layout rule: positional when the decimal exponent
  // is in [-4, 16), scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // like "-1.2345e+17"
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exp10 = std::stoi(sci.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (neg) out.push_back('-');
  const int decpt = exp10 + 1;  // position of the decimal point relative to the digits
  const size_t nd = digits.size();
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out.append("0.");
      out.append(static_cast<size_t>(-decpt), '0');
      out.append(digits);
    } else if (static_cast<size_t>(decpt) >= nd) {
      out.append(digits);
      out.append(static_cast<size_t>(decpt) - nd, '0');
      out.append(".0");
    } else {
      out.append(digits, 0, static_cast<size_t>(decpt));
      out.push_back('.');
      out.append(digits, static_cast<size_t>(decpt), std::string::npos);
    }
  } else {
    out.push_back(digits[0]);
    if (nd > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out.append(eb);
  }
  return out;
}

void python_json_dumps(const nlohmann::ordered_json& v, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null:
      out += "null";
      break;
    case T::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case T::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case T::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case T::number_float:
      out += python_float_repr(v.get<double>());
      break;
    case T::string:
      dump_string(v.get_ref<const std::string&>(), out);
      break;
    case T::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        python_json_dumps(e, out);
      }
      out.push_back(']');
      break;
    }
    case T::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_string(it.key(), out);
        out += ": ";
        python_json_dumps(it.value(), out);
      }
      out.push_back('}');
      break;
    }
    default:
      fail("cannot serialize a JSON value of this type (binary/discarded)");
  }
}

std::string python_json_dumps(const nlohmann::ordered_json& v) {
  std::string out;
  python_json_dumps(v, out);
  return out;
}

}  // namespace dsuf::text
