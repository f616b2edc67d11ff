// CPU twin of one quantized cache page of one KV head: the oracle the GPU cache is checked
// against byte for byte. Layout here is logical (one code per element, unpacked); the GPU
// byte layout lives in fp4kv/cache/layout.h.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4kv/core/recipe.h"

namespace fp4kv::ref {

struct QuantPage {
  KvFormat format = KvFormat::nvfp4;
  int d = 0;
  int tokens = 0;       // tokens present: 128, or fewer for an unfinished page
  float k_g = 1.0f;     // NVFP4: global scale g; FP8: slice scale; MXFP4: 1
  float v_g = 1.0f;
  std::vector<uint8_t> k_codes;   // [128][d]   token-wise: K blocks run along channels
  std::vector<uint8_t> k_scales;  // [128][d/B]
  std::vector<uint8_t> v_codes;   // [d][128]   channel-wise: V blocks run along tokens
  std::vector<uint8_t> v_scales;  // [d][128/B]

  int block() const { return format == KvFormat::nvfp4 ? 16 : format == KvFormat::mxfp4 ? 32 : 1; }
  // The operand an emulated MMA sees: code * block scale (exact in FP16/BF16), without g.
  float k_expanded(int t, int c) const;
  float v_expanded(int t, int c) const;
  // Dequantized value: expanded * g (one rounding).
  float k_value(int t, int c) const;
  float v_value(int t, int c) const;
};

// Quantizes n <= 128 tokens (k: transformed keys [n][d], v: [n][d]); missing tokens are
// zeros. NVFP4/FP8 slice scales come from the amax over the n present tokens. Counts
// non-finite inputs (encoded as 0) into *nonfinite.
QuantPage quantize_page(const float* k, const float* v, int n, int d, const Recipe& recipe,
                        long* nonfinite = nullptr);

}  // namespace fp4kv::ref
