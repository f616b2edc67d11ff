// The query side of the CPU reference (query_operand.h).
#include "fp4kv/ref/query_operand.h"

#include <string>

#include "fp4kv/core/block_quant.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/operand_quant.h"
#include "fp4kv/core/transform.h"

namespace fp4kv::ref {

float round_operand(float x) { return round_fp16(x); }

void check_head_dim(int d, const Recipe& r) {
  require(d > 0, "head_dim must be positive");
  if (r.rotate_keys)
    require(hadamard_supported(d), "head_dim " + std::to_string(d) +
                                       " is not supported by the Hadamard transform (needs 64, 128, 256 or 512)");
  if (r.fp4()) require(d % r.block() == 0, "head_dim " + std::to_string(d) + " is not a multiple of the " +
                                               to_string(r.kv) + " block size " + std::to_string(r.block()));
}

// q' for one head: non-finite elements become 0 (they must not poison anything), then
// the recipe's rotation.
std::vector<float> transformed_query(const float* q, int d, const Recipe& r) {
  std::vector<float> x(d), out(d);
  for (int i = 0; i < d; ++i) x[i] = is_finite(q[i]) ? q[i] : 0.0f;
  transform_query(x.data(), d, r.rotate_keys, out.data());
  return out;
}

// Quantizes x (standard rule, no search) and returns the term and the residual x - deq.
Fp4Term quantize_term(const std::vector<float>& x, KvFormat f, std::vector<float>* residual) {
  const int d = int(x.size());
  Fp4Term t;
  t.expanded.resize(d);
  t.dequant.resize(d);
  if (residual) residual->resize(d);
  uint8_t codes[32];
  if (f == KvFormat::nvfp4) {
    t.g = nvfp4_global_scale(finite_amax(x.data(), d, 1));
    for (int j = 0; j < d; j += kNvfp4Block) {
      const uint8_t s = nvfp4_quantize_block(&x[j], 1, t.g, false, codes);
      for (int i = 0; i < kNvfp4Block; ++i) t.expanded[j + i] = mul_rn(e2m1_value(codes[i]), e4m3_value(s));
      if (residual) nvfp4_block_residual(&x[j], codes, s, t.g, &(*residual)[j]);
    }
  } else {
    for (int j = 0; j < d; j += kMxfp4Block) {
      const uint8_t s = mxfp4_quantize_block(&x[j], 1, false, codes);
      for (int i = 0; i < kMxfp4Block; ++i) t.expanded[j + i] = mul_rn(e2m1_value(codes[i]), e8m0_value(s));
      if (residual) mxfp4_block_residual(&x[j], codes, s, &(*residual)[j]);
    }
  }
  for (int i = 0; i < d; ++i) t.dequant[i] = mul_rn(t.expanded[i], t.g);
  return t;
}

std::vector<QueryOperand> make_query_operands(const float* q, int G, int d, const Recipe& r) {
  std::vector<QueryOperand> ops(G);
  for (int h = 0; h < G; ++h) ops[h].full = transformed_query(q + size_t(h) * d, d, r);
  if (!(r.fp4() || r.kv == KvFormat::fp8)) return ops;  // only BF16 tokens
  std::vector<float> qbar;
  if (r.query == QueryFormat::smooth_fp4) {
    qbar.assign(d, 0.0f);
    for (int h = 0; h < G; ++h)
      for (int i = 0; i < d; ++i) qbar[i] = add_rn(qbar[i], ops[h].full[i]);
    for (int i = 0; i < d; ++i) qbar[i] = div_rn(qbar[i], float(G));
  }
  for (int h = 0; h < G; ++h) {
    QueryOperand& op = ops[h];
    switch (r.query) {
      case QueryFormat::full: {
        Fp4Term t;
        t.expanded.resize(d);
        for (int i = 0; i < d; ++i) t.expanded[i] = round_operand(op.full[i]);
        t.dequant = t.expanded;
        op.terms.push_back(std::move(t));
        break;
      }
      case QueryFormat::fp8: {  // E4M3 codes with the head's FP32 scale amax / 448
        Fp4Term t;
        t.g = fp8_slice_scale(finite_amax(op.full.data(), d, 1));
        t.expanded.resize(d);
        t.dequant.resize(d);
        for (int i = 0; i < d; ++i) {
          t.expanded[i] = e4m3_value(fp8_encode(op.full[i], t.g));
          t.dequant[i] = mul_rn(t.expanded[i], t.g);
        }
        op.terms.push_back(std::move(t));
        break;
      }
      case QueryFormat::fp4: op.terms.push_back(quantize_term(op.full, r.kv, nullptr)); break;
      case QueryFormat::dual_fp4: {
        std::vector<float> residual;
        op.terms.push_back(quantize_term(op.full, r.kv, &residual));
        op.terms.push_back(quantize_term(residual, r.kv, nullptr));
        break;
      }
      case QueryFormat::smooth_fp4: {
        std::vector<float> x(d);
        for (int i = 0; i < d; ++i) x[i] = sub_rn(op.full[i], qbar[i]);
        op.terms.push_back(quantize_term(x, r.kv, nullptr));
        op.qbar = qbar;
        break;
      }
    }
  }
  return ops;
}


// Logit of quantized key `i` of `page`: ((sum_t dot_t * g_t) * g_K) * gamma.
float page_logit(const QueryOperand& op, const QuantPage& page, int i, float gamma) {
  const int d = page.d;
  float acc = 0.0f;
  for (size_t t = 0; t < op.terms.size(); ++t) {
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += double(op.terms[t].expanded[c]) * double(page.k_expanded(i, c));
    const float term = mul_rn(float(dot), op.terms[t].g);
    acc = t == 0 ? term : add_rn(acc, term);
  }
  if (!op.qbar.empty()) {
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += double(op.qbar[c]) * double(page.k_expanded(i, c));
    acc = add_rn(acc, float(dot));
  }
  return mul_rn(mul_rn(acc, page.k_g), gamma);
}

}  // namespace fp4kv::ref
