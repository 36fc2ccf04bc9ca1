// The EP stages of the CUDA backend (DESIGN §7): the kernels of ep_kernels.cu behind the
// core::EpStages contract (core/ep_stages.h), on the backend's stream; NCCL moves the bytes
// (make_nccl_communicator). C++17-clean, for the backend's .cu files.
#pragma once

#include <memory>

namespace moekit::core {
class EpStages;
}

namespace moekit::cuda {

std::unique_ptr<core::EpStages> make_ep_stages();

}  // namespace moekit::cuda
