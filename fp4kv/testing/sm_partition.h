// Runs a benchmark's kernels on part of the GPU's SMs: a green context (CUDA 12.4+) holding
// `sms` SMs made current to the calling thread, so that every later runtime call of the
// thread (allocations, launches, events, the default stream) runs inside it.
//
// What it is for: an H200 reads 4.4-4.8 TB/s with the H100's 132 SMs at the same clock, so a
// decode kernel has to issue ~1.4x the instructions per SM per microsecond there to keep up
// with its bytes. An H100 confined to ~96 SMs gives each SM the H200's share of the read
// bandwidth (3.2 TB/s / 96 ~ 4.5 TB/s / 132 = 33-34 GB/s an SM), so a loop that is issue-bound
// on the H200 and memory-bound on the whole H100 can be timed in the H200's regime on an H100
// (docs/PERF.md, "An H100 with the H200's read bandwidth per SM").
#pragma once

namespace fp4kv::testing {

// Confines this thread's later CUDA work to a green context of at least `sms` SMs of the
// current device (the driver rounds up to its partition granularity). The converted context
// is the device's primary context with fewer SMs, so work done before (bench decode measures
// the card's bandwidth on all SMs first) needs nothing redone. Returns the SMs granted; throws
// fp4kv::Error where the driver has no green contexts or the count is out of range.
int confine_to_sms(int sms);

// The SMs this process's kernels run on: the confined count, else the device's.
int usable_sms();

}  // namespace fp4kv::testing
