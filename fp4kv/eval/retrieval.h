// Pass-key retrieval (the pk8l model's README format): filler text with k needle lines
// "\nThe pass key of WORD is NNNNNN.\n" at random byte positions, then
// "\nQuestion: what is the pass key of WORD? Answer: NNNNNN.\n". A document counts as
// correct when all six answer digits are the argmax given the correct prefix.
#pragma once

#include <random>
#include <string>
#include <vector>

namespace fp4kv::eval {

struct PasskeyDoc {
  std::vector<int> tokens;  // BOS + document bytes (exactly `context` tokens)
  int answer_pos = 0;       // index in tokens of the first answer digit
  std::string word, key;    // the asked needle
  int needles = 0;
};

// Lowercase English words of 4..9 letters found in the text, deduplicated, in order.
std::vector<std::string> passkey_words(const std::string& text);

// A document of `context` tokens; needles k drawn from {4, 8, 16}.
PasskeyDoc make_passkey_doc(const std::string& filler, const std::vector<std::string>& words, int context,
                            std::mt19937& rng);

// Teacher-forced exact match: logits [L][vocab] of the document's forward pass.
bool passkey_correct(const std::vector<float>& logits, int vocab, const PasskeyDoc& doc);

}  // namespace fp4kv::eval
