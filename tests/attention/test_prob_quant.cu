// The decode kernel's branch-free P quantization (core/operand_quant.h: div_rn_above_tiny,
// div_rn_by_6, e2m1_round_value, nvfp4_prob_scale_value, nvfp4_prob_value) against the code path of the
// CPU reference (nvfp4_prob_scale, nvfp4_prob_code, e2m1_encode, e2m1_value, e4m3_value with
// IEEE division), both run on the GPU, exhaustively: every float input of the range the
// kernel can produce, against every E4M3 scale. The decode tests cannot see a difference
// here (one E2M1 step of one probability hides inside their tolerance), so this one must
// find it. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "fp4kv/core/operand_quant.h"
#include "harness.h"

namespace fp4kv::test {
namespace {

struct Mismatch {
  unsigned long long count;
  uint32_t input, scale_code;  // the first one seen
  float got, want;
};

__device__ void record(Mismatch* m, uint32_t input, uint32_t scale_code, float got, float want) {
  if (atomicAdd(&m->count, 1ull) == 0ull) {
    m->input = input;
    m->scale_code = scale_code;
    m->got = got;
    m->want = want;
  }
}

__device__ bool same(float a, float b) { return __float_as_uint(a) == __float_as_uint(b); }

// Float bit patterns [lo, hi) by a grid-stride loop, one E4M3 code per grid row.
#define FOR_EACH_BITS(u, lo, hi) \
  for (uint32_t u = (lo) + blockIdx.x * blockDim.x + threadIdx.x; u < (hi); u += gridDim.x * blockDim.x)

// Every p in [0, 16) (p = c * exp2(.) <= c = 8) against every E4M3 value s >= 0 (codes 0..126).
__global__ void prob_value_kernel(Mismatch* m) {
  const uint32_t code = blockIdx.y;
  const float s = e4m3_value(uint8_t(code));
  FOR_EACH_BITS(u, 0u, 0x41800000u) {
    const float p = __uint_as_float(u);
    const float got = nvfp4_prob_value(p, s);
    const float want = __fmul_rn(e2m1_value(nvfp4_prob_code(p, s)), s);
    if (!same(got, want)) record(m, u, code, got, want);
  }
}

// Every pmax in [0, 256) with the standard and the underflow-aware rule, for two tau.
__global__ void prob_scale_kernel(Mismatch* m) {
  const bool underflow_aware = blockIdx.y & 1u;
  const float tau = (blockIdx.y & 2u) ? 21.0f / 1024.0f : e4m3_value(3);
  FOR_EACH_BITS(u, 0u, 0x43800000u) {
    const float pmax = __uint_as_float(u);
    const float got = nvfp4_prob_scale_value(pmax, underflow_aware, tau);
    const float want = e4m3_value(nvfp4_prob_scale(pmax, underflow_aware, tau));
    if (!same(got, want)) record(m, u, blockIdx.y, got, want);
  }
}

// Every finite x >= 0.
__global__ void e2m1_round_kernel(Mismatch* m) {
  FOR_EACH_BITS(u, 0u, 0x7f800000u) {
    const float x = __uint_as_float(u);
    const float got = e2m1_round_value(x);
    const float want = e2m1_value(e2m1_encode(x));
    if (!same(got, want)) record(m, u, 0, got, want);
  }
}

// Every a in [2^-100, 2^64) over every positive E4M3 value b (codes 1..126); below 2^-100
// a quotient below 2^-88.
__global__ void division_kernel(Mismatch* m) {
  const uint32_t code = blockIdx.y + 1;
  const float b = e4m3_value(uint8_t(code));
  FOR_EACH_BITS(u, 0u, 0x5f800000u) {
    const float a = __uint_as_float(u);
    const float got = div_rn_above_tiny(a, b);
    if (u < 0x0d800000u) {
      if (!(fabsf(got) < 0x1p-88f)) record(m, u, code, got, 0.0f);
    } else {
      const float want = __fdiv_rn(a, b);
      if (!same(got, want)) record(m, u, code, got, want);
    }
  }
}

// Every a in [2^-110, 2^70) divided by 6; below 2^-110 a quotient below 2^-100.
__global__ void division_by_6_kernel(Mismatch* m) {
  FOR_EACH_BITS(u, 0u, 0x62800000u) {
    const float a = __uint_as_float(u);
    const float got = div_rn_by_6(a);
    if (u < 0x08800000u) {
      if (!(fabsf(got) < 0x1p-100f)) record(m, u, 6, got, 0.0f);
    } else {
      const float want = __fdiv_rn(a, 6.0f);
      if (!same(got, want)) record(m, u, 6, got, want);
    }
  }
}

template <class Kernel>
Mismatch run(Kernel kernel, unsigned rows) {
  Mismatch* d = nullptr;
  Mismatch h{};
  EXPECT_EQ(cudaMalloc(&d, sizeof(Mismatch)), cudaSuccess);
  EXPECT_EQ(cudaMemset(d, 0, sizeof(Mismatch)), cudaSuccess);
  kernel<<<dim3(1024, rows), 256>>>(d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(&h, d, sizeof(Mismatch), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  return h;
}

#define EXPECT_NO_MISMATCH(m, what)                                                                       \
  EXPECT_EQ((m).count, 0ull) << what << ": first at input bits 0x" << std::hex << (m).input << std::dec \
                             << ", scale/case " << (m).scale_code << ": got " << (m).got << ", want " << (m).want

TEST(ProbQuantGpu, ValueEqualsCodeTimesScaleForEveryPAndScale) {
  SKIP_WITHOUT_GPU();
  EXPECT_NO_MISMATCH(run(prob_value_kernel, 127), "nvfp4_prob_value");
}

TEST(ProbQuantGpu, ScaleValueEqualsTheEncodedScale) {
  SKIP_WITHOUT_GPU();
  EXPECT_NO_MISMATCH(run(prob_scale_kernel, 4), "nvfp4_prob_scale_value");
}

TEST(ProbQuantGpu, E2M1RoundValueEqualsEncodeThenValue) {
  SKIP_WITHOUT_GPU();
  EXPECT_NO_MISMATCH(run(e2m1_round_kernel, 1), "e2m1_round_value");
}

TEST(ProbQuantGpu, FastDivisionIsCorrectlyRoundedByEveryE4M3Value) {
  SKIP_WITHOUT_GPU();
  EXPECT_NO_MISMATCH(run(division_kernel, 126), "div_rn_above_tiny");
}

TEST(ProbQuantGpu, DivisionBySixIsCorrectlyRounded) {
  SKIP_WITHOUT_GPU();
  EXPECT_NO_MISMATCH(run(division_by_6_kernel, 1), "div_rn_by_6");
}

}  // namespace
}  // namespace fp4kv::test
