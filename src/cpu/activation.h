// Gated activations of DESIGN §5 on the CPU.
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::cpu {

struct ActivationParams {
  Activation activation = Activation::silu_and_mul;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  std::int64_t intermediate_size = 0;  // I: the output width

  static ActivationParams of(const MoEConfig& config);
};

// One GEMM1 output row [W] (W = 2I gated: gate then up; W = I for relu2) -> out [I], f32.
void activate_row(const ActivationParams& params, const bf16* gemm1_row, float* out);

// The scalar functions, exposed for tests.
float silu(float x);
float gelu(float x);  // exact (erf) GELU
float swiglu_oai(float gate, float up, float alpha, float limit);
float relu2(float x);

}  // namespace moekit::cpu
