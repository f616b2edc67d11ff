#include "fp4kv/model/tokenizer.h"

#include <filesystem>

#include "fp4kv/core/error.h"
#include "fp4kv/model/byte_tokenizer.h"

namespace fp4kv::model {

Tokenizer Tokenizer::for_model(const std::string& dir, const Qwen3Config& config) {
  if (uses_byte_tokenizer(config)) return bytes();
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  require(std::filesystem::is_regular_file(path),
          "--model: '" + dir + "' is not byte-level (bos " + std::to_string(config.bos_token_id) + ", vocabulary " +
              std::to_string(config.vocab_size) + ") and has no tokenizer.json");
  auto bpe = std::make_shared<const BpeTokenizer>(BpeTokenizer::load(path));
  require(bpe->size() <= config.vocab_size, "tokenizer '" + path + "' has ids up to " +
                                                std::to_string(bpe->size() - 1) + ", past the model's vocabulary of " +
                                                std::to_string(config.vocab_size));
  return Tokenizer(std::move(bpe));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return bpe_ ? bpe_->encode(text) : encode_bytes(text, add_special_tokens);
}

bool Tokenizer::is_text(int id) const {
  if (!bpe_) return id >= 0 && id < kByteBos;
  return id >= 0 && id < bpe_->size() && !bpe_->is_special(id);
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  return bpe_ ? bpe_->decode(ids) : decode_bytes(ids);
}

}  // namespace fp4kv::model
