// Programmatic dependent launch (Hopper), for the short kernels of a decode step: a producer
// lets its dependents be scheduled as soon as it starts (allow_dependents), and a dependent
// launched with launch_dependent() may do work that needs no input of the producer (the
// GEMV's first weight loads) before it waits for the producer's completion and memory
// (wait_for_producer). Both instructions are no-ops where there is no such pair, so a kernel
// may use them whatever launched it. In the cache layer so that the cache, the attention
// kernels and the engine's ops share one form.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace fp4kv::cache {

__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_producer() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Launches kernel<<<grid, block, smem_bytes, stream>>>(args...) as a programmatic dependent
// of the previous kernel on the stream; a plain launch where the attribute is refused.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                      Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, kernel, args...) != cudaSuccess) {
    (void)cudaGetLastError();
    kernel<<<grid, block, smem_bytes, stream>>>(args...);
  }
}

}  // namespace fp4kv::cache
