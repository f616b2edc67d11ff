#include "fp4kv/core/tensor_quant.h"

#include <cmath>
#include <cstring>
#include <string>

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"

namespace fp4kv {

QuantizedTensor quantize_tensor(const float* x, size_t n, KvFormat format, bool search,
                                std::optional<float> global_scale) {
  require(format == KvFormat::nvfp4 || format == KvFormat::mxfp4, "quantize: format must be nvfp4 or mxfp4");
  QuantizedTensor t;
  t.format = format;
  t.size = n;
  const size_t b = size_t(t.block());
  require(n > 0, "quantize: empty input");
  require(n % b == 0, "quantize: " + std::to_string(n) + " values is not a multiple of the " + to_string(format) +
                          " block size " + std::to_string(b));
  if (format == KvFormat::nvfp4) {
    if (global_scale) {
      require(std::isfinite(*global_scale) && *global_scale > 0.0f, "quantize: --global-scale must be finite and > 0");
      t.g = *global_scale;
    } else {
      float amax = 0.0f;
      for (size_t i = 0; i < n; ++i)
        if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
      t.g = nvfp4_global_scale(amax);
    }
  } else {
    require(!global_scale, "quantize: MXFP4 has no global scale");
  }
  t.codes.assign(n / 2, 0);
  t.scales.assign(n / b, 0);
  uint8_t codes[32];
  int bad = 0;
  for (size_t blk = 0; blk < n / b; ++blk) {
    const float* xb = x + blk * b;
    uint8_t s;
    if (format == KvFormat::nvfp4) {
      s = nvfp4_quantize_block(xb, 1, t.g, search, codes, &bad);
      t.alternative_scale_blocks += search && s != nvfp4_block_scale(finite_amax(xb, 16, 1), 6.0f, t.g);
    } else {
      s = mxfp4_quantize_block(xb, 1, search, codes, &bad);
      t.alternative_scale_blocks += search && s != uint8_t(mxfp4_ocp_exponent(finite_amax(xb, 32, 1)) + kE8M0Bias);
    }
    t.scales[blk] = s;
    for (size_t i = 0; i < b; i += 2) t.codes[(blk * b + i) / 2] = pack_e2m1(codes[i], codes[i + 1]);
  }
  t.nonfinite = bad;
  return t;
}

std::vector<float> dequantize_tensor(const QuantizedTensor& t) {
  std::vector<float> out(t.size);
  const size_t b = size_t(t.block());
  for (size_t i = 0; i < t.size; ++i) {
    const uint8_t code = unpack_e2m1(t.codes[i / 2], int(i));
    const uint8_t s = t.scales[i / b];
    out[i] = t.format == KvFormat::nvfp4 ? nvfp4_value(code, s, t.g) : mxfp4_value(code, s);
  }
  return out;
}

std::vector<uint8_t> QuantizedTensor::serialize() const {
  std::vector<uint8_t> out(codes);
  out.insert(out.end(), scales.begin(), scales.end());
  if (format == KvFormat::nvfp4) {
    uint8_t gb[4];
    std::memcpy(gb, &g, 4);  // little-endian hosts only (x86-64, aarch64)
    out.insert(out.end(), gb, gb + 4);
  }
  return out;
}

QuantizedTensor QuantizedTensor::parse(const std::vector<uint8_t>& bytes, KvFormat format, size_t size) {
  QuantizedTensor t;
  t.format = format;
  t.size = size;
  const size_t b = size_t(t.block());
  const size_t want = size / 2 + size / b + (format == KvFormat::nvfp4 ? 4 : 0);
  require(bytes.size() == want, "quantized file has " + std::to_string(bytes.size()) + " bytes, expected " +
                                    std::to_string(want) + " for " + std::to_string(size) + " values");
  t.codes.assign(bytes.begin(), bytes.begin() + size / 2);
  t.scales.assign(bytes.begin() + size / 2, bytes.begin() + size / 2 + size / b);
  if (format == KvFormat::nvfp4) std::memcpy(&t.g, &bytes[size / 2 + size / b], 4);
  return t;
}

}  // namespace fp4kv
