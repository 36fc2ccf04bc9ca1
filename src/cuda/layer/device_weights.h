// The layer's weights as the GPU stages read them, prepared once (core::BackendImpl::prepare):
//   - values, routing bias and static input scales: the caller's device tensors, borrowed; host
//     tensors are copied (owned here);
//   - FP8 weight scales: always rewritten, on the device, into the grouped GEMMs' layout
//     [E_local, ceil(K/128), cols] f32 (MN-major per 128 of K): fp8-block [E, NB, KB] transposed
//     (cols = ceil(N/128)); per-row [E, N] and per-tensor [E] scales repeated over the K blocks
//     (cols = N).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/stages.h"
#include "cuda/gemm/grouped_gemm.h"
#include "moekit/config.h"
#include "moekit/device.h"
#include "moekit/layer.h"

namespace moekit::cuda {

GemmKind gemm_kind(QuantScheme scheme);

struct DeviceWeights final : core::BackendWeights {
  TensorView w13, w2;                // [E_local, W, H], [E_local, H, I] bf16 | fp8
  TensorView w13_scales, w2_scales;  // the GEMM layout above; absent for bf16
  TensorView w13_input_scale, w2_input_scale;  // [1] f32 fp8-tensor static scales; absent: dynamic
  // (bias, [E], is core::BackendWeights::bias)
  std::vector<DeviceTensor> owned;   // the copies the views above point into

  // Weights checked by the caller (core::check_weights), on the host or on the current device.
  static std::shared_ptr<const DeviceWeights> prepare(const MoEConfig& config, const Weights& weights,
                                                      core::Preparation how, Stream stream);
};

}  // namespace moekit::cuda
