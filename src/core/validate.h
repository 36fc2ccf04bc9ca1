// Checks of everything a public entry point is handed, before anything is touched.
// Each throws moekit::Error naming the argument, what was expected and what was given.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "core/stages.h"
#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/tensor.h"

namespace moekit::core {

// A required tensor: defined, this dtype (one of `dtypes`), this shape, contiguous, on `device`.
void check_tensor(std::string_view name, const TensorView& t, const std::vector<DType>& dtypes,
                  const std::vector<std::int64_t>& shape, Device device);
// The same from braced lists, as every forward checks its tensors: nothing is allocated unless it fails.
void check_tensor(std::string_view name, const TensorView& t, std::initializer_list<DType> dtypes,
                  std::initializer_list<std::int64_t> shape, Device device);

// Every weight in `device` memory; the static activation scales may also be on the host (their
// value, > 0, is checked there only).
void check_weights(const MoEConfig& config, const Weights& weights, Device device);

// Views without memory in the layout check_weights expects for config (host; f32 routing bias
// for the *_bias_* methods; no static scales): for capability checks that read no value.
Weights weights_layout(const MoEConfig& config);

// The number of tokens T of the call (from hidden), after checking every argument.
std::int64_t check_args(const MoEConfig& config, const FusedArgs& args, Device device);
std::int64_t check_args(const MoEConfig& config, const ExternalArgs& args, Device device);

// The masked call's problem (capacity, expected rows, input form), after checking every argument;
// observer left null.
MaskedProblem check_args(const MoEConfig& config, const MaskedArgs& args, Device device);

// topk_ids values lie in [-1, E) (host memory only).
void check_topk_ids(const TensorView& topk_ids, std::int64_t num_experts);

}  // namespace moekit::core
