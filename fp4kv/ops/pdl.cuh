// Programmatic dependent launch (Hopper), as the decode step's small ops use it: a producer
// lets its dependents be scheduled as soon as it starts (allow_dependents), and a dependent
// launched with launch_dependent() does work that needs no input of the producer (the GEMV's
// first weight loads) before it waits for the producer's completion and memory
// (wait_for_producer). Both instructions are no-ops where there is no such pair, so a kernel
// may use them whatever launched it.
#pragma once

#include <cuda_runtime.h>

namespace fp4kv::ops {

__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_producer() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Launches kernel<<<grid, block, 0, stream>>>(args...) as a programmatic dependent of the
// previous kernel on the stream; a plain launch where the attribute is refused.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, kernel, args...) != cudaSuccess) {
    (void)cudaGetLastError();
    kernel<<<grid, block, 0, stream>>>(args...);
  }
}

}  // namespace fp4kv::ops
