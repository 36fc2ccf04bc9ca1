// What launchers need to know about the current device, asked once per device.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/check.h"
#include "moekit/backend.h"

namespace moekit::cuda {

inline cudaStream_t as_cuda(Stream stream) { return static_cast<cudaStream_t>(stream); }

// Multiprocessors of the current device (cached; a host query, safe during graph capture).
inline int multiprocessor_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // layers may launch from several threads
  int device = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) device = 0;
  if (cached[device].load() == 0) {
    int count = 0;
    MOEKIT_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    cached[device].store(count);
  }
  return cached[device].load();
}

// Lets `kernel` take `bytes` of dynamic shared memory on the current device: the attribute is
// set once per kernel, device and size (it belongs to the device; setting it at every launch
// cost host time on each of them).
inline void allow_dynamic_shared(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> allowed;  // (kernel, device) -> bytes set
  int device = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  int& given = allowed[{kernel, device}];
  if (given >= bytes) return;
  MOEKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  given = bytes;
}

inline unsigned grid_size(std::int64_t work, std::int64_t per_block, std::int64_t cap = 1 << 30) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  return unsigned(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

}  // namespace moekit::cuda
