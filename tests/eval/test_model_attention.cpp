// The model runner with the recipes' attention against Hugging Face transformers' logits
// (models/pk8l/reference_activations.safetensors): exact with `fp32`, BF16 K/V rounding
// with `bf16`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "fp4kv/eval/model_attention.h"
#include "fp4kv/model/qwen3.h"
#include "fp4kv/model/safetensors.h"

namespace fp4kv::eval {
namespace {

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(ModelAttention, RecipesAgainstTransformersLogits) {
  const std::string dir = std::string(FP4KV_SOURCE_DIR) + "/models/pk8l";
  const model::Qwen3Model m = model::Qwen3Model::load(dir);
  const auto ref = model::SafetensorsFile::open(dir + "/reference_activations.safetensors");
  const std::vector<int32_t> ids = ref.read_i32("input_ids");
  const std::vector<float> want = ref.read_f32("logits");
  const std::vector<int> tokens(ids.begin(), ids.end());
  const double fp32 = rel_error(m.forward(tokens, recipe_attention(m.config(), parse_recipe("fp32"), nullptr)), want);
  const double bf16 = rel_error(m.forward(tokens, recipe_attention(m.config(), parse_recipe("bf16"), nullptr)), want);
  std::printf("logits vs transformers: fp32 recipe %.3g, bf16 recipe %.3g\n", fp32, bf16);
  EXPECT_LT(fp32, 1e-5);  // float32 summation order only
  EXPECT_LT(bf16, 1e-2);  // K and V rounded to BF16 (8 significant bits) in every layer
  EXPECT_GT(bf16, fp32);  // ... and the rounding is really applied
}

}  // namespace
}  // namespace fp4kv::eval
