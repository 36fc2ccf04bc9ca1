// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent may begin while
// the kernel before it on the stream finishes, so that its launch, its blocks' setup and (the
// decode GEMM) its first weight loads overlap that kernel's tail.
// The rule every kernel so launched keeps: dependent_wait() before it touches memory that an
// earlier kernel writes or reads (griddepcontrol.wait returns once the grid before has completed,
// its writes visible), then allow_dependents(), so that the next kernel starts only once this one
// has passed its wait. Whatever a kernel's predecessor's predecessor wrote is then complete when
// the kernel starts: it may read that before its own wait (the decode GEMM reads the plan's group
// offsets and streams weights before waiting for its rows). Both are no-ops in a kernel launched
// without the attribute. MOEKIT_PDL=off in the environment launches every kernel without it.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"

namespace moekit::cuda {

__device__ __forceinline__ void dependent_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// kernel<<<grid, block, shared, stream>>>(values...), allowed to begin while the kernel before it on
// the stream finishes (see above); opts in to `shared` bytes past the default 48 KiB.
template <typename... Params, typename... Values>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream,
                      Values&&... values) {
  if (shared > 48 * 1024) allow_dynamic_shared(reinterpret_cast<const void*>(kernel), int(shared));
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent_launch_switch().load(std::memory_order_relaxed) ? 1 : 0;
  MOEKIT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Values>(values)...));
}

}  // namespace moekit::cuda
