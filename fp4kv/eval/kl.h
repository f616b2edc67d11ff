// Teacher-forced KL (paper appendix A; SPEC section 8): every configuration is fed the same
// tokens as the reference, and at each step D_t = sum over the reference's top-k tokens of
// p log(p / p~). Means over steps, then over windows; configurations are compared window
// by window with the paired t statistic.
#pragma once

#include <vector>

namespace fp4kv::eval {

struct KlStats {
  double kl = 0.0;             // mean D_t over the scored steps (nats)
  double top1_mismatch = 0.0;  // fraction of steps whose argmax differs from the reference's
  long steps = 0;
};

// logits: [L][vocab]. Steps t < skip are not scored (the first page, where nothing is
// quantized yet).
KlStats teacher_forced_kl(const std::vector<float>& ref_logits, const std::vector<float>& logits, int L, int vocab,
                          int skip, int topk = 128);

// Paired t statistic of a - b over matched samples: mean(diff) / (sd(diff) / sqrt(n)).
// NaN for a single sample (undefined); 0 when a and b are identical; +-infinity when every
// difference is the same non-zero value.
double paired_t(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace fp4kv::eval
