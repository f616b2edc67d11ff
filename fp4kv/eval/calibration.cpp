#include "fp4kv/eval/calibration.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/core/operand_quant.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/core/transform.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "fp4kv/model/unicode_text.h"

namespace fp4kv::eval {

using nlohmann::json;

std::string Calibration::to_json() const {
  json j;
  j["format"] = "fp4kv-calibration";
  j["version"] = 1;
  j["model"] = model;
  j["layers"] = layers;
  j["kv_heads"] = kv_heads;
  j["head_dim"] = head_dim;
  j["context"] = context;
  j["tau"] = tau;
  j["tau_code"] = tau_code;
  j["seconds"] = seconds;
  j["mu_k"] = mu_k;  // flat [layers][kv_heads][head_dim]
  return j.dump(1) + "\n";
}

void Calibration::save(const std::string& path, const std::string& option) const {
  write_output_file(path, to_json(), option);
}

namespace {

// A JSON number is at most ~25 characters; the file may hold that per mu_k value plus
// the other fields. Anything larger is not a calibration file and is not parsed.
constexpr uint64_t kMaxJsonBytesPerValue = 32;
constexpr uint64_t kMaxJsonOverheadBytes = 1u << 20;
// Rounding slack of the key-norm bound (the mean is summed in double, stored as float).
constexpr double kKeyNormSlack = 1e-3;

json parse_calibration_json(const std::string& path, size_t values) {
  require_regular_file(path, "calibration file");
  const uint64_t size = std::filesystem::file_size(path);
  require(size <= kMaxJsonOverheadBytes + kMaxJsonBytesPerValue * values,
          "calibration file '" + path + "' has " + std::to_string(size) + " bytes, far more than " +
              std::to_string(values) + " mu_k values need: not a calibration file for this model");
  std::ifstream in(path);
  require(bool(in), "cannot read calibration file '" + path + "'");
  return json::parse(in);
}

// mu_k as float after checking each value is a finite float (a double that overflows
// float would otherwise become inf, or be undefined behaviour to convert).
std::vector<float> finite_floats(const json& a, const std::string& path) {
  require(a.is_array(), "calibration file '" + path + "': mu_k is not a list of numbers");
  std::vector<float> out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    require(a[i].is_number(), "calibration file '" + path + "': mu_k[" + std::to_string(i) + "] is " + a[i].dump() +
                                  ", not a number");
    const double x = a[i].get<double>();
    require(std::isfinite(x) && std::fabs(x) <= double(std::numeric_limits<float>::max()),
            "calibration file '" + path + "': mu_k[" + std::to_string(i) + "] = " + a[i].dump() + " is not a finite float");
    out.push_back(float(x));
  }
  return out;
}

void check_mu_norms(const Calibration& c, const std::vector<float>& bounds, const std::string& path) {
  if (bounds.empty()) return;
  require(int(bounds.size()) == c.layers, "calibration check: key norm bounds for " + std::to_string(bounds.size()) +
                                              " layers, the file has " + std::to_string(c.layers));
  for (int l = 0; l < c.layers; ++l)
    for (int h = 0; h < c.kv_heads; ++h) {
      double n2 = 0;
      for (int i = 0; i < c.head_dim; ++i) n2 += double(c.mu(l, h)[i]) * c.mu(l, h)[i];
      const double norm = std::sqrt(n2), limit = double(bounds[size_t(l)]) * (1 + kKeyNormSlack);
      require(norm <= limit, "calibration file '" + path + "': mu_k of layer " + std::to_string(l) + ", KV head " +
                                 std::to_string(h) + " has norm " + std::to_string(norm) +
                                 ", longer than any key of this model can be (" + std::to_string(limit) +
                                 " = sqrt(head_dim) x the largest k_norm weight)");
    }
}

void check_tau(const Calibration& c, const std::string& path) {
  const int max_code = max_meaningful_tau_code();
  require(c.tau_code >= 0 && c.tau_code <= max_code,
          "calibration file '" + path + "': tau_code " + std::to_string(c.tau_code) + " is outside 0.." +
              std::to_string(max_code) + " (codes above " + std::to_string(max_code) +
              " lie beyond c * max(p) = " + std::to_string(kPScaleC) + " and mean nothing)");
  require(std::isfinite(c.tau) && c.tau == tau_of_code(c.tau_code),
          "calibration file '" + path + "': tau " + std::to_string(c.tau) + " is not the midpoint of its tau_code " +
              std::to_string(c.tau_code) + " (" + std::to_string(tau_of_code(c.tau_code)) + ")");
}

}  // namespace

Calibration Calibration::load(const std::string& path, const model::Qwen3Config& config,
                              const std::vector<float>& key_norm_bounds) {
  const size_t values = size_t(config.num_hidden_layers) * config.num_key_value_heads * config.head_dim;
  Calibration c;
  try {
    const json j = parse_calibration_json(path, values);
    require(j.is_object() && j.value("format", "") == "fp4kv-calibration",
            "'" + path + "' is not an fp4kv calibration file");
    c.model = j.at("model").get<std::string>();
    c.layers = j.at("layers");
    c.kv_heads = j.at("kv_heads");
    c.head_dim = j.at("head_dim");
    c.context = j.at("context");
    const double tau = j.at("tau").get<double>();  // as double: a value beyond float must not convert
    c.tau = std::fabs(tau) <= double(std::numeric_limits<float>::max()) ? float(tau) : NAN;
    c.tau_code = j.at("tau_code");
    c.seconds = j.value("seconds", 0.0);
    c.mu_k = finite_floats(j.at("mu_k"), path);
  } catch (const json::exception& e) {
    throw Error("calibration file '" + path + "' is malformed: " + e.what());
  }
  require(c.layers == config.num_hidden_layers && c.kv_heads == config.num_key_value_heads &&
              c.head_dim == config.head_dim,
          "calibration file '" + path + "' was made for another model shape (" + std::to_string(c.layers) + " layers, " +
              std::to_string(c.kv_heads) + " KV heads, head_dim " + std::to_string(c.head_dim) + "; the model has " +
              std::to_string(config.num_hidden_layers) + ", " + std::to_string(config.num_key_value_heads) + ", " +
              std::to_string(config.head_dim) + ")");
  require(c.mu_k.size() == values, "calibration file '" + path + "' has " + std::to_string(c.mu_k.size()) +
                                       " mu_k values, the model needs " + std::to_string(values));
  require(c.context > 0, "calibration file '" + path + "' has context " + std::to_string(c.context));
  check_tau(c, path);
  check_mu_norms(c, key_norm_bounds, path);
  return c;
}

float tau_of_code(int code) { return 0.5f * (e4m3_value(uint8_t(code)) + e4m3_value(uint8_t(code + 1))); }

int max_meaningful_tau_code(float c) {
  int code = 0;
  while (code + 1 < kTauCodes && tau_of_code(code) < c) ++code;
  return code;
}

namespace {

constexpr int kCodes = kTauCodes;  // candidate codes 0..125 (tau between values of k and k+1)

// Squared error of quantizing one block of c*p values with rule kappa (NVFP4, g = 1).
double prob_block_error(const float* x, float pmax, float kappa) {
  const uint8_t s = nvfp4_block_scale(pmax, kappa, 1.0f);
  const float sv = e4m3_value(s);
  double err = 0;
  for (int i = 0; i < kNvfp4Block; ++i) {
    const double v = double(e2m1_value(nvfp4_prob_code(x[i], sv))) * sv - x[i];
    err += v * v;
  }
  return err;
}

}  // namespace

void accumulate_tau_errors(const float* q, int G, int nq, const float* k, int n, int d, float c,
                           std::vector<double>& err_by_code) {
  err_by_code.resize(kCodes, 0.0);
  std::vector<double> diff(kCodes + 1, 0.0);
  double base = 0.0;
  const float gamma = log2e_over_sqrt_d_any(d);
  std::vector<float> s(n), x(kNvfp4Block), taus(kCodes);
  for (int code = 0; code < kCodes; ++code) taus[code] = tau_of_code(code);
  for (int h = 0; h < G; ++h) {
    for (int i = 0; i < nq; ++i) {
      const int pos = n - nq + i;
      const int pages = pos / kPageTokens;  // quantized pages a decode step at pos attends to
      if (pages == 0) continue;
      const float* qi = q + (size_t(h) * nq + i) * d;
      cblas_sgemv(CblasRowMajor, CblasNoTrans, pages * kPageTokens, d, gamma, k, d, qi, 1, 0.0f, s.data(), 1);
      float m = -INFINITY;
      for (int pg = 0; pg < pages; ++pg) {
        const int first = pg == 0 ? kSinkTokens : 0;  // the sink is BF16
        for (int t = first; t < kPageTokens; ++t) m = std::max(m, s[pg * kPageTokens + t]);
        for (int b = 0; b < kPageTokens; b += kNvfp4Block) {
          float pmax = 0.0f;
          for (int t = 0; t < kNvfp4Block; ++t) {
            const int key = pg * kPageTokens + b + t;
            x[t] = (b + t < first) ? 0.0f : c * std::exp2f(s[key] - m);
            pmax = std::max(pmax, x[t]);
          }
          if (pmax == 0.0f) continue;
          const double e6 = prob_block_error(x.data(), pmax, 6.0f), e2 = prob_block_error(x.data(), pmax, 2.0f);
          base += e6;
          // Codes whose tau >= pmax switch this block to kappa 2.
          const int lo = int(std::lower_bound(taus.begin(), taus.end(), pmax) - taus.begin());
          diff[lo] += e2 - e6;
        }
      }
    }
  }
  double run = 0.0;
  for (int code = 0; code < kCodes; ++code) {
    run += diff[code];
    err_by_code[code] += base + run;
  }
}

void check_calibration_limits(const model::Qwen3Config& cfg, const CalibrationOptions& opt) {
  require(opt.context >= 2 * kPageTokens, "--context: the calibration context must be at least 256 tokens");
  require_within_positions(cfg, opt.context, "--context");
  require(opt.continuation >= 0, "--continuation must be >= 0, got " + std::to_string(opt.continuation));
  require(opt.prompts >= 1 && opt.prompt_bytes >= 1, "calibration needs at least one prompt of one byte");
  // BOS + prompt + continuation is the longest sequence the greedy generation runs.
  require_within_positions(cfg, int64_t(opt.prompt_bytes) + 1 + opt.continuation,
                           "--continuation (after BOS and a " + std::to_string(opt.prompt_bytes) + "-byte prompt)");
  const uint64_t available = available_memory_bytes();
  require_fits_memory(forward_pass_bytes(cfg, opt.context, {.logits_copies = 1, .capture_all_layers = true}),
                      available, "--context", "the calibration prefill of " + std::to_string(opt.context) + " tokens");
  // Each greedy step holds the K/V state, the prefix joined with the new token, and the new state.
  require_fits_memory(forward_pass_bytes(cfg, int64_t(opt.prompt_bytes) + 1 + opt.continuation, {.kv_states = 3}),
                      available, "--continuation",
                      "greedy generation of " + std::to_string(opt.continuation) + " tokens");
}

namespace {

// `bytes` without a partial UTF-8 character at either end (a prompt cut at byte offsets).
std::string whole_characters(std::string_view bytes) {
  while (!bytes.empty() && (uint8_t(bytes.front()) & 0xC0) == 0x80) bytes.remove_prefix(1);  // continuation bytes
  return std::string(bytes.substr(0, model::utf8_complete_prefix(bytes)));
}

}  // namespace

Calibration calibrate(const model::Qwen3Model& model, const std::string& model_name, const CalibrationOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const model::Qwen3Config& cfg = model.config();
  check_calibration_limits(cfg, opt);
  require(opt.calib_text.size() >= size_t(opt.prompts) * (opt.prompt_bytes + 1),
          "calibration text is too short for " + std::to_string(opt.prompts) + " prompts");

  // Eight seed prompts spread over the calibration text, each continued greedily.
  std::vector<int> joined;
  for (int p = 0; p < opt.prompts; ++p) {
    size_t off = opt.calib_text.size() * size_t(p) / size_t(opt.prompts);
    const size_t nl = opt.calib_text.find('\n', off);
    if (nl != std::string::npos && nl + 1 + opt.prompt_bytes <= opt.calib_text.size()) off = nl + 1;
    off = std::min(off, opt.calib_text.size() - opt.prompt_bytes);
    std::string prompt = opt.calib_text.substr(off, opt.prompt_bytes);
    if (!opt.tokenizer.is_bytes()) prompt = whole_characters(prompt);  // a subword tokenizer reads UTF-8
    std::vector<int> ids = opt.tokenizer.encode(prompt);
    const std::vector<int> cont = model.generate_greedy(ids, opt.continuation, true);
    joined.insert(joined.end(), ids.begin() + (opt.tokenizer.is_bytes() ? 1 : 0), ids.end());  // not BOS
    for (int t : cont)
      if (opt.tokenizer.is_text(t)) joined.push_back(t);
  }
  // Tile the text to fill the window, then one prefill capturing every layer's Q and K.
  std::vector<int> tokens = {cfg.bos_token_id >= 0 ? cfg.bos_token_id : model::kByteBos};
  while (int(tokens.size()) < opt.context) tokens.push_back(joined[(tokens.size() - 1) % joined.size()]);
  model::Capture cap;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) cap.layers.push_back(l);
  model.forward(tokens, &cap);

  Calibration c;
  c.model = model_name;
  c.layers = cfg.num_hidden_layers;
  c.kv_heads = cfg.num_key_value_heads;
  c.head_dim = cfg.head_dim;
  c.context = opt.context;
  const int L = opt.context, d = cfg.head_dim, G = cfg.group_size();
  c.mu_k.assign(size_t(c.layers) * c.kv_heads * d, 0.0f);
  std::vector<double> err_by_code;
  const int nq = std::min(opt.tau_queries, L / 2);
  std::vector<float> qsel(size_t(G) * nq * d);
  for (int l = 0; l < c.layers; ++l) {
    const std::vector<float>& k = cap.k_rope.at(l);
    const std::vector<float>& q = cap.q_rope.at(l);
    for (int g = 0; g < c.kv_heads; ++g) {
      std::vector<double> sum(d, 0.0);
      for (int t = 0; t < L; ++t)
        for (int i = 0; i < d; ++i) sum[i] += k[(size_t(g) * L + t) * d + i];
      for (int i = 0; i < d; ++i) c.mu_k[(size_t(l) * c.kv_heads + g) * d + i] = float(sum[i] / L);
      // Decode queries: the last nq positions of the window (every one sees ~L/128 pages).
      for (int h = 0; h < G; ++h)
        for (int i = 0; i < nq; ++i)
          std::copy_n(&q[(size_t(g * G + h) * L + (L - nq + i)) * d], d, &qsel[(size_t(h) * nq + i) * d]);
      accumulate_tau_errors(qsel.data(), G, nq, &k[size_t(g) * L * d], L, d, kPScaleC, err_by_code);
    }
  }
  c.tau_code = int(std::min_element(err_by_code.begin(), err_by_code.end()) - err_by_code.begin());
  c.tau = tau_of_code(c.tau_code);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

}  // namespace fp4kv::eval
