// testing::confine_to_sms: after it, every kernel of the process runs on the granted SMs
// only (each CTA of a wide grid records its SM), and the benchmark helpers size their grids
// by that count. One test: a confinement lasts as long as its process.
#include <gtest/gtest.h>

#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/testing/cuda_testing.h"
#include "fp4kv/testing/sm_partition.h"

namespace fp4kv::testing {
namespace {

constexpr int kMaxSmId = 1024;
constexpr long long kSpinCycles = 20000;  // long enough that the grid spreads over every SM it may use

__global__ void record_sm_kernel(int* used) {
  unsigned sm = 0;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const long long t0 = clock64();
  while (clock64() - t0 < kSpinCycles) {
  }
  if (threadIdx.x == 0 && sm < kMaxSmId) used[sm] = 1;
}

TEST(SmPartition, KernelsRunOnTheGrantedSmsOnly) {
  SKIP_WITHOUT_GPU();
  int dev = 0, total = 0;
  FP4KV_CUDA_OK(cudaGetDevice(&dev));
  FP4KV_CUDA_OK(cudaDeviceGetAttribute(&total, cudaDevAttrMultiProcessorCount, dev));
  EXPECT_THROW(confine_to_sms(0), Error);
  EXPECT_THROW(confine_to_sms(total + 1), Error);
  EXPECT_EQ(usable_sms(), total);

  const int granted = confine_to_sms(total / 2);
  EXPECT_GE(granted, total / 2);
  EXPECT_LT(granted, total);
  EXPECT_EQ(usable_sms(), granted);
  EXPECT_THROW(confine_to_sms(total / 2), Error);  // once a process

  DeviceBuffer<int> used(kMaxSmId);
  FP4KV_CUDA_OK(cudaMemset(used.get(), 0, kMaxSmId * sizeof(int)));
  record_sm_kernel<<<8 * total, 64>>>(used.get());
  FP4KV_CUDA_OK(cudaGetLastError());
  std::vector<int> host(kMaxSmId);
  FP4KV_CUDA_OK(cudaMemcpy(host.data(), used.get(), kMaxSmId * sizeof(int), cudaMemcpyDeviceToHost));
  int distinct = 0;
  for (int x : host) distinct += x;
  EXPECT_LE(distinct, granted);      // nothing ran outside the partition
  EXPECT_GE(distinct, granted / 2);  // and the partition was used
}

}  // namespace
}  // namespace fp4kv::testing
