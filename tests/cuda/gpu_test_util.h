// Helpers for the GPU tests: skip without a GPU, device buffers, checked calls.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace moekit::test {

inline bool have_gpu() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
}

#define MOEKIT_SKIP_WITHOUT_GPU() \
  if (!::moekit::test::have_gpu()) GTEST_SKIP() << "no CUDA device"

#define MOEKIT_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

// Device memory freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes ? bytes : 1) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

  void upload(const void* host, std::size_t bytes) const { cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice); }
  void download(void* host, std::size_t bytes) const { cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost); }
  void poison() const { cudaMemset(ptr_, 0xff, bytes_); }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

template <class T>
std::vector<T> download(const DeviceBuffer& buffer, std::size_t count) {
  std::vector<T> host(count);
  buffer.download(host.data(), count * sizeof(T));
  return host;
}

}  // namespace moekit::test
