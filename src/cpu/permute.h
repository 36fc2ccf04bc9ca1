// Permutation into expert order (the contiguous format of DESIGN §6) and its inverse map.
#pragma once

#include <cstdint>

#include "cpu/quant.h"
#include "moekit/config.h"

namespace moekit::cpu {

// Where each (token, slot) went. Rows of one expert are contiguous, ordered by token index
// (then slot); slots whose expert is not local (or id -1) get no row.
struct PermutePlan {
  std::int64_t* offsets = nullptr;   // [E_local + 1] first row of each expert; offsets[E_local] = rows
  std::int32_t* slot_rows = nullptr; // [T, k] permuted row of each slot, -1 for none
  std::int32_t* row_token = nullptr; // [T * k] source token of each permuted row
};

struct ExpertRange {
  std::int64_t first = 0;  // global id of local expert 0
  std::int64_t count = 0;  // E_local
};

// Fills plan from topk_ids [T, k]; returns the number of rows.
std::int64_t plan_permutation(const std::int32_t* topk_ids, std::int64_t tokens, int top_k,
                              ExpertRange experts, const PermutePlan& plan);

// dst row r = src row row_token[r], with its scales (fp8-tensor's single scale is copied).
void gather_rows(QuantScheme scheme, const QuantizedRows& src, const std::int32_t* row_token,
                 std::int64_t rows, const QuantizedRows& dst);

}  // namespace moekit::cpu
