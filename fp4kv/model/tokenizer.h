// The tokenizer of a checkpoint: byte tokens for byte-level checkpoints like pk8l
// (byte_tokenizer.h, BOS first), else the byte-level BPE of the tokenizer.json beside the
// weights (bpe_tokenizer.h: the Qwen2 family, no BOS, as its post-processor adds none).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp4kv/model/bpe_tokenizer.h"
#include "fp4kv/model/qwen3_config.h"

namespace fp4kv::model {

class Tokenizer {
 public:
  // Byte tokens when the config is byte-level, else `dir`/tokenizer.json; throws Error naming
  // `dir` when neither applies, or a tokenizer.json whose vocabulary does not fit the model.
  static Tokenizer for_model(const std::string& dir, const Qwen3Config& config);
  static Tokenizer bytes() { return Tokenizer(nullptr); }

  // With `add_special_tokens` the tokens a prompt is fed with (the byte tokenizer's BOS first;
  // the BPE's post-processor adds none), without it the text's tokens alone.
  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const;
  // Bytes (may end inside a character); special tokens (BOS, EOS, chat markers) are not text
  // and decode to nothing, as the byte tokenizer's ids >= 256 do.
  std::string decode(const std::vector<int>& ids) const;
  bool is_bytes() const { return bpe_ == nullptr; }
  // Whether the id is a token of text (not special, not past the tokenizer's ids).
  bool is_text(int id) const;

 private:
  explicit Tokenizer(std::shared_ptr<const BpeTokenizer> bpe) : bpe_(std::move(bpe)) {}
  std::shared_ptr<const BpeTokenizer> bpe_;  // null: byte tokens
};

}  // namespace fp4kv::model
