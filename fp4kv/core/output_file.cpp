#include "fp4kv/core/output_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "fp4kv/core/error.h"

namespace fp4kv {

namespace {

std::string reason() { return errno != 0 ? std::string(": ") + std::strerror(errno) : std::string(); }

void require_not_directory(const std::string& path, const std::string& option) {
  std::error_code ec;
  require(!std::filesystem::is_directory(path, ec), option + ": '" + path + "' is a directory, not a file");
}

}  // namespace

void check_output_writable(const std::string& path, const std::string& option) {
  require(!path.empty(), option + ": the output path is empty");
  require_not_directory(path, option);
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "ab");  // append: an existing file keeps its bytes
  require(f != nullptr, option + ": cannot write '" + path + "'" + reason());
  std::fclose(f);
  if (!existed) std::filesystem::remove(path, ec);
}

void write_output_file(const std::string& path, std::string_view content, const std::string& option) {
  require(!path.empty(), option + ": the output path is empty");
  require_not_directory(path, option);
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  require(f != nullptr, option + ": cannot write '" + path + "'" + reason());
  const size_t written = content.empty() ? 0 : std::fwrite(content.data(), 1, content.size(), f);
  const bool flushed = std::fflush(f) == 0;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (written != content.size() || !flushed || !closed) {
    errno = write_errno != 0 ? write_errno : errno;
    throw Error(option + ": writing '" + path + "' failed after " + std::to_string(written) + " of " +
                std::to_string(content.size()) + " bytes" + reason());
  }
}

}  // namespace fp4kv
