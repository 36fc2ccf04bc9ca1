// The EP stages of the CUDA backend (DESIGN §7): the kernels of ep_kernels.cu behind the
// core::EpStages contract, on the backend's stream; NCCL moves the bytes
// (make_nccl_communicator).
#pragma once

#include <memory>

#include "core/ep_stages.h"

namespace moekit::cuda {

std::unique_ptr<core::EpStages> make_ep_stages();

}  // namespace moekit::cuda
