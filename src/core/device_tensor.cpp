#include <cstdlib>
#include <cstring>
#include <string>

#include "moekit/device.h"
#include "moekit/error.h"

#ifdef MOEKIT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit {
namespace {

#ifdef MOEKIT_HAVE_CUDA
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(status));
}
#endif

void* allocate(std::size_t bytes, Device device) {
  if (device == Device::cpu) return std::malloc(bytes ? bytes : 1);
#ifdef MOEKIT_HAVE_CUDA
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
#else
  throw Error("device: this build has no CUDA");
#endif
}

void release(void* p, Device device) {
  if (!p) return;
  if (device == Device::cpu) std::free(p);
#ifdef MOEKIT_HAVE_CUDA
  else cudaFree(p);
#endif
}

void copy(void* dst, const void* src, std::size_t bytes, Device device, bool to_device) {
  if (bytes == 0) return;
  if (device == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef MOEKIT_HAVE_CUDA
  check(cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost), "cudaMemcpy");
#else
  (void)to_device;
#endif
}

}  // namespace

bool cuda_available() {
#ifdef MOEKIT_HAVE_CUDA
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
#else
  return false;
#endif
}

void synchronize(Device device) {
#ifdef MOEKIT_HAVE_CUDA
  if (device == Device::cuda) check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  (void)device;
#endif
}

DeviceTensor::DeviceTensor(DType dtype, std::vector<std::int64_t> shape, Device device) : shape_(std::move(shape)) {
  view_ = TensorView::contiguous(nullptr, dtype, shape_, device);
  view_.data = allocate(view_.nbytes(), device);
}

DeviceTensor::~DeviceTensor() { release(view_.data, view_.device); }

DeviceTensor::DeviceTensor(DeviceTensor&& o) noexcept : shape_(std::move(o.shape_)), view_(o.view_) {
  o.view_.data = nullptr;
}

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& o) noexcept {
  std::swap(shape_, o.shape_);
  std::swap(view_, o.view_);
  return *this;
}

void DeviceTensor::copy_from(const TensorView& host) {
  require(host.device == Device::cpu && host.dtype == view_.dtype && host.numel() == view_.numel(),
          "copy_from: expected a host tensor like " + view_.to_string() + ", given " + host.to_string());
  copy(view_.data, host.data, view_.nbytes(), view_.device, true);
}

void DeviceTensor::copy_to(const TensorView& host) const {
  require(host.device == Device::cpu && host.dtype == view_.dtype && host.numel() == view_.numel(),
          "copy_to: expected a host tensor like " + view_.to_string() + ", given " + host.to_string());
  copy(host.data, view_.data, view_.nbytes(), view_.device, false);
}

}  // namespace moekit
