// Finalize on the CPU: unpermute, weight, and sum over the k slots in slot order.
#pragma once

#include <cstdint>

#include "moekit/tensor.h"

namespace moekit::cpu {

struct FinalizeArgs {
  const bf16* expert_out = nullptr;        // [rows, H] in permuted order
  const std::int32_t* slot_rows = nullptr; // [T, k], -1 = contributes nothing
  const float* topk_weights = nullptr;     // [T, k]; null when the weights went on the input
  std::int64_t tokens = 0;
  int top_k = 0;
  std::int64_t hidden = 0;
  bf16* out = nullptr;                     // [T, H]
};

// out[t] = bf16( sum_{j ascending} w[t, j] * expert_out[slot_rows[t, j]] ), f32 sums.
void finalize(const FinalizeArgs& args);

}  // namespace moekit::cpu
