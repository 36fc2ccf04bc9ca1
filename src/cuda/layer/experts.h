// The GPU Experts stage (contiguous format): permute, GEMM1, activation + requant, GEMM2.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/stages.h"
#include "cuda/layer/device_weights.h"
#include "cuda/layer/tactic.h"

namespace moekit::cuda {

// weights must outlive the stage. tuning: the cache whose tactics it prefers (tactic.h); null:
// the heuristic alone.
std::unique_ptr<core::ExpertsStage> make_experts(const MoEConfig& config, const DeviceWeights& weights,
                                                 const TuningOptions* tuning);

// Whether the staged path's permutation plan is one launch of one block at T (decode sizes, T > 0):
// the plan that zeroes a later kernel's counters (permute::PlanArgs::zeroed; GEMM2 + combine's).
bool plan_takes_one_block(const MoEConfig& config, std::int64_t tokens);

// Whether the staged path quantizes the input in its permutation plan's launch at T (the layer
// then skips Prepare): where the plan takes one block (decode sizes), outside the expert-parallel
// pipeline (which prepares its own rows), for fp8-block (H % 128 == 0) and bf16 (H % 64 == 0).
bool plan_prepares_input(const MoEConfig& config, std::int64_t tokens, bool expert_parallel);

// The staged path's launches after routing at T under `tactic` (a staged one), for moekit explain:
// e.g. "permutation plan + the input's quantization (one launch), GEMM1 tokens8_n256_act (rows read
// by index) + activation + requantization, GEMM2 tokens8_n128_wgmma, finalize".
std::string staged_steps(const MoEConfig& config, std::int64_t tokens, const Tactic& tactic);

}  // namespace moekit::cuda
