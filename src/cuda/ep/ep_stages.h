// The EP stages of the CUDA backend (DESIGN §7): the kernels of ep_kernels.cu behind the
// core::EpStages contract, on the backend's stream; NCCL moves the bytes
// (make_nccl_communicator).
#pragma once

#include <cstdint>
#include <memory>

#include "core/ep_stages.h"
#include "core/stages.h"

namespace moekit::cuda {

std::unique_ptr<core::EpStages> make_ep_stages();

// group.all_reduce_max(values, count, stream), for CUDA sources (C++17; moekit/comm.h is C++20):
// the group-wide fp8-tensor amax of the quantize and activation stages under EP.
void all_reduce_max(Communicator& group, float* values, std::int64_t count, Stream stream);

}  // namespace moekit::cuda
