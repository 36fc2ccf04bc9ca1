// Random layers and inputs with real-looking magnitudes, a pure function of (seed, index):
// every rank of an EP group generates the same values for the experts it owns, and the
// ideal reference can regenerate any weight before quantization.
#pragma once

#include <cstdint>

#include "core/master_weights.h"
#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/tensor.h"

namespace moekit::core {

// splitmix64's finalizer: a good 64-bit mix, so mix64(key ^ index) is a counter RNG of (key, index)
// (the generators below; core/skew.cpp's expert ranks).
std::uint64_t mix64(std::uint64_t x);

struct SyntheticLayer : OwnedWeights {
  MoEConfig config;
  std::uint64_t seed = 0;
};

// The local experts' weights (then the shared experts', core/shared.h weight_owner), quantized per
// config.quant, plus the routing bias.
SyntheticLayer make_synthetic_layer(const MoEConfig& config, std::uint64_t seed);

// hidden [T, H] bf16, about N(0, 1).
Tensor make_hidden(std::int64_t tokens, std::int64_t hidden_size, std::uint64_t seed);
// router_logits [T, E] f32 or bf16, about N(0, 1).
Tensor make_router_logits(std::int64_t tokens, std::int64_t experts, DType dtype, std::uint64_t seed);

// The weights of a synthetic layer before quantization.
class SyntheticMaster final : public MasterWeights {
 public:
  SyntheticMaster(const MoEConfig& config, std::uint64_t seed) : config_(config), seed_(seed) {}
  void row(Projection which, std::int64_t local_expert, std::int64_t n, double* out) const override;

 private:
  MoEConfig config_;
  std::uint64_t seed_;
};

}  // namespace moekit::core
