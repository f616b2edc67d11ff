// Calibration of the recipe for one model (SPEC section 7; paper appendices B and C):
// mu_k, the mean post-RoPE key per (layer, KV head), and tau, the underflow-aware P
// threshold. Stored as a small JSON file next to the model.
#pragma once

#include <string>
#include <vector>

#include "fp4kv/model/qwen3.h"
#include "fp4kv/model/tokenizer.h"

namespace fp4kv::eval {

inline constexpr const char* kCalibrationFile = "fp4kv_calibration.json";

struct Calibration {
  std::string model;        // directory name it was computed for
  int layers = 0, kv_heads = 0, head_dim = 0;
  int context = 0;          // tokens of the calibration prefill
  std::vector<float> mu_k;  // [layers][kv_heads][head_dim]
  float tau = 21.0f / 1024.0f;
  int tau_code = 10;        // tau lies between E4M3 values of codes tau_code and tau_code + 1
  double seconds = 0;       // how long calibration took

  const float* mu(int layer, int head) const { return &mu_k[(size_t(layer) * kv_heads + head) * head_dim]; }
  std::string to_json() const;
  // Writes to_json() to `path`; a failed write is an Error naming `option`.
  void save(const std::string& path, const std::string& option = "calibration file") const;
  // Loads and checks every value: the shape matches the model's config, mu_k is finite and,
  // when key_norm_bounds (Qwen3Model::key_norm_bounds) is given, no (layer, head) mean key
  // is longer than a key can be; tau is its code's midpoint within the meaningful codes.
  static Calibration load(const std::string& path, const model::Qwen3Config& config,
                          const std::vector<float>& key_norm_bounds = {});
};

// The factor c of underflow-aware P scaling (SPEC section 4: c = 8).
inline constexpr float kPScaleC = 8.0f;
// Tau candidates are the codes 0 .. kTauCodes - 1.
inline constexpr int kTauCodes = 126;
// The largest tau code that means something for factor c: a block's c * max(p_b) is at
// most c (p = exp2(S - m) <= 1 against the tile maximum), so the first candidate >= c
// already switches every block to kappa 2 and larger codes behave exactly like it.
int max_meaningful_tau_code(float c = kPScaleC);

struct CalibrationOptions {
  std::string calib_text;  // text the eight seed prompts are taken from
  int context = 4096;      // tokens of the tiled prefill
  int prompts = 8;
  int prompt_bytes = 64;
  int continuation = 256;  // greedy tokens generated after each prompt
  int tau_queries = 64;    // decode queries (positions) per (layer, head) replayed for tau
  unsigned seed = 1;
  // The model's tokenizer (model::Tokenizer::for_model); byte tokens by default.
  model::Tokenizer tokenizer = model::Tokenizer::bytes();
};

// Tau candidates: midpoints between consecutive E4M3 values, tau(k) = (e4m3(k) + e4m3(k+1)) / 2.
float tau_of_code(int code);

// Chooses tau on the E4M3 grid of c * max(p_b) minimizing the total squared quantization
// error of c * p over the probability blocks of decode queries (appendix C). q: [G][nq][d]
// queries at the last nq positions, k: [n][d] keys (exact logits, no cache effects).
// Accumulates, for every candidate code, the total error into err_by_code (size 127).
void accumulate_tau_errors(const float* q, int G, int nq, const float* k, int n, int d, float c,
                           std::vector<double>& err_by_code);

// Throws Error naming the option (--context, --continuation) when `opt` asks for more
// positions than the model has or more memory than is available. calibrate() calls it;
// callers call it too before loading the weights, to fail at once.
void check_calibration_limits(const model::Qwen3Config& config, const CalibrationOptions& opt);

Calibration calibrate(const model::Qwen3Model& model, const std::string& model_name, const CalibrationOptions& opt);

}  // namespace fp4kv::eval
