// EP data movement on the GPU: the launchers of ep_kernels.cu (C++17, raw pointers and a
// stream). Each mirrors a function of src/cpu/ep_dispatch.cpp or ep_combine.cpp byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moekit::cuda {

// core::EpRecordLayout, flattened.
struct RecordLayout {
  int top_k;
  std::int64_t n_scales;
  std::size_t weights, ids, scales, values, value_bytes, bytes;
};

// core::EpPlanArgs, flattened (see there).
struct PlanLaunch {
  const std::int32_t* topk_ids;
  const float* topk_weights;
  std::int64_t tokens, capacity;
  int top_k, ranks;
  std::int64_t local_experts;
  std::int32_t* token;
  std::int32_t* ids;
  float* weights;
  std::int32_t* slot_rows;   // exact, else null
  std::int32_t* token_rows;  // partial, else null
};
void launch_plan_fixed(const PlanLaunch& a, void* stream);

struct PackLaunch {
  const std::uint8_t* values;   // [T, value_bytes] prepared rows
  const float* scales;          // [T, n_scales] (null when n_scales == 0)
  const std::int32_t* token;    // [S]
  const std::int32_t* ids;      // [S, k]
  const float* weights;         // [S, k]
  std::int64_t records;
  std::uint8_t* out;            // [S, bytes]
};
void launch_pack(const RecordLayout& l, const PackLaunch& a, void* stream);

struct UnpackLaunch {
  const std::uint8_t* records;  // [R, bytes]
  std::int64_t count;
  std::uint8_t* values;         // [R, value_bytes]
  float* scales;                // [R, n_scales] ([1] for fp8-tensor, see tensor_scale)
  std::int32_t* ids;            // [R, k]
  float* weights;               // [R, k]
  const float* tensor_scale;    // fp8-tensor: [1], copied to scales[0]; else null
};
void launch_unpack(const RecordLayout& l, const UnpackLaunch& a, void* stream);

// out[i] = rows[i] < 0 ? 0 : expert_out[rows[i]], rows of `hidden` bf16.
void launch_gather_rows(const std::uint16_t* expert_out, const std::int32_t* rows, std::int64_t count,
                        std::int64_t hidden, std::uint16_t* out, void* stream);

// out[t] = bf16(sum over d of rows[token_rows[t, d]], -1 skipped), f32, in rank order.
void launch_sum_rows(const std::uint16_t* rows, const std::int32_t* token_rows, int ranks, std::int64_t tokens,
                     std::int64_t hidden, std::uint16_t* out, void* stream);

}  // namespace moekit::cuda
