// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it: ", " and ": "
// separators, keys in insertion order, non-ASCII raw, floats in repr style (1.0, 1e-05). The
// prompt format embeds tool schemas and tool-call arguments this way, so every byte matters.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsuf::text {

std::string python_json_dumps(const nlohmann::ordered_json& value);
void python_json_dumps(const nlohmann::ordered_json& value, std::string& out);

// The body of a JSON string literal for s (no quotes), escaped as json.dumps does.
void python_json_escape(std::string_view s, std::string& out);

// Python repr() of a finite double ("0.1", "1e-05", "1e+16", "100.0").
std::string python_float_repr(double v);

}  // namespace dsuf::text
