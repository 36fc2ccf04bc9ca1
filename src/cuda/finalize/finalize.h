// Finalize on the GPU: out[t] = bf16( sum_{j ascending} w[t, j] * expert_out[slot_rows[t, j]] ),
// f32 sums in slot order, products rounded before the add: bit-identical to cpu::finalize.
// A slot whose row is -1 adds nothing; without weights (they went on the input) w = 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/stages.h"

namespace moekit::cuda::finalize {

struct Problem {
  std::int64_t tokens = 0;  // T
  int top_k = 1;            // k
  std::int64_t hidden = 0;  // H
  std::string to_string() const;
};

struct Args {
  const void* expert_out = nullptr;        // [rows, H] bf16, permuted order
  const std::int32_t* slot_rows = nullptr; // [T, k]
  const float* topk_weights = nullptr;     // [T, k], or null: every weight is 1
  void* out = nullptr;                     // [T, H] bf16
};

Status can_implement(const Problem& problem);
std::size_t workspace_size(const Problem& problem);
void run(const Problem& problem, const Args& args, core::Workspace workspace, Stream stream);

}  // namespace moekit::cuda::finalize
