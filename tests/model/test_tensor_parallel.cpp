// Tensor parallelism on the CPU runner: the ranks of a HostGroup (threads) each run their
// shard of the model (tensor_parallel.h) and must compute the whole model's logits. A wrong
// slice (a head, KV head, channel, expert or vocabulary row on the wrong rank, a missing
// all-reduce) changes the logits by O(1); the sums in another order change them by float
// rounding only (~1e-6 relative per accumulation over a few thousand terms), so the bound is
// 1e-4 of the largest logit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "fp4kv/model/collective.h"
#include "fp4kv/model/qwen3.h"
#include "fp4kv/model/tensor_parallel.h"
#include "tests/model/fixtures.h"

namespace fp4kv::model {
namespace {

using json = nlohmann::json;
using testing::expect_error;
using testing::TempDir;

// Runs fn(shard, rank) on every rank of a `ranks`-way group, one thread per rank; returns
// each rank's result.
std::vector<std::vector<float>> on_ranks(const Qwen3Model& whole, int ranks,
                                         const std::function<std::vector<float>(const Qwen3Model&)>& fn) {
  HostGroup group(ranks);
  std::vector<Qwen3Model> shards;
  for (int r = 0; r < ranks; ++r) shards.push_back(whole.shard(group.member(r)));
  std::vector<std::vector<float>> out(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { out[size_t(r)] = fn(shards[size_t(r)]); });
  for (std::thread& t : threads) t.join();
  return out;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Every rank's logits equal (bit for bit, across ranks) and within the rounding bound of the
// whole model's.
void expect_same_logits(const std::vector<float>& whole, const std::vector<std::vector<float>>& per_rank,
                        const char* what) {
  double err = 0;
  ASSERT_EQ(per_rank[0].size(), whole.size()) << what;
  for (size_t i = 0; i < whole.size(); ++i) err = std::max(err, double(std::fabs(per_rank[0][i] - whole[i])));
  const double bound = 1e-4 * max_abs(whole);
  std::printf("%s, %zu ranks: max |logit difference| %.3g (bound %.3g)\n", what, per_rank.size(), err, bound);
  EXPECT_LE(err, bound) << what;
  for (size_t r = 1; r < per_rank.size(); ++r) EXPECT_EQ(per_rank[r], per_rank[0]) << what << ": rank " << r;
}

Qwen3Model load_random(const TempDir& dir, const json& c, uint32_t seed) {
  testing::write_checkpoint(dir.str(), c, testing::qwen3_tensors(c, seed));
  return Qwen3Model::load(dir.str());
}

std::vector<int> some_tokens(int n, int vocab) {
  std::vector<int> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 7 + 3) % vocab);
  return t;
}

TEST(HostGroup, SumsInRankOrderAndGathersInRankOrder) {
  const int ranks = 3;
  HostGroup group(ranks);
  std::vector<std::vector<float>> sums(ranks), gathered(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      Collective& c = group.member(r);
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.ranks(), ranks);
      for (int round = 0; round < 3; ++round) {  // the group is reusable, operation after operation
        std::vector<float> x = {float(r + 1), float(10 * (r + 1)), float(round)};
        c.all_reduce_sum(x.data(), x.size());
        sums[size_t(r)] = x;
        const float mine[2] = {float(r), float(-r)};
        gathered[size_t(r)].assign(2 * ranks, 0.0f);
        c.all_gather(mine, 2, gathered[size_t(r)].data());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(sums[size_t(r)], (std::vector<float>{6.0f, 60.0f, 6.0f}));
    EXPECT_EQ(gathered[size_t(r)], (std::vector<float>{0, 0, 1, -1, 2, -2}));
  }
  expect_error([] { HostGroup none(0); }, {"0 ranks"});
  expect_error([&] { group.member(3); }, {"rank 3", "[0, 3)"});
}

TEST(TensorParallel, SlicesAndRefusals) {
  const Qwen3Config pk8l = Qwen3Config::load_dir(testing::pk8l_dir());  // 8 heads, 2 KV heads, 1024, vocab 264
  const TpSlice s = tp_slice(pk8l, 1, 2);
  EXPECT_EQ(s.first_head, 4);
  EXPECT_EQ(s.heads, 4);
  EXPECT_EQ(s.first_kv_head, 1);
  EXPECT_EQ(s.kv_heads, 1);
  EXPECT_EQ(s.first_inter, 512);
  EXPECT_EQ(s.first_vocab, 132);
  expect_error([&] { tp_slice(pk8l, 0, 3); },
               {"3 ranks", "num_attention_heads 8", "num_key_value_heads 2", "intermediate_size 1024"});
  expect_error([&] { tp_slice(pk8l, 0, 4); }, {"num_key_value_heads 2"});
  expect_error([&] { tp_slice(pk8l, 2, 2); }, {"rank 2"});
  expect_error([&] { tp_slice(pk8l, 0, 0); }, {"0 ranks"});
  const Qwen3Config rank = rank_attention_config(pk8l, 2);  // one GPU's heads and cache
  EXPECT_EQ(rank.num_attention_heads, 4);
  EXPECT_EQ(rank.num_key_value_heads, 1);
  EXPECT_EQ(rank.hidden_size, pk8l.hidden_size);
  expect_error([&] { rank_attention_config(pk8l, 4); }, {"num_key_value_heads 2"});

  const std::vector<float> m = {0, 1, 2, 3, 4, 5};  // [2][3]
  EXPECT_EQ(slice_rows(m, 3, 1, 1), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(slice_cols(m, 3, 1, 2), (std::vector<float>{1, 2, 4, 5}));
  expect_error([&] { slice_cols(m, 3, 2, 2); }, {"outside"});
}

TEST(TensorParallel, DenseShardsComputeTheWholeModel) {
  TempDir dir;
  const Qwen3Model whole = load_random(dir, testing::small_config(), 5);
  const std::vector<int> tokens = some_tokens(23, 40);
  const std::vector<float> want = whole.forward(tokens);
  expect_same_logits(want, on_ranks(whole, 2, [&](const Qwen3Model& m) { return m.forward(tokens); }),
                     "dense tiny model");
  // A prefix and its extension: each rank's KvState holds its own KV head.
  const std::vector<int> head(tokens.begin(), tokens.begin() + 15), tail(tokens.begin() + 15, tokens.end());
  KvState whole_prefix;
  whole.forward(head, whole.exact_attention(), nullptr, &whole_prefix);
  const std::vector<float> want_tail = whole.extend(whole_prefix, tail, whole.exact_attention());
  const auto got_tail = on_ranks(whole, 2, [&](const Qwen3Model& m) {
    KvState prefix;
    m.forward(head, m.exact_attention(), nullptr, &prefix);
    EXPECT_EQ(prefix.k[0].size(), size_t(1) * 15 * 8);  // one KV head of 15 positions
    return m.extend(prefix, tail, m.exact_attention());
  });
  expect_same_logits(want_tail, got_tail, "dense tiny model, a prefix extended");
  expect_error([&] { on_ranks(whole, 4, [](const Qwen3Model&) { return std::vector<float>(); }); },
               {"4 ranks", "num_key_value_heads 2"});
}

TEST(TensorParallel, MoeShardsSplitTheExperts) {
  json c = testing::tiny_moe_config();  // 8 experts top-2, layer 1 dense
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = 2;
  TempDir dir;
  const Qwen3Model whole = load_random(dir, c, 11);
  const std::vector<int> tokens = some_tokens(19, 10);
  const std::vector<float> want = whole.forward(tokens);
  expect_same_logits(want, on_ranks(whole, 2, [&](const Qwen3Model& m) { return m.forward(tokens); }),
                     "tiny Qwen3-MoE, experts split");
}

TEST(TensorParallel, Pk8lOneKvHeadPerRank) {
  const Qwen3Model whole = Qwen3Model::load(testing::pk8l_dir());
  std::vector<int> tokens = {256};
  for (char ch : std::string("The cat sat on the mat.")) tokens.push_back(static_cast<unsigned char>(ch));
  const std::vector<float> want = whole.forward(tokens);
  const auto got = on_ranks(whole, 2, [&](const Qwen3Model& m) { return m.forward(tokens); });
  expect_same_logits(want, got, "pk8l");
  const int V = whole.config().vocab_size;
  for (size_t t = 0; t < tokens.size(); ++t) {  // the greedy choice at every position
    const float* a = want.data() + t * V;
    const float* b = got[0].data() + t * V;
    EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << "position " << t;
  }
  HostGroup one(1);
  const Qwen3Model single = whole.shard(one.member(0));
  expect_error([&] { single.shard(one.member(0)); }, {"a shard already"});
  EXPECT_EQ(single.forward(tokens), want);  // one rank: the whole model, the same sums
}

}  // namespace
}  // namespace fp4kv::model
