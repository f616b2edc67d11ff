#include "fp4kv/eval/retrieval.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "fp4kv/core/error.h"
#include "fp4kv/model/byte_tokenizer.h"

namespace fp4kv::eval {

std::vector<std::string> passkey_words(const std::string& text) {
  std::vector<std::string> words;
  std::set<std::string> seen;
  std::string cur;
  bool plain = true;  // no capitals or digits inside the token
  for (size_t i = 0; i <= text.size(); ++i) {
    const char ch = i < text.size() ? text[i] : ' ';
    if (ch >= 'a' && ch <= 'z') {
      cur.push_back(ch);
    } else if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') {
      plain = false;
    } else {
      if (plain && cur.size() >= 4 && cur.size() <= 9 && seen.insert(cur).second) words.push_back(cur);
      cur.clear();
      plain = true;
    }
  }
  return words;
}

PasskeyDoc make_passkey_doc(const std::string& filler, const std::vector<std::string>& words, int context,
                            std::mt19937& rng) {
  require(words.size() >= 16, "pass-key retrieval needs at least 16 distinct words");
  static const int kNeedles[3] = {4, 8, 16};
  PasskeyDoc doc;
  doc.needles = kNeedles[rng() % 3];
  std::vector<std::string> w, keys;
  std::set<std::string> used;
  while (int(w.size()) < doc.needles) {
    const std::string& cand = words[rng() % words.size()];
    if (used.insert(cand).second) w.push_back(cand);
  }
  std::string needle_text;
  std::vector<std::string> lines;
  for (int i = 0; i < doc.needles; ++i) {
    char num[8];
    std::snprintf(num, sizeof num, "%06u", unsigned(rng() % 1000000u));
    keys.push_back(num);
    lines.push_back("\nThe pass key of " + w[i] + " is " + num + ".\n");
  }
  const int ask = int(rng() % unsigned(doc.needles));
  doc.word = w[ask];
  doc.key = keys[ask];
  const std::string question = "\nQuestion: what is the pass key of " + doc.word + "? Answer: ";
  const std::string tail = question + doc.key + ".\n";
  size_t fixed = tail.size();
  for (const auto& l : lines) fixed += l.size();
  require(int(fixed) + 64 < context, "retrieval context " + std::to_string(context) + " is too short for the needles");
  const size_t body = size_t(context - 1) - fixed;  // filler bytes
  require(filler.size() > body + 1, "filler text is shorter than the retrieval context");
  const size_t off = size_t(rng() % (filler.size() - body));
  std::string text = filler.substr(off, body);
  // Needles at random byte positions, inserted from the back so positions stay valid.
  std::vector<size_t> pos(doc.needles);
  for (auto& p : pos) p = size_t(rng() % (body + 1));
  std::sort(pos.begin(), pos.end());
  for (int i = doc.needles - 1; i >= 0; --i) text.insert(pos[i], lines[i]);
  text += question;
  doc.tokens = model::encode_bytes(text, true);
  doc.answer_pos = int(doc.tokens.size());
  for (char ch : doc.key + ".\n") doc.tokens.push_back(static_cast<unsigned char>(ch));
  return doc;
}

bool passkey_correct(const std::vector<float>& logits, int vocab, const PasskeyDoc& doc) {
  for (int j = 0; j < 6; ++j) {
    const int t = doc.answer_pos + j - 1;  // the step that predicts digit j
    const float* row = &logits[size_t(t) * vocab];
    if (int(std::max_element(row, row + vocab) - row) != doc.tokens[size_t(doc.answer_pos + j)]) return false;
  }
  return true;
}

}  // namespace fp4kv::eval
