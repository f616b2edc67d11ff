// Embedding, RMSNorm (+ residual), QK-norm + RoPE and SwiGLU on the GPU against their CPU
// twins, on random inputs of many shapes (one token, odd sizes, Qwen3-4B sizes).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "fp4kv/ops/common.h"
#include "fp4kv/ops/embedding.h"
#include "fp4kv/ops/qk_norm_rope.h"
#include "fp4kv/ops/reference.h"
#include "fp4kv/ops/rms_norm.h"
#include "fp4kv/ops/swiglu.h"
#include "ops_test_util.h"

namespace fp4kv::ops::test {
namespace {

struct Shape {
  int rows, n;
};
// Rows of a multiple of 8 up to 8192 take the vector kernel (1 to 4 chunks a thread), the
// others the scalar one.
const Shape kNormShapes[] = {{1, 1},    {1, 2560}, {3, 7},    {5, 33},   {17, 1000},
                             {64, 2560}, {2, 9728}, {1, 8},   {3, 8192}, {2, 5128}};

// Norm outputs against the twin: within 2 BF16 ulps each (rms_norm.h), equal almost everywhere.
void expect_norm_close(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = bf16_bits_to_float(got[i]), w = bf16_bits_to_float(want[i]);
    if (got[i] != want[i]) ++differ;
    ASSERT_LE(std::fabs(g - w), 2 * bf16_ulp(w)) << what << " at " << i;
  }
  EXPECT_LE(differ, got.size() / 100 + 1) << what;
}

TEST(OpsGpu, EmbeddingGatherMatchesTwinAndFlagsBadIds) {
  SKIP_WITHOUT_GPU();
  for (const Shape s : {Shape{1000, 2560}, Shape{37, 7}, Shape{5, 8}}) {
    const int vocab = s.rows, hidden = s.n;
    const auto table = random_bf16(size_t(vocab) * hidden, 0.0f, 1.0f, 11);
    std::vector<int32_t> ids = {0, vocab - 1, 3 % vocab, vocab, -5, 1};
    int32_t want_flags = 0;
    const auto want = ref_embedding_gather(ids, table, vocab, hidden, &want_flags);
    DeviceBuffer<uint16_t> d_table(table), d_out(ids.size() * hidden);
    DeviceBuffer<int32_t> d_ids(ids), d_flags(1);
    d_out.fill_bytes(0xFF);
    embedding_gather({d_ids.get(), int(ids.size()), as_bf16(d_table), vocab, hidden, as_bf16(d_out), d_flags.get()},
                     nullptr);
    EXPECT_EQ(d_out.download(), want) << "vocab " << vocab << " hidden " << hidden;
    EXPECT_EQ(d_flags.download()[0], kErrorTokenOutOfRange);
  }
}

// A vocabulary-parallel shard: ids outside it embed as zeros, ids outside the vocabulary flag.
TEST(OpsGpu, EmbeddingShardMatchesTwin) {
  SKIP_WITHOUT_GPU();
  const int vocab = 1000, hidden = 264, first = 250, rows = 250;
  const auto shard = random_bf16(size_t(rows) * hidden, 0.0f, 1.0f, 12);
  const std::vector<int32_t> ids = {0, 249, 250, 499, 500, 999, 300, 1000, -1};
  int32_t want_flags = 0;
  const auto want = ref_embedding_gather(ids, shard, vocab, hidden, &want_flags, first, rows);
  DeviceBuffer<uint16_t> d_table(shard), d_out(ids.size() * hidden);
  DeviceBuffer<int32_t> d_ids(ids), d_flags(1);
  d_out.fill_bytes(0xFF);
  embedding_gather({d_ids.get(), int(ids.size()), as_bf16(d_table), vocab, hidden, as_bf16(d_out), d_flags.get(), first,
                    rows},
                   nullptr);
  EXPECT_EQ(d_out.download(), want);
  EXPECT_EQ(d_flags.download()[0], kErrorTokenOutOfRange);
  EXPECT_THROW(embedding_gather({d_ids.get(), 1, as_bf16(d_table), vocab, hidden, as_bf16(d_out), d_flags.get(), 900,
                                 rows},
                                nullptr),
               Error);
}

TEST(OpsGpu, RmsNormMatchesTwin) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const Shape s : kNormShapes) {
    const auto x = random_bf16(size_t(s.rows) * s.n, 0.1f, 2.0f, seed++);
    const auto w = random_bf16(size_t(s.n), 1.0f, 0.3f, seed++);
    DeviceBuffer<uint16_t> dx(x), dw(w), dy(x.size());
    rms_norm({as_bf16(dx), as_bf16(dw), as_bf16(dy), s.rows, s.n, 1e-6f}, nullptr);
    expect_norm_close(dy.download(), ref_rms_norm(x, w, s.rows, s.n, 1e-6f),
                      "rms_norm " + std::to_string(s.rows) + "x" + std::to_string(s.n));
  }
}

// y may alias x: in place gives what out of place gives, on both kernels.
TEST(OpsGpu, RmsNormInPlace) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 50;
  for (const Shape s : {Shape{2, 2560}, Shape{3, 7}}) {
    const auto x = random_bf16(size_t(s.rows) * s.n, 0.1f, 2.0f, seed++);
    const auto w = random_bf16(size_t(s.n), 1.0f, 0.3f, seed++);
    DeviceBuffer<uint16_t> dx(x), dw(w), dy(x.size());
    rms_norm({as_bf16(dx), as_bf16(dw), as_bf16(dy), s.rows, s.n, 1e-6f}, nullptr);
    rms_norm({as_bf16(dx), as_bf16(dw), as_bf16(dx), s.rows, s.n, 1e-6f}, nullptr);
    EXPECT_EQ(dx.download(), dy.download()) << s.rows << "x" << s.n;
  }
}

TEST(OpsGpu, AddRmsNormMatchesTwin) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (const Shape s : kNormShapes) {
    auto residual = random_bf16(size_t(s.rows) * s.n, 0.0f, 4.0f, seed++);
    const auto delta = random_bf16(residual.size(), 0.0f, 1.0f, seed++);
    const auto w = random_bf16(size_t(s.n), 1.0f, 0.3f, seed++);
    DeviceBuffer<uint16_t> dr(residual), dd(delta), dw(w), dy(residual.size());
    add_rms_norm({as_bf16(dr), as_bf16(dd), as_bf16(dw), as_bf16(dy), s.rows, s.n, 1e-6f}, nullptr);
    const auto want = ref_add_rms_norm(residual, delta, w, s.rows, s.n, 1e-6f);
    EXPECT_EQ(dr.download(), residual) << "the stored residual sum is exact";
    expect_norm_close(dy.download(), want, "add_rms_norm " + std::to_string(s.rows) + "x" + std::to_string(s.n));
  }
}

struct QkvCase {
  int tokens, q_heads, kv_heads, head_dim;
};

TEST(OpsGpu, QkNormRopeMatchesTwin) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 200;
  for (const QkvCase c : {QkvCase{1, 32, 8, 128}, QkvCase{7, 32, 8, 128}, QkvCase{3, 4, 2, 64},
                          QkvCase{2, 3, 1, 6}, QkvCase{5, 2, 2, 256}}) {
    const QkvShape s{c.tokens, c.q_heads, c.kv_heads, c.head_dim, 1e-6f};
    const int heads = c.q_heads + 2 * c.kv_heads;
    const auto qkv = random_bf16(size_t(c.tokens) * heads * c.head_dim, 0.0f, 3.0f, seed++);
    const auto qn = random_bf16(size_t(c.head_dim), 1.0f, 0.5f, seed++);
    const auto kn = random_bf16(size_t(c.head_dim), 1.0f, 0.5f, seed++);
    const RopeTable rope = make_rope_table(c.head_dim, 1000000.0, 40000);
    std::vector<int32_t> pos;
    for (int t = 0; t < c.tokens; ++t) pos.push_back((t * 7919 + 13) % 40000);
    const QkvOutputs want = ref_qk_norm_rope(qkv, pos, qn, kn, rope, s);
    DeviceBuffer<uint16_t> d_qkv(qkv), d_qn(qn), d_kn(kn), d_cos(rope.cos_bits), d_sin(rope.sin_bits);
    DeviceBuffer<uint16_t> d_q(want.q.size());
    DeviceBuffer<float> d_k(want.k.size()), d_v(want.v.size());
    DeviceBuffer<int32_t> d_pos(pos), d_flags(1);
    QkNormRopeArgs a;
    a.qkv = as_bf16(d_qkv);
    a.positions = d_pos.get();
    a.q_norm = as_bf16(d_qn);
    a.k_norm = as_bf16(d_kn);
    a.rope_cos = as_bf16(d_cos);
    a.rope_sin = as_bf16(d_sin);
    a.rope_positions = rope.positions;
    a.tokens = c.tokens;
    a.q_heads = c.q_heads;
    a.kv_heads = c.kv_heads;
    a.head_dim = c.head_dim;
    a.q = as_bf16(d_q);
    a.k = d_k.get();
    a.v = d_v.get();
    a.error_flags = d_flags.get();
    DeviceBuffer<uint16_t> d_kb(want.k.size()), d_vb(want.v.size());  // the prefill's BF16 copies
    a.k_bf16 = as_bf16(d_kb);
    a.v_bf16 = as_bf16(d_vb);
    qk_norm_rope(a, nullptr);
    const auto q = d_q.download();
    const auto k = d_k.download();
    EXPECT_EQ(d_v.download(), want.v);
    const auto kb = d_kb.download(), vb = d_vb.download();
    for (size_t i = 0; i < k.size(); ++i) {
      ASSERT_EQ(bf16_bits_to_float(kb[i]), k[i]) << "k copy " << i;  // k is BF16-exact
      ASSERT_EQ(bf16_bits_to_float(vb[i]), want.v[i]) << "v copy " << i;
    }
    EXPECT_EQ(d_flags.download()[0], 0);
    // Per head: within 4 BF16 ulps of the head's largest |value| (qk_norm_rope.h).
    auto check = [&](const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
      size_t differ = 0;
      for (size_t h = 0; h < got.size() / c.head_dim; ++h) {
        float peak = 0;
        for (int i = 0; i < c.head_dim; ++i) peak = std::max(peak, std::fabs(ref[h * c.head_dim + i]));
        for (int i = 0; i < c.head_dim; ++i) {
          const size_t e = h * c.head_dim + i;
          differ += got[e] != ref[e];
          ASSERT_LE(std::fabs(got[e] - ref[e]), 4 * bf16_ulp(peak)) << what << " head " << h << " i " << i;
        }
      }
      EXPECT_LE(differ, got.size() / 50 + 1) << what;
    };
    std::vector<float> qf, qref;
    for (size_t i = 0; i < q.size(); ++i) {
      qf.push_back(bf16_bits_to_float(q[i]));
      qref.push_back(bf16_bits_to_float(want.q[i]));
    }
    check(qf, qref, "q");
    check(k, want.k, "k");
  }
}

TEST(OpsGpu, QkNormRopeFlagsBadPositions) {
  SKIP_WITHOUT_GPU();
  const QkvShape s{2, 2, 1, 8, 1e-6f};
  const auto qkv = random_bf16(size_t(2) * 4 * 8, 0.0f, 1.0f, 5);
  const auto w = random_bf16(8, 1.0f, 0.1f, 6);
  const RopeTable rope = make_rope_table(8, 10000.0, 16);
  const std::vector<int32_t> pos = {3, 16};
  const QkvOutputs want = ref_qk_norm_rope(qkv, pos, w, w, rope, s);
  DeviceBuffer<uint16_t> d_qkv(qkv), d_w(w), d_cos(rope.cos_bits), d_sin(rope.sin_bits), d_q(want.q.size());
  DeviceBuffer<float> d_k(want.k.size()), d_v(want.v.size());
  DeviceBuffer<int32_t> d_pos(pos), d_flags(1);
  QkNormRopeArgs a{as_bf16(d_qkv), d_pos.get(), as_bf16(d_w), as_bf16(d_w), as_bf16(d_cos), as_bf16(d_sin),
                   rope.positions, 2, 2, 1, 8, 1e-6f, as_bf16(d_q), d_k.get(), d_v.get(), d_flags.get()};
  qk_norm_rope(a, nullptr);
  EXPECT_EQ(d_flags.download()[0], kErrorPositionOutOfRange);
  const auto q = d_q.download();
  for (int i = 16; i < 32; ++i) EXPECT_EQ(q[size_t(i)], 0) << "token 1 is zeroed";
  a.head_dim = 258;  // past what a warp holds per head
  EXPECT_THROW(qk_norm_rope(a, nullptr), Error);
}

TEST(OpsGpu, SwigluMatchesTwinBitForBit) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 300;
  for (const Shape s : {Shape{1, 9728}, Shape{3, 7}, Shape{33, 9728}, Shape{2, 1}}) {
    const auto gu = random_bf16(size_t(s.rows) * 2 * s.n, 0.0f, 4.0f, seed++);
    DeviceBuffer<uint16_t> d_gu(gu), d_out(size_t(s.rows) * s.n);
    swiglu({as_bf16(d_gu), as_bf16(d_out), s.rows, s.n}, nullptr);
    EXPECT_EQ(d_out.download(), ref_swiglu(gu, s.rows, s.n)) << s.rows << "x" << s.n;
  }
}

TEST(OpsGpu, BadArgumentsThrowBeforeLaunch) {
  EXPECT_THROW(rms_norm({nullptr, nullptr, nullptr, 1, 0, 1e-6f}, nullptr), Error);
  EXPECT_THROW(swiglu({nullptr, nullptr, 1, 4}, nullptr), Error);
  EXPECT_THROW(embedding_gather({nullptr, 1, nullptr, 0, 4, nullptr, nullptr}, nullptr), Error);
  EXPECT_THROW(make_rope_table(7, 10000.0, 4), Error);
}

}  // namespace
}  // namespace fp4kv::ops::test
