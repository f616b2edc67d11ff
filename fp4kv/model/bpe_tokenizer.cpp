#include "fp4kv/model/bpe_tokenizer.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <utility>

#include "fp4kv/core/error.h"
#include "fp4kv/core/input_file.h"
#include "fp4kv/model/unicode_text.h"

namespace fp4kv::model {
namespace {

using json = nlohmann::json;

// The pre-tokenizer pattern of Qwen2-family tokenizer.json files, which match_qwen2 implements.
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's byte -> character map: printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100 onwards in byte order, so no token holds a space or a control character.
struct ByteMap {
  std::string to_char[256];                   // byte -> its character (UTF-8)
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? char32_t(b) : char32_t(256 + next++);
      append_utf8(cp, to_char[b]);
      to_byte.emplace(cp, uint8_t(b));
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

bool is_other(char32_t c) { return !is_whitespace(c) && !is_letter(c) && !is_number(c); }
bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }

// Length of the case-insensitive contraction ('s 't 're 've 'm 'll 'd) at i, or 0. Under
// Unicode case folding U+017F (long s) is an s.
size_t contraction_at(const std::vector<char32_t>& t, size_t i) {
  if (t[i] != '\'' || i + 1 >= t.size()) return 0;
  auto lower = [](char32_t c) { return c == 0x17F ? char32_t('s') : (c >= 'A' && c <= 'Z') ? c + 32 : c; };
  const char32_t a = lower(t[i + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= t.size()) return 0;
  const char32_t b = lower(t[i + 2]);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The match of kQwen2Pattern at i (its alternatives tried in order, each greedy, as a
// backtracking regex engine does); always at least one character.
size_t match_qwen2(const std::vector<char32_t>& t, size_t i) {
  const size_t n = t.size();
  auto run = [&](size_t j, bool (*in)(char32_t)) {
    while (j < n && in(t[j])) ++j;
    return j;
  };
  if (const size_t c = contraction_at(t, i)) return c;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (is_letter(t[i])) return run(i, is_letter) - i;
  if (!is_newline(t[i]) && !is_number(t[i]) && i + 1 < n && is_letter(t[i + 1])) return run(i + 1, is_letter) - i;
  // \p{N}
  if (is_number(t[i])) return 1;
  // ' '?[^\s\p{L}\p{N}]+[\r\n]*
  const size_t o = t[i] == ' ' && i + 1 < n && is_other(t[i + 1]) ? i + 1 : i;
  if (is_other(t[o])) return run(run(o, is_other), is_newline) - i;
  // t[i] is whitespace from here on. \s*[\r\n]+: through the last newline of the run.
  const size_t ws_end = run(i, is_whitespace);
  for (size_t j = ws_end; j > i; --j)
    if (is_newline(t[j - 1])) return j - i;
  // \s+(?!\S): the run, or all of it but the last character before a non-space.
  if (ws_end == n) return n - i;
  if (ws_end - i >= 2) return ws_end - 1 - i;
  // \s+
  return ws_end - i;
}

template <class T>
T field_or(const json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : it->get<T>();
}

std::string type_of(const json& j) { return j.is_object() ? field_or<std::string>(j, "type", "") : ""; }

void check_pre_tokenizer(const json& pre, const std::string& what) {
  const std::string why =
      what + ": pre_tokenizer must be Qwen2's (Split on its regex, then ByteLevel without a prefix space)";
  require(type_of(pre) == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].size() == 2, why);
  const json& split = pre["pretokenizers"][0];
  const json& level = pre["pretokenizers"][1];
  require(type_of(split) == "Split" && split.contains("pattern") && split["pattern"].contains("Regex") &&
              split["pattern"]["Regex"].get<std::string>() == kQwen2Pattern &&
              field_or<std::string>(split, "behavior", "") == "Isolated" && !field_or<bool>(split, "invert", false),
          why);
  require(type_of(level) == "ByteLevel" && !field_or<bool>(level, "add_prefix_space", false) &&
              !field_or<bool>(level, "use_regex", true),
          why);
}

void check_model(const json& m, const std::string& what) {
  require(type_of(m) == "BPE", what + ": model.type must be BPE, got '" + type_of(m) + "'");
  require(m.contains("vocab") && m["vocab"].is_object() && m.contains("merges") && m["merges"].is_array(),
          what + ": model needs a vocab object and a merges list");
  require(field_or<std::string>(m, "continuing_subword_prefix", "").empty() &&
              field_or<std::string>(m, "end_of_word_suffix", "").empty() &&
              !field_or<bool>(m, "byte_fallback", false) && m.value("dropout", json()).is_null(),
          what + ": BPE with a subword prefix, word suffix, byte fallback or dropout is not supported");
}

// The pattern's pieces of `cps`, as UTF-8.
std::vector<std::string> pieces_of(const std::vector<char32_t>& cps) {
  std::vector<std::string> pieces;
  for (size_t i = 0; i < cps.size();) {
    const size_t len = match_qwen2(cps, i);
    std::string& piece = pieces.emplace_back();
    for (size_t k = i; k < i + len; ++k) append_utf8(cps[k], piece);
    i += len;
  }
  return pieces;
}

}  // namespace

std::vector<std::string> qwen2_pieces(std::string_view text) {
  return pieces_of(decode_utf8(text, "the text to split"));
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  const std::optional<std::string> text = read_file(path);
  require(text.has_value(), "cannot open tokenizer '" + path + "'");
  return parse(*text, "tokenizer '" + path + "'");
}

BpeTokenizer BpeTokenizer::parse(const std::string& json_text, const std::string& what) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(what + " is not valid JSON: " + e.what());
  }
  try {
    BpeTokenizer t;
    const json normalizer = j.value("normalizer", json());
    require(normalizer.is_null() || type_of(normalizer) == "NFC",
            what + ": normalizer must be NFC or none, got '" + normalizer.dump() + "'");
    t.nfc_ = !normalizer.is_null();
    check_pre_tokenizer(j.value("pre_tokenizer", json()), what);
    const json post = j.value("post_processor", json());
    require(post.is_null() || type_of(post) == "ByteLevel",
            what + ": a post_processor that adds tokens (" + type_of(post) + ") is not supported");
    const json& m = j.value("model", json());
    check_model(m, what);
    t.ignore_merges_ = field_or<bool>(m, "ignore_merges", false);

    int size = 0;
    for (const auto& [token, id] : m["vocab"].items()) {
      require(id.is_number_integer() && id.get<int>() >= 0,
              what + ": vocab id of '" + token + "' is not a non-negative integer");
      t.vocab_.emplace(token, id.get<int>());
      size = std::max(size, id.get<int>() + 1);
    }
    const json& added = j.value("added_tokens", json::array());
    for (const json& a : added) {
      const std::string content = a.at("content").get<std::string>();
      require(!field_or<bool>(a, "lstrip", false) && !field_or<bool>(a, "rstrip", false) &&
                  !field_or<bool>(a, "single_word", false),
              what + ": added token " + content + " strips spaces or matches whole words only");
      require(!content.empty() && a.at("id").get<int>() >= 0, what + ": an added token is empty or has a negative id");
      t.added_.push_back({content, a.at("id").get<int>(), field_or<bool>(a, "special", false)});
      size = std::max(size, t.added_.back().id + 1);
    }
    std::stable_sort(t.added_.begin(), t.added_.end(),
                     [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });

    const ByteMap& bm = byte_map();
    t.id_bytes_.assign(size_t(size), std::string());
    for (const auto& [token, id] : t.vocab_) {
      std::string bytes;
      for (char32_t c : decode_utf8(token, what + ": vocab token")) {
        const auto b = bm.to_byte.find(c);
        require(b != bm.to_byte.end(), what + ": vocab token '" + token + "' holds a character outside the byte map");
        bytes.push_back(char(b->second));
      }
      t.id_bytes_[size_t(id)] = std::move(bytes);
    }
    t.special_.assign(size_t(size), false);
    for (const Added& a : t.added_) {
      t.id_bytes_[size_t(a.id)] = a.content;
      t.special_[size_t(a.id)] = a.special;
    }

    for (int b = 0; b < 256; ++b) {
      const auto it = t.vocab_.find(bm.to_char[b]);
      require(it != t.vocab_.end(), what + ": the vocabulary lacks the token of byte " + std::to_string(b));
      t.byte_id_[b] = it->second;
    }
    int rank = 0;
    for (const json& merge : m["merges"]) {
      std::string left, right;
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t space = s.find(' ');
        require(space != std::string::npos, what + ": merge \"" + s + "\" is not \"a b\"");
        left = s.substr(0, space), right = s.substr(space + 1);
      } else {
        require(merge.is_array() && merge.size() == 2, what + ": a merge is neither \"a b\" nor [a, b]");
        left = merge[0].get<std::string>(), right = merge[1].get<std::string>();
      }
      const auto l = t.vocab_.find(left), r = t.vocab_.find(right), lr = t.vocab_.find(left + right);
      require(l != t.vocab_.end() && r != t.vocab_.end() && lr != t.vocab_.end(),
              what + ": merge \"" + left + " " + right + "\" has a token outside the vocabulary");
      t.merges_.emplace(uint64_t(uint32_t(l->second)) << 32 | uint32_t(r->second), Merge{rank++, lr->second});
    }
    return t;
  } catch (const json::exception& e) {  // a field of the wrong type, or a missing one
    throw Error(what + " has an unexpected shape: " + e.what());
  }
}

int BpeTokenizer::token_id(std::string_view token) const {
  for (const Added& a : added_)
    if (a.content == token) return a.id;
  const auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

// BPE over the word's byte tokens: the lowest-ranked adjacent pair merges first, equal ranks
// (the same pair) left to right, as GPT-2's loop does, in O(n log n): symbols form a linked
// list, candidate pairs wait in a heap, and a popped pair no longer present is skipped.
void BpeTokenizer::encode_word(const std::string& word_bytes, std::vector<int>& ids) const {
  if (ignore_merges_) {
    const ByteMap& bm = byte_map();
    std::string whole;
    for (char b : word_bytes) whole += bm.to_char[uint8_t(b)];
    if (const auto it = vocab_.find(whole); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  const int n = int(word_bytes.size());
  std::vector<int> sym(size_t(n), 0), next(size_t(n), 0), prev(size_t(n), 0);
  for (int k = 0; k < n; ++k) sym[k] = byte_id_[uint8_t(word_bytes[size_t(k)])], next[k] = k + 1, prev[k] = k - 1;
  auto merge_of = [this](int left, int right) -> const Merge* {
    const auto it = merges_.find(uint64_t(uint32_t(left)) << 32 | uint32_t(right));
    return it == merges_.end() ? nullptr : &it->second;
  };
  using Candidate = std::pair<int, int>;  // (rank, position of the left symbol)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int k) {
    if (k >= 0 && next[k] < n)
      if (const Merge* m = merge_of(sym[k], sym[next[k]])) heap.push({m->rank, k});
  };
  for (int k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const auto [rank, k] = heap.top();
    heap.pop();
    if (sym[k] < 0 || next[k] >= n) continue;  // merged away, or no right neighbour now
    const Merge* m = merge_of(sym[k], sym[next[k]]);
    if (!m || m->rank != rank) continue;  // the pair here changed since it was pushed
    const int j = next[k];
    sym[k] = m->id;
    sym[j] = -1;
    next[k] = next[j];
    if (next[j] < n) prev[next[j]] = k;
    push(prev[k]);
    push(k);
  }
  for (int k = 0; k < n; k = next[k]) ids.push_back(sym[k]);
}

void BpeTokenizer::encode_segment(std::string_view text, std::vector<int>& ids) const {
  std::vector<char32_t> cps = decode_utf8(text, "the text to tokenize");
  if (nfc_) cps = nfc(cps);
  for (const std::string& word : pieces_of(cps)) encode_word(word, ids);
}

std::vector<int> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  size_t seg = 0;  // start of the text not yet tokenized
  for (size_t i = 0; i < text.size();) {
    const Added* hit = nullptr;
    for (const Added& a : added_)
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    encode_segment(text.substr(seg, i - seg), ids);
    ids.push_back(hit->id);
    i += hit->content.size();
    seg = i;
  }
  encode_segment(text.substr(seg), ids);
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int>& ids, Specials specials) const {
  std::string out;
  for (int id : ids)
    if (id >= 0 && id < size() && (specials == Specials::keep || !special_[size_t(id)])) out += id_bytes_[size_t(id)];
  return out;
}

}  // namespace fp4kv::model
