// The GPU Experts stage (contiguous format): permute, GEMM1, activation + requant, GEMM2.
#pragma once

#include <memory>

#include "core/stages.h"
#include "cuda/layer/device_weights.h"

namespace moekit::cuda {

// weights must outlive the stage. tuning: the cache whose tactics it prefers (tactic.h); null:
// the heuristic alone.
std::unique_ptr<core::ExpertsStage> make_experts(const MoEConfig& config, const DeviceWeights& weights,
                                                 const TuningOptions* tuning);

}  // namespace moekit::cuda
