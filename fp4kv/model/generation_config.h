// A checkpoint's generation_config.json: the tokens that end generation and the sampling its
// authors recommend (Qwen3: temperature 0.6, top_p 0.95, top_k 20), as transformers'
// generate reads them and vLLM's `--generation-config auto` applies them to requests that
// leave a field out.
//
// Invariants: every field present is checked (type and range) and an error names the file and
// the field; a field absent or null is nullopt; no file is an empty config. eos_token_id is
// returned as written (the caller checks the ids against its vocabulary).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace fp4kv::model {

struct GenerationConfig {
  std::string path;                // the file read; empty when the checkpoint has none
  std::vector<long long> eos_token_ids;
  std::optional<float> temperature;         // >= 0
  std::optional<float> top_p;               // (0, 1]
  std::optional<int> top_k;                 // <= 0: no top-k cut
  std::optional<int> max_new_tokens;        // >= 1
  std::optional<float> repetition_penalty;  // > 0 (1: none)
  std::optional<float> min_p;               // [0, 1] (0: none)
};

// Reads <dir>/generation_config.json. Throws fp4kv::Error for a file that is not a JSON
// object or a field of the wrong type or range.
GenerationConfig read_generation_config(const std::string& dir);

}  // namespace fp4kv::model
