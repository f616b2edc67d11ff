// The scheduler over the GPU engine (engine/gpu_backend.h): a request's greedy tokens through
// the engine equal the GPU generator's for it alone; many requests with preemption all
// complete with those same tokens and leave no block or slot behind. Skips without a GPU.
//
// GEMM tuning stays off (the default): a tuned plan keeps the fastest algorithm of a timing
// run, which may differ between two engines; the heuristic's first choice is the same in every
// engine, so the engine's tokens can be compared with a second engine's.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/engine.h"
#include "fp4kv/engine/gpu_backend.h"
#include "fp4kv/engine/gpu_generator.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "fp4kv/testing/cuda_testing.h"

namespace fp4kv::engine {
namespace {

constexpr std::chrono::milliseconds kNoWait{0};

const GpuWeights& pk8l() {
  static const GpuWeights w = GpuWeights::load(std::string(FP4KV_SOURCE_DIR) + "/models/pk8l");
  return w;
}

GpuModelOptions options(int max_batch, int num_blocks, int prefill_chunk = 0) {
  GpuModelOptions o;
  o.max_batch = max_batch;
  o.max_context = 1024;
  o.num_blocks = num_blocks;
  o.gemm_plans = GemmPlans::heuristic;
  o.prefill_chunk = prefill_chunk;
  return o;
}

TextCodec codec() { return TextCodec{[](std::string_view t) { return model::encode_bytes(t); }, model::decode_bytes}; }

std::vector<int> alone(const std::vector<int>& prompt, const RequestParams& p, int prefill_chunk = 0) {
  GpuModel model(pk8l(), parse_recipe("nvfp4"), nullptr, options(1, 8, prefill_chunk));
  GenerateOptions o;
  o.max_tokens = p.max_tokens;
  o.sampling = p.sampling;
  o.stop_at_eos = p.stop_at_eos;
  std::vector<int> out;
  generate_on_gpu(model, prompt, o, [&out](int t) { out.push_back(t); });
  return out;
}

struct Drained {
  std::vector<int> tokens;
  std::vector<TokenLogprobs> logprobs;
};
Drained drain_all(Engine& e, uint64_t id) {
  Drained out;
  for (;;) {
    const StreamChunk c = e.next(id, kNoWait);
    out.tokens.insert(out.tokens.end(), c.tokens.begin(), c.tokens.end());
    out.logprobs.insert(out.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
    if (c.finished != FinishReason::none || c.timed_out) return out;
  }
}
std::vector<int> drain(Engine& e, uint64_t id) { return drain_all(e, id).tokens; }

SchedulerConfig config(int max_batch, int blocks) {
  SchedulerConfig c;
  c.max_batch = max_batch;
  c.max_step_tokens = 256;
  c.prefill_chunk = 64;
  c.total_blocks = blocks;
  return c;
}

// Also: log-probabilities come with the GPU-drawn tokens (greedy: each token is its own top
// alternative).
// With the tensor-core prefill on both sides (the prompt is one chunk either way) and without.
class GpuBackendPrefill : public ::testing::TestWithParam<int> {};

TEST_P(GpuBackendPrefill, OneRequestMatchesTheGpuGenerator) {
  SKIP_WITHOUT_GPU();
  const int prefill_chunk = GetParam();
  GpuModel model(pk8l(), parse_recipe("nvfp4"), nullptr, options(4, 32, prefill_chunk));
  Engine e(std::make_unique<GpuBackend>(model), config(4, 32), codec());
  RequestParams p;
  p.max_tokens = 40;
  p.stop_at_eos = false;
  p.sampling.request_id = 1;
  p.logprobs = 2;
  const std::vector<int> prompt = model::encode_bytes("The quick brown fox");
  const uint64_t id = e.submit(prompt, p);
  e.run_until_idle();
  const Drained d = drain_all(e, id);
  EXPECT_EQ(d.tokens, alone(prompt, p, prefill_chunk));
  ASSERT_EQ(d.logprobs.size(), d.tokens.size());
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    ASSERT_EQ(d.logprobs[i].top.size(), 2u);
    EXPECT_EQ(d.logprobs[i].top[0].first, d.tokens[i]);
    EXPECT_FLOAT_EQ(d.logprobs[i].top[0].second, d.logprobs[i].logprob);
    EXPECT_LE(d.logprobs[i].logprob, 0.0f);
    EXPECT_GE(d.logprobs[i].top[0].second, d.logprobs[i].top[1].second);
  }
  e.check_blocks();
}

INSTANTIATE_TEST_SUITE_P(DecodeStepsOrChunks, GpuBackendPrefill, ::testing::Values(0, 64),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param ? "prefill_chunk_" + std::to_string(i.param) : std::string("decode_steps");
                         });

TEST(GpuBackend, ManyRequestsWithPreemptionAllCompleteWithTheirOwnTokens) {
  SKIP_WITHOUT_GPU();
  // 5 blocks of 128 tokens for 4 requests of ~40 + 150 tokens each: they cannot all hold
  // their second block at once, so the newest are preempted and recomputed.
  constexpr int kBlocks = 5;
  GpuModel model(pk8l(), parse_recipe("nvfp4"), nullptr, options(4, kBlocks));
  auto backend = std::make_unique<GpuBackend>(model);
  GpuBackend* raw = backend.get();
  Engine e(std::move(backend), config(4, kBlocks), codec());
  const std::vector<std::string> prompts = {"Once upon a time there was a little",
                                            "The capital of France is a city of many",
                                            "In the beginning the universe was created and",
                                            "To be or not to be, that is the question: whether"};
  std::vector<uint64_t> ids;
  std::vector<RequestParams> params;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.max_tokens = 150;
    p.stop_at_eos = false;
    p.sampling.temperature = i % 2 ? 0.8f : 0.0f;  // greedy and sampled rows side by side
    p.sampling.seed = 11;
    p.sampling.request_id = 100 + i;
    params.push_back(p);
    ids.push_back(e.submit(model::encode_bytes(prompts[i]), p));
  }
  e.run_until_idle();
  EXPECT_GT(e.counters().preemptions, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int> got = drain(e, ids[i]);
    EXPECT_EQ(got.size(), 150u) << i;
    EXPECT_EQ(got, alone(model::encode_bytes(prompts[i]), params[i])) << "request " << i;
  }
  e.check_blocks();
  EXPECT_EQ(e.counters().blocks_used, 0);
  EXPECT_EQ(raw->live_requests(), 0);
  EXPECT_EQ(raw->blocks().used_count(), 0);
}

}  // namespace
}  // namespace fp4kv::engine
