// Whole-tensor NVFP4/MXFP4 quantization (host): blocks of consecutive values, one global
// scale for NVFP4. The file format of `fp4kv quantize`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "fp4kv/core/recipe.h"

namespace fp4kv {

struct QuantizedTensor {
  KvFormat format = KvFormat::nvfp4;  // nvfp4 or mxfp4
  size_t size = 0;                    // number of values
  std::vector<uint8_t> codes;         // size / 2 bytes, element 2i in the low nibble of byte i
  std::vector<uint8_t> scales;        // one E4M3 (NVFP4) or E8M0 (MXFP4) byte per block
  float g = 1.0f;                     // NVFP4 global scale (1 for MXFP4)
  long nonfinite = 0;                 // non-finite inputs, encoded as 0
  long alternative_scale_blocks = 0;  // blocks where the search kept kappa 4 / e_ocp + 1

  int block() const { return format == KvFormat::nvfp4 ? 16 : 32; }
  // codes, then scales, then (NVFP4) the float32 g, little-endian.
  std::vector<uint8_t> serialize() const;
  static QuantizedTensor parse(const std::vector<uint8_t>& bytes, KvFormat format, size_t size);
};

// n must be a positive multiple of the block size. NVFP4 global scale: `global_scale` when
// given (finite, > 0), else amax / 2688 (1 when amax is 0).
QuantizedTensor quantize_tensor(const float* x, size_t n, KvFormat format, bool search,
                                std::optional<float> global_scale = std::nullopt);
std::vector<float> dequantize_tensor(const QuantizedTensor& t);

}  // namespace fp4kv
