// The permutation plan on the GPU (the contiguous and masked formats of DESIGN §6), from
// topk_ids [T, k] alone: per-expert counts, padded offsets, the row of every slot and the
// token of every row. Deterministic and equal to cpu::plan_permutation (alignment 1): an
// expert's rows are ordered by token, then slot. Everything stays on the device.
//
// Masked format: expert e's tokens fill rows [e * capacity, e * capacity + counts[e]); a slot
// past the capacity is dropped: its slot_rows entry is -1 (finalize adds nothing for it) and
// `dropped` counts such slots, for the caller to check or report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/stages.h"
#include "cuda/common/rows.h"

namespace moekit::cuda::permute {

struct PlanProblem {
  ExpertRows rows;                // format, E_local, alignment, capacity
  std::int64_t tokens = 0;        // T (may be 0)
  int top_k = 1;                  // k
  std::int64_t first_expert = 0;  // global id of local expert 0; ids outside the local range get no row
  std::int64_t max_rows() const { return rows.max_rows(tokens * top_k); }
  std::string to_string() const;
};

struct PlanArgs {
  const std::int32_t* topk_ids = nullptr;  // [T, k] global ids, -1 = none
  std::int32_t* counts = nullptr;          // [E_local] rows holding tokens (masked: at most capacity)
  std::int32_t* offsets = nullptr;         // [E_local + 1] contiguous: first padded row of each expert,
                                           //   offsets[E_local] = rows in use; masked: e * capacity
  std::int32_t* slot_rows = nullptr;       // [T, k] row of each slot, -1 = none or dropped
  std::int32_t* row_token = nullptr;       // [max_rows] token of each row, -1 for padding and unused rows
  std::int32_t* row_expert = nullptr;      // optional, contiguous: [max_rows] local expert of each row
                                           //   (padding included), -1 past the rows in use
  std::int32_t* dropped = nullptr;         // masked: [1] slots dropped for lack of capacity
  // Optional, one_block path only (the min-latency kernels of cuda/layer/min_latency.h):
  // work[0] = n, then n entries (local expert, first row, rows), experts in order, each expert's
  // rows cut into entries of at most work_rows; at most E_local + T·k / work_rows entries.
  std::int32_t* work = nullptr;
  int work_rows = 0;
  // Optional, one_block path only: `zeroed_count` ints set to 0 (counters of a later kernel).
  std::int32_t* zeroed = nullptr;
  std::int64_t zeroed_count = 0;
};

// How run builds the plan; choose_path (plan.cu) holds the rule. Both give the same bits.
//   one_block     one kernel, one block of 1024 threads: decode-sized problems, where the
//                 plan costs launches and dependent kernels, not bytes
//   multi_kernel  a memset and three grid-wide kernels (count, scan, assign): everything else
enum class PlanPath : std::uint8_t { one_block, multi_kernel };
std::string_view to_string(PlanPath v);
PlanPath choose_path(const PlanProblem& problem);

Status can_implement(const PlanProblem& problem);
std::size_t workspace_size(const PlanProblem& problem);  // covers both paths (one_block uses none)
void run(const PlanProblem& problem, const PlanArgs& args, core::Workspace workspace, Stream stream);

// The input's preparation in the plan's launch (one_block path only): what the Prepare stage does
// for fp8-block and bf16 layers (the 1x128 quantization, the same bits; or the bf16 copy), times
// the weight where it goes on the input. Block 0 plans, the other blocks prepare the rows; the
// launch may start while the previous kernel on the stream finishes (programmatic dependent).
struct PrepareArgs {
  const void* hidden = nullptr;    // [T, H] bf16
  const float* weights = nullptr;  // [T] with the weight on the input (k = 1), else null
  void* x = nullptr;               // [T, H] e4m3 (fp8) or bf16
  float* x_scales = nullptr;       // [T, H / 128], fp8 only
  std::int64_t hidden_size = 0;    // H, a multiple of 128 (bf16: of 64)
  bool fp8 = true;
  bool ue8m0 = false;
};
void run_prepared(const PlanProblem& problem, const PlanArgs& args, const PrepareArgs& prepare, Stream stream);

}  // namespace moekit::cuda::permute
