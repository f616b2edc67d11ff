// Continuous batching on the embedded pk8l model: a mixed batch gives every request the
// tokens generate_on_cpu gives it alone; a tiny pool forces preemption without changing a
// token; stop strings cut the output; cancel frees blocks; bad requests fail at submit;
// submissions from two threads while a third steps.
#include "fp4kv/engine/engine.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/cpu_backend.h"
#include "fp4kv/engine/cpu_generator.h"
#include "fp4kv/eval/model_attention.h"
#include "fp4kv/model/byte_tokenizer.h"

namespace fp4kv::engine {
namespace {

constexpr std::chrono::milliseconds kNoWait{0};
constexpr std::chrono::milliseconds kLongWait{60000};

const model::Qwen3Model& pk8l() {
  static const model::Qwen3Model m = model::Qwen3Model::load(std::string(FP4KV_SOURCE_DIR) + "/models/pk8l");
  return m;
}

std::vector<int> encode(std::string_view text) { return model::encode_bytes(text); }

TextCodec byte_codec() { return TextCodec{encode, model::decode_bytes}; }

model::AttentionFn nvfp4_attention() { return eval::recipe_attention(pk8l().config(), parse_recipe("nvfp4"), nullptr); }

Engine make_engine(const SchedulerConfig& config) {
  return Engine(std::make_unique<CpuBackend>(pk8l(), nvfp4_attention()), config, byte_codec());
}

std::vector<int> alone(const std::vector<int>& prompt, const RequestParams& p) {
  GenerateOptions o;
  o.max_tokens = p.max_tokens;
  o.sampling = p.sampling;
  o.stop_at_eos = p.stop_at_eos;
  std::vector<int> out;
  generate_on_cpu(pk8l(), nvfp4_attention(), prompt, o, [&out](int t) { out.push_back(t); });
  return out;
}

// Reads a finished request's whole stream (the engine must have run it to the end).
std::vector<int> drain(Engine& e, uint64_t id, FinishReason* reason = nullptr) {
  std::vector<int> out;
  for (;;) {
    StreamChunk c = e.next(id, kNoWait);
    out.insert(out.end(), c.tokens.begin(), c.tokens.end());
    if (c.finished != FinishReason::none) {
      if (reason) *reason = c.finished;
      return out;
    }
    if (c.timed_out) ADD_FAILURE() << "request " << id << " did not finish";
    if (c.timed_out) return out;
  }
}

struct Case {
  std::string prompt;
  RequestParams params;
};

std::vector<Case> mixed_cases() {
  std::vector<Case> cases;
  const char* prompts[] = {"The quick brown fox", "Hello", "Once upon a time, there was",
                           "abc", "To be or not to be, that is", "1 2 3 4"};
  for (int i = 0; i < 6; ++i) {
    Case c;
    c.prompt = prompts[i];
    c.params.max_tokens = 5 + 2 * i;
    c.params.stop_at_eos = i % 2 == 0;
    c.params.sampling.request_id = uint64_t(100 + i);
    if (i % 3 != 0) {
      c.params.sampling.temperature = 0.8f + 0.2f * float(i);
      c.params.sampling.top_p = 0.9f;
      c.params.sampling.top_k = i == 4 ? 20 : 0;
      c.params.sampling.seed = uint64_t(7 * i + 1);
    }
    cases.push_back(c);
  }
  return cases;
}

// Runs `cases` as one batch and checks that each request's tokens equal its run alone and
// that every block is free afterwards; returns the engine's counters.
SchedulerCounters expect_batch_equals_alone(const SchedulerConfig& config, const std::vector<Case>& cases) {
  Engine e = make_engine(config);
  std::vector<uint64_t> ids;
  for (const Case& c : cases) ids.push_back(e.submit(encode(c.prompt), c.params));
  e.run_until_idle();
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(drain(e, ids[i]), alone(encode(cases[i].prompt), cases[i].params)) << "request " << i;
  const SchedulerCounters k = e.counters();
  EXPECT_EQ(k.running, 0);
  EXPECT_EQ(k.waiting, 0);
  EXPECT_EQ(k.blocks_used, 0);
  EXPECT_EQ(k.blocks_free, config.total_blocks);
  EXPECT_EQ(k.finished, (long long)cases.size());
  e.check_blocks();
  return k;
}

TEST(Scheduler, BatchEqualsEachRequestAlone) {
  SchedulerConfig config;
  config.max_batch = 4;
  config.max_step_tokens = 16;
  config.prefill_chunk = 8;  // prompts span several chunks, mixed with decodes
  config.total_blocks = 16;
  expect_batch_equals_alone(config, mixed_cases());
}

TEST(Scheduler, PreemptionKeepsEveryToken) {
  // Prompts of ~120 bytes: two requests cannot both cross a block boundary in a 3-block
  // pool, so the newest is preempted and recomputed.
  SchedulerConfig config;
  config.max_batch = 3;
  config.max_step_tokens = 256;
  config.prefill_chunk = 128;
  config.total_blocks = 3;
  std::vector<Case> cases;
  for (int i = 0; i < 3; ++i) {
    Case c;
    c.prompt = std::string(size_t(120 + i), char('a' + i)) + " then";
    c.params.max_tokens = 12;
    c.params.stop_at_eos = false;
    c.params.sampling.request_id = uint64_t(5 + i);
    if (i == 1) {
      c.params.sampling.temperature = 1.0f;
      c.params.sampling.seed = 42;
    }
    cases.push_back(c);
  }
  const SchedulerCounters k = expect_batch_equals_alone(config, cases);
  EXPECT_GT(k.preemptions, 0);
  EXPECT_EQ(k.generated_tokens, 36);
}

// Greedy, 24 tokens whatever EOS says: a continuation long enough to stop inside.
RequestParams long_greedy() {
  RequestParams p;
  p.max_tokens = 24;
  p.stop_at_eos = false;
  p.sampling.request_id = 1;
  return p;
}

TEST(Scheduler, StopStringCutsTheOutput) {
  Engine e = make_engine(SchedulerConfig{});
  RequestParams p = long_greedy();
  const std::vector<int> prompt = encode("The quick brown fox");
  const std::string full = model::decode_bytes(alone(prompt, p));
  ASSERT_GE(full.size(), 8u);
  // A stop string from the middle of the greedy continuation: the output is the text before it.
  const std::string stop = full.substr(4, 3);
  p.stop = {"\x01never", stop};
  const uint64_t id = e.submit(prompt, p);
  e.run_until_idle();
  FinishReason reason = FinishReason::none;
  const std::string got = model::decode_bytes(drain(e, id, &reason));
  EXPECT_EQ(reason, FinishReason::stop);
  EXPECT_EQ(got, full.substr(0, full.find(stop)));
  EXPECT_EQ(e.counters().blocks_used, 0);
}

// A stop token ends the output at its first occurrence, the token and its text included; a
// token outside the vocabulary is refused at submit.
TEST(Scheduler, StopTokenEndsTheOutputWithIt) {
  Engine e = make_engine(SchedulerConfig{});
  RequestParams p = long_greedy();
  const std::vector<int> prompt = encode("The quick brown fox");
  const std::vector<int> full = alone(prompt, p);
  ASSERT_GE(full.size(), 8u);
  const int stop = full[5];
  const size_t first = size_t(std::find(full.begin(), full.end(), stop) - full.begin());
  p.stop_token_ids = {stop};
  const uint64_t id = e.submit(prompt, p);
  e.run_until_idle();
  FinishReason reason = FinishReason::none;
  EXPECT_EQ(drain(e, id, &reason), std::vector<int>(full.begin(), full.begin() + first + 1));
  EXPECT_EQ(reason, FinishReason::stop);
  EXPECT_EQ(e.counters().blocks_used, 0);
  p.stop_token_ids = {pk8l().config().vocab_size};
  EXPECT_THROW(e.submit(prompt, p), Error);
}

TEST(Scheduler, CancelFreesBlocks) {
  Engine e = make_engine(SchedulerConfig{});
  RequestParams p;
  p.max_tokens = 50;
  const uint64_t a = e.submit(std::string_view("Hello there"), p);
  const uint64_t b = e.submit(std::string_view("Another one"), p);
  e.step();
  EXPECT_EQ(e.counters().running, 2);
  EXPECT_EQ(e.counters().blocks_used, 2);
  EXPECT_TRUE(e.cancel(a));
  e.step();
  EXPECT_EQ(e.counters().blocks_used, 1);
  FinishReason reason = FinishReason::none;
  drain(e, a, &reason);
  EXPECT_EQ(reason, FinishReason::cancelled);
  EXPECT_FALSE(e.cancel(a));
  EXPECT_TRUE(e.cancel(b));
  e.run_until_idle();
  EXPECT_EQ(e.counters().blocks_used, 0);
  e.check_blocks();
}

TEST(Scheduler, BadRequestsFailAtSubmit) {
  SchedulerConfig config;
  config.total_blocks = 1;
  Engine e = make_engine(config);
  RequestParams p;
  EXPECT_THROW(e.submit(std::vector<int>{}, p), Error);
  p.max_tokens = 0;
  EXPECT_THROW(e.submit(std::string_view("hi"), p), Error);
  p.max_tokens = 4;
  EXPECT_THROW(e.submit(std::vector<int>(200, 'a'), p), Error);  // beyond the 1-block pool
  p.sampling.top_p = 0.0f;
  EXPECT_THROW(e.submit(std::string_view("hi"), p), Error);
  EXPECT_THROW(e.next(12345, kNoWait), Error);
  EXPECT_EQ(e.counters().waiting, 0);
}

TEST(Scheduler, SubmitFromTwoThreadsWhileAThirdSteps) {
  SchedulerConfig config;
  config.max_batch = 4;
  config.max_step_tokens = 32;
  config.prefill_chunk = 16;
  config.total_blocks = 8;
  Engine e = make_engine(config);
  e.start();
  constexpr int kPerThread = 3;
  const auto client = [&e](int thread, std::vector<std::vector<int>>* outs) {
    for (int i = 0; i < kPerThread; ++i) {
      RequestParams p;
      p.max_tokens = 4;
      p.sampling.request_id = uint64_t(thread * 10 + i + 1);
      const uint64_t id = e.submit(encode("Thread " + std::to_string(thread) + " asks " + std::to_string(i)), p);
      std::vector<int> out;
      for (;;) {
        StreamChunk c = e.next(id, kLongWait);
        out.insert(out.end(), c.tokens.begin(), c.tokens.end());
        if (c.finished != FinishReason::none || c.timed_out) break;
      }
      outs->push_back(out);
    }
  };
  std::vector<std::vector<int>> outs0, outs1;
  std::thread t0(client, 0, &outs0), t1(client, 1, &outs1);
  t0.join();
  t1.join();
  e.stop();
  ASSERT_EQ(outs0.size(), size_t(kPerThread));
  ASSERT_EQ(outs1.size(), size_t(kPerThread));
  for (int i = 0; i < kPerThread; ++i) {
    RequestParams p;
    p.max_tokens = 4;
    p.sampling.request_id = uint64_t(i + 1);
    EXPECT_EQ(outs0[size_t(i)], alone(encode("Thread 0 asks " + std::to_string(i)), p));
    p.sampling.request_id = uint64_t(10 + i + 1);
    EXPECT_EQ(outs1[size_t(i)], alone(encode("Thread 1 asks " + std::to_string(i)), p));
  }
  EXPECT_EQ(e.counters().blocks_used, 0);
  e.check_blocks();
}

}  // namespace
}  // namespace fp4kv::engine
