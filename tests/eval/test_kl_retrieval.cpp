// The KL statistics, the paired t statistic and the pass-key documents.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fp4kv/eval/calibration.h"
#include "fp4kv/eval/kl.h"
#include "fp4kv/eval/retrieval.h"
#include "fp4kv/model/byte_tokenizer.h"

namespace fp4kv::eval {
namespace {

TEST(Kl, MatchesAHandComputedCase) {
  // Two steps, vocab 3; the first step is skipped.
  const std::vector<float> a = {0, 0, 0, 1.0f, 0.0f, -1.0f}, b = {5, 0, 0, 0.0f, 2.0f, 0.0f};
  const KlStats s = teacher_forced_kl(a, b, 2, 3, 1);
  const double za = std::exp(1.0) + 1.0 + std::exp(-1.0), zb = 2.0 + std::exp(2.0);
  const double pa[3] = {std::exp(1.0) / za, 1.0 / za, std::exp(-1.0) / za}, pb[3] = {1.0 / zb, std::exp(2.0) / zb, 1.0 / zb};
  double want = 0;
  for (int i = 0; i < 3; ++i) want += pa[i] * std::log(pa[i] / pb[i]);
  EXPECT_NEAR(s.kl, want, 1e-9);
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.top1_mismatch, 1.0);  // argmax 0 vs 1
  const KlStats same = teacher_forced_kl(a, a, 2, 3, 0);
  EXPECT_EQ(same.kl, 0.0);
  EXPECT_EQ(same.top1_mismatch, 0.0);
  // Top-k restricts the sum to the reference's k most likely tokens.
  const KlStats top1 = teacher_forced_kl(a, b, 2, 3, 1, 1);
  EXPECT_NEAR(top1.kl, pa[0] * std::log(pa[0] / pb[0]), 1e-9);
}

TEST(Kl, PairedT) {
  EXPECT_EQ(paired_t({1, 2, 3}, {1, 2, 3}), 0.0);
  // diffs 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3)
  EXPECT_NEAR(paired_t({2, 4, 6}, {1, 2, 3}), 2.0 * std::sqrt(3.0), 1e-12);
  EXPECT_TRUE(std::isinf(paired_t({2, 3}, {1, 2})));
  EXPECT_TRUE(std::isnan(paired_t({2}, {1})));  // one window: undefined, printed "n/a"
}

TEST(Retrieval, DocumentsFollowTheModelsFormat) {
  std::string filler;
  for (int i = 0; i < 400; ++i) filler += "the quick brown foxes jumped over lazy dogs while singing loudly\n";
  const auto words = passkey_words(filler + " alpha bravo charlie delta echoes foxtrot golfing hotel india juliet "
                                            "kilos limas mikes novembers oscar papas quebec romeo sierra tango");
  std::mt19937 rng(3);
  for (int trial = 0; trial < 10; ++trial) {
    const PasskeyDoc doc = make_passkey_doc(filler, words, 2048, rng);
    ASSERT_TRUE(doc.questions.size() == 4 || doc.questions.size() == 8 || doc.questions.size() == 16);
    const std::string body = model::decode_bytes(doc.body);
    size_t longest = 0;
    for (const auto& q : doc.questions) {
      EXPECT_NE(body.find("\nThe pass key of " + q.word + " is " + q.key + ".\n"), std::string::npos);
      const std::string text = model::decode_bytes(q.tokens);
      EXPECT_EQ(text, "\nQuestion: what is the pass key of " + q.word + "? Answer: " + q.key + ".\n");
      EXPECT_EQ(text.substr(size_t(q.answer_offset), 6), q.key);
      longest = std::max(longest, q.tokens.size());
    }
    EXPECT_EQ(doc.body.size() + longest, 2048u);
    EXPECT_EQ(doc.body[0], model::kByteBos);
  }
}

TEST(Retrieval, TeacherForcedExactMatch) {
  PasskeyQuestion q;
  q.key = "123456";
  for (char ch : std::string("A: 123456.\n")) q.tokens.push_back(static_cast<unsigned char>(ch));
  q.answer_offset = 3;
  const int vocab = 264;
  std::vector<float> logits(q.tokens.size() * vocab, 0.0f);
  for (int j = 0; j < 6; ++j) logits[size_t(q.answer_offset + j - 1) * vocab + q.tokens[size_t(q.answer_offset + j)]] = 1;
  EXPECT_TRUE(passkey_correct(logits, vocab, q));
  logits[size_t(q.answer_offset + 4) * vocab + '0'] = 2;  // the sixth digit goes wrong
  EXPECT_FALSE(passkey_correct(logits, vocab, q));
}

TEST(Calibration, TauCandidatesSitBetweenE4m3Values) {
  EXPECT_FLOAT_EQ(tau_of_code(10), 21.0f / 1024.0f);  // the paper's production tau
  for (int c = 0; c < 120; ++c) EXPECT_LT(tau_of_code(c), tau_of_code(c + 1));
}

TEST(Calibration, TauSearchPrefersKappa2ForTinyBlocks) {
  // Keys where one key dominates every tile: the other blocks hold tiny probabilities,
  // where the max/6 scale underflows E4M3 and kappa 2 is more accurate; a tau above all
  // of them must win over tau = 0 (never kappa 2).
  const int d = 64, n = 1024, G = 1, nq = 4;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t(n) * d), q(size_t(G) * nq * d);
  for (auto& x : k) x = nd(rng);
  for (auto& x : q) x = 3.0f * nd(rng);  // a wide logit spread: most blocks hold tiny p
  std::vector<double> err;
  accumulate_tau_errors(q.data(), G, nq, k.data(), n, d, 8.0f, err);
  ASSERT_EQ(err.size(), 126u);
  const size_t best = size_t(std::min_element(err.begin(), err.end()) - err.begin());
  EXPECT_GT(best, 0u);
  EXPECT_LT(err[best], err[0]);
}

}  // namespace
}  // namespace fp4kv::eval
