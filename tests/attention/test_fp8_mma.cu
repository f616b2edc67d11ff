// The property an FP8 tensor-core path over FP4 data rests on (docs/DESIGN.md, "FP8 tensor cores
// for FP4 data"; core/fp4_as_fp8.h): an E2M1 code placed into an E4M3 byte is its value times 2^-6, so one
// mma.sync.m16n8k32 (E4M3 x E4M3, FP32 accumulate) of such bytes computes 2^-12 times a sum
// of 32 products of E2M1 values. Each product is a multiple of 1/4 of magnitude at most 36,
// so a sum of 32 is a multiple of 1/4 below 1152: 13 significant bits. The path is exact only
// if the tensor core keeps them all when it adds the 32 products; Hopper's FP8 MMA is known to
// accumulate with fewer bits than FP32 in some cases, so this is measured, not assumed: random
// codes, the worst case of 32 maximal products, a small product beside 31 maximal ones, and
// full cancellation, each against the exact sum (double). A fragment-layout error shows as a
// mismatch on the random cases. Whether the accumulator input C is added at full FP32
// precision is printed (the kernel design keeps C = 0 and applies block scales in FP32 either
// way). Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "fp4kv/core/fp4_as_fp8.h"
#include "fp4kv/core/minifloat.h"
#include "fp4kv/testing/cuda_testing.h"

namespace fp4kv::test {
namespace {

constexpr int kM = 16, kN = 8, kK = 32;

__device__ uint32_t load_bytes4(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// D[16][8] = A[16][32] B[32][8] + C with one mma.sync.m16n8k32 E4M3 (A row-major bytes, B
// stored column by column: B[n * 32 + k]). Fragments per the PTX ISA's m16n8k32 8-bit layout:
// a0/a1 rows g / g + 8 columns 4t..4t+3, a2/a3 the same rows at columns 16 + 4t..; b0/b1 rows
// 4t.. / 16 + 4t.. of column g; c0,c1 / c2,c3 rows g / g + 8, columns 2t, 2t + 1.
__global__ void mma_e4m3_kernel(const uint8_t* A, const uint8_t* B, const float* C, float* D) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  const uint32_t a0 = load_bytes4(A + g * kK + 4 * t), a1 = load_bytes4(A + (g + 8) * kK + 4 * t);
  const uint32_t a2 = load_bytes4(A + g * kK + 16 + 4 * t), a3 = load_bytes4(A + (g + 8) * kK + 16 + 4 * t);
  const uint32_t b0 = load_bytes4(B + g * kK + 4 * t), b1 = load_bytes4(B + g * kK + 16 + 4 * t);
  float d[4] = {C[g * kN + 2 * t], C[g * kN + 2 * t + 1], C[(g + 8) * kN + 2 * t], C[(g + 8) * kN + 2 * t + 1]};
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  D[g * kN + 2 * t] = d[0];
  D[g * kN + 2 * t + 1] = d[1];
  D[(g + 8) * kN + 2 * t] = d[2];
  D[(g + 8) * kN + 2 * t + 1] = d[3];
}

// One product of E2M1 code matrices: a[16][32], b[8][32] (column n of B is b[n]), c[16][8].
struct Case {
  const char* name;
  std::vector<uint8_t> a, b;  // E2M1 codes
  std::vector<float> c;
};

Case zero_case(const char* name) {
  return {name, std::vector<uint8_t>(kM * kK), std::vector<uint8_t>(kN * kK), std::vector<float>(kM * kN, 0.0f)};
}

// What the tensor core returned and what the exact sum is, element by element.
struct Outcome {
  std::vector<float> got;
  std::vector<double> want;
};

Outcome run_case(const Case& c) {
  std::vector<uint8_t> a8(c.a.size()), b8(c.b.size());
  for (size_t i = 0; i < c.a.size(); ++i) a8[i] = e2m1_as_e4m3(c.a[i]);
  for (size_t i = 0; i < c.b.size(); ++i) b8[i] = e2m1_as_e4m3(c.b[i]);
  testing::DeviceBuffer<uint8_t> da(a8.size()), db(b8.size());
  testing::DeviceBuffer<float> dc(c.c.size()), dd(c.c.size());
  da.upload(a8);
  db.upload(b8);
  dc.upload(c.c);
  mma_e4m3_kernel<<<1, 32>>>(da.get(), db.get(), dc.get(), dd.get());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  Outcome o;
  o.got = dd.download();
  const double unit = std::ldexp(1.0, 2 * kFp4AsFp8Exponent);
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      double sum = 0;
      for (int k = 0; k < kK; ++k) sum += double(e2m1_value(c.a[m * kK + k])) * double(e2m1_value(c.b[n * kK + k]));
      o.want.push_back(double(c.c[m * kN + n]) + unit * sum);
    }
  }
  return o;
}

// Elements whose result is not the exact sum; the first printed.
int mismatches(const Case& c, const Outcome& o) {
  int bad = 0;
  for (size_t i = 0; i < o.got.size(); ++i) {
    if (double(o.got[i]) == o.want[i]) continue;
    if (bad++ == 0)
      std::printf("%s: element (%zu, %zu) = %.9g, exact %.9g\n", c.name, i / kN, i % kN, double(o.got[i]), o.want[i]);
  }
  return bad;
}

constexpr uint8_t kSix = 0x7, kHalf = 0x1, kSign = 0x8;  // E2M1 codes of 6 and 0.5, the sign bit

TEST(Fp8MmaGpu, RandomE2M1ProductsAreExact) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 64; ++trial) {
    Case c = zero_case("random codes");
    for (uint8_t& x : c.a) x = uint8_t(rng() % 16);
    for (uint8_t& x : c.b) x = uint8_t(rng() % 16);
    ASSERT_EQ(mismatches(c, run_case(c)), 0) << "trial " << trial;
  }
}

TEST(Fp8MmaGpu, WorstCasesOf32ProductsAreExact) {
  SKIP_WITHOUT_GPU();
  Case maximal = zero_case("32 products of 6 x 6 (1152)");
  std::fill(maximal.a.begin(), maximal.a.end(), kSix);
  std::fill(maximal.b.begin(), maximal.b.end(), kSix);
  EXPECT_EQ(mismatches(maximal, run_case(maximal)), 0);

  // One product of 0.5 x 0.5 beside 31 of 6 x 6, at the first and at the last k (either
  // end of the hardware's adding order): 1116.25 needs all 13 bits.
  for (int k0 : {0, kK - 1}) {
    Case small = zero_case("one 0.5 x 0.5 beside 31 products of 6 x 6");
    for (int k = 0; k < kK; ++k) {
      for (int m = 0; m < kM; ++m) small.a[m * kK + k] = k == k0 ? kHalf : kSix;
      for (int n = 0; n < kN; ++n) small.b[n * kK + k] = k == k0 ? kHalf : kSix;
    }
    EXPECT_EQ(mismatches(small, run_case(small)), 0) << "small product at k = " << k0;
  }

  // 15 products of +36 and 15 of -36, interleaved, and one of 0.25: the result is the small
  // product alone, in whatever order the hardware adds, only if no bit is dropped on the way.
  Case cancelling = zero_case("15 x (+36), 15 x (-36) and 0.25");
  for (int k = 0; k < kK; ++k) {
    const uint8_t a = k < 30 ? uint8_t((k % 2 ? kSign : 0) | kSix) : (k == 30 ? kHalf : uint8_t(0));
    for (int m = 0; m < kM; ++m) cancelling.a[m * kK + k] = a;
    for (int n = 0; n < kN; ++n) cancelling.b[n * kK + k] = k == 30 ? kHalf : kSix;
  }
  EXPECT_EQ(mismatches(cancelling, run_case(cancelling)), 0);
}

// The accumulator input: printed, not asserted (a kernel adds block-scaled partial sums in
// FP32 itself and passes C = 0).
TEST(Fp8MmaGpu, ReportsWhetherTheAccumulatorInputIsAddedExactly) {
  SKIP_WITHOUT_GPU();
  Case c = zero_case("C = 4096 + A B");
  std::fill(c.a.begin(), c.a.end(), kHalf);
  std::fill(c.b.begin(), c.b.end(), kHalf);
  std::fill(c.c.begin(), c.c.end(), 4096.0f);  // 4096 + 32 x 0.25 x 2^-12: exact in FP32
  const int bad = mismatches(c, run_case(c));
  std::printf("E4M3 mma.sync with C = 4096: %s\n", bad == 0 ? "C added exactly" : "C added with fewer bits than FP32");
}

}  // namespace
}  // namespace fp4kv::test
