// The one exception type of fp4kv: a clear message for bad input or unsupported use.
#pragma once

#include <stdexcept>
#include <string>

namespace fp4kv {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Throws Error(message) unless `ok`.
inline void require(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

}  // namespace fp4kv
