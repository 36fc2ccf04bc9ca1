// The routing kernel's parameters (route.cuh), made on the host by kernel_params (route.cu) for
// the routing launch and for the kernels that route in a launch of their own (permute::run_prepared).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/routing/route.h"
#include "moekit/config.h"

namespace moekit::cuda::routing {

struct KernelParams {
  const void* logits;    // [T, E]
  const void* bias;      // [E] or null
  std::int32_t* ids;     // [T, k]
  float* weights;        // [T, k]
  int tokens;
  int experts;
  int top_k;
  int n_group;
  int group_size;        // experts / n_group (sigmoid_bias_grouped), made once on the host
  int topk_group;
  float scaling;         // routed_scaling_factor
  RoutingMethod method;
  bool bias_bf16;
  int warp_floats;       // shared floats per warp
  int bias_floats;       // shared floats for the bias (0 without one)
};

KernelParams kernel_params(const Problem& problem, const Args& args);
// Dynamic shared memory of a block whose first `warps` warps route (route.cuh: stage_block's layout).
std::size_t block_shared_bytes(const KernelParams& kp, int warps);

}  // namespace moekit::cuda::routing
