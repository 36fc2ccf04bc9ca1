// The two references of DESIGN §8, token by token, independent of the stage pipeline's
// permutation and finalize:
// - pipeline: the same quantization points and rounding as the device pipeline
//   (GEMM outputs rounded to bf16, activations requantized); checks a backend.
// - ideal: f64 throughout, real-valued weights, no activation quantization; measures what
//   quantization costs.
#pragma once

#include <vector>

#include "core/master_weights.h"
#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/tensor.h"

namespace moekit::cpu {

struct ReferenceInputs {
  MoEConfig config;
  Weights weights;          // local experts, as given to the Layer
  TensorView hidden;        // [T, H] bf16
  TensorView topk_ids;      // [T, k] i32
  TensorView topk_weights;  // [T, k] f32
};

// out [T, H] bf16; rows of tokens with no local expert are zero.
void pipeline_reference(const ReferenceInputs& in, const TensorView& out);

// Returns [T * H] in f64.
std::vector<double> ideal_reference(const ReferenceInputs& in, const core::MasterWeights& master);

}  // namespace moekit::cpu
