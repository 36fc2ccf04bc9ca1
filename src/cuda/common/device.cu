#include "cuda/common/device.h"

#include <cuda_runtime.h>

namespace moekit::cuda {
namespace {

DeviceInfo query() {
  DeviceInfo info;
  const cudaError_t status = cudaGetDeviceCount(&info.count);
  if (status != cudaSuccess) {
    info.count = 0;
    info.problem = cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky error of a failed query
    return info;
  }
  if (info.count == 0) {
    info.problem = "no CUDA device";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    info.name = prop.name;
    info.sm = prop.major * 10 + prop.minor;
    info.multiprocessors = prop.multiProcessorCount;
  }
  return info;
}

}  // namespace

std::string DeviceInfo::to_string() const {
  if (count == 0) return "none (" + problem + ")";
  return name + " (sm_" + std::to_string(sm) + ", " + std::to_string(multiprocessors) + " SMs, " +
         std::to_string(count) + " device" + (count > 1 ? "s" : "") + ")";
}

const DeviceInfo& device_info() {
  static const DeviceInfo info = query();
  return info;
}

}  // namespace moekit::cuda
