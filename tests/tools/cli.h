// Runs the fp4kv CLI as a user would, capturing exit code and output.
#pragma once

#include <array>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace fp4kv::test {

struct CliResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

inline std::string cli_path() { return FP4KV_CLI; }

// Runs a shell command line (sh -c), capturing stdout and stderr together.
inline CliResult run_cli_in_shell(const std::string& command) {
  CliResult r;
  const std::string cmd = "(" + command + ") 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline CliResult run_cli(const std::string& args) { return run_cli_in_shell(cli_path() + " " + args); }

}  // namespace fp4kv::test
