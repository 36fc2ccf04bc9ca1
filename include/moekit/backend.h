// Backends and how one is chosen (DESIGN §6).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"
#include "moekit/error.h"

namespace moekit {

struct Weights;  // moekit/layer.h

// cudaStream_t on the CUDA backend; ignored by the CPU backend.
using Stream = void*;

struct BackendDecision {
  std::string backend;
  Status status;
};

struct BackendSelection {
  std::string chosen;                       // empty when nothing can run the problem
  std::string requested;                    // "auto" or a backend name
  std::vector<BackendDecision> decisions;   // in priority order, each with its answer
  // One line per backend: "cuda: no (no CUDA device)", "cpu: yes (chosen)".
  std::string to_string() const;
};

// Backends in priority order, as registered in this build.
std::vector<std::string> backend_names();

// Walks the priority list and keeps the first backend whose can_implement says yes.
// requested is "auto" or a backend name; "auto" defers to MOEKIT_BACKEND when that is set.
// A named backend that cannot run the problem is an Error with its reason, never a fallback.
BackendSelection select_backend(const MoEConfig& config, std::string_view requested = "auto");

// The same walk without throwing: every backend's answer, chosen left empty when none fits.
BackendSelection explain_backends(const MoEConfig& config, std::string_view requested = "auto");

// The walk a Layer makes at construction: a backend must also read the weights' memory (host
// memory, which a device backend copies, or its own device's) and every one of its stages, bound
// to the weights' layout (dtypes, shapes, which tensors are given; no value is read), must accept
// T = 1 and T = max_tokens (0: T = 1 only). So "auto" keeps a backend that runs every call.
BackendSelection explain_backends(const MoEConfig& config, const Weights& weights, std::int64_t max_tokens,
                                  std::string_view requested = "auto");
BackendSelection select_backend(const MoEConfig& config, const Weights& weights, std::int64_t max_tokens,
                                std::string_view requested = "auto");

}  // namespace moekit
