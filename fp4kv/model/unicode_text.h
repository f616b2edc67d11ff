// UTF-8 and the Unicode properties a byte-level BPE tokenizer needs: decoding and encoding
// code points, the classes of its pre-tokenizer (\p{L}, \p{N}, \s) and NFC normalization,
// from the tables of unicode_tables.h (gen_unicode_tables.py).
//
// Invariants: decode_utf8 accepts only well-formed UTF-8 (RFC 3629: no overlongs, surrogates
// or code points past U+10FFFF; one classifier for it, sanitize_utf8 and
// utf8_complete_prefix) and throws Error naming the byte offset otherwise; nfc(s) equals
// Python's unicodedata.normalize("NFC", s) for the tables' Unicode version.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp4kv::model {

// The code points of well-formed UTF-8; `what` names the text in the error.
std::vector<char32_t> decode_utf8(std::string_view text, const std::string& what);
void append_utf8(char32_t cp, std::string& out);
// Bytes [0, n) of `bytes` that are safe to send now: all but a trailing, still-valid but
// incomplete UTF-8 sequence (which the next token may complete).
size_t utf8_complete_prefix(std::string_view bytes);
// Valid UTF-8: each invalid or truncated sequence's lead byte becomes U+FFFD. Cutting the
// input at utf8_complete_prefix and sanitizing the parts gives the whole's result.
std::string sanitize_utf8(std::string_view bytes);
std::string encode_utf8(const std::vector<char32_t>& cps);

bool is_letter(char32_t cp);      // General_Category L*
bool is_number(char32_t cp);      // General_Category N*
bool is_whitespace(char32_t cp);  // White_Space
int combining_class(char32_t cp);

// Canonical composition of the canonical decomposition (Unicode Normalization Form C).
std::vector<char32_t> nfc(const std::vector<char32_t>& cps);

}  // namespace fp4kv::model
