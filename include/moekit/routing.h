// Routing on its own (e.g. to produce external routing), on the CPU or on the GPU.
#pragma once

#include "moekit/backend.h"
#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit {

struct RoutingInputs {
  TensorView router_logits;  // [T, E] f32 or bf16
  TensorView bias;           // [E] f32 or bf16; only for the *_bias_* methods, else absent
};

struct RoutingOutputs {
  TensorView topk_ids;      // [T, k] i32
  TensorView topk_weights;  // [T, k] f32
};

// Computes topk ids and weights per DESIGN §3. Validates everything before writing. Every tensor
// in the memory of router_logits: host memory runs the CPU reference router on the calling
// thread; CUDA memory (builds with CUDA) enqueues the cuda backend's routing kernel on `stream`
// (no allocation, no synchronization, graph-capturable), which matches the CPU's to an ulp or
// four in rare weights (src/cuda/routing/route.h).
void route(const RoutingConfig& config, const RoutingInputs& in, const RoutingOutputs& out, Stream stream = nullptr);

}  // namespace moekit
