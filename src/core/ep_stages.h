// The EP stages of one backend (DESIGN §6, §7): packing what leaves a rank into records,
// unpacking what arrives, and the two combines' row movement. The Communicator moves the
// bytes in between; the backend's own Prepare, Experts and Finalize do the math, so an
// ep = N run does exactly the arithmetic of ep = 1. Index arrays come from the host plan
// (core/ep_plan.h), copied into the backend's memory by the pipeline, or in fixed-capacity
// mode from plan_fixed, which runs where the routing is. C++17-clean: CUDA sources include it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/rows.h"
#include "moekit/backend.h"
#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::core {

// One dispatched token on the wire, fixed size, 16-byte aligned fields first:
//   weights [k] f32 | ids [k] i32 | scales [n_scales] f32 | values [H] fp8 or bf16 | pad to 16
// Only the destination's share of the routing travels: ids it does not own are -1 (weight 0).
// fp8-tensor's one scale is the same on every rank (a group-wide amax) and does not travel.
struct EpRecordLayout {
  int top_k = 0;
  std::int64_t n_scales = 0;    // 0 (bf16, fp8-tensor), 1 (fp8-rowwise), ceil(H/128) (fp8-block)
  std::size_t weights = 0, ids = 0, scales = 0, values = 0;  // byte offsets
  std::size_t value_bytes = 0;  // H * element size
  std::size_t bytes = 0;        // the record

  static EpRecordLayout of(const MoEConfig& config);
};

// Dispatch, sending side: record r = token[r]'s prepared row and (ids, weights)[r].
struct EpPackArgs {
  QuantizedRows in;               // [T, H] this rank's prepared rows
  const std::int32_t* token;      // [S] source token of each record; -1 = padding
  const std::int32_t* ids;        // [S, k]
  const float* weights;           // [S, k]
  std::int64_t records = 0;       // S
  std::byte* out = nullptr;       // [S, layout.bytes]
};

// Dispatch, receiving side: records back into rows the Experts stage takes.
struct EpUnpackArgs {
  const std::byte* records = nullptr;  // [R, layout.bytes]
  std::int64_t count = 0;              // R
  QuantizedRows rows;                  // [R, H]
  TensorView topk_ids;                 // [R, k] i32
  TensorView topk_weights;             // [R, k] f32
  const float* tensor_scale = nullptr; // fp8-tensor: [1] the group's scale (this rank's prepared one)
};

// Exact combine, receiving side: out row i = expert_out row rows[i] (-1: zeros).
struct EpGatherArgs {
  const bf16* expert_out = nullptr;  // [max_rows(R), H]
  const std::int32_t* rows = nullptr;
  std::int64_t count = 0;
  std::int64_t hidden = 0;
  bf16* out = nullptr;  // [count, H]
};

// Partial combine, source side: out[t] = bf16(sum over d of rows[token_rows[t, d]]), f32 sums
// in rank order, -1 entries skipped (a token that went nowhere gets zeros).
struct EpSumArgs {
  const bf16* rows = nullptr;                  // [rows, H]
  const std::int32_t* token_rows = nullptr;    // [T, ranks]
  int ranks = 0;
  std::int64_t tokens = 0;
  std::int64_t hidden = 0;
  bf16* out = nullptr;  // [T, H]
};

// Fixed capacity, planned where the routing lives (on a GPU: no host copy, no wait): rank d's
// block of `capacity` records holds the tokens that go there ascending, then padding (token -1,
// ids -1, weights 0); exact combine's slot_rows and partial combine's token_rows say where the
// rows come back. The layout plan_dispatch writes for the same capacity. An id outside [0, E)
// is "no expert" on a GPU, as -1 (single-GPU external routing does the same); the CPU's plan
// throws naming topk_ids.
struct EpPlanArgs {
  const std::int32_t* topk_ids = nullptr;  // [T, k] global ids, -1 = none
  const float* topk_weights = nullptr;     // [T, k]
  std::int64_t tokens = 0;                 // T <= capacity
  std::int64_t capacity = 0;
  int top_k = 0;
  int ranks = 0;
  std::int64_t local_experts = 0;          // E / ranks
  std::int32_t* token = nullptr;           // [ranks * capacity]
  std::int32_t* ids = nullptr;             // [ranks * capacity, k]
  float* weights = nullptr;                // [ranks * capacity, k]
  std::int32_t* slot_rows = nullptr;       // exact combine: [T, k]; else null
  std::int32_t* token_rows = nullptr;      // partial combine: [T, ranks]; else null
};

class EpStages {
 public:
  virtual ~EpStages() = default;
  // Copies between the host and the backend's memory (plain memcpy on the CPU).
  virtual void to_device(void* dst, const void* src, std::size_t bytes, Stream stream) const = 0;
  virtual void to_host(void* dst, const void* src, std::size_t bytes, Stream stream) const = 0;
  // Whether stream is capturing a CUDA graph (never on the CPU): nothing may wait then.
  virtual bool capturing(Stream stream) const = 0;
  virtual void plan_fixed(const EpPlanArgs& args, Stream stream) const = 0;
  virtual void pack(const EpRecordLayout& layout, const EpPackArgs& args, Stream stream) const = 0;
  virtual void unpack(const EpRecordLayout& layout, const EpUnpackArgs& args, Stream stream) const = 0;
  virtual void gather_rows(const EpGatherArgs& args, Stream stream) const = 0;
  virtual void sum_rows(const EpSumArgs& args, Stream stream) const = 0;
};

}  // namespace moekit::core
