// The byte tokenizer of the pk8l test model: token id = byte value (0..255), 256 = BOS,
// 257 = EOS/pad; ids above 255 carry no text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/model/qwen3_config.h"

namespace fp4kv::model {

inline constexpr int kByteBos = 256;
inline constexpr int kByteEos = 257;

inline std::vector<int> encode_bytes(std::string_view text, bool add_bos = true) {
  std::vector<int> ids;
  ids.reserve(text.size() + 1);
  if (add_bos) ids.push_back(kByteBos);
  for (char ch : text) ids.push_back(int(static_cast<unsigned char>(ch)));
  return ids;
}

// Special and out-of-range ids (>= 256, or negative) are skipped.
inline std::string decode_bytes(const std::vector<int>& ids) {
  std::string text;
  text.reserve(ids.size());
  for (int id : ids) {
    if (id >= 0 && id < 256) text.push_back(char(static_cast<unsigned char>(id)));
  }
  return text;
}

// Checkpoints this tokenizer serves: BOS 256, EOS 257 and a vocabulary of a few unused ids
// past them (pk8l: 264); subword vocabularies use tokenizer.h's BPE.
inline constexpr int kMaxByteVocabulary = 512;
inline bool uses_byte_tokenizer(const Qwen3Config& c) {
  return c.bos_token_id == kByteBos && c.is_eos(kByteEos) && c.vocab_size <= kMaxByteVocabulary;
}
inline void require_byte_tokenizer(const Qwen3Config& c, const std::string& dir) {
  require(uses_byte_tokenizer(c),
          "--model: '" + dir + "' does not use the byte tokenizer (bos " + std::to_string(c.bos_token_id) +
              ", vocabulary " + std::to_string(c.vocab_size) +
              "); this needs a byte-level checkpoint like pk8l");
}

}  // namespace fp4kv::model
