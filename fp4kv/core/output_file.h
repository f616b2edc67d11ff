// Output files written whole or reported as an error: a full disk, a missing folder or a
// path that is a directory must never end in "wrote ...". Every writer of the CLI and the
// library goes through these two functions.
#pragma once

#include <string>
#include <string_view>

namespace fp4kv {

// Throws Error naming `option` unless `path` can be written: its folder exists and the
// file can be opened for writing (an existing file is left as it is; a file that did not
// exist is removed again). Call it before long work whose result goes to `path`.
void check_output_writable(const std::string& path, const std::string& option);

// Writes `content` to `path` (replacing it), flushes and closes it, and throws Error naming
// `option` if any step fails (open, write, flush, close).
void write_output_file(const std::string& path, std::string_view content, const std::string& option);

}  // namespace fp4kv
