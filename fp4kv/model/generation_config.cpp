#include "fp4kv/model/generation_config.h"

#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fp4kv/core/error.h"
#include "fp4kv/core/input_file.h"

namespace fp4kv::model {

namespace {

using nlohmann::json;

// One field of the file, or nullopt when absent or null.
class Fields {
 public:
  Fields(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  std::optional<float> number(const char* key, double lo, double hi, bool lo_open, const char* range) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) fail(key, "a number", *v);
    const double x = v->get<double>();
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) fail(key, range, *v);
    return float(x);
  }
  std::optional<int> integer(const char* key, long long lo, const char* range) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) fail(key, "an integer", *v);
    const long long x = v->get<long long>();
    if (x < lo || x > INT_MAX) fail(key, range, *v);
    return int(x);
  }
  std::vector<long long> ids(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) return {};
    std::vector<long long> out;
    for (const json& id : v->is_array() ? *v : json::array({*v})) {
      if (!id.is_number_integer() || id.get<long long>() < 0) fail(key, "a token id or a list of them", *v);
      out.push_back(id.get<long long>());
    }
    return out;
  }

 private:
  const json* find(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const char* key, const char* want, const json& got) const {
    throw Error(path_ + ": '" + key + "' must be " + want + ", got " + got.dump());
  }
  const json& j_;
  std::string path_;
};

}  // namespace

GenerationConfig read_generation_config(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir) / "generation_config.json";
  GenerationConfig g;
  if (!std::filesystem::is_regular_file(path)) return g;
  g.path = path.string();
  const std::optional<std::string> text = read_file(g.path);
  const json j = json::parse(text.value_or(""), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw Error(g.path + " is not a JSON object");
  const Fields f(j, g.path);
  g.eos_token_ids = f.ids("eos_token_id");
  g.temperature = f.number("temperature", 0, 1e30, false, ">= 0");
  g.top_p = f.number("top_p", 0, 1, true, "in (0, 1]");
  g.top_k = f.integer("top_k", LLONG_MIN, "an int");
  g.max_new_tokens = f.integer("max_new_tokens", 1, ">= 1");
  g.repetition_penalty = f.number("repetition_penalty", 0, 1e30, true, "> 0");
  g.min_p = f.number("min_p", 0, 1, false, "in [0, 1]");
  return g;
}

}  // namespace fp4kv::model
