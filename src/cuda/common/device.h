// What CUDA device this process sees, for backend selection and `moekit explain`.
#pragma once

#include <string>

namespace moekit::cuda {

struct DeviceInfo {
  int count = 0;          // CUDA devices visible
  std::string name;       // of device 0
  int sm = 0;             // compute capability of device 0, e.g. 90
  int multiprocessors = 0;
  std::string problem;    // why there is none, when count == 0
  std::string to_string() const;
};

// Asks the CUDA runtime once; never throws.
const DeviceInfo& device_info();

}  // namespace moekit::cuda
