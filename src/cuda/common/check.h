// CUDA error checks for host code: every failure becomes a moekit::Error naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "moekit/error.h"

namespace moekit::cuda {

inline void check(cudaError_t status, const char* what, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw Error(std::string("CUDA error ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
              ") in " + what + " at " + file + ":" + std::to_string(line));
}

}  // namespace moekit::cuda

// Throws moekit::Error when a CUDA runtime call fails.
#define MOEKIT_CUDA_CHECK(expr) ::moekit::cuda::check((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows up here, asynchronous faults later.
#define MOEKIT_CUDA_CHECK_LAUNCH(name) ::moekit::cuda::check(cudaGetLastError(), name, __FILE__, __LINE__)
