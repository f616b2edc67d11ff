// Device helpers of the decode benchmark (`fp4kv bench decode`): random but valid cache
// pages written directly on the device (no CPU quantizer, so a sweep over 100 GB of cache
// sets up in milliseconds), the SM-clock warm-up every timed benchmark starts with, and a
// streaming-read kernel that measures the read bandwidth the decode kernels are held to.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "fp4kv/cache/layout.h"

namespace fp4kv::testing {

// Fills `blocks` cache blocks (block_stride bytes apart, each a run of KV head parts of
// layout L) with random codes and in-range block/page scales (timing data: no NaN or Inf).
void fill_random_pages(uint8_t* pool, long long blocks, long long block_stride, const cache::PageLayout& L,
                       uint64_t seed, cudaStream_t stream = nullptr);
// n random BF16 values in +-[0.5, 2).
void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, cudaStream_t stream = nullptr);
// n random floats in +-scale.
void fill_random_float(float* p, size_t n, float scale, uint64_t seed, cudaStream_t stream = nullptr);
// Reads `bytes` (a multiple of 64) with 16-byte streaming loads; writes a checksum to *sink
// only if it matches an impossible value (so the loads are not removed).
void stream_read(const void* p, size_t bytes, unsigned long long* sink, cudaStream_t stream = nullptr);

// Keeps every SM busy until the SM clock is within 5 % of the device's peak clock, or stops
// rising (no 20-ms reading 1 % above the best for 1 s: a card held below its peak), at most
// 10 s; returns the best reading, MHz. An idle card clocks its SMs down (the H100: 345 MHz)
// and takes ~2 s of load, in steps, to reach its boost clock; a benchmark's first point
// timed before that ran up to 16 % slow (docs/PERF.md, "One wave of splits up to 128 pages").
double settle_sm_clock();
// Before a timed point, after host work that may have let the card idle: spins every SM
// until the SM clock is back within 5 % of `settled_mhz` (one 20-ms reading when it is;
// at most 1 s); returns the last reading.
double hold_sm_clock(double settled_mhz);

// Read bandwidth (streaming loads over 4 GiB) and device-copy bandwidth (read + write), TB/s,
// median of 15 CUDA-event-timed runs, after settle_sm_clock (its clock to *sm_mhz if given):
// the rates a benchmark's numbers are held to.
void measure_bandwidth(double& read_tbs, double& copy_tbs, double* sm_mhz = nullptr);
// The read bandwidth alone, TB/s, at the clock as it is (after measure_bandwidth settled it):
// the probe of a partition of the SMs (sm_partition.h).
double measure_read_bandwidth();

}  // namespace fp4kv::testing
