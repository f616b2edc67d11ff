// What every `fp4kv bench` subcommand ends with: its JSON and markdown written (paths checked
// before the work by check_output_writable) and one line saying where.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "fp4kv/core/output_file.h"

namespace fp4kv::cli {

inline void write_json_and_markdown(const std::string& json_path, const nlohmann::json& j, const std::string& md_path,
                                    const std::string& md) {
  write_output_file(json_path, j.dump(1) + "\n", "--json");
  write_output_file(md_path, md, "--markdown");
  std::printf("wrote %s, %s\n", json_path.c_str(), md_path.c_str());
}

}  // namespace fp4kv::cli
