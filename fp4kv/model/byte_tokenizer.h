// The byte tokenizer of the pk8l test model: token id = byte value (0..255), 256 = BOS,
// 257 = EOS/pad; ids above 255 carry no text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

}  // namespace fp4kv::model
