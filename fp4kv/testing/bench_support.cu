// Device helpers of the decode benchmark (bench_support.h): random valid cache pages and
// queries generated on the device, the SM-clock warm-up and the streaming-read bandwidth probe.
#include "fp4kv/testing/bench_support.h"

#include <limits>

#include "fp4kv/cache/split_plan.h"
#include "fp4kv/testing/cuda_testing.h"
#include "fp4kv/testing/sm_partition.h"

namespace fp4kv::testing {

namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct FillArgs {
  uint8_t* pool;
  long long units;  // 16-byte units
  long long block_stride;
  int head_bytes;
  int fmt;  // 0 nvfp4, 1 mxfp4, 2 fp8, 3 bf16
  int k_codes, k_scales, v_codes, v_scales, page_scales;
  uint64_t seed;
};

__global__ void fill_pages_kernel(const FillArgs a) {
  for (long long u = blockIdx.x * (long long)blockDim.x + threadIdx.x; u < a.units; u += (long long)gridDim.x * blockDim.x) {
    const long long off = u * 16;
    const int o = int((off % a.block_stride) % a.head_bytes);
    const uint64_t r0 = mix(a.seed ^ (uint64_t(u) * 2 + 0)), r1 = mix(a.seed ^ (uint64_t(u) * 2 + 1));
    uint32_t w[4] = {uint32_t(r0), uint32_t(r0 >> 32), uint32_t(r1), uint32_t(r1 >> 32)};
    if (a.fmt == 3) {  // bf16: sign, exponent 126..127, random mantissa
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = (w[i] & 0x807F807Fu) | 0x3F003F00u;
    } else if (a.fmt == 2) {  // fp8 E4M3 without NaN: clear the exponent's top bit
      if (o >= a.page_scales) {
        const float s = 0.01f;
        w[0] = w[1] = __float_as_uint(s);
        w[2] = w[3] = 0u;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] &= 0xBFBFBFBFu;
      }
    } else {
      const bool scales = (o >= a.k_scales && o < a.v_codes) || (o >= a.v_scales && o < a.page_scales);
      if (o >= a.page_scales) {
        const float s = a.fmt == 0 ? 0.01f : 1.0f / 32768.0f;  // MXFP4: 2^(emax - 15), emax = 0
        w[0] = w[1] = __float_as_uint(s);
        w[2] = w[3] = 0u;
      } else if (scales) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          w[i] = a.fmt == 0 ? ((w[i] & 0x1F1F1F1Fu) | 0x30303030u)      // E4M3 0.5 .. ~8
                            : ((w[i] & 0x07070707u) | 0x78787878u);     // E8M0 120 .. 127
      }
    }
    *reinterpret_cast<uint4*>(a.pool + off) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = uint16_t((mix(seed ^ i) & 0x807Fu) | 0x3F00u);
}

__global__ void fill_float_kernel(float* p, size_t n, float scale, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint64_t r = mix(seed ^ i);
    p[i] = scale * (float(uint32_t(r) >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

__global__ void __launch_bounds__(512) stream_read_kernel(const uint4* __restrict__ p, size_t n4, unsigned long long* sink) {
  uint32_t acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n4; i += stride) {
    const uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

// Spins every SM for spin_ns of the global timer and writes the SM clock it saw (block 0's
// cycles over the elapsed nanoseconds, in MHz) to *mhz.
__global__ void clock_spin_kernel(unsigned long long spin_ns, double* mhz) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < spin_ns);
  const long long c1 = clock64();
  if (blockIdx.x == 0 && threadIdx.x == 0) *mhz = double(c1 - c0) * 1e3 / double(t1 - t0);
}

// SMs the kernels run on (sm_partition.h; cache::kDefaultSmCount, the H200's, if the query
// fails).
int current_device_sms() {
  const int sms = usable_sms();
  return sms > 0 ? sms : cache::kDefaultSmCount;
}

int grid_for(long long work) {
  const int sms = current_device_sms();
  const long long g = (work + 255) / 256;
  return int(g < sms * 16LL ? (g > 0 ? g : 1) : sms * 16LL);
}

}  // namespace

void fill_random_pages(uint8_t* pool, long long blocks, long long block_stride, const cache::PageLayout& L,
                       uint64_t seed, cudaStream_t stream) {
  FillArgs a{};
  a.pool = pool;
  a.units = blocks * block_stride / 16;
  a.block_stride = block_stride;
  a.head_bytes = L.bytes;
  a.fmt = L.format == KvFormat::nvfp4 ? 0 : L.format == KvFormat::mxfp4 ? 1 : L.format == KvFormat::fp8 ? 2 : 3;
  a.k_codes = L.k_codes;
  a.k_scales = L.k_scales;
  a.v_codes = L.v_codes;
  a.v_scales = L.v_scales;
  a.page_scales = a.fmt == 3 ? L.bytes : L.page_scales;
  a.seed = seed;
  fill_pages_kernel<<<grid_for(a.units), 256, 0, stream>>>(a);
}

void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, cudaStream_t stream) {
  fill_bf16_kernel<<<grid_for((long long)n), 256, 0, stream>>>(p, n, seed);
}

void fill_random_float(float* p, size_t n, float scale, uint64_t seed, cudaStream_t stream) {
  fill_float_kernel<<<grid_for((long long)n), 256, 0, stream>>>(p, n, scale, seed);
}

void stream_read(const void* p, size_t bytes, unsigned long long* sink, cudaStream_t stream) {
  stream_read_kernel<<<current_device_sms() * 4, 512, 0, stream>>>(static_cast<const uint4*>(p), bytes / 16, sink);
}

namespace {

constexpr unsigned long long kClockSpinNs = 20'000'000;  // one clock reading: 20 ms of spinning
constexpr double kClockSpinSeconds = kClockSpinNs * 1e-9;
constexpr double kNearClock = 0.95;  // a clock within 5 % of its target counts as there

// The SM clock (MHz) over one kClockSpinNs spin of every SM.
double sm_clock_reading(DeviceBuffer<double>& reading) {
  clock_spin_kernel<<<current_device_sms(), 32>>>(kClockSpinNs, reading.get());
  double mhz = 0.0;
  FP4KV_CUDA_OK(cudaMemcpy(&mhz, reading.get(), sizeof mhz, cudaMemcpyDeviceToHost));
  return mhz;
}

}  // namespace

double settle_sm_clock() {
  constexpr double kSettledSeconds = 1.0, kMaxSeconds = 10.0, kRise = 1.01;
  int dev = 0, peak_khz = 0;
  FP4KV_CUDA_OK(cudaGetDevice(&dev));
  FP4KV_CUDA_OK(cudaDeviceGetAttribute(&peak_khz, cudaDevAttrClockRate, dev));
  // Near the peak is enough; without a peak to compare (attribute 0), only the rise decides.
  const double enough_mhz = peak_khz > 0 ? kNearClock * peak_khz * 1e-3 : std::numeric_limits<double>::infinity();
  DeviceBuffer<double> reading(1);
  double best = 0.0, spun = 0.0, since_rise = 0.0;
  while (spun < kMaxSeconds && since_rise < kSettledSeconds && best < enough_mhz) {
    const double mhz = sm_clock_reading(reading);
    spun += kClockSpinSeconds;
    since_rise += kClockSpinSeconds;
    if (mhz > best * kRise) since_rise = 0.0;
    if (mhz > best) best = mhz;
  }
  return best;
}

double hold_sm_clock(double settled_mhz) {
  constexpr double kMaxSeconds = 1.0;  // short: it runs before every point
  DeviceBuffer<double> reading(1);
  double mhz = 0.0;
  for (double spun = 0.0; spun < kMaxSeconds && mhz < kNearClock * settled_mhz; spun += kClockSpinSeconds)
    mhz = sm_clock_reading(reading);
  return mhz;
}

namespace {

constexpr size_t kProbeBytes = size_t(4) << 30;

// TB/s of streaming reads over `buf` (kProbeBytes), median of 15 after 3 warm-up reads.
double stream_read_tbs(const DeviceBuffer<uint8_t>& buf) {
  DeviceBuffer<unsigned long long> sink(1);
  for (int i = 0; i < 3; ++i) stream_read(buf.get(), kProbeBytes, sink.get());
  return double(kProbeBytes) /
         (median_event_us(15, [&](int) { stream_read(buf.get(), kProbeBytes, sink.get()); }) * 1e-6) / 1e12;
}

}  // namespace

double measure_read_bandwidth() {
  DeviceBuffer<uint8_t> buf(kProbeBytes);
  buf.fill_bytes(1);
  return stream_read_tbs(buf);
}

void measure_bandwidth(double& read_tbs, double& copy_tbs, double* sm_mhz) {
  const double mhz = settle_sm_clock();
  if (sm_mhz) *sm_mhz = mhz;
  const size_t bytes = kProbeBytes;
  DeviceBuffer<uint8_t> buf(bytes);
  buf.fill_bytes(1);
  read_tbs = stream_read_tbs(buf);
  const size_t half = bytes / 2;
  for (int i = 0; i < 2; ++i)
    FP4KV_CUDA_OK(cudaMemcpyAsync(buf.get() + half, buf.get(), half, cudaMemcpyDeviceToDevice));
  copy_tbs = 2.0 * double(half) /
             (median_event_us(15, [&](int) { cudaMemcpyAsync(buf.get() + half, buf.get(), half, cudaMemcpyDeviceToDevice); }) *
              1e-6) /
             1e12;
}

}  // namespace fp4kv::testing
