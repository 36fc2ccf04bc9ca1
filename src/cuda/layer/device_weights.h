// The layer's weights on the GPU, uploaded once, with the scales in the layouts the grouped
// GEMMs read (MN-major per 128 of K; per-channel and per-tensor scales repeated over K blocks).
#pragma once

#include <cstdint>

#include "cuda/gemm/grouped_gemm.h"
#include "moekit/config.h"
#include "moekit/device.h"
#include "moekit/layer.h"

namespace moekit::cuda {

GemmKind gemm_kind(QuantScheme scheme);

struct DeviceMatrix {
  DeviceTensor values;  // [E_local, N, K]
  DeviceTensor scales;  // fp8: [E_local, ceil(K/128), ceil(N/128) or N]; bf16: 1 unused float
};

struct DeviceWeights {
  DeviceMatrix w13, w2;
  DeviceTensor bias;             // [E] as given (f32 | bf16), or 1 unused float
  DeviceTensor w13_input_scale;  // [1] fp8-tensor static scales, or 1 unused float
  DeviceTensor w2_input_scale;
  bool has_bias = false, has_w13_input_scale = false, has_w2_input_scale = false;

  static DeviceWeights upload(const MoEConfig& config, const Weights& weights);
};

}  // namespace moekit::cuda
