// Gathers the prepared rows [T, H] (fp8 + scales, or bf16) into expert order, following a
// permutation plan: row r of the output is input row row_token[r]; padding rows are written
// as zeros (values and scales) so a GEMM never reads garbage; rows past those in use are not
// touched. fp8-block scales go out in either layout (ScaleLayout), written directly here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/stages.h"
#include "cuda/common/rows.h"
#include "moekit/config.h"

namespace moekit::cuda::permute {

struct GatherProblem {
  ExpertRows rows;
  std::int64_t tokens = 0;  // T
  int top_k = 1;
  std::int64_t hidden = 0;  // H
  QuantScheme scheme = QuantScheme::fp8_block;
  ScaleLayout scale_layout = ScaleLayout::k_major;  // fp8-block only
  std::int64_t max_rows() const { return rows.max_rows(tokens * top_k); }
  std::string to_string() const;
};

struct GatherArgs {
  const void* q = nullptr;          // [T, H] fp8 | bf16
  const float* scales = nullptr;    // tensor [1], rowwise [T], block [T, ceil(H/128)]
  RowPlan plan;                     // counts, offsets (contiguous)
  const std::int32_t* row_token = nullptr;  // [max_rows]
  void* out_q = nullptr;            // [max_rows, H]
  float* out_scales = nullptr;      // tensor [1], rowwise [max_rows], block [max_rows * ceil(H/128)] in scale_layout
};

Status can_implement(const GatherProblem& problem);
std::size_t workspace_size(const GatherProblem& problem);
void run(const GatherProblem& problem, const GatherArgs& args, core::Workspace workspace, Stream stream);

}  // namespace moekit::cuda::permute
