// The CPU reference router: DESIGN §3 written as plain loops, one token at a time.
#pragma once

#include "moekit/routing.h"

namespace moekit::cpu {

// Routes every token of in.router_logits [T, E] into out.topk_ids / out.topk_weights [T, k].
// Assumes what moekit::route validates: the config suits E, the tensors are contiguous
// host tensors of the documented shapes and dtypes, and the bias is present when the
// method uses one. The CPU backend's Router stage calls this after its own checks.
void route_tokens(const RoutingConfig& config, const RoutingInputs& in, const RoutingOutputs& out);

}  // namespace moekit::cpu
