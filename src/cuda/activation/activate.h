// The activation between the GEMMs, fused with the requantization of GEMM2's input
// (DESIGN §5): GEMM1's output [rows, W] bf16 (W = 2I gate|up, or I for relu2) -> [rows, I] in
// the quant scheme. f32 math on the bf16 inputs, in cpu::activate_row's order, then the
// scale rule and codes of cpu::quantize_rows; relu2 is bit-identical to the CPU, the others
// differ only where the GPU's expf / erff round differently from the host's (an ulp of f32).
//
// Rows follow the permutation plan (ExpertRows + RowPlan): rows holding a token are
// computed, padding rows are written as zeros (values and scales), rows past those in use are
// not touched. fp8-block scales go out in either ScaleLayout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/stages.h"
#include "cuda/common/rows.h"
#include "cuda/quant/quantize.h"
#include "moekit/config.h"

namespace moekit::cuda::activation {

struct Problem {
  ExpertRows rows;
  std::int64_t tokens = 0;        // T: rows = rows.max_rows(T * k)
  int top_k = 1;
  std::int64_t intermediate = 0;  // I: the output width
  Activation activation = Activation::silu_and_mul;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  QuantConfig quant;                                // GEMM2's input
  ScaleLayout scale_layout = ScaleLayout::k_major;  // fp8-block
  quant::TensorScale tensor_scale = quant::TensorScale::dynamic;  // fp8-tensor

  std::int64_t max_rows() const { return rows.max_rows(tokens * top_k); }
  std::int64_t input_width() const { return activation == Activation::relu2 ? intermediate : 2 * intermediate; }
  std::string to_string() const;
};

struct Args {
  const void* gemm1_out = nullptr;    // [max_rows, W] bf16
  RowPlan plan;
  const float* given_scale = nullptr; // [1] fp8-tensor with TensorScale::given
  void* q = nullptr;                  // [max_rows, I] fp8 | bf16
  float* scales = nullptr;            // tensor [1], rowwise [max_rows], block [max_rows * ceil(I/128)]
  // fp8-tensor dynamic under EP: the amax made the group's (quant::Args::reduce_amax); also
  // called with no rows, since every rank takes part.
  std::function<void(float* amax)> reduce_amax;
};

Status can_implement(const Problem& problem);
std::size_t workspace_size(const Problem& problem);
void run(const Problem& problem, const Args& args, core::Workspace workspace, Stream stream);

}  // namespace moekit::cuda::activation
