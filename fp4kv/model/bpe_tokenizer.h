// A Hugging Face byte-level BPE tokenizer (tokenizer.json) of the Qwen2 family (Qwen2, Qwen2.5,
// Qwen3): added tokens matched in the raw text, NFC, Qwen2's pre-tokenizer regex, GPT-2's byte
// to character map, BPE by merge rank. It encodes as the `tokenizers` library does; whatever
// tokenizer.json asks beyond that (another normalizer, pattern or model, a post-processor that
// adds tokens, added tokens that strip spaces) is refused by name at load, never approximated.
//
// Invariants: decode(encode(t)) == t for every valid UTF-8 text t already in NFC; every id
// encode returns is a vocabulary or added-token id; decode returns the bytes of its ids
// (possibly ending inside a UTF-8 character), nothing for ids without a token, and for special
// added tokens (BOS, EOS, chat markers) nothing unless asked to keep them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fp4kv::model {

// The pieces Qwen2's pre-tokenizer pattern cuts UTF-8 `text` into (no normalization); their
// concatenation is `text`.
std::vector<std::string> qwen2_pieces(std::string_view text);

class BpeTokenizer {
 public:
  // Parses `path` (a tokenizer.json); throws Error naming the file and what is unsupported.
  static BpeTokenizer load(const std::string& path);
  // From the JSON text itself (`what` names it in errors).
  static BpeTokenizer parse(const std::string& json_text, const std::string& what);

  // Throws Error if `text` is not valid UTF-8.
  std::vector<int> encode(std::string_view text) const;
  enum class Specials { skip, keep };  // special added tokens in decode: HF's skip_special_tokens
  std::string decode(const std::vector<int>& ids, Specials specials = Specials::skip) const;
  int token_id(std::string_view token) const;  // an added token's or the vocabulary's id; -1 if none
  int size() const { return int(id_bytes_.size()); }  // one past the largest id
  bool is_special(int id) const { return id >= 0 && id < size() && special_[size_t(id)]; }

 private:
  void encode_word(const std::string& word_bytes, std::vector<int>& ids) const;
  void encode_segment(std::string_view text, std::vector<int>& ids) const;

  std::unordered_map<std::string, int> vocab_;       // byte-level token (mapped characters, UTF-8) -> id
  struct Merge {
    int rank, id;  // its place in the merge list; the merged token's id
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> the merge
  int byte_id_[256] = {};                       // the token of each single byte
  std::vector<std::string> id_bytes_;                // id -> its bytes
  std::vector<bool> special_;                        // id -> a special added token
  struct Added {
    std::string content;
    int id;
    bool special;  // not text: decode skips it unless asked to keep it
  };
  std::vector<Added> added_;  // longest first: the longest match at a position wins
  bool nfc_ = false;
  bool ignore_merges_ = false;
};

}  // namespace fp4kv::model
