// The GPU engine against its references: pk8l's logits on the GPU against transformers'
// float32 logits (reference_activations.safetensors) and against the CPU runner over the same
// recipe's cache; a small Qwen3-MoE checkpoint against the CPU runner; graph replay against
// eager steps (bit-identical); a batch against its rows run alone; sampling determinism; the
// errors of bad steps. Every test skips without a GPU.
//
// Tolerances. The GPU engine runs transformers' BF16 arithmetic (BF16 activations rounded at
// the points ops/*.h list), the references run in float32; a BF16 rounding is a relative
// error of at most 2^-9 per element, and pk8l's 8 layers compound them into logit errors of a
// few hundredths on logits of magnitude ~10. The KL of two softmaxes whose logits differ by
// e is ~var(e)/2, so a logit noise of 0.05 gives a KL of ~1e-3. The bounds below (mean KL
// 5e-3, top-1 agreement on 95 % of positions) leave ~5x margin over that and still fail for
// any real defect (a wrong layer, a transposed weight, a RoPE offset: KL > 0.1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"
#include "fp4kv/engine/gpu_generator.h"
#include "fp4kv/engine/gpu_model.h"
#include "fp4kv/engine/gpu_weights.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/eval/kl.h"
#include "fp4kv/eval/model_attention.h"
#include "fp4kv/model/qwen3.h"
#include "fp4kv/model/safetensors.h"
#include "fp4kv/testing/cuda_testing.h"
#include "../model/fixtures.h"

namespace fp4kv::engine {
namespace {

std::string pk8l_dir() { return std::string(FP4KV_SOURCE_DIR) + "/models/pk8l"; }

int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

// Mean KL(want || got) over every row (the whole vocabulary: eval's teacher-forced KL with
// nothing skipped) and the fraction of rows with the same most likely token.
struct Agreement {
  double mean_kl = 0, top1 = 0;
};
Agreement compare(const std::vector<float>& want, const std::vector<float>& got, int rows, int vocab) {
  const eval::KlStats st = eval::teacher_forced_kl(want, got, rows, vocab, /*skip=*/0, /*topk=*/vocab);
  return Agreement{st.kl, 1.0 - st.top1_mismatch};
}

// Logits [n][vocab] of one sequence, teacher-forced through the engine.
std::vector<float> engine_logits(GpuModel& model, const std::vector<int>& tokens) {
  return forced_logits_on_gpu(model, std::vector<std::vector<int>>{tokens})[0];
}

GpuModelOptions small_options(int max_batch, int max_context) {
  GpuModelOptions o;
  o.max_batch = max_batch;
  o.max_context = max_context;
  return o;
}

struct Reference {
  std::vector<int> tokens;
  std::vector<float> logits;  // transformers float32, [256][264]
};
Reference reference() {
  const auto f = model::SafetensorsFile::open(pk8l_dir() + "/reference_activations.safetensors");
  Reference r;
  for (int32_t t : f.read_i32("input_ids")) r.tokens.push_back(t);
  r.logits = f.read_f32("logits");
  return r;
}

TEST(GpuModel, Pk8lBf16CacheMatchesTransformersFloat32) {
  SKIP_WITHOUT_GPU();
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  GpuModel model(w, parse_recipe("bf16"), nullptr, small_options(1, 512));
  const Reference ref = reference();
  const std::vector<float> got = engine_logits(model, ref.tokens);
  const Agreement a = compare(ref.logits, got, int(ref.tokens.size()), w.config().vocab_size);
  std::printf("pk8l bf16 engine vs transformers fp32: mean KL %.3g, top-1 %.3f\n", a.mean_kl, a.top1);
  EXPECT_LT(a.mean_kl, 5e-3);
  EXPECT_GE(a.top1, 0.95);
}

TEST(GpuModel, Pk8lNvfp4MatchesCpuRunnerOverTheSameRecipe) {
  SKIP_WITHOUT_GPU();
  const model::Qwen3Model cpu = model::Qwen3Model::load(pk8l_dir());
  const eval::Calibration cal = eval::Calibration::load(pk8l_dir() + "/" + eval::kCalibrationFile, cpu.config());
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  const Reference ref = reference();
  // 256 tokens: two full pages, so the second page is read quantized by later positions.
  // The last row: the GEMV path (the benchmarks' tuned plans at batch 1).
  for (const auto& [preset, plans] : {std::pair{"nvfp4", GemmPlans::heuristic}, std::pair{"mxfp4", GemmPlans::heuristic},
                                     std::pair{"fp8", GemmPlans::heuristic},
                                     std::pair{"nvfp4-native", GemmPlans::heuristic},
                                     std::pair{"nvfp4", GemmPlans::gemv}}) {
    Recipe recipe = parse_recipe(preset);
    GpuModelOptions o = small_options(1, 512);
    o.gemm_plans = plans;
    GpuModel model(w, recipe, cal.mu_k.data(), o);
    const std::vector<float> gpu = engine_logits(model, ref.tokens);
    const std::vector<float> want = cpu.forward(ref.tokens, eval::recipe_attention(cpu.config(), recipe, &cal));
    const Agreement a = compare(want, gpu, int(ref.tokens.size()), w.config().vocab_size);
    const Agreement to_fp32 = compare(ref.logits, gpu, int(ref.tokens.size()), w.config().vocab_size);
    const Agreement cpu_to_fp32 = compare(ref.logits, want, int(ref.tokens.size()), w.config().vocab_size);
    std::printf("pk8l %s%s: engine vs CPU runner mean KL %.3g (top-1 %.3f); vs fp32: engine %.3g, CPU %.3g\n", preset,
                plans == GemmPlans::gemv ? " (GEMV plans)" : "", a.mean_kl, a.top1, to_fp32.mean_kl,
                cpu_to_fp32.mean_kl);
    EXPECT_LT(a.mean_kl, 5e-3) << preset;
    EXPECT_GE(a.top1, 0.95) << preset;
  }
}

TEST(GpuModel, GraphReplayIsBitIdenticalToEagerSteps) {
  SKIP_WITHOUT_GPU();
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  std::vector<int> tokens = reference().tokens;
  tokens.resize(300);  // past two pages: promotions inside the replayed steps
  for (size_t i = 256; i < tokens.size(); ++i) tokens[i] = tokens[i - 200];
  // And the GEMV path.
  for (const auto& [preset, plans] : {std::pair{"nvfp4", GemmPlans::heuristic}, std::pair{"bf16", GemmPlans::heuristic},
                                     std::pair{"nvfp4", GemmPlans::gemv}}) {
    // One model (one set of GEMM plans), the sequence run eagerly and then replayed.
    GpuModelOptions o = small_options(1, 512);
    o.cuda_graphs = false;
    o.gemm_plans = plans;
    GpuModel model(w, parse_recipe(preset), nullptr, o);
    const std::vector<float> eager = engine_logits(model, tokens);
    EXPECT_FALSE(model.last_step_replayed());
    model.set_cuda_graphs(true);
    const std::vector<float> replayed = engine_logits(model, tokens);
    EXPECT_TRUE(model.last_step_replayed());
    ASSERT_EQ(eager.size(), replayed.size());
    size_t differ = 0;
    for (size_t i = 0; i < eager.size(); ++i) differ += std::memcmp(&eager[i], &replayed[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << preset << (plans == GemmPlans::gemv ? " (GEMV plans)" : "");
  }
}

// Graphs captured ahead (prepare_steps) replay the same steps as graphs captured on first use:
// three sequences of different lengths run as rows of batch 3, then 2, then 1.
TEST(GpuModel, PreparedStepsMatchStepsPreparedOnFirstUse) {
  SKIP_WITHOUT_GPU();
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  const std::vector<int> ref = reference().tokens;
  const std::vector<std::vector<int>> seqs = {std::vector<int>(ref.begin(), ref.begin() + 140),
                                              std::vector<int>(ref.begin() + 7, ref.begin() + 90),
                                              std::vector<int>(ref.begin() + 30, ref.begin() + 61)};
  GpuModel lazy(w, parse_recipe("nvfp4"), nullptr, small_options(3, 256));
  GpuModel prepared(w, parse_recipe("nvfp4"), nullptr, small_options(3, 256));
  EXPECT_THROW(prepared.prepare_steps(0), Error);
  EXPECT_THROW(prepared.prepare_steps(4), Error);
  prepared.prepare_steps(3);
  const std::vector<std::vector<float>> a = forced_logits_on_gpu(lazy, seqs);
  const std::vector<std::vector<float>> b = forced_logits_on_gpu(prepared, seqs);
  EXPECT_TRUE(prepared.last_step_replayed());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4), 0) << "sequence " << i;
  }
}

TEST(GpuModel, BatchedRowsMatchEachRowAlone) {
  SKIP_WITHOUT_GPU();
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  const std::vector<int> base = reference().tokens;
  std::vector<std::vector<int>> seqs(3);
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < 160; ++t) seqs[s].push_back(base[(t * (s + 1) + 7 * s) % base.size()]);
  // Unequal lengths: rows leave the batch as their sequences end.
  seqs[1].resize(100);
  seqs[2].resize(131);
  // GEMV plans: the serving path at 1-8 rows (its k-slices differ between 1-3 rows, W staged,
  // and 4-8, W in registers).
  for (const GemmPlans plans : {GemmPlans::heuristic, GemmPlans::gemv}) {
    GpuModelOptions o = small_options(3, 256);
    o.gemm_plans = plans;
    GpuModel model(w, parse_recipe("nvfp4"), nullptr, o);
    const std::vector<std::vector<float>> batched = forced_logits_on_gpu(model, seqs);
    for (int s = 0; s < 3; ++s) {
      GpuModelOptions one = small_options(1, 256);
      one.gemm_plans = plans;
      GpuModel alone(w, parse_recipe("nvfp4"), nullptr, one);
      const std::vector<float> single = engine_logits(alone, seqs[s]);
      // Only the GEMMs' accumulation order may differ with the row count (cuBLASLt picks an
      // algorithm per shape, the GEMV its k-slices) and the attention's split plan: BF16-ulp
      // noise, far below the model-vs-reference bounds.
      const Agreement a = compare(single, batched[s], int(seqs[s].size()), w.config().vocab_size);
      std::printf("row %d batched vs alone%s: mean KL %.3g, top-1 %.3f\n", s,
                  plans == GemmPlans::gemv ? " (GEMV plans)" : "", a.mean_kl, a.top1);
      EXPECT_LT(a.mean_kl, 1e-3) << s;
      EXPECT_GE(a.top1, 0.97) << s;
    }
  }
}

TEST(GpuModel, SamplingIsDeterministicForASeed) {
  SKIP_WITHOUT_GPU();
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  GpuModel model(w, parse_recipe("nvfp4"), nullptr, small_options(1, 512));
  const std::vector<int> ref_tokens = reference().tokens;
  const std::vector<int> prompt(ref_tokens.begin(), ref_tokens.begin() + 40);
  auto run = [&](uint64_t seed, float temperature) {
    GenerateOptions o;
    o.max_tokens = 48;
    o.stop_at_eos = false;
    o.sampling.temperature = temperature;
    o.sampling.top_p = 0.95f;
    o.sampling.seed = seed;
    std::vector<int> out;
    generate_on_gpu(model, prompt, o, [&](int t) { out.push_back(t); });
    return out;
  };
  EXPECT_EQ(run(7, 1.0f), run(7, 1.0f));
  EXPECT_NE(run(7, 1.0f), run(8, 1.0f));
  // Greedy draws are the argmax of the step's logits.
  model.step(consecutive_rows(1, model.max_pages(), 1, prompt[0]));
  const std::vector<float> logits = model.read_logits();
  EXPECT_EQ(model.sample({SamplingRow{}})[0], argmax(logits.data(), w.config().vocab_size));
  model.release(0);
}

TEST(GpuModel, BadStepsAreClearErrors) {
  SKIP_WITHOUT_GPU();
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  GpuModel model(w, parse_recipe("nvfp4"), nullptr, small_options(1, 256));
  StepRows rows;
  rows.tokens = {5};
  rows.seq_lens = {1};
  rows.block_tables = {0, 1};
  auto message_of = [&](const StepRows& r) -> std::string {
    try {
      model.step(r);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  StepRows bad = rows;
  bad.tokens = {264};
  EXPECT_NE(message_of(bad).find("outside the vocabulary"), std::string::npos);
  bad = rows;
  bad.seq_lens = {257};
  EXPECT_NE(message_of(bad).find("max_context"), std::string::npos);
  bad = rows;
  bad.block_tables = {2, 1};
  EXPECT_NE(message_of(bad).find("outside the cache"), std::string::npos);
  EXPECT_THROW(model.sample({SamplingRow{}, SamplingRow{}}), Error);  // no step ran
  GenerateOptions o;
  o.max_tokens = 300;
  EXPECT_THROW(generate_on_gpu(model, {1, 2, 3}, o, [](int) {}), Error);  // beyond max_context
  o.max_tokens = 4;
  EXPECT_THROW(generate_on_gpu(model, {}, o, [](int) {}), Error);
}

// The tensor-core prefill (GpuModel::prefill): the last token's logits of prompts cut at
// page edges and inside pages, in chunks of 128 and of 48 (so the prefix is read from the
// cache's pages and slot rows by later chunks), against transformers' float32 logits at that
// position, with the file's bounds; every preset, since the prefix is read in its format.
TEST(GpuModel, PrefillLastLogitsMatchTransformersFloat32) {
  SKIP_WITHOUT_GPU();
  const model::Qwen3Model cpu = model::Qwen3Model::load(pk8l_dir());
  const eval::Calibration cal = eval::Calibration::load(pk8l_dir() + "/" + eval::kCalibrationFile, cpu.config());
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  const Reference ref = reference();
  const int vocab = w.config().vocab_size;
  for (const char* preset : {"bf16", "nvfp4", "mxfp4", "fp8", "nvfp4-native"}) {
    for (int chunk : {128, 48}) {
      GpuModelOptions o = small_options(1, 512);
      o.prefill_chunk = chunk;
      GpuModel model(w, parse_recipe(preset), cal.mu_k.data(), o);
      const std::vector<int32_t> row = consecutive_rows(1, model.max_pages()).block_tables;
      std::vector<float> want, got;
      for (int n : {1, 17, 128, 129, 200, 256}) {
        model.prefill(std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + n), 0, row);
        const std::vector<float> logits = model.read_logits();
        got.insert(got.end(), logits.begin(), logits.end());
        want.insert(want.end(), ref.logits.begin() + size_t(n - 1) * vocab, ref.logits.begin() + size_t(n) * vocab);
        model.release(row[0]);
      }
      const Agreement a = compare(want, got, 6, vocab);
      std::printf("pk8l %s prefill in chunks of %d vs transformers fp32: mean KL %.3g, top-1 %.3f\n", preset, chunk,
                  a.mean_kl, a.top1);
      EXPECT_LT(a.mean_kl, 5e-3) << preset << " chunk " << chunk;
      EXPECT_GE(a.top1, 5.0 / 6.0) << preset << " chunk " << chunk;
    }
  }
}

// Decode steps continue a prefilled prompt: tokens 200..255 forced through step() after a
// prefill of the first 200, against transformers' logits at those positions.
TEST(GpuModel, DecodeStepsContinueAPrefill) {
  SKIP_WITHOUT_GPU();
  const model::Qwen3Model cpu = model::Qwen3Model::load(pk8l_dir());
  const eval::Calibration cal = eval::Calibration::load(pk8l_dir() + "/" + eval::kCalibrationFile, cpu.config());
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  const Reference ref = reference();
  const int vocab = w.config().vocab_size, first = 200, n = int(ref.tokens.size());
  GpuModelOptions o = small_options(1, 512);
  o.prefill_chunk = 128;
  GpuModel model(w, parse_recipe("nvfp4"), cal.mu_k.data(), o);
  StepRows rows = consecutive_rows(1, model.max_pages());
  model.prefill(std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + first), 0, rows.block_tables);
  std::vector<float> got = model.read_logits();
  for (int t = first; t + 1 < n; ++t) {
    rows.tokens[0] = ref.tokens[size_t(t)];
    rows.seq_lens[0] = t + 1;
    model.step(rows);
    const std::vector<float> logits = model.read_logits();
    got.insert(got.end(), logits.begin(), logits.end());
  }
  const std::vector<float> want(ref.logits.begin() + size_t(first - 1) * vocab, ref.logits.begin() + size_t(n - 1) * vocab);
  const Agreement a = compare(want, got, n - first, vocab);
  std::printf("pk8l nvfp4 prefill of %d, then %d decode steps, vs transformers fp32: mean KL %.3g, top-1 %.3f\n",
              first, n - 1 - first, a.mean_kl, a.top1);
  EXPECT_LT(a.mean_kl, 5e-3);
  EXPECT_GE(a.top1, 0.95);
}

TEST(GpuModel, BadPrefillsAreClearErrors) {
  SKIP_WITHOUT_GPU();
  const GpuWeights w = GpuWeights::load(pk8l_dir());
  GpuModel plain(w, parse_recipe("nvfp4"), nullptr, small_options(1, 256));
  EXPECT_THROW(plain.prefill({1, 2}, 0, {0, 1}), Error);  // built without prefill_chunk
  GpuModelOptions o = small_options(1, 256);
  o.prefill_chunk = 64;
  GpuModel model(w, parse_recipe("nvfp4"), nullptr, o);
  auto message_of = [&](const std::vector<int32_t>& tokens, int start, const std::vector<int32_t>& row) -> std::string {
    try {
      model.prefill(tokens, start, row);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message_of({264}, 0, {0, 1}).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(message_of({1}, 256, {0, 1}).find("max_context"), std::string::npos);
  EXPECT_NE(message_of({}, 0, {0, 1}).find("none"), std::string::npos);
  EXPECT_NE(message_of({1}, 0, {2, 1}).find("outside the cache"), std::string::npos);
  EXPECT_NE(message_of({1}, 0, {0}).find("max_pages"), std::string::npos);
  GpuModelOptions too_big = small_options(1, 256);
  too_big.prefill_chunk = 1 << 20;
  EXPECT_THROW(GpuModel(w, parse_recipe("nvfp4"), nullptr, too_big), Error);
}

// A small Qwen3-MoE checkpoint (BF16 tensors, so both sides read the same weights): layer 0
// sparse, layer 1 dense (mlp_only_layers). With every expert chosen (top_k = experts) no
// routing decision can flip between the engine's BF16 router logits and the runner's float32
// ones, and the engine must agree with the runner as pk8l does (the file's bounds). With
// top_k < experts a token whose k-th and (k+1)-th router probabilities lie within the BF16
// noise may pick another expert on the GPU; those positions differ, so that case is held to
// top-1 agreement on 90 % of positions and a mean KL of 0.05 (a wrong expert layout, weight or
// combine order gives KLs near 1). ops/moe's tests check the routing itself bit for bit.
nlohmann::json small_moe_config(int experts, int top_k) {
  nlohmann::json c = model::testing::tiny_moe_config();
  c["vocab_size"] = 300;
  c["hidden_size"] = 256;
  c["intermediate_size"] = 384;
  c["num_attention_heads"] = 8;  // pk8l's attention shape: 4 query heads per KV head, d 128
  c["num_key_value_heads"] = 2;
  c["head_dim"] = 128;
  c["max_position_embeddings"] = 4096;
  c["num_experts"] = experts;
  c["num_experts_per_tok"] = top_k;
  c["moe_intermediate_size"] = 96;
  c["eos_token_id"] = 299;
  return c;
}

std::vector<model::testing::RawTensor> as_bf16_tensors(const std::vector<model::testing::RawTensor>& f32) {
  std::vector<model::testing::RawTensor> out;
  for (const auto& t : f32) {
    std::vector<float> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    out.push_back(model::testing::bf16_tensor(t.name, t.shape, v));
  }
  return out;
}

TEST(GpuModel, Qwen3MoeMatchesCpuRunner) {
  SKIP_WITHOUT_GPU();
  std::vector<int> tokens;
  for (int t = 0; t < 200; ++t) tokens.push_back((t * 37 + 11) % 300);
  for (const auto& [experts, top_k] : {std::pair{8, 8}, std::pair{16, 4}}) {
    model::testing::TempDir dir;
    const nlohmann::json c = small_moe_config(experts, top_k);
    model::testing::write_checkpoint(dir.str(), c, as_bf16_tensors(model::testing::qwen3_tensors(c, 21)));
    const model::Qwen3Model cpu = model::Qwen3Model::load(dir.str());
    const GpuWeights w = GpuWeights::load(dir.str());
    ASSERT_TRUE(w.layer(0).sparse());
    ASSERT_FALSE(w.layer(1).sparse());
    GpuModelOptions o = small_options(1, 512);
    o.cuda_graphs = false;
    GpuModel model(w, parse_recipe("bf16"), nullptr, o);
    const std::vector<float> eager = engine_logits(model, tokens);
    model.set_cuda_graphs(true);
    const std::vector<float> replayed = engine_logits(model, tokens);
    EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), eager.size() * 4), 0) << experts << " experts";
    const Agreement a = compare(cpu.forward(tokens), replayed, int(tokens.size()), 300);
    std::printf("Qwen3-MoE (%d experts, %d per token) engine bf16 vs CPU runner fp32: mean KL %.3g, top-1 %.3f\n",
                experts, top_k, a.mean_kl, a.top1);
    if (top_k == experts) {
      EXPECT_LT(a.mean_kl, 5e-3);
      EXPECT_GE(a.top1, 0.95);
    } else {
      EXPECT_LT(a.mean_kl, 5e-2);
      EXPECT_GE(a.top1, 0.90);
    }
    // The tensor-core prefill runs the same MoE block over a chunk's rows: the last token's
    // logits of prompts cut at 1, 77, 128 and 200 tokens, in chunks of 64.
    GpuModelOptions po = small_options(1, 512);
    po.prefill_chunk = 64;
    GpuModel prefill_model(w, parse_recipe("bf16"), nullptr, po);
    const std::vector<int32_t> row = consecutive_rows(1, prefill_model.max_pages()).block_tables;
    std::vector<float> want, got;
    for (int n : {1, 77, 128, 200}) {
      prefill_model.prefill(std::vector<int32_t>(tokens.begin(), tokens.begin() + n), 0, row);
      const std::vector<float> logits = prefill_model.read_logits();
      got.insert(got.end(), logits.begin(), logits.end());
      want.insert(want.end(), eager.begin() + size_t(n - 1) * 300, eager.begin() + size_t(n) * 300);
      prefill_model.release(row[0]);
    }
    const Agreement p = compare(want, got, 4, 300);
    std::printf("Qwen3-MoE (%d experts, %d per token) prefill vs decode steps: mean KL %.3g, top-1 %.3f\n", experts,
                top_k, p.mean_kl, p.top1);
    EXPECT_LT(p.mean_kl, top_k == experts ? 5e-3 : 5e-2) << experts << " experts";
  }
}

TEST(GpuWeights, RandomShapesRunAndNamesAreChecked) {
  std::string shape;
  EXPECT_TRUE(is_random_model_spec("qwen3-4b:random", &shape));
  EXPECT_EQ(shape, "qwen3-4b");
  EXPECT_FALSE(is_random_model_spec("models/pk8l", &shape));
  EXPECT_THROW(known_shape("qwen3-5b"), Error);
  EXPECT_EQ(known_shape("qwen3-4b").num_hidden_layers, 36);
  const model::Qwen3Config moe = known_shape("qwen3-30b-a3b");
  EXPECT_EQ(moe.num_experts, 128);
  EXPECT_EQ(moe.num_experts_per_tok, 8);
  EXPECT_TRUE(moe.is_sparse_layer(47));
  SKIP_WITHOUT_GPU();
  const GpuWeights w = GpuWeights::random(known_shape("qwen3-0.6b"), 3);
  GpuModel model(w, parse_recipe("nvfp4"), nullptr, small_options(2, 1024));
  StepRows rows = consecutive_rows(2, model.max_pages());
  rows.tokens = {11, 151000};
  model.step(rows);
  const std::vector<float> logits = model.read_logits();
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace fp4kv::engine
