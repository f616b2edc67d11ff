#include "fp4kv/model/unicode_text.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "fp4kv/core/error.h"
#include "fp4kv/model/unicode_tables.h"

namespace fp4kv::model {
namespace {

namespace ud = unicode_data;

template <class R, size_t N>
const R* find_range(const R (&table)[N], char32_t cp) {
  const R* it = std::upper_bound(table, table + N, uint32_t(cp), [](uint32_t c, const R& r) { return c < r.first; });
  if (it == table) return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

// Hangul syllables compose and decompose by arithmetic (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

struct DecompositionIndex {
  std::unordered_map<char32_t, const ud::Decomposition*> by_cp;
  std::unordered_map<uint64_t, char32_t> composite;  // (first << 32 | second) -> primary composite
  DecompositionIndex() {
    for (const ud::Decomposition& d : ud::kDecompositions) {
      by_cp.emplace(d.cp, &d);
      if (d.composes) composite.emplace(uint64_t(d.first) << 32 | d.second, d.cp);
    }
  }
};
const DecompositionIndex& decompositions() {
  static const DecompositionIndex index;
  return index;
}

void decompose(char32_t cp, const DecompositionIndex& index, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = int(cp - kSBase);
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto it = index.by_cp.find(cp);
  if (it == index.by_cp.end()) {
    out.push_back(cp);
    return;
  }
  decompose(it->second->first, index, out);
  if (it->second->second != 0) decompose(it->second->second, index, out);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b, const DecompositionIndex& index) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto it = index.composite.find(uint64_t(a) << 32 | b);
  return it == index.composite.end() ? 0 : it->second;
}

// Below U+0300 every code point is its own NFC and none combines with a neighbour.
constexpr char32_t kFirstNormalizationSensitive = 0x300;

// Length of the UTF-8 sequence led by `lead` (0: not a lead byte), and the valid range of its
// second byte (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF).
struct Lead {
  int length = 0;
  unsigned char lo = 0x80, hi = 0xBF;
};

Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1};
  if (b >= 0xC2 && b <= 0xDF) return {2};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0};
}

enum class Seq { valid, invalid, truncated };

// Classifies the sequence starting at s[i].
Seq classify(std::string_view s, size_t i) {
  const Lead lead = lead_of((unsigned char)s[i]);
  if (lead.length == 0) return Seq::invalid;
  for (int k = 1; k < lead.length; ++k) {
    if (i + k >= s.size()) return Seq::truncated;
    const unsigned char c = (unsigned char)s[i + k];
    const unsigned char lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
    if (c < lo || c > hi) return Seq::invalid;
  }
  return Seq::valid;
}

constexpr const char* kReplacementCharacter = "\xEF\xBF\xBD";

}  // namespace

std::vector<char32_t> decode_utf8(std::string_view text, const std::string& what) {
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (classify(text, i) != Seq::valid)
      throw Error(what + " is not valid UTF-8 (at byte " + std::to_string(i) + ")");
    const int len = lead_of(uint8_t(text[i])).length;
    constexpr uint8_t kLeadPayload[] = {0, 0x7F, 0x1F, 0x0F, 0x07};  // a lead byte's code point bits
    char32_t cp = uint8_t(text[i]) & kLeadPayload[len];
    for (int k = 1; k < len; ++k) cp = cp << 6 | (uint8_t(text[i + k]) & 0x3F);
    cps.push_back(cp);
    i += size_t(len);
  }
  return cps;
}

size_t utf8_complete_prefix(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const Seq q = classify(bytes, i);
    if (q == Seq::truncated) return i;
    i += q == Seq::valid ? size_t(lead_of((unsigned char)bytes[i]).length) : 1;
  }
  return i;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    if (classify(bytes, i) == Seq::valid) {
      const size_t n = size_t(lead_of((unsigned char)bytes[i]).length);
      out.append(bytes, i, n);
      i += n;
    } else {
      out += kReplacementCharacter;
      ++i;
    }
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | cp >> 6));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | cp >> 12));
    out.push_back(char(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | cp >> 18));
    out.push_back(char(0x80 | (cp >> 12 & 0x3F)));
    out.push_back(char(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_utf8(cp, out);
  return out;
}

bool is_letter(char32_t cp) { return find_range(ud::kLetters, cp) != nullptr; }
bool is_number(char32_t cp) { return find_range(ud::kNumbers, cp) != nullptr; }

bool is_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

int combining_class(char32_t cp) {
  const ud::ValuedRange* r = find_range(ud::kCombiningClasses, cp);
  return r ? r->value : 0;
}

std::vector<char32_t> nfc(const std::vector<char32_t>& cps) {
  if (std::all_of(cps.begin(), cps.end(), [](char32_t c) { return c < kFirstNormalizationSensitive; })) return cps;
  const DecompositionIndex& index = decompositions();
  std::vector<char32_t> d;
  d.reserve(cps.size() + 8);
  for (char32_t cp : cps) decompose(cp, index, d);
  // Canonical order: each run of non-starters stably sorted by combining class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition (UAX #15): a character joins the last starter unless blocked.
  std::vector<char32_t> out;
  out.reserve(d.size());
  size_t starter = 0;
  bool have_starter = false;
  int last_class = -1;  // class of the last character kept after the starter; -1: none yet
  for (char32_t c : d) {
    const int cc = combining_class(c);
    if (have_starter) {
      // Blocked by a kept character between: canonical order puts the highest class last.
      const bool blocked = last_class != -1 && last_class >= cc;
      if (!blocked) {
        if (const char32_t comp = compose(out[starter], c, index)) {
          out[starter] = comp;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = out.size();
      have_starter = true;
      last_class = -1;
    } else {
      last_class = cc;
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace fp4kv::model
