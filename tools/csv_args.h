// Comma-separated option values of the CLI (`--contexts 4096,131072`): one parser, one message.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "fp4kv/core/error.h"

namespace fp4kv::cli {

// The non-empty items of a comma-separated list.
inline std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string t;
  while (std::getline(in, t, ','))
    if (!t.empty()) out.push_back(t);
  return out;
}

// A non-empty list of positive integers; `what` names the option in the Error ("bench:
// contexts").
inline std::vector<int> positive_ints(const std::string& csv, const std::string& what) {
  std::vector<int> out;
  for (const auto& t : split_csv(csv)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    require(used == t.size() && v >= 1, what + " must be positive integers, got '" + t + "'");
    out.push_back(v);
  }
  require(!out.empty(), what + ": no values given");
  return out;
}

}  // namespace fp4kv::cli
