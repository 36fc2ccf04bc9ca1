// Routing on the CPU, usable on its own (e.g. to produce external routing).
#pragma once

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

// Computes topk ids and weights per DESIGN §3. Validates everything before writing.
void route(const RoutingConfig& config, const RoutingInputs& in, const RoutingOutputs& out);

}  // namespace moekit
