// Helpers shared by the benchmark renderers (report.cpp, e2e_plot.cpp): checked reads of
// JSON fields (an Error names the source and the field) and SVG text.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "fp4kv/core/error.h"

namespace fp4kv::bench::detail {

using nlohmann::json;

inline const json& field(const json& obj, const char* key, const std::string& where) {
  require(obj.contains(key), where + ": missing field \"" + key + "\"");
  return obj.at(key);
}

inline std::string string_field(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  require(v.is_string(), where + ": field \"" + key + "\" must be a string, got " + v.dump());
  return v.get<std::string>();
}

inline double number_field(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  require(v.is_number(), where + ": field \"" + key + "\" must be a number, got " + v.dump());
  return v.get<double>();
}

inline int int_field(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  require(v.is_number_integer(), where + ": field \"" + key + "\" must be an integer, got " + v.dump());
  return v.get<int>();
}

// The JSON text parsed as an object; throws Error naming `source` otherwise.
inline json parse_object(std::string_view text, const std::string& source, const char* what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(source + ": not valid JSON: " + e.what());
  }
  require(j.is_object(), source + ": " + what + " must be a JSON object");
  return j;
}

inline std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

// Text inside an SVG element or attribute: the characters XML reserves, escaped.
inline std::string xml_text(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Colors of the plots' series, in order.
inline constexpr const char* kSeriesColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};
inline constexpr size_t kNumSeriesColors = sizeof kSeriesColors / sizeof kSeriesColors[0];

}  // namespace fp4kv::bench::detail
