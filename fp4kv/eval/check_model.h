// Does a checkpoint, read as its safetensors headers say, compute what an independent
// implementation computed? A header whose dtype does not match the bytes (BF16 bytes
// labelled F16, say) or perturbed weights load without complaint; only the activations
// show it. The reference file (models/pk8l/reference_activations.safetensors) holds
// input_ids and, for those ids, hidden_after_embed, layerN.{q_rope,k_rope,v} and logits.
#pragma once

#include <string>
#include <vector>

#include "fp4kv/model/qwen3.h"

namespace fp4kv::eval {

inline constexpr const char* kReferenceActivationsFile = "reference_activations.safetensors";
// Largest relative L2 error accepted per tensor (docs/DESIGN.md, "Input limits and output
// files"): ~100x the fp32 summation-order differences measured on pk8l (<= 1.1e-6), 20x
// below one bf16 rounding of the activations (2^-9 ~ 2e-3); a wrong dtype gives errors near 1.
inline constexpr double kActivationTolerance = 1e-4;
// Tokens compared at most: the model is causal, so the first n rows of every activation
// depend on the first n tokens only and a prefix is an exact, faster check.
inline constexpr int kMaxCheckTokens = 256;

struct TensorCheck {
  std::string name;
  double rel_error = 0;  // ||ours - reference|| / ||reference|| over the compared tokens
  bool ok = false;
};

struct ModelCheck {
  std::string reference;
  int tokens = 0, reference_tokens = 0;  // compared, held by the reference
  double tolerance = kActivationTolerance;
  std::vector<TensorCheck> tensors;
  int argmax_mismatches = 0;  // positions whose logits argmax differs (reported, not judged: near-ties)

  bool ok() const;
  std::string report() const;  // a table and a one-line verdict
};

// Runs `model` on the reference's input_ids (at most max_tokens of them) and compares every
// known reference tensor. Throws Error naming `option` when the reference file is missing,
// malformed, or its shapes do not fit the model.
ModelCheck check_model(const model::Qwen3Model& model, const std::string& reference_path,
                       const std::string& option = "--reference", int max_tokens = kMaxCheckTokens);

}  // namespace fp4kv::eval
