// The byte-level BPE tokenizer (model/bpe_tokenizer.h) and its Unicode support against an
// independent reference (tests/model/make_bpe_fixture.py: the `regex` module running Qwen2's
// pattern, Python's unicodedata NFC, GPT-2's BPE loop) on a small tokenizer trained on the
// calibration text: every case's ids, 2000 NFC cases, and every refusal of a tokenizer.json
// this implementation does not follow.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fixtures.h"
#include "fp4kv/model/bpe_tokenizer.h"
#include "fp4kv/model/tokenizer.h"
#include "fp4kv/model/unicode_tables.h"
#include "fp4kv/model/unicode_text.h"

namespace fp4kv::model {
namespace {

using json = nlohmann::json;
using testing::expect_error;
using testing::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
const json& cases() {
  static const json j = json::parse(read_file(testing::bpe_fixture_path("tiny_bpe_cases.json")));
  return j;
}
const BpeTokenizer& tiny() {
  static const BpeTokenizer t = BpeTokenizer::load(testing::bpe_fixture_path("tiny_bpe_tokenizer.json"));
  return t;
}

TEST(BpeTokenizer, EncodesEveryCaseAsTheReference) {
  ASSERT_EQ(cases()["unicode_version"].get<std::string>(), unicode_data::kUnicodeVersion);
  int mismatches = 0, n = 0;
  for (const json& c : cases()["encode"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int> want = c["ids"].get<std::vector<int>>(), got = tiny().encode(text);
    ++n;
    if (got != want && ++mismatches <= 5) ADD_FAILURE() << "text " << json(text).dump() << ": ids differ";
  }
  EXPECT_EQ(mismatches, 0) << "of " << n;
  EXPECT_GE(n, 400);
}

// The pre-tokenizer alone: ids cannot tell a split from no split where no merge crosses it.
TEST(BpeTokenizer, PiecesAreThePatternsMatches) {
  int mismatches = 0;
  for (const json& c : cases()["encode"]) {
    const std::string text = c["text"].get<std::string>();
    if (qwen2_pieces(text) != c["pieces"].get<std::vector<std::string>>() && ++mismatches <= 5)
      ADD_FAILURE() << "text " << json(text).dump() << ": pieces differ";
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(qwen2_pieces("it's  ok\n\n  x"), (std::vector<std::string>{"it", "'s", " ", " ok", "\n\n", " ", " x"}));
}

TEST(BpeTokenizer, DecodeInvertsEncodeOnNormalizedText) {
  for (const json& c : cases()["encode"]) {
    const std::string text = c["text"].get<std::string>();
    if (encode_utf8(nfc(decode_utf8(text, "case"))) != text) continue;  // NFC changes it
    EXPECT_EQ(tiny().decode(tiny().encode(text), BpeTokenizer::Specials::keep), text);
  }
}

TEST(BpeTokenizer, AddedTokensAreSingleIds) {
  const int start = tiny().token_id("<|im_start|>"), end = tiny().token_id("<|im_end|>");
  ASSERT_GE(start, 0);
  ASSERT_GE(end, 0);
  const std::vector<int> ids = tiny().encode("<|im_start|><|im_end|>");
  EXPECT_EQ(ids, (std::vector<int>{start, end}));
  EXPECT_EQ(tiny().decode(ids, BpeTokenizer::Specials::keep), "<|im_start|><|im_end|>");
  EXPECT_EQ(tiny().decode(ids), "");  // special: not text (HF's skip_special_tokens)
  EXPECT_EQ(tiny().token_id("no such token"), -1);
  EXPECT_EQ(tiny().decode({-1, tiny().size(), 1 << 30}), "");  // ids without a token decode to nothing
}

// An added token that is not special (Qwen3's <think>) is text; a special one is not.
TEST(BpeTokenizer, OnlySpecialAddedTokensDecodeToNothing) {
  json j = json::parse(read_file(testing::bpe_fixture_path("tiny_bpe_tokenizer.json")));
  for (json& a : j["added_tokens"])
    if (a["content"] == "<think>") a["special"] = false;
  const BpeTokenizer t = BpeTokenizer::parse(j.dump(), "edited");
  EXPECT_EQ(t.decode(t.encode("<|im_start|>a<think>b</think><|im_end|>")), "a<think>b");
}

TEST(BpeTokenizer, InvalidUtf8IsRefused) {
  for (const char* bad : {"\xC3", "ok\xC3(", "\xED\xA0\x80", "\xC0\x80", "\xF4\x90\x80\x80", "\xFF"})
    expect_error([&] { tiny().encode(bad); }, {"not valid UTF-8"});
}

TEST(Unicode, NfcEqualsPythonsUnicodedata) {
  int n = 0;
  for (const json& c : cases()["nfc"]) {
    const std::string in = c["in"].get<std::string>(), want = c["nfc"].get<std::string>();
    EXPECT_EQ(encode_utf8(nfc(decode_utf8(in, "case"))), want) << json(in).dump();
    ++n;
  }
  EXPECT_EQ(n, 2000);
}

TEST(Unicode, ClassesOfThePreTokenizer) {
  EXPECT_TRUE(is_letter(U'a'));
  EXPECT_TRUE(is_letter(U'中'));
  EXPECT_TRUE(is_letter(U'ß'));
  EXPECT_FALSE(is_letter(U'1'));
  EXPECT_TRUE(is_number(U'½'));
  EXPECT_TRUE(is_number(U'٣'));
  EXPECT_FALSE(is_number(U'a'));
  EXPECT_TRUE(is_whitespace(0x3000));
  EXPECT_TRUE(is_whitespace(0x85));
  EXPECT_FALSE(is_whitespace(0x1C));  // a control character Python's isspace calls space
  EXPECT_FALSE(is_whitespace(0x200B));
  EXPECT_EQ(combining_class(0x301), 230);
  EXPECT_EQ(combining_class(U'a'), 0);
}

// tokenizer.json with one field replaced, parsed.
void expect_refused(const std::function<void(json&)>& edit, const std::string& part) {
  json j = json::parse(read_file(testing::bpe_fixture_path("tiny_bpe_tokenizer.json")));
  edit(j);
  expect_error([&] { BpeTokenizer::parse(j.dump(), "tokenizer 'edited'"); }, {"tokenizer 'edited'", part});
}

TEST(BpeTokenizer, WhatItDoesNotFollowIsRefusedByName) {
  expect_refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,3}|\\s+"; },
                 "pre_tokenizer");
  expect_refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; }, "pre_tokenizer");
  expect_refused([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer");
  expect_refused([](json& j) { j["post_processor"] = {{"type", "TemplateProcessing"}}; }, "post_processor");
  expect_refused([](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "strips spaces");
  expect_refused([](json& j) { j["model"]["type"] = "WordPiece"; }, "BPE");
  expect_refused([](json& j) { j["model"]["byte_fallback"] = true; }, "byte fallback");
  expect_refused([](json& j) { j["model"]["merges"][0] = json::array({"a"}); }, "merge");
  expect_refused([](json& j) { j["model"]["merges"][0] = json::array({"zz", "q"}); }, "outside the vocabulary");
  expect_error([] { BpeTokenizer::parse("{not json", "tokenizer 'x'"); }, {"tokenizer 'x'", "not valid JSON"});
  expect_refused([](json& j) { j["added_tokens"][0]["content"] = 7; }, "unexpected shape");
  expect_refused([](json& j) { j["model"]["vocab"] = json::array(); }, "vocab");
  expect_error([] { BpeTokenizer::load("/nonexistent/tokenizer.json"); }, {"cannot open", "/nonexistent"});
}

// A checkpoint directory with pk8l's config made subword-sized (and bos/eos moved).
void write_subword_config(const TempDir& dir, int vocab) {
  json config = json::parse(read_file(testing::pk8l_dir() + "/config.json"));
  config["bos_token_id"] = 1;
  config["eos_token_id"] = 2;
  config["vocab_size"] = vocab;
  std::ofstream(dir.str() + "/config.json") << config.dump();
}

TEST(Tokenizer, ByteCheckpointsUseBytesOthersTheirTokenizerJson) {
  const Tokenizer bytes = Tokenizer::for_model(testing::pk8l_dir(), Qwen3Config::load_dir(testing::pk8l_dir()));
  EXPECT_TRUE(bytes.is_bytes());
  EXPECT_EQ(bytes.encode("hi"), (std::vector<int>{256, 'h', 'i'}));

  TempDir dir;
  write_subword_config(dir, tiny().size() + 64);
  expect_error([&] { Tokenizer::for_model(dir.str(), Qwen3Config::load_dir(dir.str())); }, {dir.str(), "tokenizer.json"});
  std::ofstream(dir.str() + "/tokenizer.json") << read_file(testing::bpe_fixture_path("tiny_bpe_tokenizer.json"));
  const Tokenizer bpe = Tokenizer::for_model(dir.str(), Qwen3Config::load_dir(dir.str()));
  EXPECT_FALSE(bpe.is_bytes());
  const json& c = cases()["encode"][1];
  EXPECT_EQ(bpe.encode(c["text"].get<std::string>()), c["ids"].get<std::vector<int>>());
  EXPECT_EQ(bpe.decode(bpe.encode("Hello, world!")), "Hello, world!");

  write_subword_config(dir, tiny().size() - 1);  // the model has fewer rows than the tokenizer has ids
  expect_error([&] { Tokenizer::for_model(dir.str(), Qwen3Config::load_dir(dir.str())); }, {"past the model's vocabulary"});
}

}  // namespace
}  // namespace fp4kv::model
