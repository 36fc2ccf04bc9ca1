// What `moekit bench` measures of the GPU itself, in the same run as the layer (DESIGN §9):
// the copy bandwidth, the matrix rates through cuBLASLt, and the name and driver for the record.
// Everything here needs a CUDA build; without one the functions throw moekit::Error.
#pragma once

#include <string>

namespace moekit::cli {

struct GpuInfo {
  std::string name;    // "NVIDIA H200"
  std::string driver;  // "580.159.04" (NVML), else the CUDA driver API version
  int sms = 0;
};

struct Ceilings {
  double copy_gbs = 0;  // B: a 2 GiB device-to-device copy, bytes read + written over time
  // P per scheme: cuBLASLt 8192^3 GEMMs, bf16 out, median of 20 after warm-up; 0 = not measured
  double bf16_tflops = 0;
  double fp8_tflops = 0;        // per-tensor scales (fp8-tensor, fp8-rowwise)
  double fp8_block_tflops = 0;  // 1x128 activation and 128x128 weight scales (fp8-block)
  std::string source;           // how they were obtained, for the record
};

GpuInfo gpu_info();
// Measures copy bandwidth and, with matrix = true, the three cuBLASLt rates (a rate cuBLASLt
// cannot run stays 0 and the source says why).
Ceilings measure_ceilings(bool matrix);

}  // namespace moekit::cli
