#include "cpu/activation.h"

#include <algorithm>
#include <cmath>

namespace moekit::cpu {

ActivationParams ActivationParams::of(const MoEConfig& config) {
  return {config.activation, config.swiglu_alpha, config.swiglu_limit, config.intermediate_size};
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

float swiglu_oai(float gate, float up, float alpha, float limit) {
  gate = std::fmin(gate, limit);
  up = std::clamp(up, -limit, limit);
  return gate / (1.0f + std::exp(-alpha * gate)) * (up + 1.0f);
}

float relu2(float x) {
  const float r = std::fmax(x, 0.0f);
  return r * r;
}

void activate_row(const ActivationParams& p, const bf16* row, float* out) {
  const std::int64_t n = p.intermediate_size;
  switch (p.activation) {
    case Activation::silu_and_mul:
      for (std::int64_t i = 0; i < n; ++i) out[i] = silu(bf16_to_float(row[i])) * bf16_to_float(row[n + i]);
      return;
    case Activation::gelu_and_mul:
      for (std::int64_t i = 0; i < n; ++i) out[i] = gelu(bf16_to_float(row[i])) * bf16_to_float(row[n + i]);
      return;
    case Activation::swiglu_oai:
      for (std::int64_t i = 0; i < n; ++i)
        out[i] = swiglu_oai(bf16_to_float(row[i]), bf16_to_float(row[n + i]), p.swiglu_alpha, p.swiglu_limit);
      return;
    case Activation::relu2:
      for (std::int64_t i = 0; i < n; ++i) out[i] = relu2(bf16_to_float(row[i]));
      return;
  }
}

}  // namespace moekit::cpu
