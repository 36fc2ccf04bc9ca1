// Memory on a device: host memory for Device::cpu, GPU memory for Device::cuda. For callers
// that hand a CUDA-backed Layer its inputs (the Layer's tensors live where Layer::device() says).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moekit/tensor.h"

namespace moekit {

// Whether this build has CUDA and a CUDA device is present.
bool cuda_available();

// Waits until the device finished all queued work (a no-op for the CPU).
void synchronize(Device device);

class DeviceTensor {
 public:
  DeviceTensor(DType dtype, std::vector<std::int64_t> shape, Device device);
  ~DeviceTensor();
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&&) noexcept;
  DeviceTensor& operator=(DeviceTensor&&) noexcept;

  const TensorView& view() const { return view_; }
  // Copies between this tensor and a host tensor of the same dtype and element count.
  void copy_from(const TensorView& host);
  void copy_to(const TensorView& host) const;

 private:
  std::vector<std::int64_t> shape_;
  TensorView view_;
};

}  // namespace moekit
