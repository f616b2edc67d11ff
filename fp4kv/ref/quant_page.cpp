#include "fp4kv/ref/quant_page.h"

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/minifloat.h"

namespace fp4kv::ref {

namespace {
constexpr int P = kPageTokens;

float expanded(KvFormat f, uint8_t code, uint8_t scale) {
  switch (f) {
    case KvFormat::nvfp4: return mul_rn(e2m1_value(code), e4m3_value(scale));
    case KvFormat::mxfp4: return mul_rn(e2m1_value(code), e8m0_value(scale));
    case KvFormat::fp8: return e4m3_value(code);
    default: return 0.0f;
  }
}
}  // namespace

float QuantPage::k_expanded(int t, int c) const {
  const int b = block();
  return expanded(format, k_codes[t * d + c], format == KvFormat::fp8 ? 0 : k_scales[t * (d / b) + c / b]);
}
float QuantPage::v_expanded(int t, int c) const {
  const int b = block();
  return expanded(format, v_codes[c * P + t], format == KvFormat::fp8 ? 0 : v_scales[c * (P / b) + t / b]);
}
float QuantPage::k_value(int t, int c) const { return mul_rn(k_expanded(t, c), k_g); }
float QuantPage::v_value(int t, int c) const { return mul_rn(v_expanded(t, c), v_g); }

QuantPage quantize_page(const float* k, const float* v, int n, int d, const Recipe& recipe, long* nonfinite) {
  require(recipe.kv == KvFormat::nvfp4 || recipe.kv == KvFormat::mxfp4 || recipe.kv == KvFormat::fp8,
          "quantize_page: format " + to_string(recipe.kv) + " has no quantized pages");
  require(n >= 1 && n <= P, "quantize_page: a page holds 1..128 tokens, got " + std::to_string(n));
  QuantPage page;
  page.format = recipe.kv;
  page.d = d;
  page.tokens = n;
  const int b = page.block();
  require(recipe.kv == KvFormat::fp8 || d % b == 0,
          "quantize_page: head_dim " + std::to_string(d) + " is not a multiple of the block size " + std::to_string(b));

  // Zero-padded copies: an unfinished page quantizes as if its missing tokens were zero.
  std::vector<float> kp(size_t(P) * d, 0.0f), vp(size_t(P) * d, 0.0f);
  std::copy(k, k + size_t(n) * d, kp.begin());
  std::copy(v, v + size_t(n) * d, vp.begin());
  int bad = 0;
  page.k_codes.assign(size_t(P) * d, 0);
  page.v_codes.assign(size_t(P) * d, 0);

  if (recipe.kv == KvFormat::fp8) {
    page.k_g = fp8_slice_scale(finite_amax(kp.data(), P * d, 1));
    page.v_g = fp8_slice_scale(finite_amax(vp.data(), P * d, 1));
    for (int t = 0; t < P; ++t) {
      for (int c = 0; c < d; ++c) {
        const float kx = kp[t * d + c], vx = vp[t * d + c];
        bad += !is_finite(kx) + !is_finite(vx);
        page.k_codes[t * d + c] = fp8_encode(kx, page.k_g);
        page.v_codes[c * P + t] = fp8_encode(vx, page.v_g);
      }
    }
  } else {
    const bool nv = recipe.kv == KvFormat::nvfp4;
    if (nv) {
      page.k_g = nvfp4_global_scale(finite_amax(kp.data(), P * d, 1));
      page.v_g = nvfp4_global_scale(finite_amax(vp.data(), P * d, 1));
    }
    page.k_scales.assign(size_t(P) * (d / b), 0);
    page.v_scales.assign(size_t(d) * (P / b), 0);
    uint8_t codes[32];
    for (int t = 0; t < P; ++t) {  // K: token-wise, blocks along channels
      for (int j = 0; j < d / b; ++j) {
        const float* x = &kp[size_t(t) * d + j * b];
        page.k_scales[t * (d / b) + j] = nv ? nvfp4_quantize_block(x, 1, page.k_g, recipe.key_search, codes, &bad)
                                            : mxfp4_quantize_block(x, 1, recipe.key_search, codes, &bad);
        for (int i = 0; i < b; ++i) page.k_codes[t * d + j * b + i] = codes[i];
      }
    }
    for (int c = 0; c < d; ++c) {  // V: channel-wise, blocks along tokens
      for (int j = 0; j < P / b; ++j) {
        const float* x = &vp[size_t(j) * b * d + c];
        page.v_scales[c * (P / b) + j] = nv ? nvfp4_quantize_block(x, d, page.v_g, false, codes, &bad)
                                            : mxfp4_quantize_block(x, d, false, codes, &bad);
        for (int i = 0; i < b; ++i) page.v_codes[c * P + j * b + i] = codes[i];
      }
    }
  }
  if (nonfinite) *nonfinite += bad;
  return page;
}

}  // namespace fp4kv::ref
