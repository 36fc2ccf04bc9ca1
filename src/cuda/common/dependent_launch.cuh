// Programmatic dependent launch (sm_90), host side: a kernel launched so that it may begin while
// the previous kernel on the stream finishes; it waits for it with grid_dependency_wait
// (cuda/common/vec.cuh) before reading what it wrote.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"

namespace moekit::cuda {

// Launches kernel<<<grid, block, shared, stream>>>(values...) as a programmatic dependent; opts in
// to `shared` bytes of dynamic shared memory past the default 48 KiB.
template <typename... Params, typename... Values>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared, cudaStream_t stream,
                      Values... values) {
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
  config.numAttrs = 1;
  MOEKIT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, values...));
}

}  // namespace moekit::cuda
