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
  const int k = kNeedles[rng() % 3];
  PasskeyDoc doc;
  std::vector<std::string> lines;
  std::set<std::string> used;
  size_t needle_bytes = 0, longest_question = 0;
  while (int(doc.questions.size()) < k) {
    const std::string& word = words[rng() % words.size()];
    if (!used.insert(word).second) continue;
    char num[8];
    std::snprintf(num, sizeof num, "%06u", unsigned(rng() % 1000000u));
    PasskeyQuestion q;
    q.word = word;
    q.key = num;
    const std::string question = "\nQuestion: what is the pass key of " + word + "? Answer: ";
    q.answer_offset = int(question.size());
    for (char ch : question + q.key + ".\n") q.tokens.push_back(static_cast<unsigned char>(ch));
    longest_question = std::max(longest_question, q.tokens.size());
    lines.push_back("\nThe pass key of " + word + " is " + q.key + ".\n");
    needle_bytes += lines.back().size();
    doc.questions.push_back(std::move(q));
  }
  require(int(needle_bytes + longest_question) + 64 < context,
          "retrieval context " + std::to_string(context) + " is too short for the needles");
  const size_t body = size_t(context - 1) - needle_bytes - longest_question;  // filler bytes
  require(filler.size() > body + 1, "filler text is shorter than the retrieval context");
  const size_t off = size_t(rng() % (filler.size() - body));
  std::string text = filler.substr(off, body);
  // Needles at random byte positions, inserted from the back so positions stay valid.
  std::vector<size_t> pos(static_cast<size_t>(k));
  for (auto& p : pos) p = size_t(rng() % (body + 1));
  std::sort(pos.begin(), pos.end());
  for (int i = k - 1; i >= 0; --i) text.insert(pos[size_t(i)], lines[size_t(i)]);
  doc.body = model::encode_bytes(text, true);
  return doc;
}

bool passkey_correct(const std::vector<float>& logits, int vocab, const PasskeyQuestion& q) {
  for (int j = 0; j < 6; ++j) {
    const int t = q.answer_offset + j - 1;  // the step that predicts digit j
    const float* row = &logits[size_t(t) * vocab];
    if (int(std::max_element(row, row + vocab) - row) != q.tokens[size_t(q.answer_offset + j)]) return false;
  }
  return true;
}

}  // namespace fp4kv::eval
