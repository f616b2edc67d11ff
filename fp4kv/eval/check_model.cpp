#include "fp4kv/eval/check_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>

#include "fp4kv/core/error.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/model/safetensors.h"

namespace fp4kv::eval {

namespace {

// Where a reference tensor's token axis is: [tokens][width] or [heads][tokens][width].
struct Expected {
  const std::vector<float>* ours = nullptr;
  std::vector<int64_t> shape;  // of the full reference
  bool heads_first = false;
};

double rel_error(const std::vector<float>& ours, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double(ours[i]) - double(ref[i]);
    num += e * e;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The first n tokens of a reference tensor laid out as `e` says.
std::vector<float> token_prefix(const std::vector<float>& full, const Expected& e, int n) {
  const int64_t L = e.heads_first ? e.shape[1] : e.shape[0];
  const int64_t width = e.shape.back(), heads = e.heads_first ? e.shape[0] : 1;
  std::vector<float> out;
  out.reserve(size_t(heads * n * width));
  for (int64_t h = 0; h < heads; ++h) {
    const auto first = full.begin() + h * L * width;
    out.insert(out.end(), first, first + int64_t(n) * width);
  }
  return out;
}

int argmax_mismatches(const std::vector<float>& ours, const std::vector<float>& ref, int n, int vocab) {
  int count = 0;
  for (int t = 0; t < n; ++t) {
    const float* a = ours.data() + size_t(t) * vocab;
    const float* b = ref.data() + size_t(t) * vocab;
    count += (std::max_element(a, a + vocab) - a) != (std::max_element(b, b + vocab) - b);
  }
  return count;
}

}  // namespace

bool ModelCheck::ok() const {
  if (tensors.empty()) return false;
  for (const TensorCheck& t : tensors)
    if (!t.ok) return false;
  return true;
}

std::string ModelCheck::report() const {
  std::ostringstream s;
  char line[160];
  s << "reference: " << reference << " (first " << tokens << " of " << reference_tokens << " tokens)\n";
  std::snprintf(line, sizeof line, "%-22s %12s %12s\n", "tensor", "rel error", "tolerance");
  s << line;
  for (const TensorCheck& t : tensors) {
    std::snprintf(line, sizeof line, "%-22s %12.3g %12.3g  %s\n", t.name.c_str(), t.rel_error, tolerance,
                  t.ok ? "ok" : "MISMATCH");
    s << line;
  }
  s << "logits argmax differs at " << argmax_mismatches << " of " << tokens << " positions\n";
  s << (ok() ? "verdict: PASS (weights, dtypes and the forward pass reproduce the reference)\n"
             : "verdict: MISMATCH (a dtype that does not match the bytes, altered weights, or a config the runner "
               "reads differently)\n");
  return s.str();
}

ModelCheck check_model(const model::Qwen3Model& model, const std::string& reference_path, const std::string& option,
                       int max_tokens) {
  const model::Qwen3Config& cfg = model.config();
  require_regular_file(reference_path, option);
  const model::SafetensorsFile ref = model::SafetensorsFile::open(reference_path);
  require(ref.contains("input_ids"), option + ": '" + reference_path + "' has no input_ids tensor");
  const std::vector<int32_t> ids32 = ref.read_i32("input_ids");
  require(!ids32.empty(), option + ": '" + reference_path + "' has no tokens");
  for (int32_t id : ids32)
    require(id >= 0 && id < cfg.vocab_size, option + ": input id " + std::to_string(id) + " is outside the vocabulary");
  ModelCheck check;
  check.reference = reference_path;
  check.reference_tokens = int(ids32.size());
  check.tokens = std::min<int>(int(ids32.size()), max_tokens);
  require_within_positions(cfg, check.tokens, option);
  const std::vector<int> ids(ids32.begin(), ids32.begin() + check.tokens);

  const std::regex layer_name(R"(layer(\d+)\.(q_rope|k_rope|v))");
  model::Capture cap;
  for (const auto& [name, info] : ref.tensors()) {
    std::smatch m;
    if (!std::regex_match(name, m, layer_name)) continue;
    const int layer = std::stoi(m[1].str());
    require(layer < cfg.num_hidden_layers,
            option + ": '" + name + "' names a layer the model (" + std::to_string(cfg.num_hidden_layers) + ") lacks");
    if (std::find(cap.layers.begin(), cap.layers.end(), layer) == cap.layers.end()) cap.layers.push_back(layer);
  }
  const std::vector<float> logits = model.forward(ids, &cap);

  const int64_t L = check.reference_tokens, d = cfg.head_dim;
  std::vector<std::pair<std::string, Expected>> known = {
      {"hidden_after_embed", {&cap.hidden_after_embed, {L, cfg.hidden_size}, false}},
      {"logits", {&logits, {L, cfg.vocab_size}, false}}};
  for (int l : cap.layers) {
    const std::string p = "layer" + std::to_string(l) + ".";
    known.push_back({p + "q_rope", {&cap.q_rope.at(l), {cfg.num_attention_heads, L, d}, true}});
    known.push_back({p + "k_rope", {&cap.k_rope.at(l), {cfg.num_key_value_heads, L, d}, true}});
    known.push_back({p + "v", {&cap.v.at(l), {cfg.num_key_value_heads, L, d}, true}});
  }
  for (const auto& [name, e] : known) {
    if (!ref.contains(name)) continue;
    const std::vector<int64_t>& shape = ref.info(name).shape;
    require(shape == e.shape, option + ": reference tensor '" + name + "' has shape " + model::shape_string(shape) +
                                  ", the model gives " + model::shape_string(e.shape));
    const std::vector<float> want = token_prefix(ref.read_f32(name), e, check.tokens);
    const double err = rel_error(*e.ours, want);
    check.tensors.push_back({name, err, err <= check.tolerance});  // NaN fails
    if (name == "logits") check.argmax_mismatches = argmax_mismatches(*e.ours, want, check.tokens, cfg.vocab_size);
  }
  require(!check.tensors.empty(), option + ": '" + reference_path + "' holds no activation this check knows " +
                                      "(hidden_after_embed, logits, layerN.q_rope/k_rope/v)");
  return check;
}

}  // namespace fp4kv::eval
