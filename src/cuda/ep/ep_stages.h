// The EP stages of the CUDA backend (DESIGN §7): the kernels of ep_kernels.cu behind the
// core::EpStages contract, on the backend's stream; NCCL moves the bytes
// (make_nccl_communicator).
#pragma once

#include <functional>
#include <memory>

#include "core/ep_stages.h"
#include "core/stages.h"

namespace moekit::cuda {

std::unique_ptr<core::EpStages> make_ep_stages();

// The quantize and activation stages' reduce_amax under EP: a dynamic fp8-tensor amax made the
// group's (p.group's all_reduce_max on stream); empty without a group or for another scheme.
// Here for CUDA sources (C++17), which cannot include moekit/comm.h (C++20).
std::function<void(float* amax)> group_amax(const core::StageProblem& p, Stream stream);

}  // namespace moekit::cuda
