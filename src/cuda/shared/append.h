// Shared experts on the GPU (core/shared.h): the layer's routing [T, k] with its S shared experts
// appended, [T, k + S] in experts_config's ids, before the experts run: they are then local
// experts of the grouped GEMMs like any other. The same values as core::append_shared.
#pragma once

#include <cstdint>
#include <string>

#include "moekit/backend.h"
#include "moekit/config.h"

namespace moekit::cuda::shared {

struct Problem {
  std::int64_t tokens = 0;         // T (may be 0)
  int top_k = 1;                   // k
  int shared = 0;                  // S
  std::int64_t experts = 0;        // E: routed ids lie in [0, E)
  std::int64_t local_experts = 1;  // E_local
  std::int64_t first_shared = 0;   // this rank's shared expert 0: ep_rank (E_local + S) + E_local
  float weight = 1.0f;             // shared_expert_weight

  static Problem of(const MoEConfig& config, std::int64_t tokens);
  std::string to_string() const;
};

struct Args {
  const std::int32_t* topk_ids = nullptr;   // [T, k]
  const float* topk_weights = nullptr;      // [T, k]
  std::int32_t* out_ids = nullptr;          // [T, k + S]
  float* out_weights = nullptr;             // [T, k + S]
};

Status can_implement(const Problem& problem);
// Asynchronous on `stream`, no allocation (graph-capturable).
void run(const Problem& problem, const Args& args, Stream stream);

}  // namespace moekit::cuda::shared
