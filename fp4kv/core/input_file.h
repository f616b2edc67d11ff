// Whole files read into memory (a checkpoint's JSON files, a chat template, a text): one
// reader, so every caller gets the same binary-exact bytes and words its own error.
#pragma once

#include <optional>
#include <string>

namespace fp4kv {

// The bytes of the file at `path`, or nullopt when it cannot be opened or read.
std::optional<std::string> read_file(const std::string& path);

}  // namespace fp4kv
