// Activation quantization on the GPU (Prepare, DESIGN §4): hidden [T, H] bf16 -> the GEMM1
// input of the quant scheme, bit-identical to cpu::quantize_rows (and to the CPU Prepare's
// weight-on-input rounding: row x topk_weight rounded to bf16 before quantizing).
//   bf16         q [T, H] bf16 (a copy, or the weighted row)
//   fp8-tensor   q [T, H] fp8, scales [1]: given (static) or max(amax, 1e-10)/448 (dynamic)
//   fp8-rowwise  q [T, H] fp8, scales [T]
//   fp8-block    q [T, H] fp8, scales [T, ceil(H/128)] (the public k-major layout)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/stages.h"
#include "moekit/config.h"

namespace moekit::cuda::quant {

// fp8-tensor: where the one scale comes from.
enum class TensorScale : std::uint8_t { dynamic, given };

struct Problem {
  QuantConfig quant;                                 // scheme and scale format (f32 | ue8m0)
  std::int64_t tokens = 0;                           // T (may be 0)
  std::int64_t hidden = 0;                           // H
  WeightPlacement placement = WeightPlacement::output;  // input: scale row t by topk_weights[t] first
  TensorScale tensor_scale = TensorScale::dynamic;   // fp8-tensor only
  std::string to_string() const;
};

struct Args {
  const void* hidden = nullptr;         // [T, H] bf16
  const float* topk_weights = nullptr;  // [T, 1] f32, placement == input
  const float* given_scale = nullptr;   // [1] f32 > 0, fp8-tensor with TensorScale::given
  void* q = nullptr;                    // [T, H] fp8 | bf16
  float* scales = nullptr;              // see above; unused for bf16
  // fp8-tensor dynamic under EP: makes the amax (device [1], on the stream) the group's, between
  // the amax and the quantize kernels. Empty: this call's rows alone.
  std::function<void(float* amax)> reduce_amax;
};

Status can_implement(const Problem& problem);
std::size_t workspace_size(const Problem& problem);
void run(const Problem& problem, const Args& args, core::Workspace workspace, Stream stream);

}  // namespace moekit::cuda::quant
