// Pass-key retrieval (the pk8l model's README format): filler text with k needle lines
// "\nThe pass key of WORD is NNNNNN.\n" at random byte positions, then
// "\nQuestion: what is the pass key of WORD? Answer: NNNNNN.\n". An answer counts as
// correct when all six digits are the argmax given the correct prefix (teacher-forced).
// Every needle of a document is asked about, each question extending the same document
// prefix, so one prefill serves k questions.
#pragma once

#include <random>
#include <string>
#include <vector>

namespace fp4kv::eval {

struct PasskeyQuestion {
  std::string word, key;
  std::vector<int> tokens;  // the question line, then the answer digits ".\n"
  int answer_offset = 0;    // index in tokens of the first answer digit
};

struct PasskeyDoc {
  std::vector<int> body;  // BOS + filler with the needles; body + any question = `context` tokens
  std::vector<PasskeyQuestion> questions;  // one per needle
};

// Lowercase English words of 4..9 letters found in the text, deduplicated, in order.
std::vector<std::string> passkey_words(const std::string& text);

// A document of `context` tokens (with its longest question); k needles from {4, 8, 16}.
PasskeyDoc make_passkey_doc(const std::string& filler, const std::vector<std::string>& words, int context,
                            std::mt19937& rng);

// Teacher-forced exact match from the logits [question tokens][vocab] of the question.
bool passkey_correct(const std::vector<float>& question_logits, int vocab, const PasskeyQuestion& q);

}  // namespace fp4kv::eval
