// The page kernel's straight-line block quantizers (cache/page_block_quant.cuh) against the
// core functions they replace (core/block_quant.h, the CPU reference's), on the GPU:
//   - the E2M1 magnitude rounding against e2m1_encode for every non-negative float (all 2^31
//     bit patterns up to infinity);
//   - an NVFP4 element's code by the shared-divisor quotient against e2m1_encode(div_rn(x,
//     sg)) for every BF16 x and every E4M3 scale times sampled global scales (the element
//     scales a page can have);
//   - whole blocks, NVFP4 and MXFP4, with and without the search, against the CPU's
//     nvfp4_quantize_block / mxfp4_quantize_block: random blocks, blocks whose values sit at
//     and one or two BF16 steps around every code threshold of their own scale, zeros of both
//     signs, tiny and huge blocks (subnormal and out-of-range element scales).
// Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fp4kv/cache/page_block_quant.cuh"
#include "fp4kv/core/half.h"
#include "fp4kv/testing/cuda_testing.h"

namespace fp4kv::test {
namespace {

using cache::detail::Bf16Block;
using cache::detail::CodesInOrder;

constexpr uint32_t kInfinityBits = 0x7F800000u;  // +inf; larger patterns are NaNs
constexpr uint16_t kBf16MagnitudeMask = 0x7FFFu;
constexpr uint16_t kBf16SignBit = 0x8000u;

__global__ void magnitude_kernel(uint32_t first, unsigned long long* mismatches) {
  const uint32_t bits = first + blockIdx.x * blockDim.x + threadIdx.x;
  if (bits > kInfinityBits) return;  // NaN patterns
  const float a = __uint_as_float(bits);
  const cache::detail::E2m1Magnitude m = cache::detail::e2m1_round_magnitude(a);
  const uint8_t ref = e2m1_encode(a);
  if (m.code != ref || __float_as_uint(m.value) != __float_as_uint(e2m1_value(ref))) atomicAdd(mismatches, 1ull);
}

TEST(PageBlockQuant, MagnitudeRoundingMatchesEveryFloat) {
  SKIP_WITHOUT_GPU();
  testing::DeviceBuffer<unsigned long long> mismatches(1);
  constexpr uint32_t kPerLaunch = 1u << 28, kThreads = 256;
  for (uint64_t first = 0; first <= kInfinityBits; first += kPerLaunch)
    magnitude_kernel<<<kPerLaunch / kThreads, kThreads>>>(uint32_t(first), mismatches.get());
  FP4KV_CUDA_OK(cudaGetLastError());
  EXPECT_EQ(mismatches.download()[0], 0ull);
}

// Every BF16 x (blockIdx.x: the 65536 patterns, finite ones tested) against element scales
// sg = e4m3_value(s) g for every positive E4M3 code s (threadIdx.x) and the scales in gs.
__global__ void element_kernel(const float* gs, int ng, unsigned long long* mismatches, unsigned long long* tested) {
  const float x = __uint_as_float(uint32_t(blockIdx.x) << 16);
  if (!is_finite(x)) return;
  const int s = threadIdx.x + 1;  // 1 .. 126 (kE4M3NaN excluded)
  if (s >= kE4M3NaN) return;
  unsigned long long bad = 0, n = 0;
  for (int k = 0; k < ng; ++k) {
    const float sg = mul_rn(e4m3_value(uint8_t(s)), gs[k]);
    if (!cache::detail::fast_divisor(sg)) continue;
    CodesInOrder<16> c;
    float err = 0.0f;
    cache::detail::nvfp4_element(x, 0, sg, cache::detail::refined_reciprocal(sg), c, err);
    const uint8_t ref = e2m1_encode(div_rn(x, sg));
    const float e = sub_rn(mul_rn(e2m1_value(ref), sg), x);
    bad += (c.w[0] & 0xFu) != ref || __float_as_uint(err) != __float_as_uint(mul_rn(e, e));
    ++n;
  }
  if (bad) atomicAdd(mismatches, bad);
  atomicAdd(tested, n);
}

TEST(PageBlockQuant, NvFp4ElementMatchesDivisionForEveryBf16) {
  SKIP_WITHOUT_GPU();
  // Global scales: powers of two across the range, few-bit mantissas, and random ones.
  std::vector<float> gs;
  for (int e = -90; e <= 90; e += 9) gs.push_back(std::ldexp(1.0f, e));
  for (float m : {1.25f, 1.5f, 1.75f, 1.0625f}) gs.push_back(m * 0.0078125f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-30.0f, 10.0f);
  for (int i = 0; i < 40; ++i) gs.push_back(std::exp2(u(rng)));
  testing::DeviceBuffer<float> dg(gs);
  testing::DeviceBuffer<unsigned long long> mismatches(1), tested(1);
  element_kernel<<<65536, 128>>>(dg.get(), int(gs.size()), mismatches.get(), tested.get());
  FP4KV_CUDA_OK(cudaGetLastError());
  EXPECT_EQ(mismatches.download()[0], 0ull);
  EXPECT_GT(tested.download()[0], 100000000ull);
}

// Blocks of kB BF16 values (host floats, BF16-exact) quantized on the device; the scale and
// codes (element order) out.
template <int kB, bool kNv, bool kSearch>
__global__ void block_kernel(const uint16_t* x, const float* g, int n, uint8_t* scales, uint32_t* codes) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= n) return;
  Bf16Block<kB> blk;
  for (int k = 0; k < kB / 2; ++k) blk.w[k] = uint32_t(x[b * kB + 2 * k]) | (uint32_t(x[b * kB + 2 * k + 1]) << 16);
  CodesInOrder<kB> c;
  if constexpr (kNv) scales[b] = cache::detail::nvfp4_block_fast<kSearch>(blk, g[b], c);
  else scales[b] = cache::detail::mxfp4_block_fast<kSearch>(blk, c);
  for (int k = 0; k < kB / 8; ++k) codes[b * (kB / 8) + k] = c.w[k];
}

// Test blocks: values (BF16 bits) and NVFP4 global scales.
struct Blocks {
  std::vector<uint16_t> x;
  std::vector<float> g;
};

template <int kB>
void add_block(Blocks& out, const std::vector<float>& v, float g) {
  for (int i = 0; i < kB; ++i) out.x.push_back(float_to_bf16_bits(v[i % v.size()]));
  out.g.push_back(g);
}

// The BF16 value `steps` BF16 ulps above v (below for negative steps; v BF16-exact).
float bf16_step(float v, int steps) {
  const uint16_t h = float_to_bf16_bits(v);
  const bool neg = h & kBf16SignBit;
  const int mag = int(h & kBf16MagnitudeMask) + (neg ? -steps : steps);
  if (mag < 0) return bf16_bits_to_float(uint16_t(uint16_t(-mag) | (neg ? 0 : kBf16SignBit)));
  return bf16_bits_to_float(uint16_t(uint16_t(mag) | (h & kBf16SignBit)));
}

template <int kB>
Blocks make_blocks(bool nv) {
  Blocks out;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  // Random blocks at many magnitudes; g as the page sets it (slice amax / 2688, the slice
  // amax at or above the block's).
  for (int r = 0; r < 4000; ++r) {
    const float mag = std::exp2(float(int(u(rng) * 60.0f) - 30));
    std::vector<float> v(kB);
    float amax = 0.0f;
    for (auto& e : v) {
      e = round_bf16(nd(rng) * mag);
      amax = std::max(amax, std::fabs(e));
    }
    add_block<kB>(out, v, nvfp4_global_scale(amax * (1.0f + 20.0f * u(rng))));
  }
  // Threshold blocks: element 0 fixes the block scale (amax = 6 v_s for g = 1, so s = s6 and
  // sg = v_s; MXFP4: amax = 4 2^e), the others sit at code thresholds T sg and 1-2 BF16
  // steps around them, both signs.
  const float thresholds[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
  for (int s = 1; s < kE4M3NaN; s += 3) {
    const float unit = nv ? e4m3_value(uint8_t(s)) : std::ldexp(1.0f, s - 64);
    for (int steps = -2; steps <= 2; ++steps) {
      std::vector<float> v(kB);
      v[0] = round_bf16((nv ? 6.0f : 4.0f) * unit);
      for (int i = 1; i < kB; ++i) {
        const float t = round_bf16(thresholds[i % 14] * unit);
        v[i] = bf16_step((i % 2 ? -1.0f : 1.0f) * t, steps);
      }
      for (float g : {1.0f, 1.25f, 0.0009765625f}) add_block<kB>(out, v, g);
    }
  }
  // Zeros of both signs, a lone value among negative zeros, tiny and huge blocks.
  add_block<kB>(out, {0.0f}, 1.0f);
  add_block<kB>(out, {-0.0f, 0.0f}, 1.0f);
  add_block<kB>(out, {1.0f, -0.0f, -0.0f}, 1.0f);
  add_block<kB>(out, {1e-39f, -3e-40f, 2e-38f}, nvfp4_global_scale(2e-38f));
  add_block<kB>(out, {1e-30f, -5e-31f}, 1e-36f);
  add_block<kB>(out, {3e38f, -1e38f, 2.5e38f, 7.0f}, nvfp4_global_scale(3e38f));
  add_block<kB>(out, {1e20f, -3e19f, 5e19f}, nvfp4_global_scale(1e20f));
  return out;
}

template <int kB, bool kNv, bool kSearch>
void check_blocks() {
  const Blocks in = make_blocks<kB>(kNv);
  const int n = int(in.g.size());
  testing::DeviceBuffer<uint16_t> dx(in.x);
  testing::DeviceBuffer<float> dg(in.g);
  testing::DeviceBuffer<uint8_t> ds(n);
  testing::DeviceBuffer<uint32_t> dc(size_t(n) * (kB / 8));
  block_kernel<kB, kNv, kSearch><<<(n + 127) / 128, 128>>>(dx.get(), dg.get(), n, ds.get(), dc.get());
  FP4KV_CUDA_OK(cudaGetLastError());
  const std::vector<uint8_t> scales = ds.download();
  const std::vector<uint32_t> codes = dc.download();
  int bad = 0;
  for (int b = 0; b < n && bad < 5; ++b) {
    float x[kB];
    for (int i = 0; i < kB; ++i) x[i] = bf16_bits_to_float(in.x[size_t(b) * kB + i]);
    uint8_t ref[kB];
    const uint8_t s = kNv ? nvfp4_quantize_block(x, 1, in.g[b], kSearch, ref) : mxfp4_quantize_block(x, 1, kSearch, ref);
    bool same = s == scales[b];
    for (int i = 0; i < kB; ++i) same &= ((codes[size_t(b) * (kB / 8) + i / 8] >> (4 * (i % 8))) & 0xFu) == ref[i];
    if (!same) {
      ++bad;
      ADD_FAILURE() << "block " << b << " (x0 " << x[0] << ", g " << in.g[b] << "): scale " << int(scales[b]) << " vs "
                    << int(s);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(PageBlockQuant, NvFp4BlocksMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_blocks<16, true, false>();
}
TEST(PageBlockQuant, NvFp4SearchBlocksMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_blocks<16, true, true>();
}
TEST(PageBlockQuant, MxFp4BlocksMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_blocks<32, false, false>();
}
TEST(PageBlockQuant, MxFp4SearchBlocksMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_blocks<32, false, true>();
}

}  // namespace
}  // namespace fp4kv::test
