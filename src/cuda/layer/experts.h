// The GPU Experts stage (contiguous format): permute, GEMM1, activation + requant, GEMM2.
#pragma once

#include <memory>

#include "core/stages.h"
#include "cuda/layer/device_weights.h"

namespace moekit::cuda {

// weights must outlive the stage.
std::unique_ptr<core::ExpertsStage> make_experts(const MoEConfig& config, const DeviceWeights& weights);

}  // namespace moekit::cuda
