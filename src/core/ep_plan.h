// Expert parallelism, planned on the host (DESIGN §7): which token goes to which rank with
// which share of its routing, and where each expert row comes back to. Pure functions of
// the routing, so every rank derives the same layout its peers assume.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/ep_stages.h"
#include "moekit/config.h"
#include "moekit/layer.h"

namespace moekit::core {

// The rank that owns a global expert id.
inline int owner_of(std::int64_t expert, const MoEConfig& c) { return int(expert / c.local_experts()); }

// What this rank sends and how it reassembles what comes back.
struct EpSendPlan {
  std::int64_t capacity = 0;            // records per destination in fixed-capacity mode; 0: exact counts
  std::vector<std::int64_t> counts;     // [ep] records for each rank (capacity each in fixed mode)
  std::vector<std::int64_t> offsets;    // [ep] first record of each rank's block
  std::vector<std::int32_t> token;      // [S] source token of each record; -1 = padding (ids all -1)
  std::vector<std::int32_t> ids;        // [S, k] the ids the destination owns, else -1
  std::vector<float> weights;           // [S, k] their weights, else 0

  // Combine. Rows come back in blocks by rank: rows_back[d] from rank d at rows_back_offsets[d].
  std::vector<std::int64_t> rows_back, rows_back_offsets;  // [ep]
  // exact: the row of the combine buffer holding slot (t, j), -1 for none.  [T, k]
  std::vector<std::int32_t> slot_rows;
  // partial: token t's row from rank d is token_rows[t * ep + d], -1 where it sent nothing.
  std::vector<std::int32_t> token_rows;  // [T, ep]

  std::int64_t records() const { return std::int64_t(token.size()); }
  std::int64_t rows_back_total() const;
};

// Builds the plan from this rank's routing (host memory): topk_ids [T, k] global ids, -1 = none.
// capacity > 0 selects the fixed-capacity layout (T <= capacity, checked by the caller).
// Error naming topk_ids when an id lies outside [-1, E), before anything is indexed with it.
void plan_dispatch(const std::int32_t* topk_ids, const float* topk_weights, std::int64_t tokens,
                   const MoEConfig& config, std::int64_t capacity, EpCombine combine, EpSendPlan& plan);

// EpStages::plan_fixed on the host (the CPU backend's, and the GPU kernel's reference): the
// arrays of plan_dispatch at args.capacity, written into args' host buffers. Error naming
// topk_ids for an id outside [-1, E).
void plan_fixed_on_host(const EpPlanArgs& args);

// Exact combine, on the receiving rank: which expert_out row goes back as each returned row,
// from the received routing (recv_ids [R, k]) and the experts' slot_rows [R, k].
// Rows of records from source s form block s; within it, records in order, slots ascending.
// Fixed capacity keeps every (record, slot) position (-1 = a row of zeros).
struct EpReturnPlan {
  std::vector<std::int64_t> counts, offsets;  // [ep] rows back to each source rank
  std::vector<std::int32_t> rows;             // rows of expert_out, in send order; -1 = zeros
};
void plan_return(std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_offsets,
                 const std::int32_t* slot_rows, int top_k, bool fixed_capacity, EpReturnPlan& plan);

// offsets[i] = sum of counts[0..i).
std::vector<std::int64_t> exclusive_sum(std::span<const std::int64_t> counts);

}  // namespace moekit::core
