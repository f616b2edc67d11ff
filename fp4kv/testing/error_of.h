// The message of the fp4kv::Error a callable throws, for tests that check what an error
// says (and that one is thrown at all).
#pragma once

#include <string>

#include "fp4kv/core/error.h"

namespace fp4kv::testing {

// e.what() of the Error fn() throws, or "no error".
template <class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace fp4kv::testing
